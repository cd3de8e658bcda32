"""The whole loop on real NATS and Postgres: proxy -> scheduler -> actuator -> fake model processes."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from typing import Any

import aiohttp
import pytest

from flexinfer_common.bus import Bus
from flexinfer_testbed.system import System, fake_model
from tests.support.chat import Answer, post_chat
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

RUNNING = {"Loading", "Ready", "Stopping"}


async def chat(system: System, model: str, text: str, *, delay: float = 0) -> Answer:
    """``text`` for ``model`` through the system's proxy, sent ``delay`` seconds from now."""
    await asyncio.sleep(delay)
    assert system.http is not None
    return await post_chat(system.http, system.url("proxy"), model, text)


class ProcessTableWatcher:
    """Polls the actuator's process table and remembers every set of running models it saw."""

    def __init__(self, system: System) -> None:
        self.system = system
        self.seen: list[frozenset[str]] = []
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        while True:
            table = await self.system.get("actuator", "/api/v1/processes")
            running = frozenset(p["name"] for p in table["items"] if p["phase"] in RUNNING)
            if not self.seen or self.seen[-1] != running:
                self.seen.append(running)
            await asyncio.sleep(0.01)

    def __enter__(self) -> ProcessTableWatcher:
        self._task = asyncio.create_task(self._run())
        return self

    def __exit__(self, *_: object) -> None:
        assert self._task is not None
        self._task.cancel()


async def group_gauges(system: System) -> dict[str, float]:
    """``flexinfer_group_active_model`` of group ``gpu`` per model, as the scheduler exports it; asserts that no
    swap is in progress."""
    assert system.http is not None
    async with system.http.get(system.url("scheduler") + "/metrics") as resp:
        text = await resp.text()
    assert 'flexinfer_group_swap_started_timestamp_seconds{group="gpu"}' not in text
    found = re.findall(r'^flexinfer_group_active_model\{group="gpu",model="([^"]+)"\} (\S+)$', text, re.M)
    return {model: float(value) for model, value in found}


def response_number(body: dict[str, Any]) -> int:
    """The fake model numbers completions in arrival order: ``chatcmpl-<pid>-<n>``."""
    return int(body["id"].rsplit("-", 1)[1])


async def requests_in_turn(system: System, model: str, count: int = 5) -> list[Answer]:
    """``count`` chats for ``model`` (``req-0``, ``req-1``, ...), sent 50 ms apart, and their answers."""
    return await asyncio.gather(*(chat(system, model, f"req-{i}", delay=0.05 * i) for i in range(count)))


def assert_each_answered_cold(results: list[Answer], model: str) -> list[int]:
    """Each request was answered by ``model`` itself after a cold start, and reached it once: the response numbers
    (consecutive, in the order the requests were sent)."""
    for i, (status, body, headers) in enumerate(results):
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == f"[{model}] req-{i}"
        assert headers.get("X-FlexInfer-Cold-Start") == "true"
    numbers = [response_number(body) for _, body, _ in results]
    first = min(numbers)
    assert sorted(numbers) == list(range(first, first + len(numbers))), numbers
    return numbers


