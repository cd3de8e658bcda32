"""The proxy's HTTP/1.1 server: one asyncio protocol per client connection, requests parsed once by httptools.

httptools is llhttp, the parser behind uvicorn and Node.js, in its strict mode: a request with both Content-Length
and Transfer-Encoding, a duplicate Content-Length, bare LF line endings, folded or space-padded headers, or a bad
chunk size is refused (400) before anything is forwarded. This module adds the limits llhttp leaves to its user:
the request target (``MAX_TARGET``), the header fields (``MAX_HEAD`` bytes together, ``MAX_HEADERS`` of them) and
the body (``max_body``: 413 as soon as the Content-Length or the bytes received pass it, so a large body is refused
without being held).

A ``Request`` is handed to the ``Handler`` when its head is complete (``head``): the handler answers it at once,
takes it over (a streamed body goes to ``Request.sink`` as it arrives), or lets the server collect the body and call
``request`` with all of it. Whoever answers writes with ``ServerConnection.write`` and ends with ``finish``; the
connection then serves the next request (keep-alive and pipelining, in order) or closes. A client that leaves calls
the request's ``on_gone``, so the work done for it stops. Idle connections are closed after ``idle_timeout``.

Shedding (``domain.shedding``): a connection past ``max_connections`` (or past ``max_per_client`` from its address)
gets a parser of its own that answers its first request head with 503 ``too_many_connections`` and closes, so the
connections served cost nothing more for it; slow requests (head or body) are found by the once-a-second sweep that
also closes idle connections, not by a timer per request.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable, Sequence
from time import monotonic
from typing import Protocol, cast

import httptools

from flexinfer_common.logs import get_logger
from flexinfer_proxy.adapters.flow import ReadingControl
from flexinfer_proxy.domain import errors
from flexinfer_proxy.domain.errors import ProxyError
from flexinfer_proxy.domain.requests import NOT_FORWARDED, raw_connection_tokens
from flexinfer_proxy.domain.shedding import SHED_GRACE, Limits, Shed, ShedLog, admit_connection, too_slow
from flexinfer_proxy.metrics import PROXY_OPEN_CONNECTIONS, PROXY_SHED

log = get_logger("flexinfer.proxy.server")

Header = tuple[bytes, bytes]

MAX_TARGET = 8190  # the request target (aiohttp's and uvicorn's line limit)
MAX_HEAD = 64 * 1024  # all header fields together
MAX_HEADERS = 128
#: Seconds a connection whose request was refused mid-body keeps reading (and dropping) the rest, so its client
#: reads the refusal instead of a reset.
LINGER = 2.0
#: Body bytes of a request that is not being forwarded yet (pipelined, or streamed but waiting) kept in memory
#: before the server stops reading from its client.
BUFFER_WHILE_WAITING = 64 * 1024

#: Request fields the server reads rather than only forwards.
_READ_FIELDS = NOT_FORWARDED | {b"authorization"}
#: How the server takes a request field, by its name as spelled on the wire: forwarded as it came, dropped
#: (``Proxy-*``: the hop's own credentials), or read (the value is then the lower-case name). Clients send the same
#: few names again and again, so one lookup replaces lower-casing and testing every field (``_field_kind``).
_FORWARD = b""  # (no field name is empty)
_DROP = b"proxy-"
_FIELD_KINDS: dict[bytes, bytes] = {}
#: Bounds of that table: names are the client's to choose.
_FIELD_KINDS_MAX = 1024
_FIELD_NAME_REMEMBERED = 64

_STATUS_REASONS = {
    200: b"OK",
    400: b"Bad Request",
    408: b"Request Timeout",
    401: b"Unauthorized",
    404: b"Not Found",
    405: b"Method Not Allowed",
    413: b"Content Too Large",
    414: b"URI Too Long",
    429: b"Too Many Requests",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
    501: b"Not Implemented",
    502: b"Bad Gateway",
    503: b"Service Unavailable",
    504: b"Gateway Timeout",
}


class BodySink(Protocol):
    """Where a streamed request body goes (the forwarding exchange)."""

    def body_piece(self, data: bytes) -> None: ...

    def body_end(self) -> None: ...


class Handler(Protocol):
    def head(self, request: Request) -> bool:
        """The head is complete: answer or take over the request (True), or let the server collect its body
        and call ``request`` (False)."""

    def request(self, request: Request) -> None:
        """The whole request, body included (``request.body``)."""


class Request:
    """One request on a client connection, as parsed.

    ``headers`` are its end-to-end headers, raw bytes as they came off the wire: what a proxy forwards. The fields
    that describe the hop (``Connection`` and what it names, ``Keep-Alive``, ``TE``, ``Trailer``, ``Upgrade``,
    ``Proxy-*``), ``Host`` and the body's framing (``Content-Length``, ``Transfer-Encoding``, ``Expect``) are read
    into attributes and left out.
    """

    __slots__ = (
        "answering",
        "arrived",
        "authorization",
        "body",
        "body_size",
        "chunked",
        "complete",
        "conn",
        "connection_header",
        "connection_tokens",
        "content_length",
        "expect_continue",
        "finished",
        "headers",
        "keep_alive",
        "method",
        "on_gone",
        "on_pause",
        "parts",
        "sink",
        "url",
        "version",
    )

    def __init__(self, conn: ServerConnection) -> None:
        self.conn = conn
        self.arrived = monotonic()  # its first bytes came (request timings count from here)
        self.method = b""
        self.url = b""
        self.version = "1.1"
        self.headers: list[Header] = []
        self.authorization: bytes | None = None
        self.connection_header = False
        self.connection_tokens: frozenset[bytes] | None = None
        self.keep_alive = True
        self.content_length: int | None = None
        self.chunked = False
        self.expect_continue = False
        self.body = b""
        self.parts: list[bytes] = []
        self.body_size = 0
        self.complete = False
        self.finished = False
        self.answering = False  # the answer's head was written (too late for an error status)
        self.sink: BodySink | None = None
        #: Called when the client leaves (or the request must be cut short) while it is being handled.
        self.on_gone: Callable[[], None] | None = None
        #: Called with True when the client cannot take more answer bytes now, with False when it can again.
        self.on_pause: Callable[[bool], None] | None = None

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)

    def attach(self, sink: BodySink) -> None:
        """Stream the body to ``sink`` from now on (what arrived already goes first)."""
        self.sink = sink
        parts, self.parts = self.parts, []
        for part in parts:
            sink.body_piece(part)
        if self.complete:
            sink.body_end()
        else:
            self.conn.resume_reading()

    def detach(self) -> None:
        self.sink = None

    def take_body(self) -> bytes:
        """The body collected so far as one bytes object."""
        if self.parts:
            self.body = self.parts[0] if len(self.parts) == 1 else b"".join(self.parts)
            self.parts = []
        return self.body


def _field_kind(name: bytes) -> bytes:
    """How the server takes a request field named ``name``: ``_FORWARD``, ``_DROP``, or its lower-case name when
    it is one of ``_READ_FIELDS`` (remembered in ``_FIELD_KINDS``)."""
    lower = name.lower()
    kind = lower if lower in _READ_FIELDS else _DROP if lower.startswith(b"proxy-") else _FORWARD
    if len(name) <= _FIELD_NAME_REMEMBERED and len(_FIELD_KINDS) < _FIELD_KINDS_MAX:
        _FIELD_KINDS[name] = kind
    return kind


class _Refused(Exception):
    """Parsing stops: the request was answered with an error (and the connection closes)."""


class _ShedCallbacks:
    """The parser's callbacks on a connection refused for the caps: the first request head gets 503."""

    __slots__ = ("conn",)

    def __init__(self, conn: ServerConnection) -> None:
        self.conn = conn

    def on_headers_complete(self) -> None:
        conn = self.conn
        limits = conn.server.limits
        conn._refuse(
            errors.too_many_connections(
                limits.max_per_client if conn.shed_reason is Shed.MAX_CONNECTIONS_PER_CLIENT else None,
                limits.max_connections,
            )
        )
        raise _Refused


