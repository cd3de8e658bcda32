"""Forwarding a request to a model server and streaming its answer back (the lean client in ``http1``).

Status, headers and body pass through unchanged (bytes are never decompressed or re-encoded); hop-by-hop headers
are dropped both ways. The body streams chunk by chunk, so server-sent events reach the client as the model writes
them, and a slow client slows the reading from the model (backpressure) instead of filling memory.

Failures:

- The answer never started (connect refused, connection reset or closed first): the request is tried once more
  when that is safe (``domain.requests.retry_safe``: GET/HEAD/OPTIONS without a streamed body, and
  ``POST /v1/embeddings`` whose body the proxy holds), else, and after a second failure, 502 ``upstream_unavailable``
  naming the reason. When connecting failed (nothing was sent) that 502 is a ``NeverConnected``: the handler may
  queue the request again instead (``domain.admission.after_connect_failure``).
- The answer started and then broke: too late for a status, so both connections are cut and the client sees a
  truncated answer, never a complete-looking one.
- The client left (its handler is cancelled): the model connection is closed, so the model can stop generating.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from aiohttp import web
from aiohttp.streams import StreamReader

from flexinfer_common.logs import get_logger
from flexinfer_proxy.adapters.http1 import Answer, Http1Client, UpstreamConnectionError, UpstreamStreamError
from flexinfer_proxy.domain.errors import upstream_never_connected, upstream_unavailable
from flexinfer_proxy.domain.requests import (
    Endpoint,
    forwardable_raw,
    parse_endpoint,
    raw_connection_tokens,
)

log = get_logger("flexinfer.proxy.upstream")

#: Request headers the proxy sets itself (Host, the body framing) or handles itself (Expect: 100-continue).
_DROP_FROM_REQUEST = frozenset({b"host", b"content-length", b"expect"})
_DROP_FROM_RESPONSE: frozenset[bytes] = frozenset()

OnSent = Callable[[], None]


class Upstream:
    """The client side of the proxy. ``await start()`` inside the event loop, ``await close()`` at the end."""

    def __init__(self, *, connections: int, connect_timeout: float, keepalive_timeout: float = 4.0) -> None:
        self._connections = connections
        self._connect_timeout = connect_timeout
        self._keepalive = keepalive_timeout
        self._client: Http1Client | None = None
        self._endpoints: dict[str, Endpoint] = {}

    async def start(self) -> None:
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

    def endpoint(self, url: str) -> Endpoint:
        endpoint = self._endpoints.get(url)
        if endpoint is None:
            if len(self._endpoints) > 4096:  # endpoints change with every load: keep the cache small
                self._endpoints.clear()
            endpoint = self._endpoints[url] = parse_endpoint(url)
        return endpoint

    async def forward(
        self,
        request: web.BaseRequest,
        *,
        endpoint: str,
        target: str,
        model: str,
        body: bytes | None = None,
        retry: bool = False,
        extra_headers: Sequence[tuple[str, str]] = (),
        on_sent: OnSent | None = None,
    ) -> web.StreamResponse:
        """Send ``request`` (with ``body`` when already read, else its stream) to ``endpoint`` + ``target``; stream
        the answer back. ``retry``: the request may be sent a second time if the answer never started.

        ``on_sent`` is called once the request head went out (or the attempt failed), whichever comes first.
        """
        client = self._client
        if client is None:
            raise RuntimeError("Upstream.start() was not awaited")
        try:
            where = self.endpoint(endpoint)
        except ValueError as exc:
            raise upstream_unavailable(model, str(exc)) from None
        raw = request.raw_headers
        drop = _DROP_FROM_REQUEST
        for name, value in raw:
            if len(name) == 10 and name.lower() == b"connection":
                drop = drop | raw_connection_tokens(value)
        headers = forwardable_raw(raw, drop=drop)
        content_length: int | None = None
        payload: bytes | StreamReader | None = body
        if body is None and request.body_exists:
            payload = request.content
            content_length = request.content_length  # else (chunked upload) it goes on chunked
            retry = False  # a stream cannot be sent twice
        attempts = 2 if retry else 1
        for attempt in range(attempts):
            try:
                answer = await client.request(
                    request.method,
                    where.host,
                    where.port,
                    where.base_path + target if where.base_path else target,
                    headers,
                    payload.iter_any() if isinstance(payload, StreamReader) else payload,
                    content_length=content_length,
                    on_sent=on_sent,
                )
                break
            except UpstreamConnectionError as exc:
                if attempt + 1 < attempts:
                    log.debug("retrying after a connection error", extra={"model": model, "error": str(exc)})
                    continue
                if exc.never_connected:
                    raise upstream_never_connected(model, str(exc)) from None
                raise upstream_unavailable(model, str(exc)) from None
            except UpstreamStreamError as exc:
                raise upstream_unavailable(model, str(exc)) from None
        try:
            return await self._relay(request, answer, extra_headers)
        except BaseException:  # the client left (cancelled) or writing to it failed: stop the model's work too
            answer.close()
            raise

    @staticmethod
    async def _relay(
        request: web.BaseRequest, answer: Answer, extra_headers: Sequence[tuple[str, str]]
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=answer.status, reason=answer.reason)
        drop = _DROP_FROM_RESPONSE
        for name, value in answer.headers:
            if len(name) == 10 and name.lower() == b"connection":
                drop = drop | raw_connection_tokens(value)
        response.headers.extend(
            [
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in forwardable_raw(answer.headers, drop=drop)
            ]
        )
        if extra_headers:
            response.headers.extend(extra_headers)
        await response.prepare(request)
        try:
            if answer.body_complete():  # the usual small JSON answer: head and body in one write
                chunk = await answer.read()
                answer.release()
                await response.write_eof(chunk or b"")
                return response
            while (chunk := await answer.read()) is not None:
                await response.write(chunk)
        except UpstreamStreamError as exc:
            answer.close()
            transport = request.transport
            if transport is not None and not transport.is_closing():
                log.warning("model stream broke mid-response", extra={"error": str(exc)})
                transport.close()
            return response
        answer.release()
        await response.write_eof()
        return response
