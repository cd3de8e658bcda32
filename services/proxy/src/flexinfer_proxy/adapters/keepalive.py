"""Waiting streams kept alive: a ``stream: true`` request that waits for its model gets SSE comment lines.

Clients with a read timeout (the OpenAI and Anthropic SDKs, browsers' ``EventSource``) would give up during a load
that takes longer. So once such a request has waited ``interval`` seconds, the proxy answers it early: the head
``200`` ``text/event-stream`` (chunked) goes out, then a comment line every ``interval`` seconds
(``: waiting for chat-small, loading, 12 s``), which SSE clients ignore. A wait shorter than ``interval`` is not
touched: the client gets the model's own head as usual.

Once that head went out, the status is spent, so:

- the model's answer becomes the rest of the event stream (``KeptAliveExchange``): a 200 chunked body is relayed as
  it comes (its chunks continue the stream), any other 200 body is chunked on the way; a wait comment
  ``: queue-wait-ms <n>`` comes first (the ``X-FlexInfer-Queue-Wait-Ms`` header could not be sent);
- an error (the model answered 4xx/5xx, the wait ended in 504/503/404, the model could not be reached) becomes one
  SSE error event in the API's own shape, then the stream ends cleanly (the last chunk): the OpenAI shape
  ``data: {"error": {"message", "type", "code"}}`` (the openai SDK raises it as an ``APIError``), or on
  ``/v1/messages`` Anthropic's ``event: error`` with ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from time import monotonic

from flexinfer_proxy.adapters.forwarding import Exchange
from flexinfer_proxy.adapters.http1 import Framing, UpstreamConnection, UpstreamConnectionError, UpstreamStreamError
from flexinfer_proxy.adapters.http_server import Request
from flexinfer_proxy.domain.errors import ProxyError

#: The most of a model's error body kept to quote in the error event.
ERROR_BODY_MAX = 64 * 1024

_RELAY, _WRAP, _ERROR = 0, 1, 2


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def error_event(path: bytes, status: int, code: str, message: str, type_: str) -> bytes:
    """One SSE error event in the shape of the API at ``path``."""
    if path.startswith(b"/v1/messages"):
        kind = "invalid_request_error" if status < 500 else "api_error"
        if status in (429, 503, 529):
            kind = "overloaded_error"
        payload = {"type": "error", "error": {"type": kind, "message": message}}
        return b"event: error\ndata: " + json.dumps(payload).encode() + b"\n\n"
    payload = {"error": {"message": message, "type": type_, "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


class StreamKeepAlive:
    """The early head and the comment lines of one waiting stream (see the module docstring)."""

    def __init__(
        self,
        request: Request,
        *,
        model: str,
        interval: float,
        phase: Callable[[], str],
        since: float,
    ) -> None:
        self.request = request
        self.model = model
        self.interval = interval
        self.phase = phase
        self.since = since
        self.started = False  # the 200 head went out
        self._timer: asyncio.TimerHandle | None = None
        self.resume()

    def resume(self) -> None:
        """Tick every ``interval`` seconds (again)."""
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.interval, self._tick)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _tick(self) -> None:
        self._timer = None
        request = self.request
        conn = request.conn
        if request.finished or conn.closed:
            return
        if not self.started:
            self.started = True
            request.answering = True  # too late for a status from now on
            head = [
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
                b"X-FlexInfer-Cold-Start: true\r\nTransfer-Encoding: chunked\r\n"
            ]
            if conn.will_close(request):
                head.append(b"Connection: close\r\n")
            head.append(b"\r\n")
            conn.write(b"".join(head))
        waited = int(monotonic() - self.since)
        conn.write(chunk(f": waiting for {self.model}, {self.phase()}, {waited} s\n\n".encode()))
        self.resume()

    def waited(self, waited_ms: int) -> None:
        """The wait is over: say how long it was (as a comment: the header could not be sent)."""
        self.request.conn.write(chunk(b": queue-wait-ms %d\n\n" % waited_ms))

    def fail(self, error: ProxyError, path: bytes) -> None:
        """End the stream with ``error`` as an event, cleanly."""
        self.stop()
        request = self.request
        event = error_event(path, error.status, error.code.value, error.message, error.type.value)
        request.conn.write(chunk(event) + b"0\r\n\r\n")
        request.conn.finish(request)


class KeptAliveExchange(Exchange):
    """An exchange whose client already has a 200 event-stream head: the answer continues that stream."""

    __slots__ = ("_error_body", "_mode")

    def _send(self, conn: UpstreamConnection) -> None:
        self._mode = _RELAY
        self._error_body: list[bytes] = []
        super()._send(conn)
        # (Again, with de-chunking: a body that is not a chunked 200 is re-framed. Nothing was read yet.)
        conn.begin(self, False, True)

    def answer_head(self, status: int, head: bytes, framing: Framing) -> bool:
        self.status = status
        self.head_at = monotonic()
        self.close_after = False  # the stream's framing is the proxy's own: it ends cleanly either way
        self._head = None
        if status == 200 and framing is Framing.CHUNKED:
            self._mode = _RELAY
            return False
        self._mode = _WRAP if status == 200 else _ERROR
        return True

    def answer_flush(self, data: bytes, *, complete: bool) -> None:
        if self.done:
            return
        mode = self._mode
        pieces, self._out = self._out or [], None
        if mode == _RELAY:
            out = data
        elif mode == _WRAP:
            out = b"".join(chunk(piece) for piece in pieces if piece)
            if complete:
                out += b"0\r\n\r\n"
        else:
            if sum(map(len, self._error_body)) < ERROR_BODY_MAX:
                self._error_body += pieces
            out = self._model_error() + b"0\r\n\r\n" if complete else b""
        if out:
            self.server.write(out)
        if complete:
            self._release_conn()
            self._end(None)

    def _model_error(self) -> bytes:
        """The model's error answer as an event: its own message when it sent the OpenAI shape."""
        raw = b"".join(self._error_body)[:ERROR_BODY_MAX]
        message = raw.decode("utf-8", "replace").strip() or f"the model answered {self.status}"
        code, type_ = "upstream_error", "server_error" if self.status >= 500 else "invalid_request_error"
        try:
            given = json.loads(raw)
            error = given.get("error") if isinstance(given, dict) else None
            if isinstance(error, dict) and isinstance(error.get("message"), str):
                message = error["message"]
                code = str(error.get("code") or code)
                type_ = str(error.get("type") or type_)
        except ValueError:
            pass
        return chunk(error_event(self.path, self.status, code, f"{message} (HTTP {self.status})", type_))

    def upstream_failed(self, error: UpstreamConnectionError | UpstreamStreamError) -> None:
        if self.status == 0 and not self.done:
            # The model's answer never started: fail (or retry) as if no head had gone out, so the handler ends
            # the stream with an error event (or queues the request again after a refused connect).
            request = self.request
            request.answering = False
            try:
                super().upstream_failed(error)
            finally:
                request.answering = True
            return
        super().upstream_failed(error)
