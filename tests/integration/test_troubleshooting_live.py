"""The seed's troubleshooting cases, live: real processes, NATS and Postgres. Each test is named after the
seed's heading and shows the case self-heals here."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from flexinfer_testbed.system import fake_model
from tests.integration.test_scheduler_policies import members, running
from tests.integration.test_swap import chat
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


async def test_rollout_restart_deadlock(start_system: SystemStarter) -> None:
    """The Active model's process dies (as in a rollout restart). The group must not stay at zero running models
    while a request waits: the request is answered once the model is loaded again."""
    async with start_system(shared_demand_window=1) as system:
        await system.put_model(fake_model("a", priority=10))
        await system.put_model(fake_model("b", priority=5))

        async def a_ready() -> bool:
            return (await members(system))["a"]["phase"] == "Ready"

        await wait_for(a_ready)
        (process,) = (await system.get("actuator", "/api/v1/processes"))["items"]
        os.kill(process["pid"], signal.SIGKILL)  # the "restart": the serving process is gone

        async def a_not_ready() -> bool:
            return (await members(system))["a"]["phase"] != "Ready"

        await wait_for(a_not_ready)
        # A model that crashed after it was Ready is restarted, as Kubernetes restarts a crashed pod; a request
        # sent meanwhile waits in the queue and is answered by the restarted process.
        status, body, _ = await asyncio.wait_for(chat(system, "a", "are you back?"), timeout=60)
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == "[a] are you back?"
        assert await running(system) == ["a"]
        (restarted,) = (await system.get("actuator", "/api/v1/processes"))["items"]
        assert restarted["pid"] != process["pid"]


async def test_demand_signal_not_being_detected(start_system: SystemStarter) -> None:
    """The seed's demand expired after one signal. Here a waiting request keeps demand alive past the demand
    window (1 s in this test), so the waiting model is loaded once the busy incumbent goes idle — 3 s later (b's
    maxWait is longer than that, so the bounded wait plays no part here)."""
    async with start_system(shared_demand_window=1) as system:
        await system.put_model(fake_model("a", priority=10))
        await system.put_model(fake_model("b", priority=10, gpu={"shared": "gpu", "priority": 10, "maxWait": "60s"}))

        # peers: nothing is loaded until a first request, for a
        status, _, _ = await chat(system, "a", "warm up")
        assert status == 200

        async def keep_a_busy() -> None:
            for i in range(12):  # 3 s of traffic: a is never idle meanwhile
                await chat(system, "a", f"busy {i}")
                await asyncio.sleep(0.25)

        busy = asyncio.create_task(keep_a_busy())
        waiting = asyncio.create_task(chat(system, "b", "still here"))
        await busy
        assert (await members(system))["b"]["state"] == "Queued"  # demand still counts after 3 windows
        status, body, headers = await asyncio.wait_for(waiting, timeout=30)
        assert status == 200 and body["choices"][0]["message"]["content"] == "[b] still here"
        assert int(headers["X-FlexInfer-Queue-Wait-Ms"]) >= 3000


async def test_a_busy_model_no_longer_starves_an_equal_priority_one(start_system: SystemStarter) -> None:
    """Issue 11's starvation, live: two clients loop on a; one request for b (same priority) is served within b's
    bound (maxWait 2 s here) plus a drain and a load, not after the queue timeout. a's requests in flight finish
    (the drain), and those sent meanwhile wait for a's turn (a short cooldown and bound here): none fails."""
    gpu = {"shared": "gpu", "priority": 10, "maxWait": "2s", "swapCooldown": "1s"}
    async with start_system(shared_demand_window=30) as system:
        await system.put_model(fake_model("a", gpu=gpu))
        await system.put_model(fake_model("b", gpu=gpu))
        # peers: nothing is loaded until a first request, for a
        status, _, _ = await chat(system, "a", "warm up")
        assert status == 200
        stop = asyncio.Event()
        answers: list[int] = []

        async def loop_on_a() -> None:
            while not stop.is_set():
                status, _, _ = await chat(system, "a", "busy")
                answers.append(status)

        clients = [asyncio.create_task(loop_on_a()) for _ in range(2)]
        try:
            started = asyncio.get_running_loop().time()
            status, body, headers = await asyncio.wait_for(chat(system, "b", "my turn"), timeout=30)
            waited = asyncio.get_running_loop().time() - started
        finally:
            stop.set()
            await asyncio.gather(*clients)
        assert status == 200 and body["choices"][0]["message"]["content"] == "[b] my turn"
        assert 2 <= waited < 20, waited
        assert int(headers["X-FlexInfer-Queue-Wait-Ms"]) >= 2000
        assert answers and all(code == 200 for code in answers), answers
        swaps = (await system.get("scheduler", "/api/v1/swaps"))["items"]
        to_b = next(s for s in swaps if s["toModel"] == "default/b")
        assert to_b["reason"] == "max-wait" and "draining" in to_b["phases"]
