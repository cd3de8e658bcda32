"""The lease manager's settings: the shared ones (docs/reference.md section 8), the Kubernetes ones, and its own."""

from __future__ import annotations

from datetime import timedelta

from pydantic import field_validator, model_validator

from flexinfer_common.manifests import MIN_LEASE_TTL_SECONDS
from flexinfer_common.settings import Duration, KubernetesSettings


class LeaseManagerSettings(KubernetesSettings):
    """``FLEXINFER_*`` settings of the lease manager.

    Used here: ``nats_url``, ``database_url``, ``admin_token``, ``bind_host``, ``lease_manager_port``,
    ``namespace`` (where a lease taken through the API gets its GPULease, unless the pod's own namespace is known),
    ``lease_refresh_interval`` (the reconcile: renewals of running Jobs' leases, expiry, metrics), ``instance_id``,
    ``log_level``; with ``FLEXINFER_ACTUATOR=kubernetes`` also ``kubeconfig``, ``kube_context``,
    ``watch_namespaces`` and the ``leader_*`` settings.
    """

    lease_default_ttl: Duration = timedelta(hours=1)
    """``FLEXINFER_LEASE_DEFAULT_TTL``: the TTL of a lease asked for without one (a Job's without
    ``activeDeadlineSeconds``, a GPULease's without ``spec.ttlSeconds``, a legacy ConfigMap's)."""
    leader_election_lease: str = "flexinfer-lease-manager"
    """``FLEXINFER_LEADER_ELECTION_LEASE``: the name of the coordination.k8s.io Lease the replicas share."""

    @field_validator("lease_default_ttl")
    @classmethod
    def _ttl_minimum(cls, value: timedelta) -> timedelta:
        if value < timedelta(seconds=MIN_LEASE_TTL_SECONDS):
            raise ValueError(f"must be at least {MIN_LEASE_TTL_SECONDS}s (a lease's minimum TTL)")
        return value

    @model_validator(mode="after")
    def _refresh_before_ttl(self) -> LeaseManagerSettings:
        if self.lease_refresh_interval >= timedelta(seconds=MIN_LEASE_TTL_SECONDS) or not self.lease_refresh_interval:
            raise ValueError(
                f"FLEXINFER_LEASE_REFRESH_INTERVAL must be above 0 and below {MIN_LEASE_TTL_SECONDS}s, the shortest "
                "lease TTL, or a running Job's lease could lapse between two renewals "
                f"(got {self.lease_refresh_interval})"
            )
        return self
