"""Publishing ``Demand`` for the models requests wait for, and activity for the models requests reach.

The queue tells this signaller how many requests wait per model (``queue_changed``); one background loop turns that
into messages with the pure rules of ``domain.demand_reports``: at once when a request joins, every refresh interval
while requests wait, a final ``queued=0`` when the queue empties. Forwarding calls ``activity``, which publishes the
model's current queue length at most once per interval per model, in the background: the request never waits for the
bus. If the bus is down, reports fail quietly (one warning per outage) and queued demand is retried on the refresh
tick; ``signalled_since`` tells the queue whether a waiter's demand ever got through (if not, its timeout answers
503 naming the bus error instead of 504).

The final ``queued=0`` report is dated like the model's previous report, not "now": the scheduler takes ``time`` as
the model's last activity, and a queue that emptied because its clients gave up is no new activity (so demand from
clients that left ends there instead of being extended by their leaving).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from flexinfer_common import subjects
from flexinfer_common.clock import Clock, SystemClock
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import Demand, message_id
from flexinfer_common.settings import renewed_count_ttl
from flexinfer_common.tasks import Background, cancel_and_wait
from flexinfer_proxy.domain.demand_reports import (
    DemandReport,
    activity_due,
    demand_check_in,
    demand_due,
    demand_settled,
)
from flexinfer_proxy.ports import DemandPublisher

log = get_logger("flexinfer.proxy.demand")


@dataclass(slots=True)
class _ModelDemand:
    queued: int = 0
    joins: int = 0
    last: DemandReport | None = None
    delivered_at: float | None = None  # monotonic start of the last report the bus acknowledged


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
        self._valid_for = renewed_count_ttl(timedelta(seconds=refresh_interval)).total_seconds()
        self._activity_interval = activity_interval
        self._clock = clock or SystemClock()
        self._monotonic = monotonic
        self._publish_timeout = publish_timeout
        self._models: dict[ModelKey, _ModelDemand] = {}
        self._last_activity: dict[ModelKey, float] = {}
        self._wake = asyncio.Event()
        self._worker = Background("demand-signaller", self._run)
        self._background: set[asyncio.Task[None]] = set()
        self._failing = False
        self._last_sent: dict[ModelKey, datetime] = {}  # the ``time`` of the last message about each model
        self.last_error: str | None = None

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

    def signalled_since(self, key: ModelKey, since: float) -> bool:
        """Whether a report about ``key`` reached the bus at or after monotonic time ``since``."""
        state = self._models.get(key)
        return state is not None and state.delivered_at is not None and state.delivered_at >= since

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
        self._worker.start()

    async def flush(self, *, within: float) -> None:
        """Wait (at most ``within`` seconds) until the bus heard about every emptied queue, e.g. before shutdown."""
        deadline = self._monotonic() + within
        while self._models and self._monotonic() < deadline:
            self._wake.set()
            await asyncio.sleep(0.02)

    async def stop(self) -> None:
        await self._worker.stop()
        await cancel_and_wait(list(self._background))

    async def _report_activity(self, key: ModelKey) -> None:
        state = self._models.get(key)
        await self._publish(key, state.queued if state is not None else 0)

    # --- the loop ---

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            await self._report_due()
            delay = self._next_check()
            # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel that races the wake-up
            # (then stop() would wait forever).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._wake.wait()

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
            results = await asyncio.gather(*(self._publish(key, queued, final=queued == 0) for key, queued, _ in due))
            for (key, queued, joins), delivered in zip(due, results, strict=True):
                state = self._models.get(key)
                if state is not None:
                    state.last = DemandReport(queued=queued, joins=joins, at=now, delivered=delivered)
                    if delivered:
                        state.delivered_at = now
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

    async def _publish(self, key: ModelKey, queued: int, *, final: bool = False) -> bool:
        now = self._clock.now()
        when = self._last_sent.get(key, now) if final else now
        self._last_sent[key] = when
        message = Demand(
            model=key.name,
            namespace=key.namespace,
            queued=queued,
            source=self.source,
            time=when,
            valid_for=self._valid_for,  # the scheduler keeps the count as long as this proxy's renewals need
        )
        try:
            async with asyncio.timeout(self._publish_timeout):
                await self._publisher.publish(
                    subjects.demand_subject(key.namespace, key.name),
                    message,
                    msg_id=message_id(self.source),
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.last_error = describe_error(exc)
            if not self._failing:
                self._failing = True
                log.warning(
                    "cannot publish demand; waiting requests keep waiting and demand is retried",
                    extra={"model": str(key), "error": repr(exc)},
                )
            return False
        self.last_error = None
        if self._failing:
            self._failing = False
            log.info("demand publishing works again", extra={"model": str(key)})
        log.debug("demand published", extra={"model": str(key), "queued": queued})
        return True


def describe_error(exc: BaseException) -> str:
    text = str(exc)
    return f"{exc.__class__.__name__}: {text}" if text else exc.__class__.__name__
