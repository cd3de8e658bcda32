"""What to do with a request for a model, and with a model's waiting requests when its route changes. Pure.

A route that carries a ``failure`` does not turn new requests away: the scheduler retries a failed model only when
a request (its demand) names it again, so a new request queues and signals demand like for any parked model. Only
the requests that were waiting when a failure was announced are answered 503 with its reason; a request that joined
while that very failure was already on the route keeps waiting for the retry it asked for (``fails_waiter``).
"""

from __future__ import annotations

from enum import StrEnum

from flexinfer_common.messages import Route


class Admission(StrEnum):
    FORWARD = "forward"
    QUEUE = "queue"
    QUEUE_FULL = "queue-full"
    QUEUE_BYTES_FULL = "queue-bytes-full"
    SHUTTING_DOWN = "shutting-down"


def forward_now(route: Route, queued: int) -> bool:
    """The first rule of ``admit``, on its own for the forwarding path: a Ready model with nobody waiting."""
    return route.ready and queued == 0


class Refusal(StrEnum):
    """Why a request may not wait in its model's queue (the same values in ``Admission`` and ``ConnectFailure``)."""

    QUEUE_FULL = "queue-full"
    QUEUE_BYTES_FULL = "queue-bytes-full"
    SHUTTING_DOWN = "shutting-down"


def _queue_refusal(
    queued: int, queue_max: int, shutting_down: bool, held: int, queued_bytes: int, queued_bytes_max: int | None, /
) -> Refusal | None:
    """The rule for a request that would wait, new or back after a failed connect: refused while the proxy shuts
    down, when its model's queue is full, or when the bytes it holds (``held``, its body) would take the bytes held
    by all waiting requests (``queued_bytes``) past ``queued_bytes_max``. None: it may wait."""
    if shutting_down:
        return Refusal.SHUTTING_DOWN
    if queued >= queue_max:
        return Refusal.QUEUE_FULL
    if queued_bytes_max is not None and queued_bytes + held > queued_bytes_max:
        return Refusal.QUEUE_BYTES_FULL
    return None


def admit(
    *,
    route: Route,
    queued: int,
    queue_max: int,
    shutting_down: bool,
    held: int = 0,
    queued_bytes: int = 0,
    queued_bytes_max: int | None = None,
) -> Admission:
    """Decide a new request's fate from its model's route and how many requests already wait for it.

    A Ready model with nobody waiting is forwarded at once. While earlier requests still wait (a drain in progress),
    a new one queues behind them, so requests reach the model in arrival order. A failed model queues too (see the
    module docstring). A request that would wait may be refused (``_queue_refusal``).
    """
    if forward_now(route, queued):
        return Admission.FORWARD
    refusal = _queue_refusal(queued, queue_max, shutting_down, held, queued_bytes, queued_bytes_max)
    return Admission.QUEUE if refusal is None else Admission(refusal)


#: How many times one request may go back into its model's queue after connecting to the model failed.
MAX_REQUEUES = 2


class ConnectFailure(StrEnum):
    REQUEUE = "requeue"
    UNAVAILABLE = "unavailable"
    QUEUE_FULL = "queue-full"
    QUEUE_BYTES_FULL = "queue-bytes-full"
    SHUTTING_DOWN = "shutting-down"


def after_connect_failure(
    *,
    never_connected: bool,
    body_held: bool,
    requeues: int,
    queued: int,
    queue_max: int,
    shutting_down: bool,
    max_requeues: int = MAX_REQUEUES,
    held: int = 0,
    queued_bytes: int = 0,
    queued_bytes_max: int | None = None,
) -> ConnectFailure:
    """What to do with a request whose forward failed before any answer (the retries of ``retry_safe`` done).

    When connecting failed (refused, timed out), no byte of the request went out: sending it again later is always
    safe, so a request whose body the proxy holds waits in its model's queue (as for a model that is not Ready)
    instead of hearing 502, at most ``max_requeues`` times. A connection that broke after the request went out, or a
    streamed upload (it cannot be replayed), is 502 ``upstream_unavailable`` as before.
    """
    if not never_connected or not body_held or requeues >= max_requeues:
        return ConnectFailure.UNAVAILABLE
    refusal = _queue_refusal(queued, queue_max, shutting_down, held, queued_bytes, queued_bytes_max)
    return ConnectFailure.REQUEUE if refusal is None else ConnectFailure(refusal)


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


#: A failure as announced on a route: its reason and the command generation it answers.
FailureMark = tuple[str, int]


def failure_mark(route: Route | None) -> FailureMark | None:
    """The failure a route announces (None when it announces none)."""
    if route is None or route.ready or not route.failure:
        return None
    return (route.failure, route.generation)


def fails_waiter(*, seen: FailureMark | None, route: Route) -> bool:
    """Whether a failed route answers a waiter 503: yes, unless the waiter joined while this same failure was
    already announced (then its own demand is what makes the scheduler retry; it waits for that retry)."""
    return failure_mark(route) != seen


class TimeoutAnswer(StrEnum):
    DEMAND_UNAVAILABLE = "demand-unavailable"
    MODEL_FAILED = "model-failed"
    QUEUE_TIMEOUT = "queue-timeout"


def timeout_answer(*, route: Route | None, demand_signalled: bool) -> TimeoutAnswer:
    """How to answer a request whose queue timeout ran out.

    - Its demand never reached the bus (NATS down all along): 503 naming that, since nobody was asked to load it.
    - The route still carries a failure (nobody retried): 503 naming the failure.
    - Otherwise the model simply did not become Ready in time: 504.
    """
    if not demand_signalled:
        return TimeoutAnswer.DEMAND_UNAVAILABLE
    if failure_mark(route) is not None:
        return TimeoutAnswer.MODEL_FAILED
    return TimeoutAnswer.QUEUE_TIMEOUT
