"""A lean HTTP/1.1 client for the forwarding path: keep-alive pools, httptools parsing, answers pushed to a sink.

Why not ``aiohttp.ClientSession``: profiling the proxy under load showed more than half of its CPU time inside
``ClientSession._request`` (request/response objects, timers, tracing hooks, header merging, payload registry) for
work that, for a proxy, is one ``transport.write`` of pre-built bytes and a C parser feeding the answer back. This
client does only that. It is not a general client: no redirects, cookies, TLS, proxies or decompression (bytes pass
through unchanged), and HTTP/1.1 only (what model servers speak on the cluster network).

- One pool per ``(host, port)``, most recently used connection first; an idle connection older than
  ``keepalive_timeout`` is closed instead of reused (shorter than common servers' own idle timeouts, e.g. uvicorn's
  5 s, so a request rarely races a server closing the connection).
- Nothing here awaits per request: a connection parses the answer as it arrives (httptools, the llhttp parser behind
  uvicorn) and pushes it to the ``AnswerSink`` it serves (head, body pieces, end), then calls ``answer_flush`` once
  per packet, so a sink can write what one packet brought in a single write. Only connecting is a coroutine.
- Backpressure: the sink pauses the connection's reading (``pause_reading``) while its client cannot keep up; an
  upload that fills the model's socket tells the sink (``upstream_writable``) so it stops reading the upload.
- ``UpstreamConnectionError`` means the answer never started (connect failed, or the connection closed/reset before
  the head); ``.reused`` tells whether it happened on a pooled connection, ``.never_connected`` that connecting failed
  (refused, timed out), so no byte of the request went out. Anything after the head is an ``UpstreamStreamError``.
"""

from __future__ import annotations

import asyncio
import collections
import re
import time
from collections.abc import Sequence
from enum import IntEnum
from typing import Protocol, TypeVar, cast

import httptools

from flexinfer_proxy.adapters.flow import ReadingControl

Header = tuple[bytes, bytes]


class UpstreamConnectionError(ConnectionError):
    """The model's answer never started: connecting failed, or the connection closed or broke first.

    ``never_connected``: connecting failed (refused, timed out), so no byte of the request went out and sending it
    again later is always safe.
    """

    def __init__(self, reason: str, *, reused: bool = False, never_connected: bool = False) -> None:
        super().__init__(reason)
        self.reused = reused
        self.never_connected = never_connected


class UpstreamStreamError(ConnectionError):
    """The answer started, then the connection broke (or the answer was malformed) before it ended."""


class Framing(IntEnum):
    """How an answer's body is delimited."""

    NONE = 0  # no body: HEAD, 204, 304
    SIZED = 1  # Content-Length
    CHUNKED = 2
    UNTIL_CLOSE = 3  # neither: the body ends when the model closes the connection


#: ``Transfer-Encoding`` ending in ``chunked`` (on a lower-cased head; llhttp checked the rest of the syntax).
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:[^\r]*chunked[ \t]*\r\n")


#: How many distinct answer heads ``_FRAMINGS`` (and the sink's own cache) remember before starting over: a
#: model's heads differ by their Date (once a second) and whatever the model adds per answer.
HEADS_REMEMBERED = 256
#: Longer heads are worked out each time (so the caches stay under a megabyte together).
HEAD_REMEMBERED_BYTES = 2048
_FRAMINGS: dict[bytes, Framing] = {}


_T = TypeVar("_T")


def remember_head(cache: dict[bytes, _T], head: bytes, value: _T) -> None:
    """Keep what was worked out for an answer ``head`` (heads longer than HEAD_REMEMBERED_BYTES are not kept; a
    full cache starts over)."""
    if len(head) <= HEAD_REMEMBERED_BYTES:
        if len(cache) >= HEADS_REMEMBERED:
            cache.clear()
        cache[head] = value


