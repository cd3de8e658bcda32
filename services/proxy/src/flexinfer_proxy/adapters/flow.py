"""Pausing and resuming the reading of a connection, remembering which (both sides of the proxy need it)."""

from __future__ import annotations

import asyncio


class ReadingControl:
    """``pause_reading``/``resume_reading`` for a protocol: no-ops when already so, or once the connection closed."""

    transport: asyncio.Transport | None
    closed: bool
    reading_paused: bool

    def pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None and not self.closed:
            self.reading_paused = False
            self.transport.resume_reading()
