"""The lease manager's metrics: the seed's two GPU lease metrics, exactly (docs/reference.md section 5), which no other
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
GPU_LEASE_EXPIRES = Gauge(
    "flexinfer_gpu_lease_expires_timestamp_seconds",
    "When a GPU lease that holds a group expires unless renewed (Unix time); the series goes with the lease",
    ["group", "namespace", "owner"],
)
LEASE_MANAGER_ACTING = Gauge(
    "flexinfer_lease_manager_leader",
    "1 while this lease manager replica acts (expires leases, checks parking, syncs Kubernetes); always in local mode",
)

Labels = tuple[str, str, str]


def lease_labels(lease: Lease) -> Labels:
    return (lease.group, lease.namespace, lease.owner)


class ActiveLeases:
    """``flexinfer_gpu_lease_active`` (1) and ``flexinfer_gpu_lease_expires_timestamp_seconds`` for each lease that
    holds a group, the series removed once it ends. A lease still shown past its expiry is one the lease manager
    did not end: the alert FlexInferLeaseHeldPastTTL."""

    def __init__(self) -> None:
        self._shown: set[Labels] = set()

    def show(self, leases: Iterable[Lease]) -> None:
        wanted = {lease_labels(lease): lease for lease in leases}
        for gone in self._shown - wanted.keys():
            GPU_LEASE_ACTIVE.remove(*gone)
            GPU_LEASE_EXPIRES.remove(*gone)
        for labels, lease in wanted.items():
            GPU_LEASE_ACTIVE.labels(*labels).set(1)
            GPU_LEASE_EXPIRES.labels(*labels).set(lease.expires_at.timestamp())
        self._shown = set(wanted)

    def clear(self) -> None:
        self.show(())