def framing_of(status: int, head: bytes, *, head_only: bool) -> Framing:
    """How the body of an answer with this ``status`` and ``head`` (as received) is delimited."""
    # (``find``, not ``in``: ``bytes in bytes`` first tries the needle as an int and formats a TypeError each time.)
    if head_only or status == 204 or status == 304:
        return Framing.NONE
    if head.find(b"\r\nContent-Length:") >= 0 and head.find(b"\r\nTransfer-Encoding:") < 0:  # (the usual spelling)
        return Framing.SIZED
    lower = head.lower()
    if lower.find(b"\r\ntransfer-encoding:") >= 0:
        return Framing.CHUNKED if _CHUNKED.search(lower) else Framing.UNTIL_CLOSE
    if lower.find(b"\r\ncontent-length:") >= 0:
        return Framing.SIZED
    return Framing.UNTIL_CLOSE


class AnswerSink(Protocol):
    """What a connection pushes the answer to (the forwarding exchange). Called from protocol callbacks only."""

    def answer_head(self, status: int, head: bytes, framing: Framing) -> bool:
        """The final head arrived, as the model sent it (status line to the blank line). Return True to get the body
        de-chunked through ``answer_body`` instead of as the bytes that came (``answer_flush``): only when the
        answer was begun with ``may_dechunk``."""

    def answer_body(self, data: bytes) -> None:
        """A piece of the de-chunked body (only when ``answer_head`` asked for it)."""

    def answer_flush(self, data: bytes, *, complete: bool) -> None:
        """The bytes of one packet that follow the head, as they came (chunk framing included); ``complete``: the
        answer ended with them."""

    def upstream_failed(self, error: UpstreamConnectionError | UpstreamStreamError) -> None:
        """The connection failed: before the head (``UpstreamConnectionError``) or after it."""

    def upstream_writable(self, writable: bool) -> None:
        """The model's socket buffer is full (False) or drained again (True): pause or resume an upload."""


class _RelayCallbacks:
    """The answer parser's callbacks when the body is relayed as it came: all but ``on_body``. httptools calls only
    the callbacks its protocol object has, so the body then costs no call and no bytes object per packet."""

    __slots__ = ("on_headers_complete", "on_message_begin", "on_message_complete")

    def __init__(self, conn: UpstreamConnection) -> None:
        self.on_message_begin = conn.on_message_begin
        self.on_headers_complete = conn.on_headers_complete
        self.on_message_complete = conn.on_message_complete


