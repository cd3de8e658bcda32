"""Stopping a background task ends it even when a cancellation is lost (as ``asyncio.wait_for`` loses one on
Python 3.11 when the awaited result arrives in the same turn of the loop)."""

from __future__ import annotations

import asyncio

from flexinfer_common.tasks import Background, cancel_and_wait


async def test_a_task_that_loses_its_first_cancellation_is_cancelled_again_and_stopped() -> None:
    cancellations = 0

    async def publisher_loop() -> None:
        nonlocal cancellations
        while True:
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                cancellations += 1
                if cancellations == 1:
                    continue  # the lost cancellation: the loop goes on, as after a swallowed one
                raise

    worker = Background("publisher", publisher_loop)
    worker.start()
    await asyncio.sleep(0)
    await asyncio.wait_for(worker.stop(), timeout=5)
    assert cancellations == 2
    assert not worker.running


async def test_cancel_and_wait_ends_every_task_and_keeps_their_errors_to_itself() -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    async def sleeps() -> None:
        await asyncio.sleep(3600)

    tasks = [asyncio.create_task(fails()), asyncio.create_task(sleeps())]
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(tasks), timeout=5)
    assert all(task.done() for task in tasks)
    assert tasks[1].cancelled()
