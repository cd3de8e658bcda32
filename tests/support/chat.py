"""A chat completion through a proxy, as a client sends it: the status, the body and the headers of the answer."""

from __future__ import annotations

from typing import Any

import aiohttp

Answer = tuple[int, dict[str, Any], dict[str, str]]


async def post_chat(http: aiohttp.ClientSession, base: str, model: str, text: str) -> Answer:
    """One user message ``text`` for ``model`` to the proxy at ``base``."""
    body = {"model": model, "messages": [{"role": "user", "content": text}]}
    async with http.post(base + "/v1/chat/completions", json=body) as resp:
        return resp.status, await resp.json(), dict(resp.headers)
