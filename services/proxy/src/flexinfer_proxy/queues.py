"""The per-model wait queues at run time: each waiting request holds a future that the route watcher resolves.

The FIFO itself and every decision live in ``domain`` (``WaitQueue``, ``queue_action``); this module adds the
asyncio glue (futures, the queue timeout), the queue metrics, and tells the demand signaller how many wait.

A waiter's life: ``join`` -> ``wait_turn`` (returns the Ready route, or raises ProxyError: timeout, model failed,
model removed, shutting down) -> forward -> ``leave``. ``leave`` is idempotent and must run in ``finally``: a client
that disconnects cancels its handler, and leaving at once is what takes it out of the queue and out of the demand.
Leaving also releases the next waiter when the model is Ready, which is how a drain keeps arrival order.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

from flexinfer_common.messages import Route
from flexinfer_common.metrics import PROXY_QUEUE_DEPTH, PROXY_QUEUE_WAIT
from flexinfer_proxy.adapters.demand import DemandSignaller
from flexinfer_proxy.domain.admission import QueueAction, queue_action
from flexinfer_proxy.domain.errors import ProxyError, model_failed, model_removed, queue_timeout
from flexinfer_proxy.domain.queue import Waiter, WaitQueue
from flexinfer_proxy.domain.routes import ModelKey

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

    def length(self, key: ModelKey) -> int:
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    def total(self) -> int:
        return sum(len(q) for q in self._queues.values())

    def join(self, key: ModelKey) -> Slot:
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = WaitQueue()
        waiter = queue.join(asyncio.get_running_loop().create_future(), now=self._monotonic())
        self._changed(key, len(queue), joined=True)
        # The route may be Ready already (a drain in progress): the head may go now.
        self._release_next(key, queue)
        return waiter

    async def wait_turn(self, key: ModelKey, waiter: Slot) -> Route:
        """Wait until this request may be forwarded; return the route to forward to."""
        remaining = self._timeout - waiter.waited(self._monotonic())
        try:
            async with asyncio.timeout(max(remaining, 0.0)):
                return await waiter.payload
        except TimeoutError:
            raise queue_timeout(str(key), self._timeout) from None

    def leave(self, key: ModelKey, waiter: Slot) -> None:
        """Take a waiter out of its queue (idempotent); release the next one if the model is Ready."""
        queue = self._queues.get(key)
        if queue is None or not queue.leave(waiter):
            return
        PROXY_QUEUE_WAIT.observe(waiter.waited(self._monotonic()))
        if not waiter.payload.done():
            waiter.payload.cancel()
        if not queue:
            del self._queues[key]
        self._changed(key, len(queue), joined=False)
        if queue:
            self._release_next(key, queue)

    def route_changed(self, key: ModelKey) -> None:
        """Apply a route change to the model's waiters: release the head, fail them all, or keep waiting."""
        queue = self._queues.get(key)
        if queue is None:
            return
        route = self._route_of(key)
        action = queue_action(route)
        if action is QueueAction.RELEASE:
            self._release_next(key, queue)
        elif action is QueueAction.FAIL:
            assert route is not None and route.failure is not None
            self._fail(key, model_failed(str(key), route.failure))
        elif action is QueueAction.REMOVED:
            self._fail(key, model_removed(str(key)))

    def routes_changed(self) -> None:
        """Re-check every queue (after the route snapshot was replaced)."""
        for key in list(self._queues):
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

    def _fail(self, key: ModelKey, error: ProxyError) -> None:
        queue = self._queues.pop(key, None)
        if queue is None:
            return
        now = self._monotonic()
        for waiter in queue.take_all():
            PROXY_QUEUE_WAIT.observe(waiter.waited(now))
            if not waiter.payload.done():
                waiter.payload.set_exception(error)
        self._changed(key, 0, joined=False)

    def _changed(self, key: ModelKey, queued: int, *, joined: bool) -> None:
        PROXY_QUEUE_DEPTH.labels(namespace=key.namespace, model=key.name).set(queued)
        self._demand.queue_changed(key, queued, joined=joined)
