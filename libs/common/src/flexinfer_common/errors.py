"""The one error contract of every FlexInfer HTTP API: ``{"error": {"message", "type", "code"}}`` with a string
``code`` (the OpenAI style the proxy answers with), JSON even for an unhandled exception, and ``401`` with
``WWW-Authenticate: Bearer``.

:class:`ApiError` is what a handler raises; :func:`flexinfer_common.service.install_error_handlers` makes a
FastAPI app answer every error (its own, Starlette's routing errors, request validation, and any exception) in this
shape, and :data:`ERROR_RESPONSES` documents the shape in the app's OpenAPI. The proxy's answers share the types and
codes (``ErrorType``, ``ErrorCode``). Pure: the proxy's domain reads it.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class ErrorType(StrEnum):
    INVALID_REQUEST = "invalid_request_error"
    AUTHENTICATION = "authentication_error"
    RATE_LIMIT = "rate_limit_error"
    SERVER = "server_error"


class ErrorCode(StrEnum):
    """Every ``code`` any FlexInfer API answers with (the admin APIs', then the proxy's own)."""

    INVALID_REQUEST = "invalid_request"
    UNAUTHORIZED = "unauthorized"
    NOT_FOUND = "not_found"
    METHOD_NOT_ALLOWED = "method_not_allowed"
    CONFLICT = "conflict"
    COMMAND_NOT_ALLOWED = "command_not_allowed"
    ENV_NOT_ALLOWED = "env_not_allowed"
    UNSUPPORTED_MEDIA_TYPE = "unsupported_media_type"
    UNAVAILABLE = "unavailable"
    INTERNAL = "internal_error"
    # the proxy's (OpenAI-style answers to inference requests)
    MODEL_NOT_FOUND = "model_not_found"
    MODEL_AMBIGUOUS = "model_ambiguous"
    MODEL_FAILED = "model_failed"
    MODEL_REMOVED = "model_removed"
    QUEUE_FULL = "queue_full"
    QUEUE_TIMEOUT = "queue_timeout"
    SHUTTING_DOWN = "shutting_down"
    UPSTREAM_UNAVAILABLE = "upstream_unavailable"
    ROUTES_UNAVAILABLE = "routes_unavailable"
    DEMAND_UNAVAILABLE = "demand_unavailable"
    BODY_TOO_LARGE = "body_too_large"
    QUEUE_BYTES_FULL = "queue_bytes_full"
    URI_TOO_LONG = "uri_too_long"
    HEADERS_TOO_LARGE = "headers_too_large"
    UNSUPPORTED_TRANSFER_ENCODING = "unsupported_transfer_encoding"
    TOO_MANY_CONNECTIONS = "too_many_connections"
    REQUEST_TIMEOUT = "request_timeout"


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
    400: _doc("The body could not be read (not UTF-8 or not JSON)"),
    401: _doc("No or wrong bearer token (when the service has FLEXINFER_ADMIN_TOKEN)"),
    404: _doc("No such resource"),
    422: _doc("The request is malformed; the message names the field"),
    500: _doc("An internal error (the message names nothing internal; the service logs the details)"),
}
