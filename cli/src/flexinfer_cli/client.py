"""A tiny JSON client for the services' admin APIs (docs/reference.md section 4).

Failures become two exceptions whose text is ready for a terminal: :class:`ApiError` (the service answered
with an error: its message, as the API put it) and :class:`ServiceUnreachable` (nothing answered: which
service, where, and what to do about it).
"""

from __future__ import annotations

import json
from types import TracebackType
from typing import Any, Self

import aiohttp

from flexinfer_cli.config import Service

_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=2.0)


class CliError(Exception):
    """An error to print on stderr (without a traceback) before exiting with ``exit_code``."""

    exit_code = 1


UNAUTHORIZED_HINT = (
    "set FLEXINFER_ADMIN_TOKEN to the services' token, or run this command in the folder of `flexinfer up` "
    "(it keeps the token it generated in .flexinfer/admin-token; FLEXINFER_STATE_DIR names another folder)"
)


class ApiError(CliError):
    def __init__(self, service: Service, method: str, path: str, status: int, message: str) -> None:
        self.service = service
        self.status = status
        self.message = message
        hint = f"; {UNAUTHORIZED_HINT}" if status == 401 else ""
        super().__init__(f"{service.value}: {method} {path} failed ({status}): {message}{hint}")


class ServiceUnreachable(CliError):
    def __init__(self, service: Service, url: str, reason: str) -> None:
        self.service = service
        self.url = url
        super().__init__(
            f"cannot reach the {service.value} at {url} ({reason}). Is FlexInfer running? Start it with "
            f"`flexinfer up`, or point the CLI at it with {service.url_flag} / {service.url_variable}."
        )


def error_message(status: int, body: bytes) -> str:
    """The readable part of an error response: ``{"error": {"message"}}``, FastAPI's ``{"detail"}``, or text."""
    text = body.decode("utf-8", errors="replace").strip()
    try:
        payload = json.loads(text) if text else None
    except json.JSONDecodeError:
        payload = None
    if isinstance(payload, dict):
        error = payload.get("error")
        if isinstance(error, dict) and error.get("message"):
            return str(error["message"])
        if isinstance(error, str) and error:
            return error
        detail = payload.get("detail")
        if isinstance(detail, str) and detail:
            return detail
        if isinstance(detail, list) and detail:
            return "; ".join(_describe_detail(item) for item in detail)
        if isinstance(payload.get("message"), str):
            return str(payload["message"])
    if text:
        return text if len(text) <= 500 else text[:500] + "..."
    return f"HTTP {status} with an empty body"


def _describe_detail(item: Any) -> str:
    if isinstance(item, dict) and "msg" in item:
        loc = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        return f"{loc}: {item['msg']}" if loc else str(item["msg"])
    return str(item)


class AdminClient:
    """One service's admin API. Use as ``async with AdminClient(...) as client``."""

    def __init__(self, service: Service, base_url: str, *, token: str | None = None, timeout: float = 15.0) -> None:
        self.service = service
        self.base_url = base_url.rstrip("/")
        self._headers = {"Accept": "application/json"}
        if token:
            self._headers["Authorization"] = f"Bearer {token}"
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Self:
        self._session = aiohttp.ClientSession(headers=self._headers, timeout=self._timeout)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(self, method: str, path: str, body: Any = None) -> Any:
        """Send one request; return the decoded JSON body (None when empty), or raise a CliError."""
        if self._session is None:
            raise RuntimeError("AdminClient used outside 'async with'")
        url = self.base_url + path
        try:
            async with self._session.request(method, url, json=body) as response:
                payload = await response.read()
                if response.status >= 400:
                    raise ApiError(self.service, method, path, response.status, error_message(response.status, payload))
        except aiohttp.ClientConnectorError as exc:
            error = exc.os_error
            if isinstance(error, ConnectionRefusedError):
                reason = "connection refused"  # asyncio's own text is "Connect call failed (...)"
            else:
                reason = error.strerror if error is not None and error.strerror else str(exc)
            raise ServiceUnreachable(self.service, self.base_url, reason.lower()) from None
        except TimeoutError:
            raise ServiceUnreachable(self.service, self.base_url, "no answer in time") from None
        except aiohttp.ClientError as exc:
            raise ServiceUnreachable(self.service, self.base_url, str(exc) or type(exc).__name__) from None
        if not payload.strip():
            return None
        try:
            return json.loads(payload)
        except json.JSONDecodeError:
            raise ApiError(
                self.service, method, path, response.status, "the answer is not JSON: " + payload[:200].decode()
            ) from None

    async def get(self, path: str) -> Any:
        return await self.request("GET", path)

    async def put(self, path: str, body: Any) -> Any:
        return await self.request("PUT", path, body)

    async def post(self, path: str, body: Any = None) -> Any:
        return await self.request("POST", path, body)

    async def delete(self, path: str) -> Any:
        return await self.request("DELETE", path)

    async def ready(self) -> bool:
        """True when ``GET /readyz`` answers 200 (no exception when the service is not up yet)."""
        if self._session is None:
            raise RuntimeError("AdminClient used outside 'async with'")
        try:
            async with self._session.get(self.base_url + "/readyz", timeout=_PROBE_TIMEOUT) as response:
                await response.read()
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError, OSError):
            return False
