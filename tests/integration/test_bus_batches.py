"""``Bus.publish_many`` on a real NATS: many messages that only observers read go in atomic batches (NATS 2.12 and
later), one ack a batch; a few go alone (a batch's commit costs the server milliseconds); a refused batch is sent
again message by message; a server without batches gets every message alone."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from flexinfer_common import subjects
from flexinfer_common.bus import ATOMIC_BATCH, ATOMIC_MIN, Bus

pytestmark = pytest.mark.integration

STATUS = subjects.MODEL_STATUS_STREAM


def batches_supported(bus: Bus) -> bool:
    version = bus.nc.connected_server_version
    return (version.major, version.minor) >= (2, 12)


def status(i: int, size: int = 20) -> tuple[str, bytes, None]:
    return subjects.model_status_subject("default", f"m{i}"), b'{"n":%d,"pad":"%s"}' % (i, b"x" * size), None


async def stored_headers(bus: Bus, i: int) -> dict[str, str]:
    msg = await bus.js.get_last_msg(STATUS, subjects.model_status_subject("default", f"m{i}"))
    return dict(msg.headers or {})


async def test_many_statuses_are_stored_in_batches_of_at_most_a_thousand_with_commands_between(bus: Bus) -> None:
    count = 2 * ATOMIC_BATCH + 500
    items: list[tuple[str, bytes, str | None]] = list(map(status, range(count)))
    # commands carry a message id (a publish that may be retried): each goes alone, in the middle of the batches
    items[10:10] = [(f"{subjects.COMMAND_PREFIX}.default.c{i}", b"{}", f"test:c{i}") for i in range(3)]
    assert await bus.publish_many(items) == [True] * len(items)

    info = await bus.js.stream_info(STATUS)
    assert info.state.messages == count
    assert (await bus.js.stream_info(subjects.COMMAND_STREAM)).state.messages == 3
    first, last_of_first, second, last = [await stored_headers(bus, i) for i in (0, 999, 1000, count - 1)]
    if batches_supported(bus):
        assert info.config.allow_atomic
        assert first["Nats-Batch-Id"] == last_of_first["Nats-Batch-Id"] != second["Nats-Batch-Id"]
        assert last_of_first["Nats-Batch-Commit"] == "1" and "Nats-Batch-Commit" not in first
        assert last["Nats-Batch-Sequence"] == "500"
    else:  # (an older server: nothing was sent that it does not know)
        assert not info.config.allow_atomic and "Nats-Batch-Id" not in first


async def test_a_few_messages_go_alone_for_a_quick_answer(bus: Bus) -> None:
    """An event's pass publishes a handful: each gets its own ack at once, no batch commit to wait for."""
    assert await bus.publish_many([status(i) for i in range(10)]) == [True] * 10
    assert "Nats-Batch-Id" not in await stored_headers(bus, 9)


async def test_a_batch_with_one_message_the_stream_refuses_costs_only_that_message(bus: Bus) -> None:
    config = (await bus.js.stream_info(STATUS)).config
    await bus.js.update_stream(dataclasses.replace(config, max_msg_size=1024))
    items = [status(i, size=4096 if i == 3 else 20) for i in range(ATOMIC_MIN)]
    assert await bus.publish_many(items) == [i != 3 for i in range(ATOMIC_MIN)]
    assert (await bus.js.stream_info(STATUS)).state.messages == ATOMIC_MIN - 1

    assert await bus.publish_many([status(i) for i in range(ATOMIC_MIN)]) == [True] * ATOMIC_MIN
    if batches_supported(bus):  # still in batches: the stream takes them, one message did not fit
        assert "Nats-Batch-Id" in await stored_headers(bus, ATOMIC_MIN - 1)


async def test_a_stream_that_stops_taking_batches_gets_each_message_alone(
    bus: Bus, caplog: pytest.LogCaptureFixture
) -> None:
    """Reconfigured behind the scheduler's back (or by an older version of another service): the batch is refused,
    sent again message by message, and later calls do not try batches on that stream."""
    config = (await bus.js.stream_info(STATUS)).config
    await bus.js.update_stream(dataclasses.replace(config, allow_atomic=False))
    with caplog.at_level(logging.WARNING):
        assert await bus.publish_many([status(i) for i in range(ATOMIC_MIN)]) == [True] * ATOMIC_MIN
        assert await bus.publish_many([status(i) for i in range(ATOMIC_MIN)]) == [True] * ATOMIC_MIN
    assert (await bus.js.stream_info(STATUS)).state.messages == ATOMIC_MIN
    assert "Nats-Batch-Id" not in await stored_headers(bus, ATOMIC_MIN - 1)
    refusals = [r for r in caplog.records if "refuses atomic batches" in r.getMessage()]
    assert len(refusals) == (1 if batches_supported(bus) else 0)


async def test_routes_are_put_in_batches_and_read_back_from_the_bucket(bus: Bus) -> None:
    kv = await bus.routes()
    prefix = f"$KV.{subjects.ROUTES_BUCKET}."
    count = ATOMIC_MIN + 100
    items = [(prefix + subjects.route_key("default", f"m{i}"), b'{"i":%d}' % i, None) for i in range(count)]
    assert await bus.publish_many(items) == [True] * count  # type: ignore[arg-type]
    entry = await kv.get(subjects.route_key("default", f"m{count - 1}"))
    assert entry.value == b'{"i":%d}' % (count - 1)
    stream = f"KV_{subjects.ROUTES_BUCKET}"
    stored = await bus.js.get_last_msg(stream, prefix + subjects.route_key("default", f"m{count - 1}"))
    assert ("Nats-Batch-Id" in (stored.headers or {})) == batches_supported(bus)
    info = await bus.js.stream_info(stream)
    assert bool(info.config.allow_atomic) == batches_supported(bus)
    assert info.state.messages == count
