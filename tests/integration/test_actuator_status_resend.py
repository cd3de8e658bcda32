"""A runtime status the actuator observed while NATS was down reaches the scheduler's stream once NATS is back.

The scheduler re-issues a command only while no status answers it, so a Ready lost after the Loading that answered
its activate left the model Loading for the scheduler until the load timed out, its requests waiting (the chaos
suite saw 51-101 x 504 when NATS was killed just as a model became Ready). This test runs its own embedded NATS
(it stops and restarts it), never the shared one of the other tests.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flexinfer_actuator.domain.processes import Observation
from flexinfer_actuator.loop import StatusPublisher
from flexinfer_cli.embedded import EmbeddedNats
from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.clock import SystemClock
from flexinfer_common.enums import RuntimePhase
from flexinfer_common.messages import RuntimeStatus
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_a_status_observed_while_nats_was_down_is_in_the_stream_once_it_is_back(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    url = await asyncio.to_thread(server.start)
    bus = Bus(url, name="actuator")
    await bus.connect()
    await bus.ensure_streams()
    publisher = StatusPublisher(bus=bus, actuator="act", clock=SystemClock(), resend_interval=0.1)
    publisher.start()
    observer = Bus(url, name="observer")
    try:
        await publisher.report(Observation("default", "a", RuntimePhase.LOADING, generation=5))
        await asyncio.to_thread(server.stop)
        await wait_for(lambda: not bus.connected, what="the actuator's bus to notice NATS is gone")
        await publisher.report(Observation("default", "a", RuntimePhase.READY, 5, endpoint="http://127.0.0.1:9"))
        assert publisher.unsent == 1

        await asyncio.to_thread(server.start)
        await wait_for(lambda: publisher.unsent == 0, within=20, what="the kept Ready to be sent")
        await observer.connect()
        last = await observer.js.get_last_msg(
            subjects.RUNTIME_STATUS_STREAM, subjects.runtime_status_subject("default", "a")
        )
        status = RuntimeStatus.model_validate_json(last.data or b"")
        assert (status.phase, status.generation, status.endpoint) == (RuntimePhase.READY, 5, "http://127.0.0.1:9")
    finally:
        await publisher.stop()
        for each in (observer, bus):
            if each.connected:
                await each.close()
        await asyncio.to_thread(server.stop)
