"""The lease manager's metrics: the seed's two GPU lease metrics, exactly (CONTRACT section 5), which no other
service emits, and whether this replica acts."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import Counter, Gauge

from flexinfer_lease_manager.domain.leases import Lease

GPU_LEASE_ACTIVE = Gauge(
    "flexinfer_gpu_lease_active", "1 while a GPU lease holds a group", ["group", "namespace", "owner"]
)
GPU_LEASE_ACQUIRED = Counter(
    "flexinfer_gpu_lease_acquired_total", "GPU lease acquisitions", ["group", "namespace", "owner"]
)
LEASE_MANAGER_ACTING = Gauge(
    "flexinfer_lease_manager_leader",
    "1 while this lease manager replica acts (expires leases, checks parking, syncs Kubernetes); always in local mode",
)

Labels = tuple[str, str, str]


def lease_labels(lease: Lease) -> Labels:
    return (lease.group, lease.namespace, lease.owner)


class ActiveLeases:
    """``flexinfer_gpu_lease_active``: 1 for each lease that holds a group, the series removed once it ends."""

    def __init__(self) -> None:
        self._shown: set[Labels] = set()

    def show(self, leases: Iterable[Lease]) -> None:
        wanted = {lease_labels(lease) for lease in leases}
        for gone in self._shown - wanted:
            GPU_LEASE_ACTIVE.remove(*gone)
        for labels in wanted:
            GPU_LEASE_ACTIVE.labels(*labels).set(1)
        self._shown = wanted

    def clear(self) -> None:
        self.show(())
