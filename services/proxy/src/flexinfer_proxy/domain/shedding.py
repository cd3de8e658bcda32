"""What the proxy sheds to keep serving: connections past the caps, and requests that arrive too slowly.

Pure decisions (time is an argument); the HTTP server applies them (``adapters.http_server``).

- **Connections**: at most ``max_connections`` open at once, and ``max_per_client`` from one client address (0: no
  per-address cap). A connection past either is refused at once: it gets 503 ``too_many_connections`` as soon as its
  request head is read (``SHED_GRACE`` seconds at most), or, when so many are being refused that even that would
  hold descriptors (``shed_backlog``), it is closed without a word.
- **Slow requests**: a request's head must be complete within ``header_timeout`` of its first byte (of the
  connection's opening, for a connection that has sent nothing yet). Its body must then keep up a minimum rate:
  at any moment the time spent on it may be at most ``body_timeout + received / body_min_rate`` (so a 16 MiB upload at
  64 KiB/s is fine, one byte every 5 s is cut after ``body_timeout``). Time during which the proxy itself stopped
  reading (backpressure from the model, or a request waiting its turn) does not count: the clock restarts when
  reading resumes. Either deadline passed: 408 ``request_timeout`` (or a plain close when no byte of a request came).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

#: Seconds a connection refused for the caps may take to send its request head before it is closed unanswered.
SHED_GRACE = 1.0


class Shed(StrEnum):
    """Why a connection or request was shed (the ``reason`` label of ``flexinfer_proxy_shed_total``)."""

    MAX_CONNECTIONS = "max_connections"
    MAX_CONNECTIONS_PER_CLIENT = "max_connections_per_client"
    HEADER_TIMEOUT = "header_timeout"
    BODY_TIMEOUT = "body_timeout"


@dataclass(frozen=True, slots=True)
class Limits:
    max_connections: int
    max_per_client: int  # 0: none
    header_timeout: float
    body_timeout: float
    body_min_rate: float  # bytes per second

    @property
    def shed_backlog(self) -> int:
        """How many refused connections may wait for their head (to be told 503) before more are simply closed."""
        return max(64, self.max_connections // 10)


def admit_connection(limits: Limits, open_total: int, open_from_client: int) -> Shed | None:
    """Whether one more connection may be served, given those open (admitted) now in all and from its address."""
    if open_total >= limits.max_connections:
        return Shed.MAX_CONNECTIONS
    if limits.max_per_client and open_from_client >= limits.max_per_client:
        return Shed.MAX_CONNECTIONS_PER_CLIENT
    return None


def too_slow(limits: Limits, now: float, since: float, *, head_done: bool, received: int) -> Shed | None:
    """Whether a request still arriving must be cut: ``since`` is when its clock started (its first byte, or
    when the proxy last resumed reading it), ``received`` the body bytes that came since then."""
    elapsed = now - since
    if not head_done:
        return Shed.HEADER_TIMEOUT if elapsed > limits.header_timeout else None
    if elapsed > limits.body_timeout + received / limits.body_min_rate:
        return Shed.BODY_TIMEOUT
    return None


class ShedLog:
    """One log line per ``interval`` seconds at most, with the counts of what was shed since the last one."""

    def __init__(self, interval: float = 10.0) -> None:
        self.interval = interval
        self.counts: dict[Shed, int] = {}
        self._last: float | None = None

    def shed(self, reason: Shed, now: float) -> dict[Shed, int] | None:
        """Count one; the counts to log now (and start over), or None when the last line was too recent."""
        self.counts[reason] = self.counts.get(reason, 0) + 1
        return self.due(now)

    def due(self, now: float) -> dict[Shed, int] | None:
        if not self.counts or (self._last is not None and now - self._last < self.interval):
            return None
        self._last = now
        counts, self.counts = self.counts, {}
        return counts
