"""Forwarding one request to a model and relaying its answer to the client, driven by protocol callbacks.

An ``Exchange`` joins a client request (``http_server.Request``) and a model connection (``http1``): it writes the
request with only the changes HTTP requires of a proxy (hop-by-hop headers and those named in ``Connection`` dropped,
``Host`` and the body framing set), and relays the answer's bytes as they arrive, one write per packet from the
model: the head as the model sent it less its hop-by-hop fields, the body with its framing unchanged (only an
HTTP/1.0 client gets a chunked body de-chunked; a body that ends when the model closes ends the client's connection
too). No task, future or timer is made per request when a pooled connection is free; connecting is the
only coroutine. Backpressure both ways: a client that cannot keep up pauses the reading from the model, a model
that does not read an upload pauses the reading from the client.

Failures:

- The answer never started (connect refused, connection reset or closed first): the request is tried once more
  when that is safe (``domain.requests.retry_safe``), else, and after a second failure, the exchange ends with 502
  ``upstream_unavailable`` naming the reason. When connecting failed (nothing was sent) that 502 is a
  ``NeverConnected``: the handler may queue the request again instead (``domain.admission.after_connect_failure``).
- The answer started and then broke: too late for a status, so the client connection is closed with the answer's
  framing unfinished, and the client sees a truncated answer, never a complete-looking one.
- The client left: the model connection is closed, so the model can stop generating.

``Forwarder`` owns the client pools and the per-model count of exchanges in flight (``in_flight``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from time import monotonic

from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import Route
from flexinfer_proxy.adapters.http1 import (
    Framing,
    Header,
    Http1Client,
    Pool,
    UpstreamConnection,
    UpstreamConnectionError,
    UpstreamStreamError,
    remember_head,
)
from flexinfer_proxy.adapters.http_server import Request, ServerConnection
from flexinfer_proxy.domain.errors import ProxyError, upstream_never_connected, upstream_unavailable
from flexinfer_proxy.domain.requests import Endpoint, parse_endpoint, relayed_head, retry_safe

log = get_logger("flexinfer.proxy.upstream")

#: Answer heads as relayed to a client whose connection stays open, with no field added (``relayed_head``), by
#: the head as the model sent it.
_RELAYED_HEADS: dict[bytes, bytes] = {}

# (Read per answer: looking an Enum member up on its class costs about 50 ns on CPython 3.11, a global 6 ns.)
_CHUNKED, _UNTIL_CLOSE = Framing.CHUNKED, Framing.UNTIL_CLOSE

#: Request fields that carry the proxy's own API key when FLEXINFER_PROXY_API_KEYS is set (never forwarded then).
_CREDENTIAL_FIELDS = frozenset({b"authorization", b"x-api-key"})

#: Methods whose empty body goes without a Content-Length (as clients send them).
_NO_BODY_METHODS = frozenset({b"GET", b"HEAD", b"OPTIONS", b"DELETE"})

#: ``on_done(exchange, error)``: the exchange ended. ``error`` is None when an answer was relayed (whole, or cut
#: after it began) or the client left (``exchange.client_left``); else nothing was answered and the caller answers
#: ``error`` (a ``NeverConnected`` may be queued again instead).
OnDone = Callable[["Exchange", ProxyError | None], None]
OnSent = Callable[[], None]


class Forwarder:
    """The client side of the proxy: model connection pools, endpoints, and the exchanges in flight per model.

    ``on_forward(key)`` is called as each exchange starts (the model is in use). ``start()`` inside the event loop,
    ``await close()`` at the end.
    """

    def __init__(
        self,
        *,
        connections: int,
        connect_timeout: float,
        keepalive_timeout: float = 4.0,
        on_forward: Callable[[ModelKey], None] | None = None,
    ) -> None:
        self._connections = connections
        self._on_forward = on_forward
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive_timeout
        self._client: Http1Client | None = None
        self._endpoints: dict[str, Endpoint] = {}
        self._in_flight: dict[ModelKey, int] = {}

    def start(self) -> None:
        if self._client is None:
            self._client = Http1Client(
                connections=self._connections,
                connect_timeout=self._connect_timeout,
                keepalive_timeout=self._keepalive,
            )

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        self._client = None

    def in_flight(self) -> dict[ModelKey, int]:
        """Requests being forwarded right now, per model (models with none are left out).

        Counted from the moment forwarding starts (connecting included) until the exchange ends: answered, failed,
        or its client left. This is what a drain waits for before a model may be parked.
        """
        return {key: count for key, count in self._in_flight.items() if count}

    def endpoint(self, url: str) -> Endpoint:
        """A route's endpoint taken apart (cached); ValueError when it is not a plain ``http://`` URL."""
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            if len(self._endpoints) > 4096:  # endpoints change with every load: keep the cache small
                self._endpoints.clear()
            endpoint = self._endpoints[url] = parse_endpoint(url)
        return endpoint

    def exchange(
        self,
        request: Request,
        key: ModelKey,
        route: Route,
        endpoint: Endpoint,
        path: bytes,
        body: bytes | None,
        on_done: OnDone,
        strip_authorization: bool = False,
        *,
        extra_headers: Sequence[Header] = (),
        on_sent: OnSent | None = None,
        kind: type[Exchange] | None = None,
    ) -> Exchange:
        """Start forwarding ``request`` to ``route``'s ``endpoint`` + ``path`` (with ``body`` when the proxy holds
        it, else its body streams); ``on_done`` is called once when it ends. ``on_sent`` runs once the request
        head went out (or the attempt failed before that). ``strip_authorization``: the client's credentials were
        the proxy's own API key, not the model's to see. ``kind``: an ``Exchange`` subclass to relay the answer
        differently (``keepalive.KeptAliveExchange``)."""
        client = self._client
        if client is None:
            raise RuntimeError("Forwarder.start() was not called")
        in_flight = self._in_flight
        in_flight[key] = in_flight.get(key, 0) + 1
        if self._on_forward is not None:
            self._on_forward(key)
        headers = request.headers
        if strip_authorization:  # (the proxy's API key: Authorization, or an Anthropic client's x-api-key)
            headers = [h for h in headers if h[0].lower() not in _CREDENTIAL_FIELDS]
        pool = client.pool(endpoint.host, endpoint.port)
        exchange = (Exchange if kind is None else kind)(
            self, pool, request, key, route, path, body, on_done, headers, extra_headers, on_sent
        )
        if endpoint.base_path:
            exchange.target = endpoint.base_path.encode() + path
        conn = pool.take()
        if conn is not None:
            exchange._send(conn)
        else:
            exchange.attempt()
        return exchange


