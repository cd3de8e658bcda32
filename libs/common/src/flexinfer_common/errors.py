"""The one error contract of every FlexInfer HTTP API: ``{"error": {"message", "type", "code"}}`` with a string
``code`` (the OpenAI style the proxy answers with), JSON even for an unhandled exception, and ``401`` with
``WWW-Authenticate: Bearer``.

:class:`ApiError` is what a handler raises; :func:`install_error_handlers` makes a FastAPI app answer every error
(its own, Starlette's routing errors, request validation, and any exception) in this shape, and
:data:`ERROR_RESPONSES` documents the shape in the app's OpenAPI.
"""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field

from flexinfer_common.logs import get_logger

if TYPE_CHECKING:
    from fastapi import FastAPI

log = get_logger("flexinfer.errors")


class ErrorType(StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    RATE_LIMIT = "rate_limit_error"
    SERVER = "server_error"


class ErrorCode(StrEnum):
    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    COMMAND_NOT_ALLOWED = "command_not_allowed"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal_error"


class ErrorDetail(BaseModel):
    message: str = Field(description="What went wrong, for a person", examples=["model default/qwen not found"])
    type: str = Field(description="The error's class, OpenAI style", examples=["invalid_request_error"])
    code: str = Field(description="A stable machine-readable code", examples=["not_found"])


class ErrorBody(BaseModel):
    """Every error answer of every FlexInfer service."""

    error: ErrorDetail


_STATUS_CODES: dict[int, ErrorCode] = {
    400: ErrorCode.INVALID_REQUEST,
    401: ErrorCode.UNAUTHORIZED,
    404: ErrorCode.NOT_FOUND,
    405: ErrorCode.METHOD_NOT_ALLOWED,
    409: ErrorCode.CONFLICT,
    415: ErrorCode.UNSUPPORTED_MEDIA_TYPE,
    422: ErrorCode.INVALID_REQUEST,
    503: ErrorCode.UNAVAILABLE,
}


def error_type(status: int) -> ErrorType:
    if status == 401:
        return ErrorType.AUTHENTICATION
    if status == 429:
        return ErrorType.RATE_LIMIT
    if status >= 500:
        return ErrorType.SERVER
    return ErrorType.INVALID_REQUEST


def error_body(status: int, message: str, code: str | None = None) -> dict[str, Any]:
    """The body of an error answer (``code`` defaults from the status)."""
    code = code or _STATUS_CODES.get(status, ErrorCode.INTERNAL if status >= 500 else ErrorCode.INVALID_REQUEST)
    return {"error": {"message": message, "type": error_type(status).value, "code": str(code)}}


def error_headers(status: int, extra: dict[str, str] | None = None) -> dict[str, str] | None:
    headers = dict(extra or {})
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    return headers or None


class ApiError(Exception):
    """An error a handler answers with: ``raise ApiError(404, "model default/x not found")``."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


def _doc(description: str) -> dict[str, Any]:
    return {"model": ErrorBody, "description": description}


# OpenAPI ``responses`` for an admin router: the real shape of every error it can answer.
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: _doc("No or wrong bearer token (when the service has FLEXINFER_ADMIN_TOKEN)"),
    404: _doc("No such resource"),
    422: _doc("The request is malformed; the message names the field"),
    500: _doc("An internal error (the message names nothing internal; the service logs the details)"),
}


def install_error_handlers(app: FastAPI) -> None:
    """Make a FastAPI app answer every error as :class:`ErrorBody`."""
    from fastapi import Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException as StarletteHTTPException

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
        log.error(
            "unhandled error",
            exc_info=exc,
            extra={"method": request.method, "path": request.url.path},
        )
        return answer(500, "internal error; the service logged the details")
