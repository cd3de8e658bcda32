"""A Ready route whose model cannot be connected to (it died; the scheduler has not withdrawn the route yet).

Connecting failed, so nothing was sent: a chat request is not answered 502 but waits in the model's queue (signalling
demand) for the route to be Ready again, then is served with the usual wait headers. The local "not Ready" mark
ends at once with a newer route from the KV, or by itself after ``FLEXINFER_PROXY_SUSPECT_FOR``; a request goes back
into the queue at most twice (``MAX_REQUEUES``). With nothing ever coming back it ends 504 ``queue_timeout`` when the
queue timeout runs out first, else 502 ``upstream_unavailable`` once its re-queues are spent: never hangs.
"""

from __future__ import annotations

import asyncio
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import pytest

from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Demand
from flexinfer_common.tcp import free_port
from flexinfer_proxy.app import Proxy
from flexinfer_testbed.routes import make_route, write_route
from tests.support.proxy import fake_model_server, proxy_to_model
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

KEY = ModelKey("default", "m1")
CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


def proxy_with_dead_route(nats_url: str, dead_port: int, **overrides: Any) -> AbstractAsyncContextManager[Proxy]:
    """A started proxy whose model ``m1`` is Ready at ``dead_port`` on loopback, where nothing listens."""
    return proxy_to_model(nats_url, f"http://127.0.0.1:{dead_port}", instance_id="proxy-requeue", **overrides)


async def test_a_request_for_a_dead_endpoint_waits_and_is_served_by_the_model_that_comes_back(
    bus: Bus, clean_nats: str
) -> None:
    demands: list[Demand] = []

    async def on_demand(msg: Any) -> None:
        demands.append(Demand.model_validate_json(msg.data))

    await bus.nc.subscribe(subjects.DEMAND_PREFIX + ".>", cb=on_demand)
    async with (
        proxy_with_dead_route(clean_nats, free_port(), queue_timeout=10) as proxy,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
    ):
        url = f"http://127.0.0.1:{proxy.port}/v1/chat/completions"
        waiting = asyncio.create_task(http.post(url, json=CHAT))
        await wait_for(lambda: proxy.queues.length(KEY) == 1)
        marked = proxy.routes.get(KEY)
        assert marked is not None and not marked.ready, "the route counts as not Ready here"
        await asyncio.sleep(0.3)
        assert not waiting.done()
        async with fake_model_server() as model:
            await write_route(bus, make_route("m1", endpoint=model))
            async with await waiting as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers["X-FlexInfer-Cold-Start"] == "true"
                assert int(resp.headers["X-FlexInfer-Queue-Wait-Ms"]) >= 300
                assert (await resp.json())["object"] == "chat.completion"
    await wait_for(lambda: any(d.model == "m1" and d.queued >= 1 for d in demands), within=5)
    assert all(d.source == "proxy-requeue" for d in demands)


async def test_the_mark_runs_out_by_itself_when_the_model_was_alive(bus: Bus, clean_nats: str) -> None:
    """The connect was refused once but the scheduler publishes nothing: after FLEXINFER_PROXY_SUSPECT_FOR the KV's
    route applies again and the waiter tries it once more."""
    port = free_port()
    async with (
        proxy_with_dead_route(clean_nats, port, queue_timeout=10, proxy_suspect_for=0.5) as proxy,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
    ):
        url = f"http://127.0.0.1:{proxy.port}/v1/chat/completions"
        waiting = asyncio.create_task(http.post(url, json=CHAT))
        await wait_for(lambda: proxy.queues.length(KEY) == 1)
        async with fake_model_server(port=port):
            async with await waiting as resp:
                assert resp.status == 200, await resp.text()
                assert resp.headers["X-FlexInfer-Cold-Start"] == "true"
            route = proxy.routes.get(KEY)
            assert route is not None and route.ready


@pytest.mark.parametrize(
    ("overrides", "status", "code"),
    [
        pytest.param({"queue_timeout": 1}, 504, "queue_timeout", id="queue-timeout-first-504"),
        pytest.param({"queue_timeout": 10, "proxy_suspect_for": 0.1}, 502, "upstream_unavailable", id="requeues-502"),
    ],
)
async def test_with_nothing_coming_back_the_request_ends_rather_than_hangs(
    bus: Bus, clean_nats: str, overrides: dict[str, Any], status: int, code: str
) -> None:
    async with (
        proxy_with_dead_route(clean_nats, free_port(), **overrides) as proxy,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http,
    ):
        started = asyncio.get_running_loop().time()
        async with http.post(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", json=CHAT) as resp:
            assert resp.status == status
            assert (await resp.json())["error"]["code"] == code
        assert asyncio.get_running_loop().time() - started < 5
        assert proxy.queues.length(KEY) == 0
