"""vLLM's sleep mode, as both back-ends use it to park a model without stopping its server: ``POST /sleep?level=1``
(weights offloaded, the GPU's memory freed), ``POST /wake_up`` (its answer means the server serves again: no need to
wait for a readiness probe), ``GET /is_sleeping`` to confirm either."""

from __future__ import annotations

import aiohttp

from flexinfer_common.logs import get_logger

log = get_logger("flexinfer.actuator.sleep")

_CONFIRM_TIMEOUT = 5.0


class SleepMode:
    """Each call answers None when it worked, else why it did not (for a status message)."""

    def __init__(self, *, timeout: float) -> None:
        self.timeout = timeout  # weights move: allow as long as a load
        self._http: aiohttp.ClientSession | None = None

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # No keep-alive: an endpoint may be served by a new process or Pod after a restart.
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return self._http

    async def sleep(self, endpoint: str) -> str | None:
        problem = await self._post(endpoint, "/sleep?level=1")
        if problem is None and await self.is_sleeping(endpoint) is False:
            problem = "POST /sleep answered, but GET /is_sleeping says it is awake"
        return problem

    async def wake(self, endpoint: str) -> str | None:
        problem = await self._post(endpoint, "/wake_up")
        if problem is None and await self.is_sleeping(endpoint) is True:
            problem = "POST /wake_up answered, but GET /is_sleeping says it still sleeps"
        return problem

    async def is_sleeping(self, endpoint: str) -> bool | None:
        """True or False as the server says; None when it cannot say (a server without sleep mode)."""
        try:
            async with self._session().get(
                endpoint + "/is_sleeping", timeout=aiohttp.ClientTimeout(total=_CONFIRM_TIMEOUT)
            ) as response:
                if response.status != 200:
                    return None
                body = await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError):
            return None
        value = body.get("is_sleeping") if isinstance(body, dict) else None
        return value if isinstance(value, bool) else None

    async def _post(self, endpoint: str, path: str) -> str | None:
        url = endpoint + path
        try:
            async with self._session().post(url, timeout=aiohttp.ClientTimeout(total=self.timeout)) as response:
                if 200 <= response.status < 300:
                    return None
                body = (await response.text())[:200]
                log.warning("request refused", extra={"url": url, "status": response.status, "body": body})
                return f"POST {path} answered {response.status}: {body}"
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            log.warning("request failed", extra={"url": url, "error": repr(exc)})
            return f"POST {path} failed: {exc!r}"

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None