class UpstreamConnection(ReadingControl, asyncio.Protocol):
    """One keep-alive connection to a model, and the answer currently being read on it.

    The parser (strict llhttp) checks the answer and finds where it ends; the head is handed over as the bytes that
    came (llhttp refused anything but CRLF line endings, so the first empty line ends it), and so is the body.
    """

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(_RelayCallbacks(self))
        self.parser_dechunks = False  # the parser calls ``on_body``
        self.sink: AnswerSink | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.slot_returned = False  # the client's open-connection count no longer includes this one
        self.reading_paused = False
        self.writable = True
        # The answer being read (reset by ``begin``):
        self.buffer = b""  # the answer's bytes until its head is complete
        self.interim = 0  # 1xx heads before the final one
        self.head_done = False
        self.head_only = False  # a HEAD request: the answer ends with its head
        self.complete = False
        # Set with the final head, and read only once ``head_done`` (so ``begin`` need not reset them):
        self.body_at = 0  # where the body starts in ``buffer`` (in the packet that completed the head)
        self.dechunk = False
        self.framing = Framing.NONE
        self.keep_alive = False  # the parser forgets it once the message is complete
        self.spoiled = False  # bytes beyond the answer arrived: never reuse

    def begin(self, sink: AnswerSink, head_only: bool, may_dechunk: bool = False) -> None:
        """Start reading a new answer for ``sink`` (the request is written next by the caller). ``may_dechunk``:
        the sink may ask for the body de-chunked (``answer_head``), so the parser must hand over its pieces."""
        if may_dechunk != self.parser_dechunks:  # (between answers: a fresh parser is in the same state)
            self.parser = httptools.HttpResponseParser(self if may_dechunk else _RelayCallbacks(self))
            self.parser_dechunks = may_dechunk
        self.sink = sink
        self.buffer = b""
        self.interim = 0
        self.head_done = False
        self.head_only = head_only
        self.complete = False

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        sink = self.sink
        if sink is None or self.complete:  # nothing asked: an unsolicited answer (or bytes after one)
            self.spoiled = True
            self.close()
            return
        started = self.head_done
        if not started:
            self.buffer = data = self.buffer + data if self.buffer else data
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self.close()
            if self.sink is sink:
                self._fail(UpstreamStreamError(f"malformed answer from the model: {exc}"))
            return
        if self.sink is not sink or not self.head_done:
            return
        if self.spoiled:  # a second answer to one request: this packet cannot be relayed as it is
            self.close()
            self._fail(UpstreamStreamError("the model sent more than one answer to a request"))
            return
        if not started:
            data = data[self.body_at :]
            self.buffer = b""
        sink.answer_flush(b"" if self.dechunk or self.head_only else data, complete=self.complete)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        sink = self.sink
        if sink is None or self.complete:
            return
        if self.head_done and exc is None and self.framing is Framing.UNTIL_CLOSE:
            # An answer without a length ends when the model closes the connection (llhttp says it may).
            self.complete = True
            sink.answer_flush(b"", complete=True)
            return
        reason = f"{type(exc).__name__}: {exc}" if exc else "the model closed the connection"
        self._fail(
            UpstreamStreamError(reason) if self.head_done else UpstreamConnectionError(reason, reused=self.reused)
        )

    def pause_writing(self) -> None:
        self.writable = False
        if self.sink is not None:
            self.sink.upstream_writable(False)

    def resume_writing(self) -> None:
        self.writable = True
        if self.sink is not None:
            self.sink.upstream_writable(True)

    # --- httptools callbacks ---

    def on_message_begin(self) -> None:
        if self.head_done:
            self.spoiled = True  # a second answer to one request

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        if 100 <= status < 200:  # an interim answer (the proxy never sends Expect): wait for the final one
            self.interim += 1
            return
        buffer = self.buffer
        pool = self.pool
        # A model answers with the same head again and again (only its Date changes, once a second): its framing is
        # looked up, not worked out (the head's hash, computed here, serves the sink's lookup too). Where the head
        # ends is not searched for either when the bytes up to the last head's length are a head remembered: a
        # remembered head holds one blank line, at its end, so this head is exactly those bytes.
        head = buffer[: pool.head_length]
        framing = _FRAMINGS.get(head)
        if framing is None or self.interim or self.head_only:
            end = buffer.index(b"\r\n\r\n") + 4
            for _ in range(self.interim):  # the final head follows the interim ones
                end = buffer.index(b"\r\n\r\n", end) + 4
            head = buffer[:end]
            if self.head_only:
                framing = Framing.NONE
            else:
                pool.head_length = end
                framing = _FRAMINGS.get(head)
                if framing is None:
                    framing = framing_of(status, head, head_only=False)
                    remember_head(_FRAMINGS, head, framing)
        self.body_at = len(head)
        self.framing = framing
        self.keep_alive = self.parser.should_keep_alive()
        self.head_done = True
        sink = self.sink
        assert sink is not None
        self.dechunk = sink.answer_head(status, head, framing)
        if self.head_only:
            # A HEAD answer's length describes a body that never comes: the answer ends with its head, and the
            # connection is not reused in case the model sent a body anyway.
            self.complete = True
            self.keep_alive = False

    def on_body(self, body: bytes) -> None:  # (only when ``begin`` was told ``may_dechunk``)
        if self.dechunk and not self.complete and self.sink is not None:
            self.sink.answer_body(body)

    def on_message_complete(self) -> None:
        if self.head_done:
            self.complete = True

    # --- used by the sink ---

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def release(self, *, request_sent: bool = True) -> None:
        """Done with the answer: the connection goes back to the pool when it was read to its end (and the request
        was sent whole), else it is closed."""
        self.sink = None
        if self.keep_alive and self.complete and request_sent and not self.spoiled and not self.closed:
            if self.reading_paused:
                self.resume_reading()
            self.reused = True
            self.idle_since = time.monotonic()
            pool = self.pool
            pool.idle.append(self)
            if pool.client.slot_waiters:
                pool.client.connection_idle()
        else:
            self.close()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True
        self.pool.forget(self)

    def abandon(self) -> None:
        """The sink no longer wants the answer (its client left): close without telling it."""
        self.sink = None
        self.close()

    def _fail(self, error: UpstreamConnectionError | UpstreamStreamError) -> None:
        sink = self.sink
        self.sink = None
        if sink is not None:
            sink.upstream_failed(error)


