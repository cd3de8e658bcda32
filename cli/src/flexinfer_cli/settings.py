"""The settings of ``flexinfer up`` itself (on top of the ones every service reads), validated before anything
starts: a bad value stops ``up`` with a message naming the variable."""

from __future__ import annotations

from datetime import timedelta

from pydantic import Field, model_validator

from flexinfer_common.settings import CommonSettings, Duration


class UpSettings(CommonSettings):
    liveness_period: Duration = timedelta(seconds=5)
    """``FLEXINFER_LIVENESS_PERIOD``: how often ``up`` probes each service's ``GET /healthz``."""
    liveness_timeout: Duration = timedelta(seconds=2)
    """``FLEXINFER_LIVENESS_TIMEOUT``: how long one probe may take before it counts as failed."""
    liveness_failure_threshold: int = Field(3, ge=1, le=1000)
    """``FLEXINFER_LIVENESS_FAILURE_THRESHOLD``: failed probes in a row after which the service is killed and
    restarted."""
    liveness_initial_delay: Duration = timedelta(seconds=30)
    """``FLEXINFER_LIVENESS_INITIAL_DELAY``: after a (re)start, failures count only once the service has answered
    or this long has passed."""

    @model_validator(mode="after")
    def _liveness_timings(self) -> UpSettings:
        period, timeout = self.liveness_period, self.liveness_timeout
        if period <= timedelta(0) or timeout <= timedelta(0) or timeout > period:
            raise ValueError(
                "liveness probing needs 0 < FLEXINFER_LIVENESS_TIMEOUT <= FLEXINFER_LIVENESS_PERIOD "
                f"(got {timeout} and {period})"
            )
        if self.liveness_initial_delay < timedelta(0):
            raise ValueError("FLEXINFER_LIVENESS_INITIAL_DELAY must not be negative")
        return self
