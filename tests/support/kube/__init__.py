"""FlexInfer's test-side Kubernetes: an API server emulator over real HTTP and a fake one-node kubelet.

See README.md in this folder. The public names:
"""

from tests.support.kube.cluster import KubeCluster, KubectlResult, in_thread, rendered_crds, running_cluster
from tests.support.kube.errors import ApiError, Reason
from tests.support.kube.kubelet import FakeKubelet, KubeletConfig, NodeConfig
from tests.support.kube.server import ApiCall, Emulator
from tests.support.kube.store import Store

__all__ = [
    "ApiCall",
    "ApiError",
    "Emulator",
    "FakeKubelet",
    "KubeCluster",
    "KubectlResult",
    "KubeletConfig",
    "NodeConfig",
    "Reason",
    "Store",
    "in_thread",
    "rendered_crds",
    "running_cluster",
]
