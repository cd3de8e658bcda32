from __future__ import annotations

from datetime import timedelta

from flexinfer_common.settings import CommonSettings, Duration


class SchedulerSettings(CommonSettings):
    command_retry: Duration = timedelta(seconds=10)
    # A model that crashed after it was Ready is restarted at most once per this (counted from its last activate).
    restart_backoff: Duration = timedelta(seconds=10)
    leader_lock_id: int = 0x466C6578  # "Flex"
    prune_after: Duration = timedelta(hours=1)
    # How long a swap waits for the outgoing model's requests in flight before parking it (a v1alpha1 GPUGroup's
    # drainTimeoutSeconds wins for its group).
    drain_timeout: Duration = timedelta(seconds=60)
    # The quiet yield (off when unset): a model that holds the GPU and has had no request for this long (none in
    # flight or queued) is parked as for its idle timeout when requests wait for a model of another priority, so a
    # lower-priority model may use a GPU its betters leave unused. Unset keeps the seed's rule: lower priority never
    # takes the GPU from a higher-priority model that is still loaded, however idle.
    quiet_yield: Duration | None = None
