"""Crash safety and HA of the scheduler, with real processes: SIGKILL mid-swap and restart; two replicas, the
leader killed. Swap state lives in Postgres, so a new scheduler process resumes where the old one stopped."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_cli.embedded import free_port
from flexinfer_testbed.system import TIMINGS, System, fake_model
from tests.integration.test_swap import ProcessTableWatcher, chat
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


class SchedulerProcess:
    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.env = {**env, "FLEXINFER_SCHEDULER_PORT": str(self.port)}
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "flexinfer_scheduler"], env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    async def metric(self, http: aiohttp.ClientSession, name: str) -> float | None:
        try:
            async with http.get(self.url + "/metrics") as resp:
                text = await resp.text()
        except aiohttp.ClientError:
            return None
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None


@pytest.fixture
async def scheduler_processes(
    database_url: str, clean_nats: str, tmp_path: Path
) -> AsyncIterator[Callable[[], SchedulerProcess]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXINFER_")}
    env.update(
        FLEXINFER_DATABASE_URL=database_url,
        FLEXINFER_NATS_URL=clean_nats,
        FLEXINFER_BIND_HOST="127.0.0.1",
        FLEXINFER_RECONCILE_INTERVAL=str(TIMINGS["reconcile_interval"]),
        FLEXINFER_COMMAND_RETRY=str(TIMINGS["command_retry"]),
    )
    started: list[SchedulerProcess] = []

    def make() -> SchedulerProcess:
        process = SchedulerProcess(env, tmp_path / f"scheduler-{len(started)}.log")
        started.append(process)
        return process

    try:
        yield make
    finally:
        for process in started:
            process.stop()


async def wait_http(url: str, limit: float = 30) -> None:
    async with aiohttp.ClientSession() as http:

        async def up() -> bool:
            try:
                async with http.get(url + "/readyz") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(up, within=limit, what=f"{url}/readyz")


async def group_state(http: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with http.get(url + "/api/v1/groups/gpu") as resp:
        result: dict[str, Any] = await resp.json()
        return result


async def test_scheduler_killed_mid_swap_resumes_it_on_restart(
    scheduler_processes: Callable[[], SchedulerProcess], start_system: SystemStarter
) -> None:
    first = scheduler_processes()
    first.start()
    await wait_http(first.url)
    async with start_system(services=("actuator", "proxy"), shared_demand_window=1) as system:
        http = system.http
        assert http is not None
        for manifest in (fake_model("a", priority=20), fake_model("b", priority=10, startup_delay=3)):
            async with http.put(
                f"{first.url}/api/v1/models/default/{manifest['metadata']['name']}", json=manifest
            ) as r:
                assert r.status in (200, 201)

        async def a_ready() -> bool:
            group = await group_state(http, first.url)
            return any(m["name"] == "a" and m["phase"] == "Ready" for m in group["models"])

        await wait_for(a_ready)  # the fallback: the one model of the highest priority
        with ProcessTableWatcher(system) as watcher:
            waiting = asyncio.create_task(chat(system, "b", "after the crash"))

            async def b_loading() -> bool:
                group = await group_state(http, first.url)
                return any(
                    m["name"] == "b" and m["phase"] == "Loading" and m["state"] == "Active" for m in group["models"]
                )

            await wait_for(b_loading)
            first.kill()  # mid-swap: b is loading (3 s startup), the swap is in phase "loading"

            second = scheduler_processes()
            second.start()
            await wait_http(second.url)
            status, body, _ = await asyncio.wait_for(waiting, timeout=60)
            assert status == 200 and body["choices"][0]["message"]["content"] == "[b] after the crash"
            await asyncio.sleep(0.2)

        assert all(len(running) <= 1 for running in watcher.seen), watcher.seen
        async with http.get(second.url + "/api/v1/swaps") as resp:
            swaps = (await resp.json())["items"]
        to_b = [s for s in swaps if s["toModel"] == "default/b"]
        assert len(to_b) == 1, swaps  # the same swap was resumed, not restarted
        assert to_b[0]["finishedAt"] is not None and to_b[0]["phase"] == "ready"
        # the restarted scheduler did not reload b from scratch: one process start for b
        table = await system.get("actuator", "/api/v1/processes")
        assert [p["name"] for p in table["items"]] == ["b"]


async def test_two_replicas_one_leads_and_the_other_takes_over_when_it_dies(
    scheduler_processes: Callable[[], SchedulerProcess], start_system: SystemStarter
) -> None:
    one, two = scheduler_processes(), scheduler_processes()
    one.start()
    two.start()
    await wait_http(one.url)
    await wait_http(two.url)
    async with aiohttp.ClientSession() as http:

        async def exactly_one_leader() -> list[SchedulerProcess] | None:
            leaders = [p for p in (one, two) if await p.metric(http, "flexinfer_scheduler_leader") == 1.0]
            return leaders if len(leaders) == 1 else None

        (leader,) = await wait_for(exactly_one_leader)
        follower = two if leader is one else one
        assert await follower.metric(http, "flexinfer_scheduler_leader") == 0.0

        async with start_system(services=("actuator",)) as system:
            for manifest in (fake_model("a", priority=10),):
                async with http.put(f"{follower.url}/api/v1/models/default/a", json=manifest) as r:
                    assert r.status == 201  # any replica serves the admin API

            async def a_ready(url: str) -> bool:
                group = await group_state(http, url)
                return group["models"][0]["phase"] == "Ready"

            await wait_for(lambda: a_ready(follower.url))
            killed_at = time.monotonic()
            leader.kill()

            async def follower_leads() -> bool:
                return await follower.metric(http, "flexinfer_scheduler_leader") == 1.0

            await wait_for(follower_leads)
            took_over = time.monotonic() - killed_at
            assert took_over <= 2 * TIMINGS["reconcile_interval"] + 1.0, took_over

            # the new leader drives elections: a second model, promoted by an operator, takes the GPU
            async with http.put(f"{follower.url}/api/v1/models/default/b", json=fake_model("b", priority=50)) as r:
                assert r.status == 201
            async with http.post(f"{follower.url}/api/v1/models/default/b/promote") as r:
                assert r.status == 200

            async def b_ready() -> bool:
                group = await group_state(http, follower.url)
                return {m["name"]: m["phase"] for m in group["models"]}.get("b") == "Ready"

            await wait_for(b_ready)
            assert isinstance(system, System)
