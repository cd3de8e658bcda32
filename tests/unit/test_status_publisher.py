"""The actuator's status publisher (``flexinfer_actuator.loop.StatusPublisher``): a runtime status that cannot be
published at once is retried (stamina: three attempts, with the same message id, so a publish that reached the
server before its ack was lost is not counted twice), a bus that is down is not waited on, and ``report`` never
raises."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel

from flexinfer_actuator.domain.processes import Observation
from flexinfer_actuator.loop import StatusPublisher
from flexinfer_common.clock import SystemClock
from flexinfer_common.enums import RuntimePhase

READY = Observation("default", "a", RuntimePhase.READY, generation=3, endpoint="http://127.0.0.1:9")


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
