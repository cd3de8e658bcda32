"""The proxy in the whole loop (scheduler + actuator + fake model processes, real NATS and Postgres): several proxy
replicas side by side, a restarted proxy, and a load test with swaps."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from flexinfer_cli.embedded import free_port
from flexinfer_testbed.system import TIMINGS, _ready, fake_model
from tests.support.chat import post_chat as chat
from tests.support.system import SystemStarter

pytestmark = pytest.mark.integration


def shared_model(name: str, *, startup_delay: float = 0.2) -> dict[str, Any]:
    manifest = fake_model(name, priority=10, startup_delay=startup_delay)
    manifest["spec"]["gpu"]["swapCooldown"] = "1s"
    return manifest


@contextlib.asynccontextmanager
async def extra_proxy(nats_url: str, *, instance_id: str, **overrides: Any) -> AsyncIterator[str]:
    """Another proxy replica beside the one ``running_system`` starts (same NATS, same timings); its base URL."""
    from flexinfer_proxy.main import serve
    from flexinfer_proxy.settings import ProxySettings

    port = free_port()
    timings = {k: v for k, v in {**TIMINGS, **overrides}.items() if k in ProxySettings.model_fields}
    settings = ProxySettings(
        nats_url=nats_url, bind_host="127.0.0.1", proxy_port=port, instance_id=instance_id, **timings
    )
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop), name=f"service:{instance_id}")
    url = f"http://127.0.0.1:{port}"
    try:
        await _ready(url, task)
        yield url
    finally:
        stop.set()
        await asyncio.wait_for(task, timeout=30)


async def test_two_proxy_replicas_share_one_scheduler_and_a_restarted_one_routes_at_once(
    clean_nats: str, start_system: SystemStarter
) -> None:
    async with start_system(shared_demand_window=1) as system:
        await system.put_model(shared_model("a"))
        await system.put_model(shared_model("b"))
        async with (
            extra_proxy(clean_nats, instance_id="proxy-test-2") as second,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        ):
            first = system.url("proxy")
            for model in ("a", "b"):  # each load is asked for through both replicas; both are served by it
                results = await asyncio.gather(
                    *(chat(http, base, model, f"{model}-{i}") for i, base in enumerate([first, second] * 3))
                )
                for i, (status, body, headers) in enumerate(results):
                    assert status == 200, body
                    assert body["choices"][0]["message"]["content"] == f"[{model}] {model}-{i}"
                    assert headers.get("X-FlexInfer-Cold-Start") == "true"
            group = await system.get("scheduler", "/api/v1/groups/gpu")
            assert group["activeModel"]["name"] == "b"

        # A replica started now knows the routes from the snapshot: b is Ready, so it is served at once.
        async with (
            extra_proxy(clean_nats, instance_id="proxy-test-3") as restarted,
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http,
        ):
            status, body, headers = await chat(http, restarted, "b", "hello")
            assert status == 200, body
            assert "X-FlexInfer-Cold-Start" not in headers


async def test_a_proxy_restarted_with_the_same_instance_id_has_its_new_demand_acted_on(
    clean_nats: str, start_system: SystemStarter
) -> None:
    """A pod restarts under the same name: its new demand messages must not look like its old ones (JetStream's
    de-duplication and the scheduler's processed-message table would drop them, and its requests would end in
    504). With no demand refresh in the test's window, each cold request is signalled by exactly one message, so
    a dropped one would show as a 504."""
    quiet = {"demand_refresh_interval": 600, "queue_timeout": 30}
    # One message keeps a demand alive for the window: 3 s, so a scheduler slowed by a loaded machine still sees it.
    async with start_system(shared_demand_window=3) as system:
        await system.put_model(shared_model("a"))
        await system.put_model(shared_model("b"))
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
            for model in ("b", "a"):  # b is a cold start, then a (swapped back) through a restarted proxy
                async with extra_proxy(clean_nats, instance_id="proxy-pod-0", **quiet) as proxy:
                    status, body, headers = await chat(http, proxy, model, f"to {model}")
                    assert status == 200, body
                    assert body["choices"][0]["message"]["content"] == f"[{model}] to {model}"
                    assert headers.get("X-FlexInfer-Cold-Start") == "true"
                await idle_past_demand_window(system, model, window=3.0)
        group = await system.get("scheduler", "/api/v1/groups/gpu")
        assert group["activeModel"]["name"] == "a"


async def idle_past_demand_window(system: Any, model: str, *, window: float) -> None:
    """Until ``model`` had no request for longer than the demand window: a demanded model then takes the GPU at
    the next election (a busy incumbent would keep it, and a single demand message could expire meanwhile)."""
    from datetime import UTC, datetime

    deadline = asyncio.get_running_loop().time() + 30
    while True:
        status = (await system.get("scheduler", f"/api/v1/models/default/{model}"))["status"]
        last = status.get("lastActiveTime")
        if last and (datetime.now(UTC) - datetime.fromisoformat(last.replace("Z", "+00:00"))).total_seconds() > window:
            return
        assert asyncio.get_running_loop().time() < deadline, status
        await asyncio.sleep(0.1)


@pytest.mark.timeout(120)
async def test_load_1000_concurrent_requests_over_three_models_with_swaps(start_system: SystemStarter) -> None:
    """Every request is answered 2xx or a documented 429/504; none is lost or reset."""
    models = ("a", "b", "c")
    async with start_system(shared_demand_window=1, queue_max=2000, queue_timeout=TIMINGS["queue_timeout"]) as system:
        for name in models:
            await system.put_model(shared_model(name))
        connector = aiohttp.TCPConnector(limit=0)
        outcomes: collections.Counter[str] = collections.Counter()
        wrong: list[str] = []
        started = time.monotonic()
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=90)) as http:

            async def one(i: int) -> None:
                model = models[i % len(models)]
                try:
                    status, body, _ = await chat(http, system.url("proxy"), model, f"r{i}")
                except Exception as exc:  # a lost or reset request
                    outcomes[f"error:{type(exc).__name__}"] += 1
                    return
                outcomes[str(status)] += 1
                if status == 200 and body["choices"][0]["message"]["content"] != f"[{model}] r{i}":
                    wrong.append(f"r{i} -> {body['choices'][0]['message']['content']}")

            await asyncio.gather(*(one(i) for i in range(1000)))
        elapsed = time.monotonic() - started
        swaps = (await system.get("scheduler", "/api/v1/swaps"))["items"]

    print(f"1000 requests in {elapsed:.1f}s: {dict(outcomes)}; {len(swaps)} swaps")
    assert sum(outcomes.values()) == 1000
    assert set(outcomes) <= {"200", "429", "504"}, outcomes
    assert outcomes["200"] >= 900, outcomes  # with queue_max 2000 and a 60 s timeout, all should pass
    assert not wrong, wrong[:5]
    assert len({s["toModel"] for s in swaps}) == 3, "each model was swapped in"