async def test_request_for_b_is_answered_by_b_after_a_was_parked(start_system: SystemStarter) -> None:
    async with start_system(shared_demand_window=1.5) as system:
        await system.put_model(fake_model("a", priority=10))
        await system.put_model(fake_model("b", priority=10))

        # peers: nothing is loaded until this first request, for a, which loads it.
        status, body, _ = await chat(system, "a", "hello")
        assert status == 200 and body["choices"][0]["message"]["content"] == "[a] hello"

        with ProcessTableWatcher(system) as watcher:
            results = await requests_in_turn(system, "b")
            await asyncio.sleep(0.1)

        assert_each_answered_cold(results, "b")  # each reached b once
        assert all(int(headers["X-FlexInfer-Queue-Wait-Ms"]) > 0 for _, _, headers in results)
        # (The proxy releases the queue in arrival order, each request written to the model before the next is
        # released: test_proxy_queues.py::test_drain_releases_in_arrival_order_one_after_another. The order the
        # model's server begins them in is not the proxy's: on several connections its accept loop races the
        # keep-alive reads, and on a loaded CI machine it began them as [1, 3, 2, 4, 5] and [1, 2, 4, 5, 3].)

        assert all(len(running) <= 1 for running in watcher.seen), f"two models ran at once: {watcher.seen}"
        assert frozenset({"a"}) in watcher.seen and watcher.seen[-1] == frozenset({"b"})
        assert watcher.seen.index(frozenset({"a"})) < watcher.seen.index(frozenset({"b"}))

        group = await system.get("scheduler", "/api/v1/groups/gpu")
        assert group["activeModel"] == {"namespace": "default", "name": "b"}
        members = {m["name"]: m for m in group["models"]}
        assert members["b"]["phase"] == "Ready" and members["b"]["state"] == "Active"
        # a was quiet: FlexInfer's policy parks it as idle (no preemption) and b holds for its load
        assert members["a"]["phase"] == "Idle" and members["a"]["preemptedBy"] is None
        assert group["scheduling"] == "flexinfer" and group["election"]["leader"]["name"] == "b"
        assert members["a"]["requests"]["waiting"] == 0 and "inFlight" in members["b"]["requests"]
        assert group["cooldownRemainingSeconds"] > 0

        swaps = (await system.get("scheduler", "/api/v1/swaps"))["items"]
        latest = swaps[0]
        assert (latest["fromModel"], latest["toModel"], latest["reason"]) == ("default/a", "default/b", "idle")
        assert latest["finishedAt"] is not None and {"parking", "loading"} <= set(latest["phases"])

        # The leader's per-group gauges: b active, a a member; no swap running. A deleted model's series goes.
        assert await group_gauges(system) == {"b": 1.0, "a": 0.0}
        assert system.http is not None
        async with system.http.delete(system.url("scheduler") + "/api/v1/models/default/a") as resp:
            assert resp.status in (200, 204), await resp.text()

        async def a_forgotten() -> bool:
            return await group_gauges(system) == {"b": 1.0}

        await wait_for(a_forgotten)


async def test_malformed_demand_is_counted_and_the_next_good_one_works(
    clean_nats: str, caplog: pytest.LogCaptureFixture, start_system: SystemStarter
) -> None:
    caplog.set_level(logging.WARNING, logger="flexinfer.bus")
    async with start_system(services=("scheduler",)) as system:
        await system.put_model(fake_model("a", priority=100))
        await system.put_model(fake_model("b", priority=1))
        bus = Bus(clean_nats, name="external-producer")
        await bus.connect()
        try:
            await bus.nc.publish("flexinfer.demand.default.b", b"{this is not json")
            await bus.nc.publish("flexinfer.demand.default.b", json.dumps({"model": "b", "queued": -4}).encode())
            await bus.nc.publish("flexinfer.demand.default.b", json.dumps({"model": "b", "source": "batch"}).encode())
            await bus.nc.flush()
        finally:
            await bus.close()

        async def b_demanded() -> bool:
            model = await system.get("scheduler", "/api/v1/models/default/b")
            # no actuator runs here, so nothing is loaded: the demanded b wins the election (stage 3)
            return (
                model["status"].get("lastActiveTime") is not None
                and model["status"]["sharedGroup"].get("state") == "Active"
            )

        await wait_for(b_demanded)
        assert system.http is not None
        async with system.http.get(system.url("scheduler") + "/metrics") as resp:
            metrics = await resp.text()
        line = next(x for x in metrics.splitlines() if x.startswith("flexinfer_bad_messages_total{"))
        assert float(line.rsplit(" ", 1)[1]) >= 2
        reasons = [
            r.__dict__.get("reason", "") for r in caplog.records if r.getMessage() == "rejected malformed message"
        ]
        assert any("not JSON" in r for r in reasons) and any("queued" in r for r in reasons)


async def test_unknown_model_is_404_and_bad_manifest_is_422(start_system: SystemStarter) -> None:
    async with start_system() as system:
        status, body, _ = await chat(system, "nope", "hi")
        assert status == 404 and body["error"]["code"] == "model_not_found"
        assert system.http is not None
        bad = fake_model("c")
        bad["spec"]["gpu"]["priority"] = "very high"
        async with system.http.put(system.url("scheduler") + "/api/v1/models/default/c", json=bad) as resp:
            assert resp.status == 422
            assert "spec.gpu.priority" in (await resp.json())["error"]["message"]
        async with aiohttp.ClientSession() as http, http.get(system.url("scheduler") + "/api/v1/models") as resp:
            assert (await resp.json())["items"] == []
