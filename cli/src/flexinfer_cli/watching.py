"""``flexinfer get KIND --watch``: the list, then a line for every object that appears or changes, as ``kubectl get
-w`` prints them. The admin APIs have no watch stream, so the list is polled (``--watch-interval``); what changed is
decided by :func:`changes`, a pure function of the previous and the current poll.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class Snapshot(Generic[K, V]):
    """One poll: each object's identity and what is shown of it, in the API's order."""

    entries: tuple[tuple[K, V], ...]


def changes(previous: Snapshot[K, V] | None, current: Snapshot[K, V]) -> list[V]:
    """What to print for ``current``: everything on the first poll; then the objects that are new or whose shown
    value differs (a deleted object prints nothing: there is no row to show). Pure."""
    if previous is None:
        return [value for _, value in current.entries]
    before = dict(previous.entries)
    return [value for key, value in current.entries if key not in before or before[key] != value]


async def watch(
    poll: Callable[[], Awaitable[Snapshot[K, V]]],
    show: Callable[[Sequence[V], bool], None],
    *,
    interval: float,
    stop: asyncio.Event,
    sleep: Callable[[float], Awaitable[None]] | None = None,
) -> None:
    """Poll until ``stop`` is set; ``show(values, first)`` prints what changed (``first``: the initial list). The
    wait between polls (``sleep``; by default ``interval`` seconds) ends as soon as ``stop`` is set."""
    pause = sleep or (lambda seconds: _until_stopped(stop, seconds))
    previous: Snapshot[K, V] | None = None
    while not stop.is_set():
        current = await poll()
        changed = changes(previous, current)
        if changed or previous is None:
            show(changed, previous is None)
        previous = current
        await pause(interval)


async def _until_stopped(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def watch_until_interrupted(
    poll: Callable[[], Awaitable[Snapshot[K, V]]], show: Callable[[Sequence[V], bool], None], *, interval: float
) -> None:
    """``watch`` until Ctrl-C. The first SIGINT sets the stop (the poll in progress is answered, the wait ends at
    once) rather than cancelling the task: a watch was once seen polling on after Ctrl-C, most likely a
    cancellation absorbed inside the HTTP client's request. A second Ctrl-C interrupts as it would without a
    watch (KeyboardInterrupt)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def interrupted() -> None:
        stop.set()
        loop.remove_signal_handler(signal.SIGINT)

    with contextlib.suppress(NotImplementedError):  # no signal handlers in this event loop: Ctrl-C cancels
        loop.add_signal_handler(signal.SIGINT, interrupted)
    try:
        await watch(poll, show, interval=interval, stop=stop)
    finally:
        with contextlib.suppress(NotImplementedError):
            loop.remove_signal_handler(signal.SIGINT)
