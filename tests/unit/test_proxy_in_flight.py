"""The proxy's in-flight reports (what a swap's drain waits for), on a fast-forwarded event loop clock."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import BaseModel

from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import InFlightReport
from flexinfer_proxy.adapters.in_flight import InFlightReporter

A, B = ModelKey("default", "a"), ModelKey("ml", "b")

# A loop of their own: looptime fast-forwards only while no real I/O is pending, and the session loop of the
# integration tests may still hold sockets.
pytestmark = [pytest.mark.looptime, pytest.mark.asyncio(loop_scope="function")]


class Recorder:
    connected = True

    def __init__(self) -> None:
        self.reports: list[tuple[float, dict[str, int]]] = []

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None:
        assert isinstance(message, InFlightReport) and subject == "flexinfer.proxy.inflight.proxy-1"
        now = asyncio.get_running_loop().time()
        self.reports.append((now, {f"{c.namespace}/{c.model}": c.in_flight for c in message.models}))


async def test_reports_changes_and_a_heartbeat_while_requests_are_in_flight_then_one_empty_report() -> None:
    counts: dict[ModelKey, int] = {}
    bus = Recorder()
    reporter = InFlightReporter(bus, source="proxy-1", interval=1.0, counts=lambda: counts)
    start = asyncio.get_running_loop().time()
    await reporter.start()
    await asyncio.sleep(3.5)
    assert bus.reports == []  # nothing in flight, nothing said

    counts.update({A: 2, B: 1})
    await asyncio.sleep(2)  # reported once per interval while requests are in flight
    counts[B] = 0
    await asyncio.sleep(1)
    del counts[A]
    await asyncio.sleep(5)  # one empty report, then quiet again
    await reporter.stop()
    seen = [(round(t - start), r) for t, r in bus.reports]
    assert seen == [
        (4, {"default/a": 2, "ml/b": 1}),
        (5, {"default/a": 2, "ml/b": 1}),
        (6, {"default/a": 2}),
        (7, {}),
    ]


async def test_stopping_with_requests_in_flight_says_none_are_left() -> None:
    counts = {A: 1}
    bus = Recorder()
    reporter = InFlightReporter(bus, source="proxy-1", interval=1.0, counts=lambda: counts)
    await reporter.start()
    await asyncio.sleep(1.5)
    await reporter.stop()
    assert [r for _, r in bus.reports] == [{"default/a": 1}, {}]


async def test_a_bus_that_is_down_is_skipped_and_the_counts_go_out_once_it_is_back() -> None:
    counts = {A: 1}
    bus = Recorder()
    bus.connected = False
    reporter = InFlightReporter(bus, source="proxy-1", interval=1.0, counts=lambda: counts)
    await reporter.start()
    await asyncio.sleep(3.5)
    assert bus.reports == []
    bus.connected = True
    await asyncio.sleep(1)
    await reporter.stop()
    assert [r for _, r in bus.reports][:1] == [{"default/a": 1}]
