"""``Bus.publish_many`` with ``sole_writer`` on a real NATS: the scheduler's many statuses ask for two acks, and the
stream's sequence numbers in them prove that every message in between was stored; when they do not add up, every
one of those messages is sent again with its own ack, so a refused message costs only itself."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator

import nats
import pytest

from flexinfer_common import subjects
from flexinfer_common.bus import SEQUENCED_MIN, Bus

pytestmark = pytest.mark.integration

STATUS = subjects.MODEL_STATUS_STREAM
SOLE = (subjects.STATUS_PREFIX + ".",)


def status(i: int, size: int = 20) -> tuple[str, bytes, str | None]:
    return subjects.model_status_subject("default", f"m{i}"), b'{"n":%d,"pad":"%s"}' % (i, b"x" * size), None


@pytest.fixture
async def acks_seen(bus: Bus) -> AsyncIterator[list[bytes]]:
    """Every JetStream ack this test's bus gets (its replies come to inboxes; another connection listens)."""
    seen: list[bytes] = []
    spy = await nats.connect(bus.url)

    async def note(msg: nats.aio.msg.Msg) -> None:
        seen.append(msg.data)

    await spy.subscribe("_INBOX.>", cb=note)
    await spy.flush()
    yield seen
    await spy.close()


async def settled(seen: list[bytes]) -> list[bytes]:
    await asyncio.sleep(0.2)  # (the spy's copy of the last acks)
    return seen


async def test_many_statuses_ask_for_two_acks_and_are_all_stored(bus: Bus, acks_seen: list[bytes]) -> None:
    items = [status(i) for i in range(1000)]
    # commands between them carry a message id and go to another stream: each keeps its own ack
    items[500:500] = [(f"{subjects.COMMAND_PREFIX}.default.c{i}", b"{}", f"test:c{i}") for i in range(3)]
    assert await bus.publish_many(items, sole_writer=SOLE) == [True] * len(items)
    assert len(await settled(acks_seen)) == 2 + 3
    assert (await bus.js.stream_info(STATUS)).state.messages == 1000
    assert (await bus.js.stream_info(subjects.COMMAND_STREAM)).state.messages == 3


async def test_a_few_statuses_each_get_their_ack(bus: Bus, acks_seen: list[bytes]) -> None:
    count = SEQUENCED_MIN - 1
    assert await bus.publish_many([status(i) for i in range(count)], sole_writer=SOLE) == [True] * count
    assert len(await settled(acks_seen)) == count


async def test_without_sole_writer_every_message_gets_its_ack(bus: Bus, acks_seen: list[bytes]) -> None:
    assert await bus.publish_many([status(i) for i in range(300)]) == [True] * 300
    assert len(await settled(acks_seen)) == 300


async def test_a_refused_status_costs_only_itself_the_others_go_again_one_by_one(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    config = (await bus.js.stream_info(STATUS)).config
    await bus.js.update_stream(dataclasses.replace(config, max_msg_size=1024))
    items = [status(i, size=4096 if i == 150 else 20) for i in range(300)]
    with caplog.at_level(logging.WARNING):
        assert await bus.publish_many(items, sole_writer=SOLE) == [i != 150 for i in range(300)]
    assert (await bus.js.stream_info(STATUS)).state.messages == 299
    assert any("sequence does not add up" in r.getMessage() for r in caplog.records)
