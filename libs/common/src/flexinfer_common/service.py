"""What every HTTP-serving service shares at its edges: the ops endpoints (/healthz, /readyz, /metrics), admin-token
checking, serving an ASGI app with uvicorn inside our own event loop, and graceful shutdown on SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import sys
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

import uvicorn
from fastapi import FastAPI, HTTPException, Request, Response
from fastapi.responses import JSONResponse

from flexinfer_common.logs import configure_logging, get_logger
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


def admin_token_dependency(token: str | None) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency: when a token is set, ``/api/v1`` calls need ``Authorization: Bearer <token>``."""

    async def check(request: Request) -> None:
        if token is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.encode(), token.encode()):
            raise HTTPException(status_code=401, detail="missing or wrong bearer token (FLEXINFER_ADMIN_TOKEN)")

    return check


def install_error_handlers(app: FastAPI) -> None:
    """Errors as ``{"error": {"message", "type", "code"}}``, with validation errors naming the field."""
    from fastapi.exceptions import RequestValidationError
    from starlette.exceptions import HTTPException as StarletteHTTPException

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        return JSONResponse(
            {"error": {"message": detail, "type": "invalid_request_error", "code": exc.status_code}},
            status_code=exc.status_code,
            headers=getattr(exc, "headers", None),
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        parts = [f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors()]
        return JSONResponse(
            {"error": {"message": "; ".join(parts), "type": "invalid_request_error", "code": 422}},
            status_code=422,
        )


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
    name: str, settings_cls: type[S], serve: Callable[[S, asyncio.Event], Coroutine[Any, Any, None]]
) -> None:
    """A service's ``main``: settings (a bad value exits 2 naming the variable), JSON logs, then ``serve`` until
    SIGTERM/SIGINT."""
    try:
        settings = load_settings(settings_cls)
    except SettingsError as exc:
        print(f"flexinfer-{name}: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    configure_logging(name, settings.log_level)
    run_until_signalled(lambda stop: serve(settings, stop))
