"""A per-model FIFO of waiting requests. No I/O and no clock: arrival times are passed in.

Waiters are released one at a time: ``next_release`` hands out the head, and the next one becomes eligible only
once the head has left (its forward started, or it gave up). That keeps requests reaching the model in arrival order.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")


@dataclass(slots=True, eq=False)
class Waiter(Generic[T]):
    payload: T
    arrived_at: float
    released: bool = False
    #: A failure the model's route already announced when this waiter joined (see ``admission.fails_waiter``).
    seen_failure: tuple[str, int] | None = None
    #: Bytes the waiting request holds in memory (its body): they count towards the proxy's queued-bytes limit.
    held: int = 0

    def waited(self, now: float) -> float:
        return max(0.0, now - self.arrived_at)


class WaitQueue(Generic[T]):
    def __init__(self) -> None:
        # A dict keeps insertion (arrival) order and removes any member in O(1).
        self._waiters: dict[Waiter[T], None] = {}

    def __len__(self) -> int:
        return len(self._waiters)

    def __iter__(self) -> Iterator[Waiter[T]]:
        return iter(list(self._waiters))

    def __contains__(self, waiter: object) -> bool:
        return waiter in self._waiters

    def join(self, payload: T, *, now: float, seen_failure: tuple[str, int] | None = None, held: int = 0) -> Waiter[T]:
        waiter = Waiter(payload, now, seen_failure=seen_failure, held=held)
        self._waiters[waiter] = None
        return waiter

    def leave(self, waiter: Waiter[T]) -> bool:
        """Remove a waiter (idempotent); True if it was still queued."""
        if waiter in self._waiters:
            del self._waiters[waiter]
            return True
        return False

    def in_order(self) -> Iterator[Waiter[T]]:
        """The waiters in arrival order, without a copy: do not join or leave while iterating."""
        return iter(self._waiters)

    def head(self) -> Waiter[T] | None:
        return next(iter(self._waiters), None)

    def next_release(self) -> Waiter[T] | None:
        """The head, marked released, unless it was released already (then wait until it leaves)."""
        head = self.head()
        if head is None or head.released:
            return None
        head.released = True
        return head

    def take(self, waiters: list[Waiter[T]]) -> None:
        """Remove these waiters (they are being answered)."""
        for waiter in waiters:
            self._waiters.pop(waiter, None)

    def take_all(self) -> list[Waiter[T]]:
        """Empty the queue; return its waiters in arrival order."""
        waiters = list(self._waiters)
        self._waiters.clear()
        return waiters

    def oldest_wait(self, now: float) -> float:
        head = self.head()
        return head.waited(now) if head is not None else 0.0
