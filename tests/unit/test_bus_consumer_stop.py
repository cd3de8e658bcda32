"""A consumer stops when asked, even when the NATS client takes the cancellation for an error of its own."""

from __future__ import annotations

import asyncio
from typing import Any

import nats.errors
import pytest

from flexinfer_common.bus import Consumer
from flexinfer_common.tasks import cancel_and_wait


class SwallowingSubscription:
    """A pull subscription whose fetch, cancelled, raises a connection error instead (as a client whose connection
    closes under it does) and fails at once from then on, or (``answers``) returns as if its reply had arrived in the
    same turn (``asyncio.wait_for`` on Python 3.11 then drops the cancellation)."""

    def __init__(self, *, answers: bool) -> None:
        self.answers = answers
        self.fetching = asyncio.Event()
        self.fetches = 0
        self.closed = False

    async def fetch(self, batch: int, timeout: float) -> list[Any]:  # noqa: ASYNC109  (nats-py's signature)
        self.fetches += 1
        if self.closed:
            raise nats.errors.ConnectionClosedError
        self.fetching.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if self.answers:
                return []
            self.closed = True
            raise nats.errors.ConnectionClosedError from None
        return []

    async def unsubscribe(self) -> None:
        return None


@pytest.mark.parametrize("answers", [False, True], ids=["connection-error", "reply-in-the-same-turn"])
@pytest.mark.parametrize("durable", ["scheduler-demand", None], ids=["durable", "ephemeral"])
async def test_a_consumer_whose_fetch_swallows_the_cancel_still_stops(
    durable: str | None, answers: bool, caplog: pytest.LogCaptureFixture
) -> None:
    sub = SwallowingSubscription(answers=answers)

    async def handler(_message: object) -> None:
        return None

    consumer: Consumer[object] = Consumer(
        None,  # type: ignore[arg-type]  (the bus is only asked for a new subscription, patched below)
        stream="FLEXINFER",
        durable=durable,
        filter_subject="flexinfer.demand.>",
        decode=lambda data: data,
        handler=handler,
    )

    async def subscribe() -> SwallowingSubscription:
        return sub

    consumer._subscribe = subscribe  # type: ignore[method-assign,assignment]
    await consumer.start()
    await sub.fetching.wait()
    task = consumer._task
    assert task is not None
    try:
        async with asyncio.timeout(4):  # under the consumer's own 5 s bound on a stop
            await consumer.stop()
    finally:
        if not task.done():  # the regression: end the loop anyway, so the failure does not hang the session
            sub.closed, sub.answers = True, False
            await cancel_and_wait([task])
    assert task.done() and task.cancelled()
    assert "did not stop in time" not in caplog.text
    assert sub.fetches == 1, "no fetch after the stop"
