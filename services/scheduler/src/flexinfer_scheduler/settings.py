from __future__ import annotations

from datetime import timedelta

from pydantic import model_validator

from flexinfer_common.enums import SchedulingPolicy
from flexinfer_common.settings import QUEUED_TTL_MARGIN, CommonSettings, Duration
from flexinfer_scheduler.domain.election import DRAIN_TIMEOUT


class SchedulerSettings(CommonSettings):
    command_retry: Duration = timedelta(seconds=10)
    """``FLEXINFER_COMMAND_RETRY``: a scale command the actuator has not confirmed is sent again after this."""
    # A model that crashed after it was Ready is restarted at most once per this (counted from its last activate).
    restart_backoff: Duration = timedelta(seconds=10)
    leader_lock_id: int = 0x466C6578  # "Flex"
    """``FLEXINFER_LEADER_LOCK_ID``: the PostgreSQL advisory lock the scheduler replicas take to lead."""
    prune_after: Duration = timedelta(hours=1)
    """``FLEXINFER_PRUNE_AFTER``: demand signals and processed-message records older than this are deleted."""
    # How long a swap waits for the outgoing model's requests in flight before parking it (a v1alpha1 GPUGroup's
    # drainTimeoutSeconds wins for its group).
    drain_timeout: Duration = DRAIN_TIMEOUT
    # FlexInfer's policy: a holder with nothing in flight or queued and no request for this long is quiet, and may
    # yield the GPU to a waiting model (when unset: 10 s, or the demand window if that is shorter). Not used by
    # FLEXINFER_SCHEDULING_POLICY=seed.
    quiet_yield: Duration | None = None
    # Where the status page's "release lease" goes (the lease manager's admin API); default
    # http://127.0.0.1:<FLEXINFER_LEASE_MANAGER_PORT>, as `flexinfer up` runs it.
    lease_manager_url: str | None = None

    def lease_manager_base_url(self) -> str:
        return (self.lease_manager_url or f"http://127.0.0.1:{self.lease_manager_port}").rstrip("/")

    # FLEXINFER_SCHEDULING_POLICY: the election of a v1alpha2 group without its own spec.scheduling.
    scheduling_policy: SchedulingPolicy = SchedulingPolicy.FLEXINFER

    @property
    def explicit_swap_cooldown(self) -> timedelta | None:
        """FLEXINFER_DEFAULT_SWAP_COOLDOWN when the operator set it (FlexInfer's policy then holds a new holder for
        it, as the seed does), else None (the policy follows the holder's measured load time)."""
        return self.default_swap_cooldown if "default_swap_cooldown" in self.model_fields_set else None

    @model_validator(mode="after")
    def _timings_that_work(self) -> SchedulerSettings:
        """Refuse the combinations that cannot work, naming the settings (all at once). (The TTLs themselves follow
        the proxies' intervals, so no window or interval can make waiting requests lapse.)"""
        problems = []
        if self.prune_after <= max(self.queued_ttl, self.in_flight_ttl):
            # pruning would delete the demand of requests that still wait between two of the proxy's renewals
            problems.append(
                f"FLEXINFER_PRUNE_AFTER ({self.prune_after}) must be longer than the queued-count TTL "
                f"(3 x FLEXINFER_DEMAND_REFRESH_INTERVAL + {QUEUED_TTL_MARGIN} = {self.queued_ttl}) and the "
                f"in-flight TTL (3 x FLEXINFER_ACTIVITY_REPORT_INTERVAL, at least 5s = {self.in_flight_ttl}): "
                "pruning would forget the demand of requests that still wait"
            )
        if problems:
            raise ValueError("; ".join(problems))
        return self
