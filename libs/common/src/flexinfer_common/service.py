"""What every HTTP-serving service shares at its edges: the ops endpoints (/healthz, /readyz, /metrics), admin-token
checking, serving an ASGI app with uvicorn inside our own event loop, and graceful shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvicorn
from fastapi import APIRouter, Depends, FastAPI, Request, Response, Security
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException as StarletteHTTPException

from flexinfer_common.auth import bearer_matches, token_matches
from flexinfer_common.errors import ERROR_RESPONSES, ApiError, error_body, error_headers
from flexinfer_common.logs import get_logger, start_logging
from flexinfer_common.metrics import render_latest
from flexinfer_common.runner import run_until_signalled
from flexinfer_common.settings import CommonSettings, SettingsError, load_settings

log = get_logger("flexinfer.service")

ReadinessCheck = Callable[[], Awaitable[dict[str, bool]]]


def add_ops_routes(app: FastAPI, readiness: ReadinessCheck) -> None:
    """``/healthz`` (the process answers), ``/readyz`` (its dependencies answer), ``/metrics``."""

    @app.get("/healthz", include_in_schema=False)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", include_in_schema=False)
    async def readyz() -> JSONResponse:
        checks = await readiness()
        ok = all(checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

    @app.get("/metrics", include_in_schema=False)
    async def metrics() -> Response:
        body, content_type = render_latest()
        return Response(body, media_type=content_type)


_BEARER = HTTPBearer(
    auto_error=False,
    scheme_name="adminToken",
    description="FLEXINFER_ADMIN_TOKEN; `flexinfer up` writes the one it generates to .flexinfer/admin-token",
)


def admin_token_dependency(token: str | None) -> Callable[..., Awaitable[None]]:
    """A FastAPI dependency: when a token is set, ``/api/v1`` calls need ``Authorization: Bearer <token>``
    (401 with ``WWW-Authenticate: Bearer`` otherwise). The OpenAPI names the bearer scheme either way."""
    expected = token.encode() if token else None

    async def check(credentials: HTTPAuthorizationCredentials | None = Security(_BEARER)) -> None:
        if expected is None:
            return
        if not token_matches(credentials.credentials if credentials is not None else b"", expected):
            raise ApiError(401, "missing or wrong bearer token (FLEXINFER_ADMIN_TOKEN)")

    return check


def _token_first(token: str | None) -> type[APIRoute]:
    """A route class that checks the bearer token before FastAPI reads the request body: a caller without the
    token gets 401 whatever it sends (a body that is not JSON would otherwise answer 422 first)."""
    expected = token.encode() if token else None

    class TokenFirstRoute(APIRoute):
        def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
            handler = super().get_route_handler()
            if expected is None:
                return handler

            async def checked(request: Request) -> Response:
                if not bearer_matches(request.headers.get("authorization"), expected):
                    raise ApiError(401, "missing or wrong bearer token (FLEXINFER_ADMIN_TOKEN)")
                return await handler(request)

            return checked

    return TokenFirstRoute


def admin_router(token: str | None) -> APIRouter:
    """The ``/api/v1`` router of an admin API: the bearer check (before the body is read; the dependency documents
    it in the OpenAPI) and the documented error shape on every route."""
    return APIRouter(
        prefix="/api/v1",
        dependencies=[Depends(admin_token_dependency(token))],
        responses=ERROR_RESPONSES,
        route_class=_token_first(token),
    )


def admin_app(title: str, version: str, readiness: ReadinessCheck) -> FastAPI:
    """A FastAPI app with the one error shape and the ops endpoints."""
    app = FastAPI(title=title, version=version)
    install_error_handlers(app)
    add_ops_routes(app, readiness)
    return app


class HttpServer:
    """uvicorn serving an ASGI app inside the caller's event loop (no signal handlers of its own)."""

    def __init__(self, app: Any, *, host: str, port: int, name: str) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=10,
        )
        self.server = uvicorn.Server(config)
        # The service owns SIGTERM/SIGINT (run_until_signalled); uvicorn must not capture them.
        self.server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
        self.name = name
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self.server.serve(), name=f"http:{self.name}")
        while not self.server.started:
            if self._task.done():
                await self._task  # re-raise the bind error
                raise RuntimeError(f"{self.name}: HTTP server stopped during start-up")
            await asyncio.sleep(0.01)

    @property
    def port(self) -> int:
        servers = getattr(self.server, "servers", [])
        for server in servers:
            for sock in server.sockets:
                return int(sock.getsockname()[1])
        return int(self.server.config.port)

    async def stop(self) -> None:
        self.server.should_exit = True
        if self._task:
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


def database_and_bus_readiness(engine: Any, bus: Any) -> ReadinessCheck:
    """``/readyz`` for a service that needs Postgres and NATS: both must answer."""

    async def readiness() -> dict[str, bool]:
        db_ok = True
        try:
            async with engine.connect() as conn:
                await conn.exec_driver_sql("SELECT 1")
        except Exception:
            db_ok = False
        return {"nats": bus.connected, "postgres": db_ok}

    return readiness


S = TypeVar("S", bound=CommonSettings)


def run_service(
    name: str,
    settings_cls: type[S],
    serve: Callable[[S, asyncio.Event], Coroutine[Any, Any, None]],
    *,
    check: Callable[[S], None] | None = None,
    logger: logging.Logger = log,
) -> None:
    """A service's ``main``: settings (a bad value, or a ``check`` raising SettingsError, exits 2 naming the
    variable), JSON logs, then ``serve`` until SIGTERM/SIGINT (a server it cannot reach at start exits 1, said by
    ``logger``)."""
    try:
        settings = load_settings(settings_cls)
        if check is not None:
            check(settings)
    except SettingsError as exc:
        print(f"flexinfer-{name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    start_logging(name, settings)
    try:
        run_until_signalled(lambda stop: serve(settings, stop))
    except ConnectionError as exc:
        logger.error("cannot start", extra={"error": str(exc)})
        raise SystemExit(1) from None


_errors_log = get_logger("flexinfer.errors")


def install_error_handlers(app: FastAPI) -> None:
    """Make a FastAPI app answer every error as :class:`ErrorBody`."""

    def answer(status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None) -> Any:
        return JSONResponse(
            error_body(status, message, code), status_code=status, headers=error_headers(status, headers)
        )

    @app.exception_handler(ApiError)
    async def api_error(_: Request, exc: ApiError) -> Any:
        return answer(exc.status, exc.message, exc.code)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> Any:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return answer(exc.status_code, detail, None, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> Any:
        parts = []
        for e in exc.errors():
            where = ".".join(str(p) for p in e["loc"] if p != "body") or "body"
            parts.append(f"{where}: {e['msg']}")
        return answer(422, "; ".join(parts) or "invalid request")

    @app.exception_handler(Exception)
    async def unhandled(request: Request, exc: Exception) -> Any:
        # The details go to the log, never to the caller.
        _errors_log.error(
            "unhandled error",
            exc_info=exc,
            extra={"method": request.method, "path": request.url.path},
        )
        return answer(500, "internal error; the service logged the details")
