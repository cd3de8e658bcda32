"""Background tasks a component starts once and stops on the way out: cancelled, then awaited.

Stopping cancels again until the task has ended. On Python 3.11 a cancellation can be lost: ``asyncio.wait_for``
(which nats-py awaits its replies with) swallows it when the awaited result arrives in the same turn of the loop, and
a loop that then goes on (``while True: ... publish ...``) would keep ``await task`` waiting for ever — a shutdown
that never ends.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

#: How long one cancellation is given before the task is cancelled again.
RECANCEL_AFTER = 0.5


async def cancel_and_wait(tasks: list[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until every one has ended, cancelling again any that goes on; their results and
    exceptions are dropped (a stopping component has no use for them)."""
    pending = {task for task in tasks if not task.done()}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=RECANCEL_AFTER)
    for task in tasks:
        if not task.cancelled():
            with contextlib.suppress(Exception):
                task.exception()  # retrieved, so asyncio does not log "exception was never retrieved"


class Background:
    """``start()`` runs ``work()`` as a task unless it runs already; ``stop()`` cancels it and waits for it."""

    def __init__(self, name: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        self.name = name
        self._work = work
        self._task: asyncio.Task[None] | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._work(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait([task])
