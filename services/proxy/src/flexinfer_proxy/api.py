"""The proxy's one HTTP handler: it dispatches on the path, admits, queues and forwards. No framework routing.

| path | |
|---|---|
| ``POST /v1/chat/completions``, ``/v1/completions``, ``/v1/embeddings`` (any ``POST /v1/...``) | model from the body |
| ``GET /v1/models``, ``GET /v1/models/{model}`` | every managed model, OpenAI-style, plus namespace/state/ready |
| ``/{namespace}/{model}/<path>`` | any method, forwarded to the model as ``<path>`` (query kept) |
| ``GET /api/v1/queues`` | waiting requests per model (bearer token when FLEXINFER_ADMIN_TOKEN is set) |
| ``/healthz``, ``/readyz``, ``/metrics`` | operations |

The hot path reads the body once (to find ``model``), resolves it with dictionary lookups, and forwards the
original bytes; it logs nothing at info level.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web
from prometheus_client import Counter

from flexinfer_common.logs import get_logger
from flexinfer_common.messages import Route
from flexinfer_common.metrics import PROXY_COLD_STARTS, PROXY_REQUESTS, render_latest
from flexinfer_proxy.adapters.demand import DemandSignaller
from flexinfer_proxy.adapters.upstream import Upstream
from flexinfer_proxy.domain import errors
from flexinfer_proxy.domain.admission import Admission, ConnectFailure, admit, after_connect_failure
from flexinfer_proxy.domain.errors import NeverConnected, ProxyError
from flexinfer_proxy.domain.requests import model_of, retry_safe
from flexinfer_proxy.domain.routes import ModelKey, Resolved, RouteTable
from flexinfer_proxy.queues import ModelQueues

log = get_logger("flexinfer.proxy.api")

QUEUE_WAIT_HEADER = "X-FlexInfer-Queue-Wait-Ms"
COLD_START_HEADER = "X-FlexInfer-Cold-Start"
EXPECT = "Expect"
JSON = "application/json"

ReadinessCheck = Callable[[], dict[str, bool]]


def error_response(error: ProxyError) -> web.Response:
    response = web.Response(status=error.status, body=error.body(), content_type=JSON)
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    if error.status == 401:
        response.headers["WWW-Authenticate"] = "Bearer"
    return response


def json_response(payload: Any, *, status: int = 200) -> web.Response:
    return web.Response(status=status, body=json.dumps(payload).encode(), content_type=JSON)


def prefixed_target(raw_target: str) -> tuple[str, str, str] | None:
    """``/ns/model/rest?q`` -> ``("ns", "model", "/rest?q")``, all still encoded as sent; None without a model."""
    path, sep, query = raw_target.partition("?")
    parts = path.split("/", 3)
    if len(parts) < 3 or parts[0] != "" or not parts[1] or not parts[2]:
        return None
    rest = "/" + parts[3] if len(parts) == 4 else "/"
    return parts[1], parts[2], rest + sep + query


class ProxyHandler:
    def __init__(
        self,
        *,
        routes: RouteTable,
        queues: ModelQueues,
        demand: DemandSignaller,
        upstream: Upstream,
        routes_loaded: asyncio.Event,
        readiness: ReadinessCheck,
        default_namespace: str,
        queue_max: int,
        queue_timeout: float,
        retry_after: int,
        max_body: int,
        admin_token: str | None,
        suspect_for: float = 2.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._routes = routes
        self._queues = queues
        self._demand = demand
        self._upstream = upstream
        self._loaded = routes_loaded
        self._readiness = readiness
        self._namespace = default_namespace
        self._queue_max = queue_max
        self._queue_timeout = queue_timeout
        self._retry_after = retry_after
        self._max_body = max_body
        self._admin_token = admin_token.encode() if admin_token else None
        self._suspect_for = suspect_for
        self._monotonic = monotonic
        self._counters: dict[tuple[ModelKey, int], Counter] = {}
        self.shutting_down = False

    async def __call__(self, request: web.BaseRequest) -> web.StreamResponse:
        try:
            return await self._dispatch(request)
        except ProxyError as error:
            return error_response(error)
        except web.HTTPRequestEntityTooLarge:
            return error_response(errors.body_too_large(self._max_body))
        except Exception:
            log.exception("request failed", extra={"method": request.method, "path": request.path})
            return error_response(errors.internal_error())

    async def _dispatch(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path
        method = request.method
        if path.startswith("/v1/"):
            if path == "/v1/models" or path.startswith("/v1/models/"):
                if method != "GET":
                    raise errors.method_not_allowed(method, path)
                return await self._models(path[len("/v1/models/") :] if path != "/v1/models" else None)
            if method != "POST":
                raise errors.method_not_allowed(method, path)
            if EXPECT in request.headers:
                await _send_continue(request)
            body = await request.read()
            resolved = await self._resolve(model_of(body))
            return await self._serve(request, resolved, self._raw_target(request), body)
        if path.startswith("/api/"):
            self._authorize(request)
            if path == "/api/v1/queues":
                if method != "GET":
                    raise errors.method_not_allowed(method, path)
                return self._queue_list()
            raise errors.path_not_found(path)
        if path == "/healthz":
            return json_response({"status": "ok"})
        if path == "/readyz":
            checks = self._readiness()
            ready = checks.get("routes", False) and not self.shutting_down
            return json_response({"ready": ready, "checks": checks}, status=200 if ready else 503)
        if path == "/metrics":
            body, content_type = render_latest()
            return web.Response(body=body, headers={"Content-Type": content_type})
        target = prefixed_target(self._raw_target(request))
        names = path.split("/", 3)
        if target is None or len(names) < 3 or not names[1] or not names[2]:
            raise errors.path_not_found(path)
        # Names from the decoded path; the rest is forwarded exactly as the client encoded it.
        resolved = await self._resolve(f"{names[1]}/{names[2]}")
        if EXPECT in request.headers and request.body_exists:
            await _send_continue(request)
        return await self._serve(request, resolved, target[2], None)

    @staticmethod
    def _raw_target(request: web.BaseRequest) -> str:
        target = request.raw_path
        return target if target.startswith("/") else request.rel_url.raw_path_qs

    async def _resolve(self, model: str) -> Resolved:
        if not self._loaded.is_set():
            await self._wait_for_routes()
        return self._routes.resolve(model, default_namespace=self._namespace)

    async def _wait_for_routes(self) -> None:
        """Just started: wait for the route snapshot rather than calling a real model unknown."""
        try:
            async with asyncio.timeout(self._queue_timeout):
                await self._loaded.wait()
        except TimeoutError:
            raise errors.routes_unavailable() from None

    async def _serve(
        self, request: web.BaseRequest, resolved: Resolved, target: str, body: bytes | None
    ) -> web.StreamResponse:
        key, route = resolved.key, resolved.route
        try:
            decision = admit(
                route=route,
                queued=self._queues.length(key),
                queue_max=self._queue_max,
                shutting_down=self.shutting_down,
            )
            if decision is Admission.FORWARD:
                self._demand.activity(key)
                try:
                    response = await self._upstream.forward(
                        request,
                        endpoint=_endpoint(key, route),
                        target=target,
                        model=str(key),
                        body=body,
                        retry=self._retry_safe(request, target, body),
                    )
                except NeverConnected as failed:
                    response = await self._requeue(request, key, route, target, body, failed, requeues=0, since=None)
            elif decision is Admission.QUEUE:
                response = await self._wait_and_forward(request, key, target, body)
            elif decision is Admission.QUEUE_FULL:
                raise errors.queue_full(str(key), self._queue_max, self._retry_after)
            else:
                raise errors.shutting_down()
        except ProxyError as error:
            self._count(key, error.status)
            raise
        self._count(key, response.status)
        return response

    @staticmethod
    def _retry_safe(request: web.BaseRequest, target: str, body: bytes | None) -> bool:
        return retry_safe(request.method, target, body_held=body is not None or not request.body_exists)

    async def _wait_and_forward(
        self,
        request: web.BaseRequest,
        key: ModelKey,
        target: str,
        body: bytes | None,
        *,
        requeues: int = 0,
        since: float | None = None,
    ) -> web.StreamResponse:
        """Queue, then forward. ``requeues``: how many times the request came back after connecting failed;
        ``since``: when it first started waiting (its ``X-FlexInfer-Queue-Wait-Ms`` counts from there)."""
        waiter = self._queues.join(key)
        if since is None:
            since = waiter.arrived_at
        try:
            route = await self._queues.wait_turn(key, waiter)
            waited_ms = round((self._monotonic() - since) * 1000)
            PROXY_COLD_STARTS.labels(namespace=key.namespace, model=key.name).inc()
            self._demand.activity(key)

            def started() -> None:
                self._queues.leave(key, waiter)

            try:
                return await self._upstream.forward(
                    request,
                    endpoint=_endpoint(key, route),
                    target=target,
                    model=str(key),
                    body=body,
                    retry=self._retry_safe(request, target, body),
                    # A server woken from sleep was not started: the wait was short, and not a cold start.
                    extra_headers=((QUEUE_WAIT_HEADER, str(waited_ms)),)
                    if route.woken
                    else ((QUEUE_WAIT_HEADER, str(waited_ms)), (COLD_START_HEADER, "true")),
                    on_sent=started,
                )
            except NeverConnected as exc:
                failed = exc
        finally:
            self._queues.leave(key, waiter)
        return await self._requeue(request, key, route, target, body, failed, requeues=requeues, since=since)

    async def _requeue(
        self,
        request: web.BaseRequest,
        key: ModelKey,
        route: Route,
        target: str,
        body: bytes | None,
        failed: NeverConnected,
        *,
        requeues: int,
        since: float | None,
    ) -> web.StreamResponse:
        """Connecting to the model failed, so nothing was sent: wait in its queue for the route to be Ready again
        (``route`` counts as not Ready here for ``suspect_for``) instead of answering 502, a bounded number of times.
        """
        answer = after_connect_failure(
            never_connected=True,
            body_held=body is not None or not request.body_exists,
            requeues=requeues,
            queued=self._queues.length(key),
            queue_max=self._queue_max,
            shutting_down=self.shutting_down,
        )
        if answer is ConnectFailure.UNAVAILABLE:
            raise failed
        if answer is ConnectFailure.SHUTTING_DOWN:
            raise errors.shutting_down()
        if answer is ConnectFailure.QUEUE_FULL:
            raise errors.queue_full(str(key), self._queue_max, self._retry_after)
        if since is not None and (waited := self._monotonic() - since) >= self._queue_timeout:
            raise errors.queue_timeout(str(key), waited)  # no fresh queue timeout for a request that waited one out
        if self._routes.suspect(key, route):
            log.info("cannot connect to the model: its requests wait", extra={"model": str(key), "error": str(failed)})
            asyncio.get_running_loop().call_later(self._suspect_for, self._unsuspect, key, route)
        return await self._wait_and_forward(request, key, target, body, requeues=requeues + 1, since=since)

    def _unsuspect(self, key: ModelKey, route: Route) -> None:
        """The ``suspect`` mark ran out with no newer route from the KV: its route applies again (waiters try it)."""
        if self._routes.unsuspect(key, route):
            self._queues.route_changed(key)

    def _count(self, key: ModelKey, status: int) -> None:
        counter = self._counters.get((key, status))
        if counter is None:
            counter = PROXY_REQUESTS.labels(namespace=key.namespace, model=key.name, code=str(status))
            self._counters[(key, status)] = counter
        counter.inc()

    def _authorize(self, request: web.BaseRequest) -> None:
        if self._admin_token is None:
            return
        scheme, _, given = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), self._admin_token):
            raise errors.unauthorized()

    async def _models(self, model: str | None) -> web.Response:
        if not self._loaded.is_set():
            await self._wait_for_routes()
        if model is not None:
            resolved = self._routes.resolve(model, default_namespace=self._namespace)
            return json_response(_model_object(resolved.route))
        return json_response({"object": "list", "data": [_model_object(route) for route in self._routes]})

    def _queue_list(self) -> web.Response:
        items = [
            {
                "namespace": info.key.namespace,
                "model": info.key.name,
                "queued": info.queued,
                "oldestWaitSeconds": round(info.oldest_wait_seconds, 3),
            }
            for info in self._queues.snapshot()
        ]
        return json_response({"items": items})


async def _send_continue(request: web.BaseRequest) -> None:
    """``Expect: 100-continue``: the low-level server does not answer it, and the client would wait (curl: 1 s)
    before sending the body. The proxy never forwards the header (it has the body already, or streams it)."""
    if request.headers[EXPECT].lower() == "100-continue" and request.version >= (1, 1):
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")


def _endpoint(key: ModelKey, route: Route) -> str:
    if not route.endpoint:
        raise errors.upstream_unavailable(str(key), "the route is Ready but has no endpoint")
    return route.endpoint


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
