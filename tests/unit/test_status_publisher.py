"""The actuator's status publisher (``flexinfer_actuator.loop.StatusPublisher``): a runtime status that cannot be
published at once is retried (stamina: three attempts, with the same message id, so a publish that reached the
server before its ack was lost is not counted twice), a bus that is down is not waited on, ``report`` never
raises, and a status the bus did not take is sent again once it does, unless a newer one replaced it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel

from flexinfer_actuator.domain.processes import Observation
from flexinfer_actuator.loop import StatusPublisher
from flexinfer_common.clock import SystemClock
from flexinfer_common.enums import RuntimePhase
from flexinfer_common.messages import RuntimeStatus
from tests.support.waiting import wait_for

READY = Observation("default", "a", RuntimePhase.READY, generation=3, endpoint="http://127.0.0.1:9")
STOPPING = Observation("default", "a", RuntimePhase.STOPPING, generation=4)


@dataclass
class FlakyBus:
    failures: int = 0  # how many publishes fail before one succeeds
    connected: bool = True
    tried: list[str | None] = field(default_factory=list)  # the msg_id of every attempt
    published: list[BaseModel] = field(default_factory=list)

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None:
        self.tried.append(msg_id)
        if len(self.tried) <= self.failures:
            raise TimeoutError("nats: timeout")
        self.published.append(message)


async def test_a_failed_publish_is_retried_with_the_same_message_id() -> None:
    bus = FlakyBus(failures=2)
    await StatusPublisher(bus=bus, actuator="act", clock=SystemClock()).report(READY)
    assert len(bus.published) == 1 and len(bus.tried) == 3
    assert len(set(bus.tried)) == 1 and bus.tried[0]


async def test_a_publish_that_keeps_failing_is_logged_and_report_returns(caplog: pytest.LogCaptureFixture) -> None:
    bus = FlakyBus(failures=10)
    with caplog.at_level(logging.ERROR):
        await StatusPublisher(bus=bus, actuator="act", clock=SystemClock()).report(READY)
    assert len(bus.tried) == 3 and not bus.published
    assert any("could not publish runtime status" in r.getMessage() for r in caplog.records)


async def test_a_bus_that_is_down_is_not_waited_on() -> None:
    bus = FlakyBus(connected=False)
    publisher = StatusPublisher(bus=bus, actuator="act", clock=SystemClock())
    await publisher.report(READY)
    assert not bus.tried
    assert publisher.last("default", "a") is not None  # remembered: a repeated command is answered with it


@contextlib.asynccontextmanager
async def resending(bus: FlakyBus) -> AsyncIterator[StatusPublisher]:
    publisher = StatusPublisher(bus=bus, actuator="act", clock=SystemClock(), resend_interval=0.01)
    publisher.start()
    try:
        yield publisher
    finally:
        await publisher.stop()


def phases(bus: FlakyBus) -> list[tuple[RuntimePhase, int]]:
    return [(m.phase, m.generation) for m in bus.published if isinstance(m, RuntimeStatus)]


async def test_a_status_the_bus_did_not_take_is_sent_once_it_is_back() -> None:
    # the scheduler re-issues a command only while no status answers it: a Ready lost after its Loading would
    # leave the model Loading there until the load timed out
    bus = FlakyBus(connected=False)
    async with resending(bus) as publisher:
        await publisher.report(READY)
        assert publisher.unsent == 1 and not bus.published
        bus.connected = True
        await wait_for(lambda: bus.published, within=5, what="the kept status sent")
        assert publisher.unsent == 0
    assert phases(bus) == [(RuntimePhase.READY, 3)]


async def test_a_status_that_failed_every_attempt_is_sent_again_later() -> None:
    bus = FlakyBus(failures=3)  # the three attempts of the report fail; the next send succeeds
    async with resending(bus) as publisher:
        await publisher.report(READY)
        await wait_for(lambda: bus.published, within=5, what="the status sent again")
    assert phases(bus) == [(RuntimePhase.READY, 3)]
    assert len(set(bus.tried)) == 2  # a fresh message id for the new send: not de-duplicated away


async def test_only_the_newest_kept_status_is_sent() -> None:
    bus = FlakyBus(connected=False)
    async with resending(bus) as publisher:
        await publisher.report(READY)
        await publisher.report(STOPPING)
        assert publisher.unsent == 1
        bus.connected = True
        await wait_for(lambda: publisher.unsent == 0, within=5, what="the kept status sent")
    assert phases(bus) == [(RuntimePhase.STOPPING, 4)]


async def test_a_kept_status_is_dropped_once_a_newer_one_was_published() -> None:
    bus = FlakyBus(connected=False)
    publisher = StatusPublisher(bus=bus, actuator="act", clock=SystemClock(), resend_interval=0.01)
    await publisher.report(READY)
    bus.connected = True
    await publisher.report(STOPPING)
    assert publisher.unsent == 0  # nothing older than what the scheduler has is sent after it
    assert phases(bus) == [(RuntimePhase.STOPPING, 4)]