class Exchange:
    """One request forwarded to a model and its answer relayed to the client (see the module docstring)."""

    __slots__ = (
        "_connecting",
        "_forwarder",
        "_head",
        "_on_done",
        "_on_sent",
        "_out",
        "_pool",
        "attempts_left",
        "body",
        "client_left",
        "close_after",
        "conn",
        "done",
        "extra_headers",
        "head_at",
        "headers",
        "key",
        "path",
        "request",
        "route",
        "server",
        "status",
        "streamed",
        "target",
        "upload_done",
    )

    def __init__(
        self,
        forwarder: Forwarder,
        pool: Pool,
        request: Request,
        key: ModelKey,
        route: Route,
        path: bytes,
        body: bytes | None,
        on_done: OnDone,
        headers: list[Header],
        extra_headers: Sequence[Header] = (),
        on_sent: OnSent | None = None,
    ) -> None:
        self._forwarder = forwarder
        self._pool = pool
        self.request = request
        self.server: ServerConnection = request.conn
        self.key = key
        self.route = route
        self.path = path  # as the model sees it, below the endpoint's base path
        self.target = path
        self.body = body
        self.streamed = streamed = body is None and (request.chunked or bool(request.content_length))  # (has_body)
        self.upload_done = not streamed
        self.attempts_left = 0  # decided at the first failure (``retry_safe``)
        self.headers = headers  # the end-to-end fields forwarded (``request.headers``, less the proxy's API key)
        self.extra_headers = extra_headers
        self._on_sent = on_sent
        self._on_done = on_done
        self._connecting: asyncio.Task[None] | None = None
        self._head: bytes | None = None
        self._out: list[bytes] | None = None  # de-chunked body pieces not written yet (an HTTP/1.0 client only)
        self.conn: UpstreamConnection | None = None
        self.status = 0
        self.head_at = 0.0  # when the model's answer head came (monotonic): the request's time to first byte
        self.close_after = False
        self.done = False
        self.client_left = False
        request.on_gone = self.client_gone
        request.on_pause = self.client_paused

    # --- sending ---

    def attempt(self) -> None:
        conn = self._pool.take()
        if conn is not None:
            self._send(conn)
        else:
            self._connecting = asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        try:
            conn = await self._pool.client.connect(self._pool)
        except UpstreamConnectionError as exc:
            self._connecting = None
            self.upstream_failed(exc)
            return
        self._connecting = None
        if self.done:  # the client left meanwhile: the fresh connection is idle, keep it
            conn.release()
            return
        self._send(conn)

    def _send(self, conn: UpstreamConnection) -> None:
        """Write the request on ``conn`` (the answer comes to this exchange)."""
        self.conn = conn
        request = self.request
        method = request.method
        # (Only an HTTP/1.0 client gets a chunked answer de-chunked: see ``answer_head``.)
        conn.begin(self, method == b"HEAD", request.version != "1.1")  # (positional: a cheaper call)
        body = self.body
        if body is not None:
            length = len(body) if body or method not in _NO_BODY_METHODS else None
            chunked = False
        else:
            length = request.content_length if self.streamed else None
            chunked = self.streamed and request.chunked
        # ``request_head`` inlined (once per request), with the body joined into the same write.
        pieces = [method, b" ", self.target, b" HTTP/1.1\r\nHost: ", self._pool.host_header]
        for name, value in self.headers:
            pieces += (b"\r\n", name, b": ", value)
        if chunked:
            pieces.append(b"\r\nTransfer-Encoding: chunked\r\n\r\n")
        elif length is not None:
            pieces.append(b"\r\nContent-Length: %d\r\n\r\n" % length)
        else:
            pieces.append(b"\r\n\r\n")
        if body:
            pieces.append(body)
        transport = conn.transport
        assert transport is not None  # (just taken from the pool, or connected)
        transport.write(b"".join(pieces))
        if self._on_sent is not None:
            self._sent()
        if self.server.writing_paused:
            conn.pause_reading()
        if self.streamed:
            request.attach(self)

    def _sent(self) -> None:
        on_sent = self._on_sent
        if on_sent is not None:
            self._on_sent = None
            on_sent()

    # --- the streamed upload (BodySink) ---

    def body_piece(self, data: bytes) -> None:
        conn = self.conn
        if conn is None or self.done:
            return
        conn.write(b"%x\r\n%s\r\n" % (len(data), data) if self.request.chunked else data)
        if not conn.writable:
            self.server.pause_reading()

    def body_end(self) -> None:
        conn = self.conn
        if conn is None or self.done:
            return
        if self.request.chunked:
            conn.write(b"0\r\n\r\n")
        self.upload_done = True

    def upstream_writable(self, writable: bool) -> None:
        if self.streamed and not self.upload_done:
            if writable:
                self.server.resume_reading()
            else:
                self.server.pause_reading()

    # --- the answer (AnswerSink) ---

    def answer_head(self, status: int, head: bytes, framing: Framing) -> bool:
        self.status = status
        self.head_at = monotonic()
        request = self.request
        server = self.server  # (``will_close`` inlined)
        close = not request.keep_alive or server.server.closing or server.refusing
        dechunk = False
        if framing is _UNTIL_CLOSE:
            close = True  # the client, too, learns where the body ends from the connection closing
        elif framing is _CHUNKED and request.version != "1.1":
            dechunk = close = True  # an HTTP/1.0 client does not read chunked framing
        self.close_after = close
        if close or self.extra_headers:
            self._head = relayed_head(head, self.extra_headers, keep_framing=not dechunk, close=close)
            return dechunk
        # The usual answer: its head relayed as another answer with the same head was (see ``http1._FRAMINGS``).
        relayed = _RELAYED_HEADS.get(head)
        if relayed is None:
            relayed = relayed_head(head)
            remember_head(_RELAYED_HEADS, head, relayed)
        self._head = relayed
        return False

    def answer_body(self, data: bytes) -> None:
        if self._out is None:
            self._out = []
        self._out.append(data)

    def answer_flush(self, data: bytes, *, complete: bool) -> None:
        if self.done:
            return
        head = self._head
        if head is not None:  # the head goes out with the first body bytes, in one write
            self._head = None
            self.request.answering = True
            data = head + data if data else head
        if self._out:
            data += b"".join(self._out)
            self._out = None
        if data:
            server = self.server  # (``ServerConnection.write`` inlined: once or more per answer)
            if not server.closed and server.transport is not None:
                server.transport.write(data)
        if complete:
            self._release_conn()
            request = self.request
            if self.close_after:
                request.keep_alive = False
            self._end(None)

    def _release_conn(self) -> None:
        """The answer is complete: done with the model connection (back to its pool, or closed)."""
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.release(request_sent=self.upload_done)

    def upstream_failed(self, error: UpstreamConnectionError | UpstreamStreamError) -> None:
        if self.done:
            return
        self.conn = None
        request = self.request
        self._head = None
        self._out = None
        if request.answering:
            # Too late for a status: the client's connection closes with the answer's framing unfinished, so it
            # cannot take the cut answer for a complete one.
            log.warning("model stream broke mid-response", extra={"model": str(self.key), "error": str(error)})
            request.keep_alive = False
            self._end(None)
            return
        model = str(self.key)
        if isinstance(error, UpstreamConnectionError):
            if self.attempts_left == 0:  # the first failure: may it be sent once more?
                retry = not self.streamed and retry_safe(  # (a stream cannot be sent twice)
                    request.method.decode("latin-1"), self.path.decode("latin-1"), body_held=True
                )
                self.attempts_left = 2 if retry else 1
            self.attempts_left -= 1
            if self.attempts_left > 0:
                log.debug("retrying after a connection error", extra={"model": model, "error": str(error)})
                self.attempt()
                return
            failure: ProxyError = (
                upstream_never_connected(model, str(error))
                if error.never_connected
                else upstream_unavailable(model, str(error))
            )
        else:
            failure = upstream_unavailable(model, str(error))
        self._sent()
        self._end(failure)

    # --- the client ---

    def client_gone(self) -> None:
        """The client left (or its request was cut short): stop the model's work too."""
        if self.done:
            return
        self.client_left = True
        if self._connecting is not None:
            self._connecting.cancel()
            self._connecting = None
        conn = self.conn
        self.conn = None
        if conn is not None:
            conn.abandon()
        self._sent()
        self._end(None)

    def client_paused(self, paused: bool) -> None:
        conn = self.conn
        if conn is not None:
            if paused:
                conn.pause_reading()
            else:
                conn.resume_reading()

    def _end(self, error: ProxyError | None) -> None:
        self.done = True
        request = self.request
        request.sink = request.on_gone = request.on_pause = None
        in_flight = self._forwarder._in_flight
        key = self.key
        count = in_flight[key] - 1
        if count:
            in_flight[key] = count
        else:
            del in_flight[key]
        self._on_done(self, error)
