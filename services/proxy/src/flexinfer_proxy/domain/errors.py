"""The errors the proxy answers with, as OpenAI-style bodies: ``{"error": {"message", "type", "code"}}`` (the one
error contract of :mod:`flexinfer_common.errors`: its types and codes)."""

from __future__ import annotations

import json

from flexinfer_common.errors import ErrorCode, ErrorType, error_type


class ProxyError(Exception):
    """A request the proxy answers itself. ``retry_after`` (seconds) becomes a ``Retry-After`` header."""

    def __init__(
        self,
        status: int,
        code: ErrorCode,
        message: str,
        *,
        type_: ErrorType | None = None,
        retry_after: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.type = type_ or error_type(status)
        self.retry_after = retry_after

    def body(self) -> bytes:
        return json.dumps(
            {"error": {"message": self.message, "type": self.type.value, "code": self.code.value}}
        ).encode()

    def __repr__(self) -> str:
        return f"ProxyError({self.status}, {self.code.value}, {self.message!r})"


def model_not_found(model: str) -> ProxyError:
    return ProxyError(404, ErrorCode.MODEL_NOT_FOUND, f"model '{model}' not found")


def model_ambiguous(model: str, namespaces: list[str]) -> ProxyError:
    candidates = ", ".join(f"{ns}/{model}" for ns in namespaces)
    return ProxyError(
        400, ErrorCode.MODEL_AMBIGUOUS, f"model '{model}' exists in several namespaces ({candidates}); name one"
    )


def model_failed(model: str, reason: str) -> ProxyError:
    return ProxyError(503, ErrorCode.MODEL_FAILED, f"model '{model}' cannot be loaded: {reason}")


def model_removed(model: str) -> ProxyError:
    return ProxyError(404, ErrorCode.MODEL_REMOVED, f"model '{model}' was removed while the request waited")


def queue_full(model: str, limit: int, retry_after: int) -> ProxyError:
    return ProxyError(
        429,
        ErrorCode.QUEUE_FULL,
        f"too many requests are waiting for model '{model}' (limit {limit}); retry later",
        retry_after=retry_after,
    )


def queue_timeout(model: str, waited_seconds: float) -> ProxyError:
    return ProxyError(504, ErrorCode.QUEUE_TIMEOUT, f"model '{model}' did not become ready within {waited_seconds:g}s")


def demand_unavailable(model: str, waited_seconds: float, reason: str) -> ProxyError:
    return ProxyError(
        503,
        ErrorCode.DEMAND_UNAVAILABLE,
        f"could not ask for model '{model}' to be loaded within {waited_seconds:g}s (the bus is unreachable: "
        f"{reason}); retry later",
    )


def shutting_down() -> ProxyError:
    return ProxyError(503, ErrorCode.SHUTTING_DOWN, "the proxy is shutting down; retry on another instance")


def upstream_unavailable(model: str, reason: str) -> ProxyError:
    return ProxyError(502, ErrorCode.UPSTREAM_UNAVAILABLE, f"cannot reach model '{model}': {reason}")


class NeverConnected(ProxyError):
    """502 ``upstream_unavailable`` because connecting to the model failed (refused, timed out): no byte of the
    request went out, so it may be queued again instead (``admission.after_connect_failure``)."""


def upstream_never_connected(model: str, reason: str) -> NeverConnected:
    return NeverConnected(502, ErrorCode.UPSTREAM_UNAVAILABLE, f"cannot reach model '{model}': {reason}")


def routes_unavailable() -> ProxyError:
    return ProxyError(503, ErrorCode.ROUTES_UNAVAILABLE, "the proxy has not loaded its model routes yet; retry soon")


def invalid_request(message: str) -> ProxyError:
    return ProxyError(400, ErrorCode.INVALID_REQUEST, message)


def body_too_large(limit: int) -> ProxyError:
    return ProxyError(413, ErrorCode.BODY_TOO_LARGE, f"request body is larger than {limit} bytes")


def queue_bytes_full(limit: int, retry_after: int) -> ProxyError:
    return ProxyError(
        429,
        ErrorCode.QUEUE_BYTES_FULL,
        f"the proxy holds too many bytes of waiting requests (limit {limit}); retry later",
        retry_after=retry_after,
    )


def uri_too_long(limit: int) -> ProxyError:
    return ProxyError(414, ErrorCode.URI_TOO_LONG, f"the request target is longer than {limit} bytes")


def headers_too_large(count: int, total: int) -> ProxyError:
    return ProxyError(
        431,
        ErrorCode.HEADERS_TOO_LARGE,
        f"the request headers are too large (at most {count} headers and {total} bytes in all)",
    )


def unsupported_transfer_encoding(value: str) -> ProxyError:
    return ProxyError(
        501,
        ErrorCode.UNSUPPORTED_TRANSFER_ENCODING,
        f"Transfer-Encoding {value!r} is not supported (only chunked)",
        type_=ErrorType.INVALID_REQUEST,
    )


def path_not_found(path: str) -> ProxyError:
    return ProxyError(404, ErrorCode.NOT_FOUND, f"no such path: {path}")


def method_not_allowed(method: str, path: str) -> ProxyError:
    return ProxyError(405, ErrorCode.METHOD_NOT_ALLOWED, f"{method} is not allowed on {path}")


def unauthorized() -> ProxyError:
    return ProxyError(401, ErrorCode.UNAUTHORIZED, "missing or wrong bearer token (FLEXINFER_ADMIN_TOKEN)")


def invalid_api_key() -> ProxyError:
    return ProxyError(
        401,
        ErrorCode.UNAUTHORIZED,
        "missing or wrong API key: send Authorization: Bearer <key> (FLEXINFER_PROXY_API_KEYS)",
    )


def too_many_connections(per_client: int | None, total: int) -> ProxyError:
    what = f"{per_client} from one address" if per_client is not None else f"{total} in all"
    return ProxyError(
        503,
        ErrorCode.TOO_MANY_CONNECTIONS,
        f"the proxy has too many open connections ({what}); retry later",
        retry_after=1,
    )


def request_timeout(part: str) -> ProxyError:
    return ProxyError(
        408,
        ErrorCode.REQUEST_TIMEOUT,
        f"the request {part} arrived too slowly (FLEXINFER_PROXY_HEADER_TIMEOUT, FLEXINFER_PROXY_BODY_TIMEOUT, "
        "FLEXINFER_PROXY_BODY_MIN_RATE)",
        type_=ErrorType.INVALID_REQUEST,
    )


def internal_error() -> ProxyError:
    return ProxyError(500, ErrorCode.INTERNAL, "internal proxy error")
