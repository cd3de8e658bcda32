"""The proxy's request handler: it dispatches on the path, admits, queues and forwards. No framework routing.

| path | |
|---|---|
| ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` (any ``POST /v1/...``) | model from the body |
| ``POST /v1/audio/...``, ``/v1/images/...`` as ``multipart/form-data`` | model from the form field, body streamed |
| ``GET /v1/models``, ``GET /v1/models/{model}`` | every managed model, OpenAI-style, plus namespace/state/ready, |
| | and every service label as an alias (``alias_of``: the model a request for it goes to now) |
| ``/{namespace}/{model}/<path>`` | any method, forwarded to the model as ``<path>`` (query kept) |
| ``GET /api/v1/queues`` | waiting requests per model (bearer token when FLEXINFER_ADMIN_TOKEN is set) |
| ``/healthz``, ``/readyz``, ``/metrics`` | operations |

Two paths, chosen per request:

- **Fast**: the model is Ready and nobody waits for it. Everything happens in the server's protocol callbacks: the
  body is parsed once (for ``model``), resolved with dictionary lookups, and the original bytes are forwarded
  (``adapters.forwarding``); the answer is counted in a plain dict (``tally``). No task, no log line.
- **Waiting** (a coroutine per request): the route snapshot is not loaded yet, the model is not Ready, others wait
  before it, or connecting to it failed (a dead endpoint): queue, signal demand, forward when it is the request's
  turn with ``X-FlexInfer-Queue-Wait-Ms`` and ``X-FlexInfer-Cold-Start``, answer 429/503/504 as its wait ends.

A client that leaves stops what is done for it: the wait (it leaves the queue and its demand), or the forwarding
(the model connection is closed).

A ``stream: true`` request that waits longer than ``stream_keepalive`` seconds gets its head early and SSE comments
until its answer (``adapters.keepalive``); its errors are then events, not statuses (``_answer_error``). A multipart
body (``/v1/audio/...``, ``/v1/images/...``) is read only up to its ``model`` field (``_FormModel``), then streamed.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from time import monotonic
from typing import Any
from urllib.parse import unquote

import httptools

from flexinfer_common.auth import bearer_matches
from flexinfer_common.errors import ErrorCode
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import Route
from flexinfer_common.tasks import cancel_and_wait
from flexinfer_proxy.adapters.forwarding import Exchange, Forwarder
from flexinfer_proxy.adapters.http_server import Request
from flexinfer_proxy.adapters.keepalive import KeptAliveExchange, StreamKeepAlive
from flexinfer_proxy.domain import errors
from flexinfer_proxy.domain.admission import (
    Admission,
    ConnectFailure,
    Refusal,
    admit,
    after_connect_failure,
    forward_now,
)
from flexinfer_proxy.domain.errors import NeverConnected, ProxyError
from flexinfer_proxy.domain.multipart import ModelField, multipart_boundary, no_model
from flexinfer_proxy.domain.requests import ApiKeys, Endpoint, model_of, prefixed_target
from flexinfer_proxy.domain.routes import Resolved, ResolvedBy, RouteTable
from flexinfer_proxy.metrics import PROXY_COLD_STARTS
from flexinfer_proxy.queues import ModelQueues, Slot
from flexinfer_proxy.tally import RequestTally, render_metrics

log = get_logger("flexinfer.proxy.api")

QUEUE_WAIT_HEADER = b"X-FlexInfer-Queue-Wait-Ms"
COLD_START_HEADER = b"X-FlexInfer-Cold-Start"

ReadinessCheck = Callable[[], dict[str, bool]]


def json_body(payload: Any) -> bytes:
    return json.dumps(payload).encode()


class ProxyHandler:
    def __init__(
        self,
        *,
        routes: RouteTable,
        queues: ModelQueues,
        forwarder: Forwarder,
        tally: RequestTally,
        routes_loaded: asyncio.Event,
        readiness: ReadinessCheck,
        default_namespace: str,
        queue_max: int,
        queue_timeout: float,
        retry_after: int,
        admin_token: str | None,
        api_keys: ApiKeys | None = None,
        queued_bytes_max: int | None = None,
        suspect_for: float = 2.0,
        stream_keepalive: float = 0.0,
        monotonic: Callable[[], float] = time.monotonic,
        routes_caught_up: Callable[[], Awaitable[bool]] | None = None,
    ) -> None:
        self._routes = routes
        # a request for a model the table does not hold waits for the route watch to catch up before its 404
        self._caught_up = routes_caught_up
        self._queues = queues
        self._forwarder = forwarder
        self._tally = tally
        self._loaded = routes_loaded
        self._readiness = readiness
        self._namespace = default_namespace
        self._queue_max = queue_max
        self._queue_timeout = queue_timeout
        self._retry_after = retry_after
        self._admin_token = admin_token.encode() if admin_token else None
        self._api_keys = api_keys
        self._queued_bytes_max = queued_bytes_max
        self._suspect_for = suspect_for
        self._stream_keepalive = stream_keepalive  # seconds between comment lines for waiting streams (0: none)
        self._kept_alive: dict[Request, StreamKeepAlive] = {}
        self._monotonic = monotonic
        self._tasks: set[asyncio.Task[None]] = set()
        self._resolved: dict[str, tuple[ModelKey, Route, Endpoint | None]] = {}
        self._resolved_at = -1
        self.shutting_down = False

    # --- the server's two calls ---

    def head(self, request: Request) -> bool:
        """Dispatch on the path once the head is complete; False: a ``/v1`` POST whose body comes to ``request``."""
        try:
            target = request.url
            if target[:1] != b"/":  # (the usual origin form needs no call)
                target = request.url = _origin_target(target)
            if target[:4] == b"/v1/" and target.find(b"%") < 0:  # (``find``: see ``framing_of``)
                if self._api_keys is not None and not self._api_keys.allows(request.authorization):
                    self._check_api_key(request)  # (an Anthropic client's ``x-api-key``)
                if request.method == b"POST":
                    prefix = target[:10]
                    if prefix != b"/v1/models":
                        if prefix != b"/v1/audio/" and prefix != b"/v1/images":
                            return False  # the body is collected, then ``request``
                        return self._form(request, target)
            return self._dispatch(request, target)
        except ProxyError as error:
            request.conn.respond_error(request, error)
        except Exception:
            log.exception("request failed", extra={"method": request.method.decode("latin-1")})
            request.conn.respond_error(request, errors.internal_error())
        return True

    def request(self, request: Request) -> None:
        """A ``/v1`` POST with its whole body: find ``model`` in it, then forward or queue."""
        key: ModelKey | None = None
        try:
            body = request.body
            model = model_of(body)
            target = request.url
            # A cached resolution means the snapshot was loaded (``_resolve`` runs only then, and it stays loaded).
            hit = self._resolved.get(model) if self._routes.version == self._resolved_at else None
            if hit is None:
                self._serve_model(request, model, target, body)
                return
            key, route, endpoint = hit
            if endpoint is not None and route.ready and not self._queues.length(key):
                # ``_forward_or_queue``'s fast path (``forward_now``) inlined for the usual request.
                self._forwarder.exchange(
                    request, key, route, endpoint, target, body, self._forwarded, self._api_keys is not None
                )
            else:
                self._forward_or_queue(request, key, route, endpoint, target, body)
        except ProxyError as error:
            self._answer_error(request, key, error)
        except Exception:
            log.exception("request failed", extra={"path": request.url.decode("latin-1", "replace")[:200]})
            self._answer_error(request, key, errors.internal_error())

    def _form(self, request: Request, target: bytes) -> bool:
        """A ``/v1/audio/...`` or ``/v1/images/...`` POST: a ``multipart/form-data`` body is read only up to its
        ``model`` field, then streamed on (``_FormModel``); any other body is collected for ``request`` (False)."""
        content_type = None
        for name, value in request.headers:
            if name.lower() == b"content-type":
                content_type = value
                break
        boundary = multipart_boundary(content_type)
        if boundary is None:
            return False
        if not request.has_body:
            raise no_model()
        request.attach(_FormModel(self, request, target, ModelField(boundary)))
        return True

    def serve_streamed(self, request: Request, model: str, target: bytes) -> None:
        """Forward or queue a request whose body streams (what arrived of it is in ``request.parts``)."""
        self._serve_model(request, model, target, None)

    def _serve_model(self, request: Request, model: str, target: bytes, body: bytes | None) -> None:
        """Forward or queue a request for ``model`` (not resolved yet)."""
        key: ModelKey | None = None
        try:
            if not self._loaded.is_set():
                self._wait(request, self._serve_when(self._wait_for_routes, request, model, target, body))
                return
            hit = self._resolve_or_wait(request, model, target, body)
            if hit is None:
                return
            key, route, endpoint = hit
            self._forward_or_queue(request, key, route, endpoint, target, body)
        except ProxyError as error:
            self._answer_error(request, key, error)

    def _resolve_or_wait(
        self, request: Request, model: str, target: bytes, body: bytes | None
    ) -> tuple[ModelKey, Route, Endpoint | None] | None:
        """``_resolve``; for a model the table does not hold, None: the request goes on once the route watch has
        caught up with the bucket (a model applied a moment ago is then found; an unknown one gets its 404)."""
        try:
            return self._resolve(model)
        except ProxyError as error:
            if error.code is not ErrorCode.MODEL_NOT_FOUND or self._caught_up is None:
                raise
            caught_up = self._caught_up
        self._wait(request, self._serve_when(caught_up, request, model, target, body))
        return None

    def _resolve(self, model: str) -> tuple[ModelKey, Route, Endpoint | None]:
        """The model a request names, its route, and where a Ready one listens; cached until the table changes."""
        routes = self._routes
        if routes.version != self._resolved_at:
            self._resolved.clear()
            self._resolved_at = routes.version
        hit = self._resolved.get(model)
        if hit is None:
            resolved = routes.resolve(model, default_namespace=self._namespace)
            endpoint = self._endpoint(resolved.key, resolved.route) if resolved.route.ready else None
            hit = (resolved.key, resolved.route, endpoint)
            if len(self._resolved) < 4096:
                self._resolved[model] = hit
        return hit

    # --- dispatch ---

    def _dispatch(self, request: Request, target: bytes) -> bool:
        raw_path = target.partition(b"?")[0]
        path = unquote(raw_path.decode("utf-8", "replace")) if b"%" in raw_path else raw_path.decode("latin-1")
        method = request.method
        conn = request.conn
        if path.startswith("/v1/"):
            self._check_api_key(request)  # (again, for a path that was encoded)
            if path == "/v1/models" or path.startswith("/v1/models/"):
                if method != b"GET":
                    raise errors.method_not_allowed(method.decode(), path)
                model = path[len("/v1/models/") :] if path != "/v1/models" else None
                if not self._loaded.is_set():
                    self._wait(request, self._models_when_loaded(request, model))
                else:
                    conn.respond(request, 200, self._models(model))
                return True
            if method != b"POST":
                raise errors.method_not_allowed(method.decode(), path)
            return False  # the body is collected, then ``request``
        if path.startswith("/api/"):
            self._authorize(request)
            if path == "/api/v1/queues":
                if method != b"GET":
                    raise errors.method_not_allowed(method.decode(), path)
                conn.respond(request, 200, self._queue_list())
                return True
            raise errors.path_not_found(path)
        if path == "/healthz":
            conn.respond(request, 200, b'{"status": "ok"}')
            return True
        if path == "/readyz":
            checks = self._readiness()
            ready = checks.get("routes", False) and not self.shutting_down
            conn.respond(request, 200 if ready else 503, json_body({"ready": ready, "checks": checks}))
            return True
        if path == "/metrics":
            self._tally.flush()
            body, content_type = render_metrics()
            conn.respond(request, 200, body, content_type=content_type.encode())
            return True
        prefixed = prefixed_target(target.decode("latin-1"))
        names = path.split("/", 3)
        if prefixed is None or len(names) < 3 or not names[1] or not names[2]:
            raise errors.path_not_found(path)
        self._check_api_key(request)
        # Names from the decoded path; the rest is forwarded exactly as the client encoded it.
        model = f"{names[1]}/{names[2]}"
        # as a /v1 request: a model applied a moment ago is found once the route watch caught up, not 404 at once
        self._serve_model(request, model, prefixed[2].encode("latin-1"), None)
        return True

    def _forward_or_queue(
        self,
        request: Request,
        key: ModelKey,
        route: Route,
        endpoint: Endpoint | None,
        target: bytes,
        body: bytes | None,
    ) -> None:
        """Forward at once when the model is Ready and nobody waits for it (the fast path: admission's first rule,
        without weighing the queues); else admission: queue the request, or raise ProxyError for a refusal."""
        if forward_now(route, self._queues.length(key)):
            decision = Admission.FORWARD
        else:
            decision = admit(route=route, **self._queue_state(request, key, body))
        if decision is Admission.FORWARD:
            self._forwarder.exchange(
                request,
                key,
                route,
                endpoint or self._endpoint(key, route),
                target,
                body,
                self._forwarded,
                strip_authorization=self._api_keys is not None,
            )
        elif decision is Admission.QUEUE:
            self._wait(request, self._wait_and_forward(request, key, target, body))
        else:
            raise self._refused(key, Refusal(decision))

    def _queue_state(self, request: Request, key: ModelKey, body: bytes | None) -> dict[str, Any]:
        """What admission weighs besides the route: the model's queue, the bytes all queues hold, shutdown."""
        return {
            "queued": self._queues.length(key),
            "queue_max": self._queue_max,
            "shutting_down": self.shutting_down,
            "held": _held(request, body),
            "queued_bytes": self._queues.held_bytes,
            "queued_bytes_max": self._queued_bytes_max,
        }

    def _refused(self, key: ModelKey, refusal: Refusal) -> ProxyError:
        """The answer to a request refused a place in its model's queue: a new one (``admit``) or one back after
        connecting failed (``after_connect_failure``)."""
        if refusal is Refusal.QUEUE_FULL:
            return errors.queue_full(str(key), self._queue_max, self._retry_after)
        if refusal is Refusal.QUEUE_BYTES_FULL:
            return errors.queue_bytes_full(self._queued_bytes_max or 0, self._retry_after)
        return errors.shutting_down()

    # --- the fast path ---

    def _forwarded(self, exchange: Exchange, error: ProxyError | None) -> None:
        """A fast-path exchange ended: count its answer, or answer its error, or queue it after a refused connect."""
        request = exchange.request
        if error is None:
            if not exchange.client_left:
                tally = self._tally  # (``tally.count`` inlined: once per request)
                tally.answers.append((exchange.key, exchange.status, request.arrived, exchange.head_at, monotonic()))
                if not tally.armed:
                    tally.arm()
                request.conn.finish(request)
        elif isinstance(error, NeverConnected):
            self._wait(request, self._requeue(exchange, error, requeues=0, since=None))
        else:
            self._answer_error(request, exchange.key, error)

    def _answer_error(self, request: Request, key: ModelKey | None, error: ProxyError) -> None:
        if key is not None:
            self._tally.count(key, error.status, request.arrived)
        if request.answering:  # (a waiting stream kept alive: its 200 head went out)
            kept = self._kept_alive.pop(request, None)
            if kept is not None:
                kept.fail(error, request.url)
                return
        request.conn.respond_error(request, error)

    def _endpoint(self, key: ModelKey, route: Route) -> Endpoint:
        if not route.endpoint:
            raise errors.upstream_unavailable(str(key), "the route is Ready but has no endpoint")
        try:
            return self._forwarder.endpoint(route.endpoint)
        except ValueError as exc:
            raise errors.upstream_unavailable(str(key), str(exc)) from None

    # --- the waiting path ---

    def _wait(self, request: Request, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` for ``request`` as a task; the client leaving cancels it."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        if self._stream_keepalive:

            def forget(_: object) -> None:
                kept = self._kept_alive.pop(request, None)
                if kept is not None:
                    kept.stop()

            task.add_done_callback(forget)

        def gone() -> None:
            task.cancel()

        request.on_gone = gone

    async def _serve_when(
        self,
        ready: Callable[[], Awaitable[object]],
        request: Request,
        model: str,
        target: bytes,
        body: bytes | None,
    ) -> None:
        """Wait until ``ready`` (just started: the route snapshot; a model not in it: the watch caught up with the
        bucket) rather than calling a real model unknown, then resolve and forward or queue."""
        key: ModelKey | None = None
        try:
            await ready()
            key, route, endpoint = self._resolve(model)
            self._forward_or_queue(request, key, route, endpoint, target, body)
        except ProxyError as error:
            self._answer_error(request, key, error)

    async def _models_when_loaded(self, request: Request, model: str | None) -> None:
        try:
            await self._wait_for_routes()
            request.conn.respond(request, 200, self._models(model))
        except ProxyError as error:
            request.conn.respond_error(request, error)

    async def _wait_for_routes(self) -> None:
        try:
            async with asyncio.timeout(self._queue_timeout):
                await self._loaded.wait()
        except TimeoutError:
            raise errors.routes_unavailable() from None

    async def _wait_and_forward(
        self,
        request: Request,
        key: ModelKey,
        target: bytes,
        body: bytes | None,
        *,
        requeues: int = 0,
        since: float | None = None,
    ) -> None:
        """Queue, then forward. ``requeues``: how many times the request came back after connecting failed;
        ``since``: when it first started waiting (its ``X-FlexInfer-Queue-Wait-Ms`` counts from there)."""
        try:
            waiter = self._queues.join(key, held=_held(request, body))
            if since is None:
                since = waiter.arrived_at
            kept = self._kept_alive.get(request)
            if kept is None and self._stream_keepalive and _streams(request, body):
                kept = self._kept_alive[request] = StreamKeepAlive(
                    request,
                    model=key.name,
                    interval=self._stream_keepalive,
                    phase=lambda: self._phase(key),
                    since=since,
                )
            elif kept is not None:
                kept.resume()  # (back in the queue after a refused connect)
            try:
                route = await self._queues.wait_turn(key, waiter)
                if kept is not None:
                    kept.stop()
                waited_ms = round((self._monotonic() - since) * 1000)
                PROXY_COLD_STARTS.labels(namespace=key.namespace, model=key.name).inc()
                failure = await self._forward_after_wait(request, key, route, target, body, waiter, waited_ms)
            finally:
                self._queues.leave(key, waiter)
            if failure is not None:
                await self._requeue(*failure, requeues=requeues, since=since)
        except ProxyError as error:
            self._answer_error(request, key, error)

    async def _forward_after_wait(
        self,
        request: Request,
        key: ModelKey,
        route: Route,
        target: bytes,
        body: bytes | None,
        waiter: Slot,
        waited_ms: int,
    ) -> tuple[Exchange, NeverConnected] | None:
        """Forward a request whose turn came; an exchange that never connected comes back, with its error, for a
        re-queue."""
        ended: asyncio.Future[ProxyError | None] = asyncio.get_running_loop().create_future()

        def done(_: Exchange, error: ProxyError | None) -> None:
            if not ended.done():
                ended.set_result(error)

        def started() -> None:
            self._queues.leave(key, waiter)

        kept = self._kept_alive.get(request)
        if kept is not None and kept.started:
            kept.waited(waited_ms)
        exchange = self._forwarder.exchange(
            request,
            key,
            route,
            self._endpoint(key, route),
            target,
            body,
            done,
            strip_authorization=self._api_keys is not None,
            # A server woken from sleep was not started: the wait was short, and not a cold start.
            extra_headers=((QUEUE_WAIT_HEADER, str(waited_ms).encode()),)
            if route.woken
            else ((QUEUE_WAIT_HEADER, str(waited_ms).encode()), (COLD_START_HEADER, b"true")),
            on_sent=started,
            kind=KeptAliveExchange if kept is not None and kept.started else None,
        )
        try:
            error = await ended
        except asyncio.CancelledError:
            exchange.client_gone()
            raise
        if error is None:
            self._kept_alive.pop(request, None)
            if not exchange.client_left:
                self._tally.count(key, exchange.status, request.arrived, exchange.head_at)
                request.conn.finish(request)
            return None
        if isinstance(error, NeverConnected):
            request.on_gone = _current_task_canceller()
            return exchange, error
        raise error

    async def _requeue(self, exchange: Exchange, failed: NeverConnected, *, requeues: int, since: float | None) -> None:
        """Connecting to the model failed, so nothing of ``exchange`` was sent: its request waits in its model's
        queue for the route to be Ready again (the exchange's ``route`` counts as not Ready here for ``suspect_for``)
        instead of answering 502, a bounded number of times.
        """
        request, key, route, target, body = exchange.request, exchange.key, exchange.route, exchange.path, exchange.body
        try:
            answer = after_connect_failure(
                never_connected=True,
                body_held=body is not None or not request.has_body,
                requeues=requeues,
                **self._queue_state(request, key, body),
            )
            if answer is ConnectFailure.UNAVAILABLE:
                raise failed
            if answer is not ConnectFailure.REQUEUE:
                raise self._refused(key, Refusal(answer))
            if since is not None and (waited := self._monotonic() - since) >= self._queue_timeout:
                raise errors.queue_timeout(str(key), waited)  # no fresh queue timeout for a request that waited one
            if self._routes.suspect(key, route):
                log.info(
                    "cannot connect to the model: its requests wait", extra={"model": str(key), "error": str(failed)}
                )
                asyncio.get_running_loop().call_later(self._suspect_for, self._unsuspect, key, route)
        except ProxyError as error:
            self._answer_error(request, key, error)
            return
        await self._wait_and_forward(request, key, target, body, requeues=requeues + 1, since=since)

    def _phase(self, key: ModelKey) -> str:
        """What a waiting model is doing, for the keep-alive comments (``loading``, ``draining``...)."""
        route = self._routes.get(key)
        return route.phase.value.lower() if route is not None else "unknown"

    def _unsuspect(self, key: ModelKey, route: Route) -> None:
        """The ``suspect`` mark ran out with no newer route from the KV: its route applies again (waiters try it)."""
        if self._routes.unsuspect(key, route):
            self._queues.route_changed(key)

    # --- lifecycle ---

    async def cancel_waits(self) -> None:
        """Shutdown: end what still runs for requests (after their clients were answered)."""
        await cancel_and_wait(list(self._tasks))

    # --- small answers ---

    def _check_api_key(self, request: Request) -> None:
        keys = self._api_keys
        if keys is not None and not keys.allows(request.authorization):
            # Anthropic's clients send the key as ``x-api-key`` (read only here, when Authorization did not do).
            for name, value in request.headers:
                if name.lower() == b"x-api-key" and keys.allows(b"Bearer " + value):
                    return
            raise errors.invalid_api_key()

    def _authorize(self, request: Request) -> None:
        if self._admin_token is None:
            return
        if not bearer_matches(request.authorization, self._admin_token):
            raise errors.unauthorized()

    def _models(self, model: str | None) -> bytes:
        if model is not None:
            resolved = self._routes.resolve(model, default_namespace=self._namespace)
            if resolved.by is ResolvedBy.SERVICE_LABEL:
                return json_body(_alias_object(model.rpartition("/")[2], resolved))
            return json_body(_model_object(resolved.route))
        data = [_model_object(route) for route in self._routes]
        data += [_alias_object(label, resolved) for label, resolved in self._routes.aliases()]
        return json_body({"object": "list", "data": data})

    def _queue_list(self) -> bytes:
        items = [
            {
                "namespace": info.key.namespace,
                "model": info.key.name,
                "queued": info.queued,
                "oldestWaitSeconds": round(info.oldest_wait_seconds, 3),
            }
            for info in self._queues.snapshot()
        ]
        return json_body({"items": items})


def _origin_target(url: bytes) -> bytes:
    """The request target in origin form (``/path?query``): an absolute-form target (``http://host/path``) is cut
    to its path and query; anything else (``*``) gives b"" (no such path)."""
    if url[:1] == b"/":
        return url
    try:
        parsed = httptools.parse_url(url)
    except httptools.HttpParserInvalidURLError:
        return b""
    if not parsed.schema:
        return b""
    path = parsed.path or b"/"
    return path + b"?" + parsed.query if parsed.query else path


def _streams(request: Request, body: bytes | None) -> bool:
    """Whether a waiting request asks for a streamed answer (``"stream": true`` in its JSON body) that can be kept
    alive: an HTTP/1.1 client (chunked framing) whose body the proxy holds."""
    if body is None or request.version != "1.1" or body.find(b'"stream"') < 0:
        return False
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError):
        return False
    return isinstance(parsed, dict) and parsed.get("stream") is True


def _held(request: Request, body: bytes | None) -> int:
    """The bytes a waiting request keeps in memory: its body, or what arrived of a streamed one."""
    return len(body) if body is not None else request.body_size


def _current_task_canceller() -> Callable[[], None]:
    task = asyncio.current_task()
    assert task is not None

    def gone() -> None:
        task.cancel()

    return gone


class _FormModel:
    """The body sink of a multipart request until its ``model`` field is read: it keeps the bytes, then hands the
    request (those bytes first, the rest streamed) to ``serve_streamed``."""

    __slots__ = ("field", "handler", "kept", "request", "target")

    def __init__(self, handler: ProxyHandler, request: Request, target: bytes, field: ModelField) -> None:
        self.handler = handler
        self.request = request
        self.target = target
        self.field = field
        self.kept: list[bytes] = []

    def body_piece(self, data: bytes) -> None:
        self.kept.append(data)
        try:
            model = self.field.feed(data)
        except ProxyError as error:
            self._refuse(error)
            return
        if model is not None:
            request = self.request
            request.detach()
            request.parts = [b"".join(self.kept)]
            self.kept = []
            self.handler.serve_streamed(request, model, self.target)

    def body_end(self) -> None:
        self._refuse(no_model())

    def _refuse(self, error: ProxyError) -> None:
        request = self.request
        request.detach()
        self.kept = []
        request.conn.respond_error(request, error)


def _alias_object(label: str, resolved: Resolved) -> dict[str, Any]:
    return {**_model_object(resolved.route), "id": label, "alias_of": str(resolved.key)}


def _model_object(route: Route) -> dict[str, Any]:
    return {
        "id": route.name,
        "object": "model",
        "created": int(route.updated_at.timestamp()),
        "owned_by": "flexinfer",
        "namespace": route.namespace,
        "state": route.state.value if route.state is not None else None,
        "phase": route.phase.value,
        "ready": route.ready,
    }
