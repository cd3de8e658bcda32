"""Publishing ``Demand`` for the models requests wait for, and activity for the models requests reach.

The queue tells this signaller how many requests wait per model (``queue_changed``); one background loop turns that
into messages with the pure rules of ``domain.demand``: at once when a request joins, every refresh interval while
requests wait, a final ``queued=0`` when the queue empties. Forwarding calls ``activity``, which publishes
``queued=0`` at most once per interval per model, in the background: the request never waits for the bus.
If the bus is down, reports fail quietly (one warning per outage) and queued demand is retried on the refresh tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from pydantic import BaseModel

from flexinfer_common import subjects
from flexinfer_common.clock import Clock, SystemClock
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import Demand
from flexinfer_proxy.domain.demand import (
    DemandReport,
    activity_due,
    demand_check_in,
    demand_due,
    demand_settled,
)
from flexinfer_proxy.domain.routes import ModelKey

log = get_logger("flexinfer.proxy.demand")


class DemandPublisher(Protocol):
    """What the signaller needs from the bus (``flexinfer_common.bus.Bus`` fits)."""

    @property
    def connected(self) -> bool: ...

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None: ...


@dataclass(slots=True)
class _ModelDemand:
    queued: int = 0
    joins: int = 0
    last: DemandReport | None = None


class DemandSignaller:
    def __init__(
        self,
        publisher: DemandPublisher,
        *,
        source: str,
        refresh_interval: float,
        activity_interval: float,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        publish_timeout: float = 5.0,
    ) -> None:
        self._publisher = publisher
        self.source = source
        self._refresh = refresh_interval
        self._activity_interval = activity_interval
        self._clock = clock or SystemClock()
        self._monotonic = monotonic
        self._publish_timeout = publish_timeout
        self._models: dict[ModelKey, _ModelDemand] = {}
        self._last_activity: dict[ModelKey, float] = {}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()
        self._ids = itertools.count(1)
        self._failing = False

    # --- called by the queue and the forwarding path (synchronous, never blocks) ---

    def queue_changed(self, key: ModelKey, queued: int, *, joined: bool) -> None:
        """A request joined (``joined``) or left a model's queue, which now holds ``queued``."""
        state = self._models.get(key)
        if state is None:
            state = self._models[key] = _ModelDemand()
        state.queued = queued
        if joined:
            state.joins += 1
        self._wake.set()

    def activity(self, key: ModelKey) -> None:
        """A request is being forwarded to ``key``: report activity if none was reported lately."""
        now = self._monotonic()
        if not activity_due(last_at=self._last_activity.get(key), now=now, interval=self._activity_interval):
            return
        self._last_activity[key] = now
        if not self._publisher.connected:
            return
        task = asyncio.create_task(self._report_activity(key), name=f"activity:{key}")
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # --- lifecycle ---

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="demand-signaller")

    async def flush(self, *, within: float) -> None:
        """Wait (at most ``within`` seconds) until the bus heard about every emptied queue, e.g. before shutdown."""
        deadline = self._monotonic() + within
        while self._models and self._monotonic() < deadline:
            self._wake.set()
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._background) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._task = None

    async def _report_activity(self, key: ModelKey) -> None:
        await self._publish(key, 0)

    # --- the loop ---

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            await self._report_due()
            delay = self._next_check()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=delay)

    async def _report_due(self) -> None:
        now = self._monotonic()
        due = [
            (key, state.queued, state.joins)
            for key, state in self._models.items()
            if demand_due(
                queued=state.queued, joins=state.joins, last=state.last, now=now, refresh_interval=self._refresh
            )
        ]
        if due:
            results = await asyncio.gather(*(self._publish(key, queued) for key, queued, _ in due))
            for (key, queued, joins), delivered in zip(due, results, strict=True):
                state = self._models.get(key)
                if state is not None:
                    state.last = DemandReport(queued=queued, joins=joins, at=now, delivered=delivered)
        for key in [k for k, s in self._models.items() if demand_settled(queued=s.queued, last=s.last)]:
            del self._models[key]

    def _next_check(self) -> float | None:
        now = self._monotonic()
        delays = [
            d
            for s in self._models.values()
            if (d := demand_check_in(queued=s.queued, last=s.last, now=now, refresh_interval=self._refresh)) is not None
        ]
        return max(min(delays), 0.01) if delays else None

    async def _publish(self, key: ModelKey, queued: int) -> bool:
        message = Demand(
            model=key.name, namespace=key.namespace, queued=queued, source=self.source, time=self._clock.now()
        )
        try:
            await asyncio.wait_for(
                self._publisher.publish(
                    subjects.demand_subject(key.namespace, key.name),
                    message,
                    msg_id=f"{self.source}-{next(self._ids)}",
                ),
                timeout=self._publish_timeout,
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not self._failing:
                self._failing = True
                log.warning(
                    "cannot publish demand; waiting requests keep waiting and demand is retried",
                    extra={"model": str(key), "error": repr(exc)},
                )
            return False
        if self._failing:
            self._failing = False
            log.info("demand publishing works again", extra={"model": str(key)})
        log.debug("demand published", extra={"model": str(key), "queued": queued})
        return True
