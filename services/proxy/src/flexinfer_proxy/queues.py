"""The per-model wait queues at run time: each waiting request holds a future that the route watcher resolves.

The FIFO itself and every decision live in ``domain`` (``WaitQueue``, ``queue_action``); this module adds the
asyncio glue (futures, the queue timeout), the queue metrics, and tells the demand signaller how many wait.

A waiter's life: ``join`` -> ``wait_turn`` (returns the Ready route, or raises ProxyError: timeout, model failed,
model removed, demand could not be signalled, shutting down) -> forward -> ``leave``. ``leave`` is idempotent and
must run in ``finally``: a client that disconnects cancels its handler, and leaving at once is what takes it out of
the queue and out of the demand.
Leaving also releases the next waiter when the model is Ready, which is how a drain keeps arrival order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Route
from flexinfer_proxy.adapters.demand_publisher import DemandSignaller
from flexinfer_proxy.domain.admission import (
    QueueAction,
    TimeoutAnswer,
    fails_waiter,
    failure_mark,
    queue_action,
    timeout_answer,
)
from flexinfer_proxy.domain.errors import (
    ProxyError,
    demand_unavailable,
    model_failed,
    model_removed,
    queue_timeout,
)
from flexinfer_proxy.domain.fifo import Waiter, WaitQueue
from flexinfer_proxy.metrics import PROXY_QUEUE_DEPTH, PROXY_QUEUE_WAIT

Slot = Waiter["asyncio.Future[Route]"]


@dataclass(frozen=True, slots=True)
class QueueInfo:
    key: ModelKey
    queued: int
    oldest_wait_seconds: float


class ModelQueues:
    def __init__(
        self,
        *,
        routes: Callable[[ModelKey], Route | None],
        demand: DemandSignaller,
        queue_timeout: float,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._route_of = routes
        self._demand = demand
        self._timeout = queue_timeout
        self._monotonic = monotonic
        self._queues: dict[ModelKey, WaitQueue[asyncio.Future[Route]]] = {}
        self._timers: dict[ModelKey, asyncio.TimerHandle] = {}
        #: Bytes held by all waiting requests (their bodies), for the proxy's queued-bytes limit.
        self.held_bytes = 0
        self._depth_shown: set[ModelKey] = set()  # models with a flexinfer_proxy_queue_depth series

    def length(self, key: ModelKey) -> int:
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    def total(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def join(self, key: ModelKey, *, held: int = 0) -> Slot:
        """A new waiter for ``key``; ``held``: the bytes it keeps in memory while it waits (its body)."""
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = WaitQueue()
        loop = asyncio.get_running_loop()
        waiter = queue.join(
            loop.create_future(),
            now=self._monotonic(),
            seen_failure=failure_mark(self._route_of(key)),
            held=held,
        )
        self.held_bytes += held
        if key not in self._timers:
            self._arm(key, waiter.arrived_at)
        self._changed(key, len(queue), joined=True)
        # The route may be Ready already (a drain in progress): the head may go now.
        self._release_next(key, queue)
        return waiter

    @staticmethod
    def wait_turn(key: ModelKey, waiter: Slot) -> asyncio.Future[Route]:
        """Await this until the request may be forwarded: it gives the route to forward to, or raises ProxyError
        (timeout, model failed, model removed, demand could not be signalled, shutting down)."""
        return waiter.payload

    # Timeouts: one timer per model, not per waiter. All waiters have the same timeout and the FIFO is in arrival
    # order, so the earliest deadline is always the first waiter not yet answered; 10,000 waiting requests cost
    # one timer instead of 10,000 (see bench/proxy_queue_memory.py).

    def _arm(self, key: ModelKey, arrived_at: float) -> None:
        delay = max(0.0, arrived_at + self._timeout - self._monotonic())
        self._timers[key] = asyncio.get_running_loop().call_later(delay, self._expire, key)

    def _expire(self, key: ModelKey) -> None:
        self._timers.pop(key, None)
        queue = self._queues.get(key)
        if queue is None:
            return
        now = self._monotonic()
        for waiter in queue.in_order():
            if waiter.payload.done():
                continue  # answered, about to leave
            if waiter.waited(now) < self._timeout:
                self._arm(key, waiter.arrived_at)
                return
            waiter.payload.set_exception(self._timeout_error(key, waiter))

    def _disarm(self, key: ModelKey) -> None:
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def _timeout_error(self, key: ModelKey, waiter: Slot) -> ProxyError:
        route = self._route_of(key)
        answer = timeout_answer(route=route, demand_signalled=self._demand.signalled_since(key, waiter.arrived_at))
        if answer is TimeoutAnswer.DEMAND_UNAVAILABLE:
            return demand_unavailable(str(key), self._timeout, self._demand.last_error or "not connected")
        if answer is TimeoutAnswer.MODEL_FAILED:
            assert route is not None and route.failure is not None
            return model_failed(str(key), route.failure)
        return queue_timeout(str(key), self._timeout)

    def leave(self, key: ModelKey, waiter: Slot) -> None:
        """Take a waiter out of its queue (idempotent); release the next one if the model is Ready."""
        queue = self._queues.get(key)
        if queue is None or not queue.leave(waiter):
            return
        self.held_bytes -= waiter.held
        PROXY_QUEUE_WAIT.observe(waiter.waited(self._monotonic()))
        if not waiter.payload.done():
            waiter.payload.cancel()
        elif not waiter.payload.cancelled():
            waiter.payload.exception()  # answered already (e.g. timed out as the client left): mark it seen
        if not queue:
            del self._queues[key]
            self._disarm(key)
        self._changed(key, len(queue), joined=False)
        if queue:
            self._release_next(key, queue)

    def route_changed(self, key: ModelKey) -> None:
        """Apply a route change to the model's waiters: release the head, fail them, or keep waiting.

        A failure fails the waiters that had not seen it announced yet (``fails_waiter``); a route without failure
        makes every waiter forget the one it saw, so the next failure (of the retry) answers them too.
        """
        queue = self._queues.get(key)
        if queue is None:
            if self._route_of(key) is None:
                self._forget_depth(key)
            return
        route = self._route_of(key)
        action = queue_action(route)
        if action is QueueAction.RELEASE:
            self._release_next(key, queue)
        elif action is QueueAction.FAIL:
            assert route is not None and route.failure is not None
            error = model_failed(str(key), route.failure)
            self._fail(key, error, [w for w in queue if fails_waiter(seen=w.seen_failure, route=route)])
        elif action is QueueAction.REMOVED:
            self._fail(key, model_removed(str(key)))
            self._forget_depth(key)
        else:
            for waiter in queue:
                waiter.seen_failure = None

    def routes_changed(self) -> None:
        """Re-check every queue (after the route snapshot was replaced)."""
        for key in [*self._queues, *(self._depth_shown - self._queues.keys())]:
            self.route_changed(key)

    def fail_all(self, error: ProxyError) -> None:
        for key in list(self._queues):
            self._fail(key, error)

    def snapshot(self) -> list[QueueInfo]:
        now = self._monotonic()
        return [
            QueueInfo(key, len(queue), queue.oldest_wait(now)) for key, queue in sorted(self._queues.items()) if queue
        ]

    def _release_next(self, key: ModelKey, queue: WaitQueue[asyncio.Future[Route]]) -> None:
        route = self._route_of(key)
        if route is None or not route.ready:
            return
        waiter = queue.next_release()
        # A waiter whose client just left (future cancelled) is skipped: its own leave() releases the next one.
        if waiter is not None and not waiter.payload.done():
            waiter.payload.set_result(route)

    def _fail(self, key: ModelKey, error: ProxyError, waiters: list[Slot] | None = None) -> None:
        """Answer ``waiters`` (default: all of the model's) with ``error``."""
        queue = self._queues.get(key)
        if queue is None:
            return
        if waiters is None:
            waiters = queue.take_all()
        elif not waiters:
            return
        else:
            queue.take(waiters)
        if not queue:
            del self._queues[key]
            self._disarm(key)
        now = self._monotonic()
        for waiter in waiters:
            self.held_bytes -= waiter.held
            PROXY_QUEUE_WAIT.observe(waiter.waited(now))
            if not waiter.payload.done():
                waiter.payload.set_exception(error)
        self._changed(key, len(queue), joined=False)

    def _forget_depth(self, key: ModelKey) -> None:
        """The model is gone: its queue-depth series goes too (a dashboard shows no deleted model)."""
        if key in self._depth_shown:
            self._depth_shown.discard(key)
            PROXY_QUEUE_DEPTH.remove(key.namespace, key.name)

    def _changed(self, key: ModelKey, queued: int, *, joined: bool) -> None:
        PROXY_QUEUE_DEPTH.labels(namespace=key.namespace, model=key.name).set(queued)
        self._depth_shown.add(key)
        self._demand.queue_changed(key, queued, joined=joined)