class ServerConnection(ReadingControl, asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.handler = server.handler
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.current: Request | None = None  # being parsed
        self.active: Request | None = None  # being answered
        self.pipeline: collections.deque[Request] = collections.deque()
        self.closed = False
        self.refusing = False  # an error was answered mid-request: the rest of the input is not read
        self.reading_paused = False
        self.writing_paused = False
        self.opened = self.last_active = time.monotonic()
        self._head_bytes = 0
        self.client: str | None = None  # the peer's address, once admitted (counted against the caps)
        self.shed_reason: Shed | None = None  # refused for the caps: answered 503 once its head is read
        #: ``(request, since, body bytes then)``: when the proxy last stopped reading this request (the time it
        #: spent paused does not count against its deadline).
        self.clock: tuple[Request, float, int] | None = None

    # --- asyncio.Protocol ---

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        server = self.server
        server.connections.add(self)
        peer = transport.get_extra_info("peername")
        client = str(peer[0]) if isinstance(peer, tuple) and peer else ""
        reason = admit_connection(server.limits, server.admitted, server.per_client.get(client, 0))
        if reason is None:
            self.client = client
            server.admitted += 1
            server.per_client[client] = server.per_client.get(client, 0) + 1
            return
        server.shed(reason)
        if server.shedding >= server.limits.shed_backlog:
            self.refusing = True  # too many refused already: not even a 503 (that would hold the descriptor longer)
            self.transport.close()
            return
        self.shed_reason = reason
        server.shedding += 1
        self.parser = httptools.HttpRequestParser(_ShedCallbacks(self))

    def data_received(self, data: bytes) -> None:
        if self.refusing or self.closed:
            return
        try:
            self.parser.feed_data(data)
        except _Refused:
            pass
        except httptools.HttpParserCallbackError as exc:
            if not isinstance(exc.__context__, _Refused):
                log.exception("request handling failed")
                self._refuse(errors.internal_error())
        except httptools.HttpParserUpgrade:
            # The proxy forwards no protocol switch (Upgrade is hop-by-hop): answer the request, then close.
            if self.current is not None and not self.current.complete:
                self._refuse(errors.invalid_request("protocol upgrades are not supported"))
            self.refusing = True
            self._close_when_idle()
        except httptools.HttpParserError as exc:
            self._refuse(errors.invalid_request(f"malformed HTTP request: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        server = self.server
        server.connections.discard(self)
        client = self.client
        if client is not None:
            self.client = None
            server.admitted -= 1
            left = server.per_client[client] - 1
            if left:
                server.per_client[client] = left
            else:
                del server.per_client[client]
        elif self.shed_reason is not None:
            self.shed_reason = None
            server.shedding -= 1
        server.connection_closed()
        active = self.active
        self.active = None
        self.pipeline.clear()
        if active is not None and not active.finished:
            active.finished = True
            if active.on_gone is not None:
                active.on_gone()

    def pause_writing(self) -> None:
        self.writing_paused = True
        active = self.active
        if active is not None and active.on_pause is not None:
            active.on_pause(True)

    def resume_writing(self) -> None:
        self.writing_paused = False
        active = self.active
        if active is not None and active.on_pause is not None:
            active.on_pause(False)

    # --- httptools callbacks ---

    # (No ``on_message_begin``: every request line has a target, so the first ``on_url`` of a message begins it,
    # and each callback llhttp makes into Python costs about a microsecond here.)

    def on_url(self, url: bytes) -> None:
        request = self.current
        if request is None:  # a new message
            request = self.current = Request(self)
            self._head_bytes = 0
            if self.active is not None:
                self.pause_reading()  # pipelined: read no further until the answers before it went out
            request.url = url
        else:  # (the target came in pieces)
            request.url += url
        if len(request.url) > MAX_TARGET:
            self._refuse(errors.uri_too_long(MAX_TARGET))
            raise _Refused

    def on_header(self, name: bytes, value: bytes) -> None:
        request = self.current
        assert request is not None
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD:
            self._refuse(errors.headers_too_large(MAX_HEADERS, MAX_HEAD))
            raise _Refused
        kind = _FIELD_KINDS.get(name)
        if kind is None:
            kind = _field_kind(name)
        if kind is _FORWARD:  # (the usual field)
            request.headers.append((name, value))
        elif kind == b"content-length":
            request.content_length = int(value)  # llhttp checked it is one plain number
        elif kind == b"authorization":
            request.authorization = value
            request.headers.append((name, value))
        elif kind is not _DROP and kind != b"host":
            self._hop_header(request, kind, value)

    def _hop_header(self, request: Request, lower: bytes, value: bytes) -> None:
        if lower == b"transfer-encoding":
            if value.strip().lower() != b"chunked":  # llhttp ensured chunked comes last; more is not relayed
                self._refuse(errors.unsupported_transfer_encoding(value.decode("latin-1")))
                raise _Refused
            request.chunked = True
        elif lower == b"expect":
            request.expect_continue = value.lower() == b"100-continue"
        elif lower == b"connection":
            request.connection_header = True
            tokens = raw_connection_tokens(value) - NOT_FORWARDED
            if tokens:
                request.connection_tokens = (request.connection_tokens or frozenset()) | tokens

    def on_headers_complete(self) -> None:
        request = self.current
        assert request is not None
        parser = self.parser
        request.method = parser.get_method()
        request.keep_alive = parser.should_keep_alive()
        if not request.keep_alive or request.connection_header:
            # (An HTTP/1.0 request keeps its connection only when it says so: otherwise it is 1.1, and the parser
            # need not format its version.)
            request.version = parser.get_http_version()
            if request.version != "1.1":
                request.expect_continue = False
        if len(request.headers) > MAX_HEADERS:
            self._refuse(errors.headers_too_large(MAX_HEADERS, MAX_HEAD))
            raise _Refused
        if request.connection_tokens:  # fields named by Connection describe this hop only
            tokens = request.connection_tokens
            request.headers = [(n, v) for n, v in request.headers if n.lower() not in tokens]
            if request.authorization is not None and b"authorization" in tokens:
                request.authorization = None
        if request.content_length is not None and request.content_length > self.server.max_body:
            self._refuse(errors.body_too_large(self.server.max_body))
            raise _Refused
        if not request.chunked and not request.content_length:
            request.complete = True  # no body: the message ends with its head
        if self.active is not None or self.pipeline:
            self.pipeline.append(request)
            return
        self.active = request
        if request.expect_continue and not request.complete:
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self.handler.head(request) and request.complete and not request.finished and self.active is request:
            self.handler.request(request)  # (no body)

    def on_body(self, body: bytes) -> None:
        request = self.current
        assert request is not None
        request.body_size += len(body)
        if request.body_size > self.server.max_body:
            self._refuse(errors.body_too_large(self.server.max_body))
            raise _Refused
        if request.sink is not None:
            request.sink.body_piece(body)
            return
        request.parts.append(body)
        # Not collected for ``request`` (pipelined, or waiting to stream): bound what is held.
        if (request is not self.active or request.on_gone is not None) and request.body_size > BUFFER_WHILE_WAITING:
            self.pause_reading()

    def on_message_complete(self) -> None:
        request = self.current
        assert request is not None
        self.current = None
        request.complete = True
        if request is not self.active:
            return
        if request.sink is not None:
            request.sink.body_end()
        elif (request.chunked or request.content_length) and request.on_gone is None and not request.finished:
            # (a body, collected by the server: ``has_body`` inlined)
            parts = request.parts
            if parts:
                request.body = parts[0] if len(parts) == 1 else b"".join(parts)
                request.parts = []
            self.handler.request(request)

    # --- for the handler ---

    def _start(self, request: Request) -> None:
        self.active = request
        if request.expect_continue and not request.complete:
            self.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not self.handler.head(request) and request.complete and not request.finished and self.active is request:
            request.take_body()
            self.handler.request(request)

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(data)

    def will_close(self, request: Request) -> bool:
        """Whether the connection closes after answering ``request`` (the answer says ``Connection: close``)."""
        return not request.keep_alive or self.server.closing or self.refusing

    def finish(self, request: Request) -> None:
        """``request`` has been answered (all its bytes written): serve the next one, or close."""
        if request.finished:
            return
        request.finished = True
        request.sink = request.on_gone = request.on_pause = None
        if self.active is request:
            self.active = None
        if self.closed:
            return
        self.last_active = time.monotonic()
        if not request.complete:
            self._linger()  # the client may still be sending the body nobody reads
            return
        if not request.keep_alive or self.server.closing or self.refusing:
            self._close()
            return
        pipeline = self.pipeline
        if pipeline:
            while pipeline and self.active is None and not self.closed:
                self._start(pipeline.popleft())
            if pipeline:
                return
        if self.reading_paused:
            self.resume_reading()

    def respond(
        self,
        request: Request,
        status: int,
        body: bytes,
        *,
        content_type: bytes = b"application/json",
        headers: Sequence[Header] = (),
    ) -> None:
        """Answer ``request`` with a complete response the proxy made itself."""
        if request.finished:
            return
        lines = [b"HTTP/1.1 %d %s\r\nContent-Type: " % (status, _STATUS_REASONS.get(status, b"")), content_type]
        for name, value in headers:
            lines += (b"\r\n", name, b": ", value)
        if self.will_close(request) or not request.complete:
            lines.append(b"\r\nConnection: close")
        lines.append(b"\r\nContent-Length: %d\r\n\r\n" % len(body))
        if request.method != b"HEAD":
            lines.append(body)
        self.write(b"".join(lines))
        self.finish(request)

    def respond_error(self, request: Request, error: ProxyError) -> None:
        headers: list[Header] = []
        if error.retry_after is not None:
            headers.append((b"Retry-After", str(error.retry_after).encode()))
        if error.status == 401:
            headers.append((b"WWW-Authenticate", b"Bearer"))
        self.respond(request, error.status, error.body(), headers=headers)

    def abort(self) -> None:
        """Cut the connection (an answer broke midway: the client must not take it for a complete one)."""
        if self.transport is not None and not self.closed:
            self.transport.abort()

    # --- internals ---

    def _refuse(self, error: ProxyError) -> None:
        """Answer ``error`` for the request being parsed, then close (its input is not read on).

        A request being answered already is cut short (its forwarding or waiting stops); when its answer has
        begun, the connection is cut instead. A malformed request pipelined behind one being answered gets no
        answer: the connection closes once the one before it is answered.
        """
        self.refusing = True
        self.pipeline.clear()
        request = self.current if self.current is not None else Request(self)
        active = self.active
        if active is not None and active is not request:
            return  # ``finish`` closes the connection after the answer in progress
        gone, request.on_gone = request.on_gone, None
        if gone is not None:
            gone()  # stop what was being done for it (forwarding, waiting)
        if request.answering:
            request.finished = True
            self.abort()  # too late for a status: the client must not take the cut answer for a whole one
            return
        self.active = request
        request.keep_alive = False
        self.respond_error(request, error)

    def _linger(self) -> None:
        """Close a connection whose request was answered before its body was read, without losing the answer.

        Closing at once with unread bytes in the socket makes the kernel reset the connection, and a client still
        sending would see the reset instead of the answer (413, 401...). So: say nothing more (half-close), read on
        and drop whatever still comes for ``LINGER`` seconds, then close.
        """
        self.refusing = True  # what comes now is dropped unread
        transport = self.transport
        if transport is None or self.closed:
            return
        if transport.can_write_eof():
            transport.write_eof()
        self.resume_reading()
        asyncio.get_running_loop().call_later(LINGER, self._close)

    def _close(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.close()  # after what was written went out

    def _close_when_idle(self) -> None:
        if self.active is None:
            self._close()

    def close_if_idle(self, now: float, idle_timeout: float) -> None:
        if self.active is None and (self.server.closing or now - self.last_active > idle_timeout):
            self._close()

    def sweep(self, now: float, idle_timeout: float, limits: Limits) -> None:
        """Once a second: close the connection when idle too long, cut its request when it arrives too slowly
        (``domain.shedding.too_slow``), close a refused connection that has not sent its head in time."""
        if self.closed or self.refusing:
            return  # (closing already, or lingering for a bounded time)
        if self.shed_reason is not None:
            if now - self.opened > SHED_GRACE:
                self._close()
            return
        request = self.current
        if request is None:
            if self.active is None:
                if self.last_active == self.opened and now - self.opened > limits.header_timeout:
                    self.server.shed(Shed.HEADER_TIMEOUT)  # connected, and not one byte of a request since
                    self._close()
                else:
                    self.close_if_idle(now, idle_timeout)
            return
        if self.reading_paused:  # the proxy is not reading it (backpressure, or its turn has not come)
            self.clock = (request, now, request.body_size)
            return
        clock = self.clock
        if clock is not None and clock[0] is request:
            since, received = clock[1], request.body_size - clock[2]
        else:
            since, received = request.arrived, request.body_size
        reason = too_slow(limits, now, since, head_done=bool(request.method), received=received)
        if reason is not None:
            self.server.shed(reason)
            self._refuse(errors.request_timeout("headers" if reason is Shed.HEADER_TIMEOUT else "body"))


#: The caps and deadlines when none are given (``ProxySettings``' defaults).
DEFAULT_LIMITS = Limits(
    max_connections=8192, max_per_client=1024, header_timeout=10.0, body_timeout=10.0, body_min_rate=8192.0
)


class HttpServer:
    """Listening, the set of open client connections, idle closing, and a graceful close."""

    def __init__(
        self, handler: Handler, *, max_body: int, idle_timeout: float = 75.0, limits: Limits = DEFAULT_LIMITS
    ) -> None:
        self.handler = handler
        self.max_body = max_body
        self.idle_timeout = idle_timeout
        self.limits = limits
        self.connections: set[ServerConnection] = set()
        self.admitted = 0  # connections served (not refused for the caps)
        self.per_client: dict[str, int] = {}  # of those, per client address
        self.shedding = 0  # connections refused for the caps, waiting for their head to be told 503
        self.shed_log = ShedLog()
        self.closing = False
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._all_closed: asyncio.Event | None = None

    async def start(self, host: str, port: int, *, reuse_port: bool = False, backlog: int = 1024) -> None:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ServerConnection(self), host, port, backlog=backlog, reuse_port=reuse_port or None
        )
        self._sweeper = loop.call_later(1.0, self._sweep)

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return int(self._server.sockets[0].getsockname()[1])

    def _sweep(self) -> None:
        now = time.monotonic()
        idle_timeout, limits = self.idle_timeout, self.limits
        for conn in list(self.connections):
            conn.sweep(now, idle_timeout, limits)
        PROXY_OPEN_CONNECTIONS.set(self.admitted)
        self._log_shed(self.shed_log.due(now))
        self._sweeper = asyncio.get_running_loop().call_later(1.0, self._sweep)

    def shed(self, reason: Shed) -> None:
        """Count a connection or request shed (the metric at once, a log line at most every 10 s)."""
        PROXY_SHED.labels(reason=reason.value).inc()
        self._log_shed(self.shed_log.shed(reason, time.monotonic()))

    def _log_shed(self, counts: dict[Shed, int] | None) -> None:
        if counts:
            log.warning(
                "shedding connections and slow requests",
                extra={
                    **{f"shed_{reason.value}": count for reason, count in counts.items()},
                    "open_connections": self.admitted,
                    "max_connections": self.limits.max_connections,
                },
            )

    def connection_closed(self) -> None:
        if self._all_closed is not None and not self.connections:
            self._all_closed.set()

    def stop_listening(self) -> None:
        """Accept no new connection; answers from now on say ``Connection: close``."""
        self.closing = True
        if self._server is not None:
            self._server.close()
        now = time.monotonic()
        for conn in list(self.connections):
            conn.close_if_idle(now, self.idle_timeout)

    async def close(self, *, grace: float) -> None:
        """Wait (at most ``grace`` seconds) for the answers in progress, then cut what is left."""
        self.stop_listening()
        if self.connections:
            self._all_closed = asyncio.Event()
            try:
                async with asyncio.timeout(grace):
                    await self._all_closed.wait()
            except TimeoutError:
                log.warning("cutting connections still busy at shutdown", extra={"connections": len(self.connections)})
                for conn in list(self.connections):
                    conn.abort()
        if self._sweeper is not None:
            self._sweeper.cancel()
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None
