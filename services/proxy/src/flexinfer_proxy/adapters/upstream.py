"""Forwarding a request to a model server and streaming its answer back, with one shared keep-alive pool.

Status, headers and body pass through unchanged (bytes are never decompressed or re-encoded); hop-by-hop headers
are dropped. The body streams chunk by chunk, so server-sent events reach the client as the model writes them.
A connection failure before the answer starts becomes a 502 ``upstream_unavailable``; a failure after it started
can only cut the client's connection (the status line is already out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web
from multidict import CIMultiDict
from yarl import URL

from flexinfer_common.logs import get_logger
from flexinfer_proxy.domain.errors import upstream_unavailable
from flexinfer_proxy.domain.requests import connection_tokens, forwardable

log = get_logger("flexinfer.proxy.upstream")

_DROP_FROM_REQUEST = frozenset({"host"})
_DROP_FROM_BUFFERED_REQUEST = frozenset({"host", "content-length"})
_DROP_FROM_RESPONSE: frozenset[str] = frozenset()

OnSent = Callable[[], None]


async def _on_request_headers_sent(
    _session: aiohttp.ClientSession, context: SimpleNamespace, _params: aiohttp.TraceRequestHeadersSentParams
) -> None:
    callback = context.trace_request_ctx
    if callback is not None:
        callback()


def describe(exc: BaseException) -> str:
    """A short reason for a 502: the error class and its text."""
    text = str(exc) or exc.__class__.__name__
    return f"{exc.__class__.__name__}: {text}" if text != exc.__class__.__name__ else text


class Upstream:
    """The HTTP client side of the proxy. ``await start()`` inside the event loop, ``await close()`` at the end.

    Two sessions: the hot one has no tracing at all; the second, used only for requests released from a queue,
    reports when a request's headers went out, so the next waiter is released only after it (arrival order).
    """

    def __init__(self, *, connections: int, connect_timeout: float) -> None:
        self._connections = connections
        self._timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout, sock_read=None)
        self._session: aiohttp.ClientSession | None = None
        self._drain_session: aiohttp.ClientSession | None = None

    def _new_session(self, *, traced: bool) -> aiohttp.ClientSession:
        trace_configs = None
        if traced:
            trace = aiohttp.TraceConfig()
            trace.on_request_headers_sent.append(_on_request_headers_sent)
            trace_configs = [trace]
        return aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(
                limit=self._connections, limit_per_host=0, keepalive_timeout=30, ttl_dns_cache=30
            ),
            timeout=self._timeout,
            auto_decompress=False,  # pass bytes through with their Content-Encoding
            skip_auto_headers=("User-Agent", "Accept-Encoding", "Content-Type"),  # send only what the client sent
            cookie_jar=aiohttp.DummyCookieJar(),  # never carry one client's cookies to another
            trace_configs=trace_configs,
        )

    async def start(self) -> None:
        if self._session is None:
            self._session = self._new_session(traced=False)
            self._drain_session = self._new_session(traced=True)

    async def close(self) -> None:
        for session in (self._session, self._drain_session):
            if session is not None:
                await session.close()
        self._session = self._drain_session = None

    async def forward(
        self,
        request: web.BaseRequest,
        *,
        url: URL,
        model: str,
        body: bytes | None = None,
        extra_headers: Sequence[tuple[str, str]] = (),
        on_sent: OnSent | None = None,
    ) -> web.StreamResponse:
        """Send ``request`` (with ``body`` when already read, else its stream) to ``url``; stream the answer back.

        ``on_sent`` is called once the request headers went out (or the attempt failed), whichever comes first.
        """
        session = self._session if on_sent is None else self._drain_session
        if session is None:
            raise RuntimeError("Upstream.start() was not awaited")
        incoming = request.headers
        drop = _DROP_FROM_REQUEST if body is None else _DROP_FROM_BUFFERED_REQUEST
        hop = incoming.get("Connection")
        if hop:
            drop = drop | connection_tokens(hop)
        headers = CIMultiDict(forwardable(incoming.items(), drop=drop))
        data: Any = body if body is not None else (request.content if request.body_exists else None)
        try:
            upstream = await session.request(
                request.method,
                url,
                headers=headers,
                data=data,
                allow_redirects=False,
                trace_request_ctx=on_sent,
            )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise upstream_unavailable(model, describe(exc)) from None
        finally:
            if on_sent is not None:
                on_sent()
        try:
            response = await self._relay(request, upstream, extra_headers)
        except BaseException:  # the client left (cancelled) or writing failed: stop the model's work too
            upstream.close()
            raise
        upstream.release()
        return response

    async def _relay(
        self, request: web.BaseRequest, upstream: aiohttp.ClientResponse, extra_headers: Sequence[tuple[str, str]]
    ) -> web.StreamResponse:
        response = web.StreamResponse(status=upstream.status, reason=upstream.reason)
        drop = _DROP_FROM_RESPONSE
        hop = upstream.headers.get("Connection")
        if hop:
            drop = drop | connection_tokens(hop)
        response.headers.extend(forwardable(upstream.headers.items(), drop=drop))
        if extra_headers:
            response.headers.extend(extra_headers)
        await response.prepare(request)
        try:
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
        except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError, OSError, TimeoutError) as exc:
            # Too late for an error status: cut both connections so the client sees a truncated answer, not a
            # complete-looking one.
            upstream.close()
            transport = request.transport
            if transport is None or transport.is_closing():
                log.debug("client left mid-response", extra={"url": str(upstream.url)})
            else:
                log.warning("model stream broke mid-response", extra={"url": str(upstream.url), "error": describe(exc)})
                transport.close()
            return response
        await response.write_eof()
        return response
