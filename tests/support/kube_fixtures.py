"""pytest fixtures of the emulated cluster (registered in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from flexinfer_testbed.kube.cluster import KubeCluster, running_cluster


@pytest.fixture
async def kube(tmp_path: Path) -> AsyncIterator[KubeCluster]:
    """A running emulated cluster: API server, one fake GPU node (1 nvidia.com/gpu), FlexInfer's CRDs installed,
    kubeconfig at `kube.kubeconfig`, namespace `default`."""
    async with running_cluster(tmp_path / "kube") as cluster:
        yield cluster
