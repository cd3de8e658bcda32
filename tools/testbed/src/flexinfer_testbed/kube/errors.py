"""Kubernetes `Status` errors, raised by the store and rendered by the HTTP layer as the API server does."""

from __future__ import annotations

from enum import StrEnum
from typing import Any


class Reason(StrEnum):
    """`Status.reason` values (k8s.io/apimachinery/pkg/apis/meta/v1 StatusReason) the emulator answers with."""

    NOT_FOUND = "NotFound"
    ALREADY_EXISTS = "AlreadyExists"
    CONFLICT = "Conflict"
    INVALID = "Invalid"
    GONE = "Expired"
    METHOD_NOT_ALLOWED = "MethodNotAllowed"
    BAD_REQUEST = "BadRequest"
    UNSUPPORTED_MEDIA_TYPE = "UnsupportedMediaType"
    NOT_ACCEPTABLE = "NotAcceptable"
    INTERNAL_ERROR = "InternalError"
    FORBIDDEN = "Forbidden"
    SERVICE_UNAVAILABLE = "ServiceUnavailable"
    TOO_MANY_REQUESTS = "TooManyRequests"


CODES = {
    Reason.NOT_FOUND: 404,
    Reason.ALREADY_EXISTS: 409,
    Reason.CONFLICT: 409,
    Reason.INVALID: 422,
    Reason.GONE: 410,
    Reason.METHOD_NOT_ALLOWED: 405,
    Reason.BAD_REQUEST: 400,
    Reason.UNSUPPORTED_MEDIA_TYPE: 415,
    Reason.NOT_ACCEPTABLE: 406,
    Reason.INTERNAL_ERROR: 500,
    Reason.FORBIDDEN: 403,
    Reason.SERVICE_UNAVAILABLE: 503,
    Reason.TOO_MANY_REQUESTS: 429,
}


class ApiError(Exception):
    """An API error with the exact `Status` body the real API server sends."""

    def __init__(
        self,
        reason: Reason,
        message: str,
        *,
        group: str = "",
        kind: str = "",
        name: str = "",
        causes: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
        self.code = CODES[reason]
        self.details: dict[str, Any] = {}
        if name:
            self.details["name"] = name
        if group:
            self.details["group"] = group
        if kind:
            self.details["kind"] = kind
        if causes:
            self.details["causes"] = causes

    def status(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason.value,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


def not_found(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(Reason.NOT_FOUND, f'{qualified} "{name}" not found', group=group, kind=resource, name=name)


def already_exists(resource: str, name: str, group: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    return ApiError(
        Reason.ALREADY_EXISTS, f'{qualified} "{name}" already exists', group=group, kind=resource, name=name
    )


def conflict(resource: str, name: str, group: str = "", why: str = "") -> ApiError:
    qualified = f"{resource}.{group}" if group else resource
    why = why or "the object has been modified; please apply your changes to the latest version and try again"
    return ApiError(
        Reason.CONFLICT,
        f'Operation cannot be fulfilled on {qualified} "{name}": {why}',
        group=group,
        kind=resource,
        name=name,
    )


def invalid(kind: str, name: str, causes: list[tuple[str, str]], group: str = "") -> ApiError:
    """422 Invalid; `causes` are (field, message) pairs, as `field.ErrorList` renders them."""
    text = "; ".join(f"{field}: {message}" for field, message in causes)
    qualified = f"{kind}.{group}" if group else kind
    return ApiError(
        Reason.INVALID,
        f'{qualified} "{name}" is invalid: {text}',
        group=group,
        kind=kind,
        name=name,
        causes=[{"reason": "FieldValueInvalid", "message": message, "field": field} for field, message in causes],
    )


def bad_request(message: str) -> ApiError:
    return ApiError(Reason.BAD_REQUEST, message)


def gone(message: str) -> ApiError:
    return ApiError(Reason.GONE, message)