class Pool:
    """The idle keep-alive connections to one ``(host, port)``."""

    def __init__(self, client: Http1Client, host: str, port: int) -> None:
        self.client = client
        self.host = host
        self.port = port
        self.idle: list[UpstreamConnection] = []
        self.host_header = f"{host}:{port}".encode()
        self.head_length = 0  # of the last answer head read from this endpoint (``on_headers_complete``)

    def forget(self, conn: UpstreamConnection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        if not conn.slot_returned:
            conn.slot_returned = True
            self.client.connection_closed()

    def take(self) -> UpstreamConnection | None:
        """The most recently used idle connection that is still open and fresh, else None."""
        idle = self.idle
        if not idle:
            return None
        now = time.monotonic()
        keepalive = self.client.keepalive
        while idle:
            conn = idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > keepalive:
                conn.close()
                continue
            return conn
        return None


class Http1Client:
    """Pools of keep-alive connections towards the models, at most ``connections`` open at once (all together)."""

    def __init__(self, *, connections: int, connect_timeout: float, keepalive_timeout: float = 4.0) -> None:
        self._limit = connections
        self._connect_timeout = connect_timeout
        self.keepalive = keepalive_timeout
        self._pools: dict[tuple[str, int], Pool] = {}
        self._open = 0
        self.slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closing = False

    def pool(self, host: str, port: int) -> Pool:
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = Pool(self, host, port)
        return pool

    @property
    def closing(self) -> bool:
        return self._closing

    def connection_closed(self) -> None:
        self._open -= 1
        self._wake_one()

    def connection_idle(self) -> None:
        self._wake_one()

    def _wake_one(self) -> None:
        while self.slot_waiters:
            waiter = self.slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def _evict_idle(self) -> bool:
        """Close the longest idle connection of any pool (to open one elsewhere); False when none is idle."""
        oldest: UpstreamConnection | None = None
        for pool in self._pools.values():
            if pool.idle and (oldest is None or pool.idle[0].idle_since < oldest.idle_since):
                oldest = pool.idle[0]
        if oldest is None:
            return False
        oldest.close()
        return True

    async def connect(self, pool: Pool) -> UpstreamConnection:
        """An idle connection of ``pool``, else a new one; at the connection limit, wait for one to free up.

        Raises UpstreamConnectionError (``never_connected``) when connecting fails or times out."""
        if self._closing:
            raise UpstreamConnectionError("the proxy is shutting down", never_connected=True)
        loop = asyncio.get_running_loop()
        while True:
            conn = pool.take()
            if conn is not None:
                return conn
            if self._open < self._limit or self._evict_idle():
                break
            waiter = loop.create_future()
            self.slot_waiters.append(waiter)
            await waiter
        self._open += 1
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, protocol = await loop.create_connection(lambda: UpstreamConnection(pool), pool.host, pool.port)
        except BaseException as exc:
            self.connection_closed()
            if isinstance(exc, TimeoutError):
                raise UpstreamConnectionError(
                    f"connecting timed out after {self._connect_timeout:g}s", never_connected=True
                ) from None
            if isinstance(exc, OSError):
                raise UpstreamConnectionError(
                    f"{type(exc).__name__}: {exc.strerror or exc}", never_connected=True
                ) from None
            raise
        return protocol

    async def close(self) -> None:
        self._closing = True
        for pool in self._pools.values():
            for conn in list(pool.idle):
                conn.close()
        self._pools.clear()


def request_head(
    method: bytes,
    target: bytes,
    host_header: bytes,
    headers: Sequence[Header],
    *,
    content_length: int | None,
    chunked: bool,
) -> list[bytes]:
    """The request line and headers as wire pieces (join them, and the body, into one write): what the forwarding
    exchange writes (``forwarding.Exchange._send`` builds the same pieces inline, once per request).

    ``headers`` are end-to-end headers only (no Host, Content-Length or Transfer-Encoding: set here).
    """
    lines = [method, b" ", target, b" HTTP/1.1\r\nHost: ", host_header]
    for name, value in headers:
        lines += (b"\r\n", name, b": ", value)
    if chunked:
        lines.append(b"\r\nTransfer-Encoding: chunked")
    elif content_length is not None:
        lines.append(b"\r\nContent-Length: %d" % content_length)
    lines.append(b"\r\n\r\n")
    return lines
