"""One way for a test to wait for something it can observe but not be told of: poll it until it holds.

A sleep of a guessed length passes on a quiet machine and fails on a loaded one (or wastes time on both); this
returns as soon as the condition holds and, when it never does, fails with what was awaited and the last value.
(Where the thing awaited is a change of the emulated cluster, ``KubeCluster.wait_for`` re-checks on every write.)
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any


async def wait_for(
    check: Callable[[], Any | Awaitable[Any]], *, within: float = 20.0, what: str = "condition", interval: float = 0.05
) -> Any:
    """Call ``check`` (a function or a coroutine function) until it returns something truthy, and return that."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {within} s waiting for {what} (last value {value!r})")
        await asyncio.sleep(interval)
