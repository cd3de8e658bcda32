"""A lean HTTP/1.1 client for the forwarding hot path: keep-alive pools, httptools parsing, streamed bodies.

Why not ``aiohttp.ClientSession``: profiling the proxy under load showed more than half of its CPU time inside
``ClientSession._request`` (request/response objects, timers, tracing hooks, header merging, payload registry) for
work that, for a proxy, is one ``transport.write`` of pre-built bytes and a C parser feeding the answer back. This
client does only that. It is not a general client: no redirects, cookies, TLS, proxies or decompression (bytes pass
through unchanged), and HTTP/1.1 only (what model servers speak on the cluster network).

- One pool per ``(host, port)``, most recently used connection first; an idle connection older than
  ``keepalive_timeout`` is closed instead of reused (shorter than common servers' own idle timeouts, e.g. uvicorn's
  5 s, so a request rarely races a server closing the connection).
- The answer's body is handed out chunk by chunk as it arrives (SSE goes through event by event); when the caller
  reads slower than the model writes, reading from the model pauses (backpressure) above ``HIGH_WATER`` bytes.
- ``UpstreamConnectionError`` means no byte of an answer arrived (connect failed, or the connection closed/reset
  first); ``.reused`` tells whether it happened on a pooled connection, ``.never_connected`` that connecting failed
  (refused, timed out), so no byte of the request went out. Anything after the head is a broken stream.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterable, Callable, Sequence
from typing import cast

import httptools

HIGH_WATER = 256 * 1024
LOW_WATER = 64 * 1024

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


class _Connection(asyncio.Protocol):
    """One keep-alive connection and the answer currently being read on it."""

    def __init__(self, pool: _Pool) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.slot_returned = False  # the client's open-connection count no longer includes this one
        self.chunks: collections.deque[bytes] = collections.deque()
        self._reset()
        self._paused_writing = False
        self._drain: asyncio.Future[None] | None = None

    def _reset(self) -> None:
        self.status = 0
        self.reason = b""
        self.headers: list[Header] = []
        self.head: asyncio.Future[None] | None = None
        self.chunks.clear()
        self.buffered = 0
        self.complete = False
        self.failure: BaseException | None = None
        self.reading_paused = False
        self.waiter: asyncio.Future[None] | None = None
        self.delimited = False  # Content-Length or chunked: the end is known (else the answer ends at EOF)
        self.no_body = False
        self.keep_alive = False  # read with the head: the parser forgets it once the message is complete

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's

    def data_received(self, data: bytes) -> None:
        if self.head is None:  # nothing asked: an unsolicited answer (or bytes after one) means a broken stream
            self.close()
            return
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(UpstreamStreamError(f"malformed answer from the model: {exc}"))
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.pool.forget(self)
        self.resume_writing()  # an upload waiting to write on goes on, and sees the connection closed
        if self.head is None or self.complete:
            return
        if self.head.done() and not self.delimited and not self.no_body and exc is None:
            self._message_complete()  # an answer without a length ends when the model closes the connection
            return
        reason = f"{type(exc).__name__}: {exc}" if exc else "the model closed the connection"
        if not self.head.done():
            self._fail(UpstreamConnectionError(reason, reused=self.reused))
        else:
            self._fail(UpstreamStreamError(reason))

    def pause_writing(self) -> None:
        self._paused_writing = True

    def resume_writing(self) -> None:
        self._paused_writing = False
        if self._drain is not None and not self._drain.done():
            self._drain.set_result(None)
        self._drain = None

    # --- httptools callbacks ---

    def on_status(self, status: bytes) -> None:
        self.reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        lower = name.lower()
        if lower == b"content-length" or (lower == b"transfer-encoding" and b"chunked" in value.lower()):
            self.delimited = True
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self.parser.get_status_code()
        if 100 <= self.status < 200:  # an interim answer (we never send Expect): wait for the final one
            self.headers = []
            self.reason = b""
            self.delimited = False
            return
        self.keep_alive = self.parser.should_keep_alive()
        if self.status in (204, 304):
            self.no_body = True
        assert self.head is not None
        if not self.head.done():
            self.head.set_result(None)
        if self.no_body:  # (HEAD answers too, see ``request``) nothing follows the head
            self._message_complete()

    def on_body(self, body: bytes) -> None:
        self.chunks.append(body)
        self.buffered += len(body)
        if self.buffered > HIGH_WATER and not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        if 100 <= self.status < 200:
            return
        self._message_complete()

    # --- internals ---

    def _message_complete(self) -> None:
        self.complete = True
        self._wake()

    def _wake(self) -> None:
        waiter = self.waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        self.failure = exc
        if self.head is not None and not self.head.done():
            self.head.set_exception(exc)
        self._wake()

    def close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()
        self.closed = True
        self.pool.forget(self)

    async def drain(self) -> None:
        if self._paused_writing and not self.closed:
            self._drain = asyncio.get_running_loop().create_future()
            await self._drain

    def start(self, loop: asyncio.AbstractEventLoop) -> asyncio.Future[None]:
        self._reset()
        self.head = loop.create_future()
        return self.head

    async def read(self) -> bytes | None:
        """The next piece of the body; None at its end. Raises UpstreamStreamError when it broke."""
        while True:
            if self.chunks:
                if len(self.chunks) == 1:
                    chunk = self.chunks.popleft()
                else:  # what arrived while the caller was busy goes out in one write
                    chunk = b"".join(self.chunks)
                    self.chunks.clear()
                self.buffered = 0
                if self.reading_paused and self.transport is not None:
                    self.reading_paused = False
                    self.transport.resume_reading()
                return chunk
            if self.complete:
                return None
            if self.failure is not None:
                raise self.failure
            self.waiter = asyncio.get_running_loop().create_future()
            try:
                await self.waiter
            finally:
                self.waiter = None


class Answer:
    """A model's answer: status line and headers at once, the body read piece by piece. ``release()`` (or
    ``close()``) exactly once when done with it."""

    __slots__ = ("_conn", "_keep", "headers", "reason", "status")

    def __init__(self, conn: _Connection, *, keep_alive: bool) -> None:
        self._conn = conn
        self._keep = keep_alive
        self.status = conn.status
        self.reason = conn.reason.decode("latin-1")
        self.headers = conn.headers

    def body_complete(self) -> bool:
        """The whole body has arrived (``read`` will not wait)."""
        return self._conn.complete

    async def read(self) -> bytes | None:
        return await self._conn.read()

    def release(self) -> None:
        """Done: the connection goes back to the pool when the answer was read to its end, else it is closed."""
        conn = self._conn
        if self._keep and conn.complete and not conn.chunks and not conn.closed and conn.failure is None:
            conn.head = None
            conn.pool.put(conn)
        else:
            conn.close()

    def close(self) -> None:
        self._conn.close()


class _Pool:
    def __init__(self, client: Http1Client, host: str, port: int) -> None:
        self.client = client
        self.host = host
        self.port = port
        self.idle: list[_Connection] = []
        self.host_header = f"{host}:{port}".encode()

    def put(self, conn: _Connection) -> None:
        conn.reused = True
        conn.idle_since = time.monotonic()
        self.idle.append(conn)
        self.client.connection_idle()

    def forget(self, conn: _Connection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        if not conn.slot_returned:
            conn.slot_returned = True
            self.client.connection_closed()

    def take(self, now: float, keepalive: float) -> _Connection | None:
        while self.idle:
            conn = self.idle.pop()
            if conn.closed or conn.transport is None or conn.transport.is_closing():
                continue
            if now - conn.idle_since > keepalive:
                conn.close()
                continue
            return conn
        return None


OnSent = Callable[[], None]


class Http1Client:
    def __init__(self, *, connections: int, connect_timeout: float, keepalive_timeout: float = 4.0) -> None:
        self._limit = connections
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive_timeout
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._open = 0
        self._slot_waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self._closing = False

    def connection_closed(self) -> None:
        self._open -= 1
        self._wake_one()

    def connection_idle(self) -> None:
        self._wake_one()

    def _wake_one(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                break

    def _evict_idle(self) -> bool:
        """Close the longest idle connection of any pool (to open one elsewhere); False when none is idle."""
        oldest: _Connection | None = None
        for pool in self._pools.values():
            if pool.idle and (oldest is None or pool.idle[0].idle_since < oldest.idle_since):
                oldest = pool.idle[0]
        if oldest is None:
            return False
        oldest.close()
        return True

    async def _acquire(self, pool: _Pool) -> _Connection:
        """An idle connection of ``pool``, else a new one; at the connection limit, wait for one to free up."""
        loop = asyncio.get_running_loop()
        while True:
            conn = pool.take(time.monotonic(), self._keepalive)
            if conn is not None:
                return conn
            if self._open < self._limit or self._evict_idle():
                break
            waiter = loop.create_future()
            self._slot_waiters.append(waiter)
            await waiter
        self._open += 1
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, protocol = await loop.create_connection(lambda: _Connection(pool), pool.host, pool.port)
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

    async def request(
        self,
        method: str,
        host: str,
        port: int,
        target: str,
        headers: Sequence[Header],
        body: bytes | AsyncIterable[bytes] | None,
        *,
        content_length: int | None = None,
        on_sent: OnSent | None = None,
    ) -> Answer:
        """Send one request; return when the answer's head arrived.

        ``headers`` are end-to-end headers only (no Host, Content-Length or Transfer-Encoding: this sets them).
        A streamed ``body`` goes with ``content_length`` when known, else chunked. ``on_sent`` runs once the request
        head went out (or the attempt failed before that).
        """
        if self._closing:
            raise UpstreamConnectionError("the proxy is shutting down")
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = _Pool(self, host, port)
        try:
            conn = pool.take(time.monotonic(), self._keepalive) or await self._acquire(pool)
        except BaseException:
            if on_sent is not None:
                on_sent()
            raise
        loop = asyncio.get_running_loop()
        head_done = conn.start(loop)
        lines = [f"{method} {target} HTTP/1.1\r\nHost: ".encode("utf-8", "surrogateescape"), pool.host_header]
        for name, value in headers:
            lines += (b"\r\n", name, b": ", value)
        streamed = body is not None and not isinstance(body, bytes)
        chunked = streamed and content_length is None
        if isinstance(body, bytes):
            if body or method not in ("GET", "HEAD", "OPTIONS", "DELETE"):
                lines.append(b"\r\nContent-Length: %d" % len(body))
        elif chunked:
            lines.append(b"\r\nTransfer-Encoding: chunked")
        elif streamed:
            lines.append(b"\r\nContent-Length: %d" % (content_length or 0))
        lines.append(b"\r\n\r\n")
        if isinstance(body, bytes) and body:
            lines.append(body)
        transport = conn.transport
        assert transport is not None
        try:
            transport.write(b"".join(lines))
        finally:
            if on_sent is not None:
                on_sent()
        try:
            if streamed:
                assert body is not None and not isinstance(body, bytes)
                await self._send_stream(conn, body, chunked=chunked)
            await head_done
        except BaseException:
            conn.close()
            raise
        if method == "HEAD":
            # A HEAD answer's length describes a body that never comes: the answer ends with its head (anything
            # after it is not ours to pass on), and the connection is not reused in case the model sent it anyway.
            conn.chunks.clear()
            conn.no_body = True
            conn._message_complete()
            return Answer(conn, keep_alive=False)
        return Answer(conn, keep_alive=conn.keep_alive)

    @staticmethod
    async def _send_stream(conn: _Connection, body: AsyncIterable[bytes], *, chunked: bool) -> None:
        transport = conn.transport
        assert transport is not None
        async for chunk in body:
            if conn.closed or conn.failure is not None:
                return  # the model answered (or hung up) before the upload ended
            if chunk:
                transport.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if chunked else chunk)
                await conn.drain()
        if chunked and not conn.closed:
            transport.write(b"0\r\n\r\n")

    async def close(self) -> None:
        self._closing = True
        for pool in self._pools.values():
            for conn in list(pool.idle):
                conn.close()
        self._pools.clear()
