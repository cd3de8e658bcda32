"""pytest fixtures of the emulated cluster (registered in tests/conftest.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from flexinfer_testbed.kube.cluster import KubeCluster, running_cluster
from flexinfer_testbed.kube_models import PodsRecorder, add_model
from flexinfer_testbed.system import System
from tests.support.system import SystemStarter


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeCluster]:
    """A running emulated cluster: API server, one fake GPU node (1 nvidia.com/gpu), FlexInfer's CRDs installed,
    kubeconfig at `kube.kubeconfig`, namespace `default`."""
    async with running_cluster(tmp_path / "kube") as cluster:
        yield cluster


#: ``async with kube_system(**options) as system``: the whole system in Kubernetes mode (``running_system``'s
#: options), against the test's emulated cluster, on its database and NATS.
KubeSystem = Callable[..., contextlib.AbstractAsyncContextManager[System]]


@pytest.fixture
def kube_system(kube: KubeCluster, start_system: SystemStarter) -> KubeSystem:
    """Starts the whole system in Kubernetes mode against ``kube``: ``start_system`` (this test's database, NATS and
    state folder) with the cluster's kubeconfig."""

    def start(**options: Any) -> contextlib.AbstractAsyncContextManager[System]:
        return start_system(kubeconfig=kube.kubeconfig, **options)

    return start


@contextlib.asynccontextmanager
async def pair_on_one_gpu(
    kube: KubeCluster, kube_system: KubeSystem, *, priorities: tuple[int, int] = (10, 10), **options: Any
) -> AsyncIterator[tuple[System, PodsRecorder]]:
    """Models ``a`` and ``b`` (of ``priorities``) sharing the node's one GPU, and the system running (``options``);
    a recorder of their Pods, which (when the block ends without an error) never had two at once."""
    recorder = PodsRecorder(kube, {"a", "b"})
    with recorder.watching():
        await add_model(kube, "a", priority=priorities[0])
        await add_model(kube, "b", priority=priorities[1])
        async with kube_system(**options) as system:
            yield system, recorder
    recorder.assert_never_two()
