"""FlexInfer's test-side Kubernetes: an API server emulator over real HTTP and a fake one-node kubelet.

See README.md in this folder. The public names:
"""

from flexinfer_testbed.kube.cluster import KubeCluster, KubectlResult, in_thread, rendered_crds, running_cluster
from flexinfer_testbed.kube.errors import ApiError, Reason
from flexinfer_testbed.kube.kubelet import FakeKubelet, KubeletConfig, NodeConfig
from flexinfer_testbed.kube.server import ApiCall, Emulator
from flexinfer_testbed.kube.store import Store

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
