"""When the proxy tells the scheduler that a model is wanted. Pure functions of the last report and ``now``.

- A request queued since the last report: report at once (with the current queue length).
- Requests still wait: report again every refresh interval, so the demand never expires while they wait.
- The queue emptied (drained, timed out, or its clients left): one final report with ``queued=0``.
- A report that failed (bus down) is retried on the refresh tick, never in a tight loop (a final ``queued=0``
  too: else the scheduler would go on counting requests that are long gone).
- Forwarding to a Ready model reports activity (``queued=0``) at most once per activity interval.

Times are monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DemandReport:
    """The last demand message the proxy tried to publish for one model."""

    queued: int
    joins: int  # how many requests had joined the model's queue (ever) when this report was made
    at: float
    delivered: bool


def demand_due(*, queued: int, joins: int, last: DemandReport | None, now: float, refresh_interval: float) -> bool:
    """Whether to publish a demand report for one model now."""
    if last is None:
        return queued > 0
    if not last.delivered:  # the bus did not hear the last one (whatever it said): retry on the tick
        return now - last.at >= refresh_interval
    if queued == 0:
        return last.queued > 0
    if joins > last.joins:
        return True
    return now - last.at >= refresh_interval


def demand_check_in(*, queued: int, last: DemandReport | None, now: float, refresh_interval: float) -> float | None:
    """Seconds until ``demand_due`` may turn true with no new event; None when only an event can make it due."""
    if last is None:
        return None
    if not last.delivered or queued > 0:
        return max(0.0, last.at + refresh_interval - now)
    return None


def demand_settled(*, queued: int, last: DemandReport | None) -> bool:
    """True when nothing is waiting and the bus has heard so: the model's demand state can be forgotten."""
    if queued > 0:
        return False
    return last is None or (last.delivered and last.queued == 0)


def activity_due(*, last_at: float | None, now: float, interval: float) -> bool:
    """Whether forwarding a request to a Ready model should report activity now."""
    return last_at is None or now - last_at >= interval
