"""What to do with a request for a model, and with a model's waiting requests when its route changes. Pure."""

from __future__ import annotations

from enum import StrEnum

from flexinfer_common.messages import Route


class Admission(StrEnum):
    FORWARD = "forward"
    QUEUE = "queue"
    MODEL_FAILED = "model-failed"
    QUEUE_FULL = "queue-full"
    SHUTTING_DOWN = "shutting-down"


def admit(*, route: Route, queued: int, queue_max: int, shutting_down: bool) -> Admission:
    """Decide a new request's fate from its model's route and how many requests already wait for it.

    A Ready model with nobody waiting is forwarded at once. While earlier requests still wait (a drain in progress),
    a new one queues behind them, so requests reach the model in arrival order.
    """
    if route.ready:
        if queued == 0:
            return Admission.FORWARD
    elif route.failure:
        return Admission.MODEL_FAILED
    if shutting_down:
        return Admission.SHUTTING_DOWN
    if queued >= queue_max:
        return Admission.QUEUE_FULL
    return Admission.QUEUE


class QueueAction(StrEnum):
    RELEASE = "release"
    HOLD = "hold"
    FAIL = "fail"
    REMOVED = "removed"


def queue_action(route: Route | None) -> QueueAction:
    """What a model's waiting requests should do now that its route is ``route`` (None: the model is gone)."""
    if route is None:
        return QueueAction.REMOVED
    if route.ready:
        return QueueAction.RELEASE
    if route.failure:
        return QueueAction.FAIL
    return QueueAction.HOLD
