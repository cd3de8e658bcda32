"""Measured GPU memory and discovered capacity through the real scheduler, actuator and proxy on NATS and Postgres,
with a fake GPU in place of the driver (no GPU needed): the local actuator names the fake card in its hello, the
shared group without a declared capacity gets it, and once the model is Ready what its process holds becomes its
``status.memory`` (source measured), with a warning event since it exceeds the declaration."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flexinfer_actuator import main as actuator_main
from flexinfer_actuator.domain.gpu_memory import GpuDevice, ProcessMemory
from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_testbed.system import fake_model
from tests.integration.test_swap import chat
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

GiB = 1 << 30


class FakeGpu:
    """One 24 GiB card; a process holds what the test says (pid -> bytes)."""

    name = "fake"

    def __init__(self) -> None:
        self.held: dict[int, int] = {}

    def devices(self) -> list[GpuDevice]:
        return [GpuDevice(0, 24 * GiB)]

    def processes(self) -> list[ProcessMemory]:
        return [ProcessMemory(pid=pid, device=0, bytes=b) for pid, b in self.held.items()]

    def close(self) -> None:
        return None


async def test_a_models_measured_memory_reaches_its_status_and_the_group_gets_the_cards_capacity(
    bus: Bus, monkeypatch: pytest.MonkeyPatch, start_system: SystemStarter
) -> None:
    gpu = FakeGpu()
    monkeypatch.setattr(actuator_main, "open_gpu_memory", lambda: gpu)
    events: list[dict[str, Any]] = []

    async def on_event(msg: Any) -> None:
        events.append(json.loads(msg.data))

    subscription = await bus.nc.subscribe(subjects.EVENTS_PREFIX + ".model.>", cb=on_event)
    try:
        async with start_system(gpu_memory_interval=0.2) as system:
            model = fake_model("chat", priority=10)
            model["spec"]["gpu"]["memory"] = "4Gi"
            await system.put_model(model)

            async def capacity() -> Any:
                return (await system.get("scheduler", "/api/v1/groups/gpu")).get("capacity")

            status, _, _ = await chat(system, "chat", "hello")
            assert status == 200
            assert await capacity() == {"devices": 1, "memoryPerDevice": 24 * GiB}, "the card the actuator found"

            processes = (await system.get("actuator", "/api/v1/processes"))["items"]
            pid = next(p["pid"] for p in processes if p["name"] == "chat")
            gpu.held[pid] = 6 * GiB  # the server grew beyond its declaration: measured at the next refresh

            async def memory() -> Any:
                return (await system.get("scheduler", "/api/v1/models/default/chat"))["status"].get("memory")

            async def measured() -> bool:
                return bool(await memory() == {"bytes": 6 * GiB, "source": "measured"})

            await wait_for(measured, within=15, what="status.memory measured at 6 GiB")
            group = await system.get("scheduler", "/api/v1/groups/gpu")
            member = next(m for m in group["models"] if m["name"] == "chat")
            assert member["memory"] == {"bytes": 6 * GiB, "source": "measured"}, "fitting counts the measured figure"
            await wait_for(
                lambda: any(e.get("kind") == "model.memory" for e in events),
                within=10,
                what="a model.memory warning event",
            )
    finally:
        await subscription.unsubscribe()
