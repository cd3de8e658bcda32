"""The proxy under faults: NATS going away and coming back, and model connections that break before answering.

The NATS test runs its own embedded server (it stops and restarts it), never the shared one of the other tests.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_cli.embedded import EmbeddedNats
from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.messages import Demand
from flexinfer_proxy.app import Proxy
from flexinfer_testbed.routes import make_route, write_route
from tests.support.proxy import fake_model_server, proxy_to_model, started_proxy
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CHAT_M1 = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
CHAT_M2 = {"model": "m2", "messages": [{"role": "user", "content": "hi"}]}


# --------------------------------------------------------------------------- NATS down


async def test_with_nats_down_ready_models_are_served_and_the_rest_queue_until_demand_gets_through(
    tmp_path: Path,
) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    nats_url = await asyncio.to_thread(server.start)
    observer = Bus(nats_url, name="observer")
    await observer.connect()
    await observer.ensure_streams()
    demands: asyncio.Queue[Demand] = asyncio.Queue()
    try:
        async with (
            fake_model_server("m1") as m1,
            fake_model_server("m2") as m2,
            started_proxy(nats_url, instance_id="proxy-faults", queue_timeout=1, demand_refresh_interval=0.2) as proxy,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
        ):
            for route in (make_route("m1", endpoint=m1), make_route("m2")):
                await write_route(observer, route)
            await wait_for(lambda: len(proxy.routes) == 2)
            base = f"http://127.0.0.1:{proxy.port}/v1/chat/completions"

            await asyncio.to_thread(server.stop)
            await wait_for(lambda: not proxy.bus.connected)
            async with http.post(base, json=CHAT_M1) as resp:
                assert resp.status == 200, "a Ready model is served without NATS"
            async with http.post(base, json=CHAT_M2) as resp:
                assert resp.status == 503, "the demand could not be signalled before the queue timeout"
                error = (await resp.json())["error"]
            assert error["code"] == "demand_unavailable"
            assert "default/m2" in error["message"] and "bus is unreachable" in error["message"]

            # NATS comes back: a waiting request's demand gets through, and it is served once the model is Ready.
            await asyncio.to_thread(server.start)
            await wait_for(lambda: proxy.bus.connected and proxy.watcher.watching, within=15)

            async def on_demand(msg: Any) -> None:
                await demands.put(Demand.model_validate_json(msg.data))

            await observer.nc.subscribe(subjects.DEMAND_PREFIX + ".>", cb=on_demand)
            waiting = asyncio.create_task(http.post(base, json=CHAT_M2))
            async with asyncio.timeout(5):
                while (demand := await demands.get()).queued == 0:
                    pass
            assert (demand.model, demand.source) == ("m2", "proxy-faults")
            await write_route(observer, make_route("m2", endpoint=m2))
            async with await waiting as resp:
                assert resp.status == 200
                assert resp.headers["X-FlexInfer-Cold-Start"] == "true"
    finally:
        await observer.close()
        await asyncio.to_thread(server.stop)


# --------------------------------------------------------------------------- broken model connections


@dataclass
class Flaky:
    """A model server that hangs up on the next ``drop`` requests without a byte of answer, then answers 200."""

    drop: int = 0
    seen: list[str] = field(default_factory=list)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                length = next((int(x.split(":")[1]) for x in lines if x.lower().startswith("content-length:")), 0)
                await reader.readexactly(length)
                self.seen.append(lines[0])
                if self.drop > 0:
                    self.drop -= 1
                    writer.transport.abort()  # hang up, no answer
                    return
                body = json.dumps({"ok": True, "request": lines[0]}).encode()
                status_head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
                writer.write(status_head % len(body))
                if not lines[0].startswith("HEAD"):
                    writer.write(body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            return


@pytest.fixture
async def flaky(clean_nats: str) -> AsyncIterator[tuple[Flaky, str, Proxy]]:
    model = Flaky()
    server = await asyncio.start_server(model.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with proxy_to_model(clean_nats, f"http://127.0.0.1:{port}", instance_id="proxy-faults") as proxy:
        yield model, f"http://127.0.0.1:{proxy.port}", proxy
    server.close()


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "attempts"),
    [
        pytest.param("GET", "/default/m1/v1/models", None, 200, 2, id="get-is-retried-once"),
        pytest.param("HEAD", "/default/m1/health", None, 200, 2, id="head-is-retried-once"),
        pytest.param("POST", "/v1/embeddings", {"model": "m1", "input": "x"}, 200, 2, id="embeddings-retried"),
        pytest.param("POST", "/v1/chat/completions", {"model": "m1", "messages": []}, 502, 1, id="chat-not-retried"),
        pytest.param("POST", "/v1/completions", {"model": "m1", "prompt": "x"}, 502, 1, id="completion-not-retried"),
    ],
)
async def test_a_connection_that_breaks_before_the_answer_is_retried_only_when_safe(
    flaky: tuple[Flaky, str, Proxy], method: str, path: str, body: Any, status: int, attempts: int
) -> None:
    model, base, _ = flaky
    model.drop = 1
    async with aiohttp.ClientSession() as http, http.request(method, base + path, json=body) as resp:
        assert resp.status == status
        if status == 502:
            error = (await resp.json())["error"]
            assert error["code"] == "upstream_unavailable"
            assert error["message"] == "cannot reach model 'default/m1': the model closed the connection"
    assert len(model.seen) == attempts


async def test_a_second_failure_is_502(flaky: tuple[Flaky, str, Proxy]) -> None:
    model, base, _ = flaky
    model.drop = 2
    async with aiohttp.ClientSession() as http, http.get(base + "/default/m1/v1/models") as resp:
        assert resp.status == 502
    assert len(model.seen) == 2
