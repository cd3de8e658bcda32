"""Telling the scheduler how many requests this proxy is forwarding to each model (``InFlightReport``), so a swap's
drain knows when the outgoing model has finished what it was answering.

One accessor feeds it (``counts``: the forwarding path's per-model count of requests in flight). Batched like the
activity reports: at most one message per interval, sent when the counts changed and, while any is not zero, every
interval (a report the scheduler has not heard for a few intervals counts as gone, so a proxy that died does not
hold a drain up). A final empty report on stop. If the bus is down, reports are skipped (the drain then ends by its
timeout at worst).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping

from flexinfer_common import subjects
from flexinfer_common.clock import Clock, SystemClock
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import InFlightCount, InFlightReport, message_id
from flexinfer_common.tasks import Background
from flexinfer_proxy.ports import DemandPublisher

log = get_logger("flexinfer.proxy.in_flight")


class InFlightReporter:
    def __init__(
        self,
        publisher: DemandPublisher,
        *,
        source: str,
        interval: float,
        counts: Callable[[], Mapping[ModelKey, int]],
        clock: Clock | None = None,
    ) -> None:
        self._publisher = publisher
        self.source = source
        self._interval = interval
        self._counts = counts
        self._clock = clock or SystemClock()
        self._last: dict[ModelKey, int] = {}
        self._worker = Background("in-flight-reporter", self._run)

    async def start(self) -> None:
        self._worker.start()

    async def stop(self) -> None:
        await self._worker.stop()
        if self._last:
            await self._publish({})  # nothing is in flight any more: a drain need not wait for our counts to age

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            await self.report()

    async def report(self) -> None:
        """One tick: publish the counts if they changed, or while any is not zero."""
        counts = {key: n for key, n in self._counts().items() if n > 0}
        if counts or counts != self._last:
            await self._publish(counts)

    async def _publish(self, counts: dict[ModelKey, int]) -> None:
        if not self._publisher.connected:
            return
        report = InFlightReport(
            source=self.source,
            models=[InFlightCount(namespace=k.namespace, model=k.name, in_flight=n) for k, n in sorted(counts.items())],
            time=self._clock.now(),
        )
        try:
            async with asyncio.timeout(max(self._interval, 1.0)):
                await self._publisher.publish(
                    subjects.in_flight_subject(self.source), report, msg_id=message_id(self.source)
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.debug("in-flight report not published", extra={"error": repr(exc)})
            return
        self._last = counts
