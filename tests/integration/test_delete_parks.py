"""Deleting a model parks it first, on real NATS and Postgres with the real local actuator and fake model
processes (issue 22): the deleted model is drained and parked before the next loads and before its row goes, and
a model deleted and applied again serves each time (its command generation continues; the actuator remembers the
last one it applied per model and would ignore a lower one as stale)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from flexinfer_testbed.system import System, fake_model
from tests.integration.test_swap import ProcessTableWatcher, chat
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


async def phase(system: System, name: str) -> Any:
    status, body = await system.call("GET", "scheduler", f"/api/v1/models/default/{name}")
    return None if status == 404 else body


async def test_deleting_the_serving_model_parks_it_before_the_next_one_loads(start_system: SystemStarter) -> None:
    async with start_system() as system:
        await system.put_model(fake_model("a", priority=10))
        await system.put_model(fake_model("b", priority=5))
        status, body, _ = await chat(system, "a", "hello")
        assert status == 200, body
        with ProcessTableWatcher(system) as watcher:
            status, deleted = await system.call("DELETE", "scheduler", "/api/v1/models/default/a")
            assert status == 200, deleted
            assert deleted["metadata"]["deletionTimestamp"] and deleted["status"]["phase"] == "Draining"
            status, body, _ = await chat(system, "b", "after a")
            assert status == 200 and body["choices"][0]["message"]["content"] == "[b] after a"

            async def a_gone() -> bool:
                return await phase(system, "a") is None

            await wait_for(a_gone)
            await asyncio.sleep(0.1)
        assert all(len(running) <= 1 for running in watcher.seen), f"two models ran at once: {watcher.seen}"
        assert "a" not in watcher.seen[-1]
        status, body, _ = await chat(system, "a", "gone")
        assert status == 404, body


async def test_a_model_deleted_and_applied_again_three_times_serves_each_time(start_system: SystemStarter) -> None:
    async with start_system() as system:
        for round_ in range(4):
            await system.put_model(fake_model("a", group="solo-gpu"))
            status, body, _ = await chat(system, "a", f"round {round_}")
            assert status == 200 and body["choices"][0]["message"]["content"] == f"[a] round {round_}", body
            status, _ = await system.call("DELETE", "scheduler", "/api/v1/models/default/a")
            assert status == 200

            async def gone() -> bool:
                processes = await system.get("actuator", "/api/v1/processes")
                running = [p for p in processes["items"] if p["phase"] in {"Loading", "Ready", "Stopping"}]
                return await phase(system, "a") is None and not running

            await wait_for(gone)
            groups = await system.get("scheduler", "/api/v1/groups")
            assert [g["name"] for g in groups["items"]] == []  # the group went with its last model
