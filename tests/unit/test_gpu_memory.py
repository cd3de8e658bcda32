"""Measured GPU memory and discovered capacity (local mode with a GPU), with a fake NVML: what a model's process
tree holds is summed per device and reported; the scheduler shows it as ``status.memory`` (source measured),
fits with it where it exceeds the declaration (a warning event, once) and never lowers a declaration with it; a
machine's GPUs become the capacity of a v1alpha2 group that declares none. No real GPU anywhere."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_actuator.adapters.gpu import AmdSmiGpuMemory, NullGpuMemory, NvmlGpuMemory, open_gpu_memory
from flexinfer_actuator.domain.gpu_memory import (
    GpuDevice,
    ProcessMemory,
    memory_per_device,
    model_memory,
    process_tree,
)
from flexinfer_common import subjects
from flexinfer_common.clock import FakeClock
from flexinfer_common.enums import RuntimePhase
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GPUGroup, Model
from flexinfer_common.messages import ActuatorHello, Demand, ModelEvent, ModelStatusUpdate, ScaleCommand
from flexinfer_scheduler.adapters.memory import MemoryBus, MemoryLeaderLock, MemoryStore
from flexinfer_scheduler.domain.model import Capacity
from flexinfer_scheduler.loop import Scheduler
from flexinfer_scheduler.settings import SchedulerSettings
from tests.support.actuator import done, reported
from tests.support.waiting import wait_for

GiB = 1 << 30
START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


# ---------------------------------------------------------------------------------------------- a fake NVML


class NVMLError(Exception):
    pass


@dataclass
class FakeNvml:
    """The few pynvml calls the adapter makes, over devices (total bytes) and processes (pid, device, bytes)."""

    totals: list[int]
    processes: list[tuple[int, int, int | None]] = field(default_factory=list)
    driver: bool = True
    shut_down: bool = False

    def nvmlInit(self) -> None:
        if not self.driver:
            raise NVMLError("NVML Shared Library Not Found")

    def nvmlDeviceGetCount(self) -> int:
        return len(self.totals)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return type("Memory", (), {"total": self.totals[handle], "used": 0, "free": self.totals[handle]})()

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[Any]:
        return [
            type("Process", (), {"pid": pid, "usedGpuMemory": used})()
            for pid, device, used in self.processes
            if device == handle
        ]

    def nvmlShutdown(self) -> None:
        self.shut_down = True


def test_a_models_memory_is_summed_over_its_process_tree_per_device() -> None:
    # 100 is the model's server; 101 its worker, 102 the worker's child; 200 another program on the card
    parents = {100: 1, 101: 100, 102: 101, 200: 1, 201: 200}
    nvml = FakeNvml(
        totals=[24 * GiB, 24 * GiB],
        processes=[(100, 0, 1 * GiB), (101, 0, 5 * GiB), (102, 1, 3 * GiB), (200, 0, 9 * GiB), (201, 1, None)],
    )
    gpu = open_gpu_memory(nvml=nvml)
    assert isinstance(gpu, NvmlGpuMemory)
    tree = process_tree(100, parents)
    assert tree == {100, 101, 102}
    per_device = memory_per_device(gpu.processes(), tree)
    assert per_device == {0: 6 * GiB, 1: 3 * GiB}, "another program's memory is not the model's"
    assert model_memory(per_device) == 6 * GiB, "status.memory is what it holds on its busiest device"
    assert gpu.devices() == [GpuDevice(0, 24 * GiB), GpuDevice(1, 24 * GiB)]
    gpu.close()
    assert nvml.shut_down


class FakeAmdSmi:
    """The amdsmi calls the adapter makes: two cards, processes listed as dicts (amdsmi 6.x)."""

    class AmdSmiMemoryType:
        VRAM = "vram"

    def __init__(self) -> None:
        self.lists = {0: [{"pid": 100, "memory_usage": {"vram_mem": 2 * GiB}}], 1: [{"pid": 101, "mem": GiB}]}

    def amdsmi_init(self) -> None:
        return None

    def amdsmi_get_processor_handles(self) -> list[int]:
        return [0, 1]

    def amdsmi_get_gpu_memory_total(self, handle: int, kind: str) -> int:
        assert kind == "vram"
        return (16 if handle == 0 else 32) * GiB

    def amdsmi_get_gpu_process_list(self, handle: int) -> list[dict[str, Any]]:
        return self.lists[handle]

    def amdsmi_shut_down(self) -> None:
        return None


def test_amdsmi_is_used_when_nvml_finds_no_gpu() -> None:
    gpu = open_gpu_memory(nvml=FakeNvml(totals=[], driver=False), amdsmi=FakeAmdSmi())
    assert isinstance(gpu, AmdSmiGpuMemory)
    assert gpu.devices() == [GpuDevice(0, 16 * GiB), GpuDevice(1, 32 * GiB)]
    per_device = memory_per_device(gpu.processes(), process_tree(100, {101: 100}))
    assert per_device == {0: 2 * GiB, 1: GiB}


def test_a_process_the_driver_does_not_list_holds_nothing() -> None:
    usage = [ProcessMemory(pid=7, device=0, bytes=GiB)]
    assert model_memory(memory_per_device(usage, process_tree(100, {7: 1}))) is None


def test_without_a_driver_nothing_is_measured(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="flexinfer.actuator.gpu"):
        gpu = open_gpu_memory(nvml=FakeNvml(totals=[GiB], driver=False))
    assert isinstance(gpu, NullGpuMemory)
    assert gpu.devices() == [] and gpu.processes() == []
    assert any("no GPU here" in r.getMessage() for r in caplog.records)


def test_the_installed_library_on_a_machine_without_a_gpu_fails_cleanly() -> None:
    """This machine (and CI) has no GPU: the real pynvml's init fails, which is "no GPU here"."""
    pynvml = pytest.importorskip("pynvml")
    with contextlib.suppress(Exception):
        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA GPU")
    assert isinstance(open_gpu_memory(), NullGpuMemory)


# ---------------------------------------------------------------------------------------------- the scheduler


CHAT = ModelKey("default", "chat")


def model(memory: str | None) -> Model:
    gpu: dict[str, Any] = {"shared": "gpu", "priority": 10}
    if memory is not None:
        gpu["memory"] = memory
    return Model.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": "chat", "namespace": "default"},
            "spec": {"gpu": gpu, "local": {"command": ["serve", "{port}"]}},
        }
    )


@dataclass
class Harness:
    store: MemoryStore
    bus: MemoryBus
    measured: int | None = None  # what the fake actuator reports with Ready
    seen: int = 0

    def now(self) -> datetime:
        return START + timedelta(seconds=asyncio.get_running_loop().time())

    async def actuator(self) -> None:
        while True:
            commands = [m for m in self.bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
            for command in commands[self.seen :]:
                self.seen += 1
                await self.report(command.generation, done(command))
            await asyncio.sleep(0.05)

    async def report(self, generation: int, phase: RuntimePhase = RuntimePhase.READY) -> None:
        measured = self.measured if phase is RuntimePhase.READY else None
        subject, status = reported("default", "chat", phase, generation, self.now(), gpu_memory=measured)
        assert await self.bus.deliver(subject, status.to_bytes())

    def memory(self) -> tuple[int, str] | None:
        updates = [m for m in self.bus.messages(subjects.MODEL_STATUS_PREFIX) if isinstance(m, ModelStatusUpdate)]
        memory = updates[-1].status.memory if updates else None
        return (memory.bytes, memory.source) if memory else None

    def warnings(self) -> list[ModelEvent]:
        events = self.bus.messages(subjects.EVENTS_PREFIX)
        return [e for e in events if isinstance(e, ModelEvent) and e.kind == "model.memory"]

    async def fitting(self) -> int | None:
        world, _ = await self.store.load_world(self.now(), timedelta(minutes=1))
        group = world.group("gpu")
        assert group is not None
        member = group.member(CHAT)
        assert member is not None
        return member.memory

    async def until(self, predicate: Any, within: float = 30) -> None:
        await wait_for(predicate, within=within)


@contextlib.asynccontextmanager
async def scheduling(memory: str | None, measured: int) -> AsyncIterator[Harness]:
    store, bus = MemoryStore(), MemoryBus()
    h = Harness(store, bus, measured=measured)
    settings = SchedulerSettings(reconcile_interval=3, activity_report_interval=1)
    scheduler = Scheduler(store=store, bus=bus, lock=MemoryLeaderLock(), settings=settings, clock=h)
    await store.put_model(model(memory), h.now())
    stop = asyncio.Event()
    tasks = [asyncio.create_task(scheduler.run(stop)), asyncio.create_task(h.actuator())]
    try:
        await h.until(lambda: len(bus.subscriptions) == 4, within=1)
        demand = Demand(model="chat", namespace="default", queued=1, source="p1", time=h.now())
        assert await bus.deliver(subjects.demand_subject("default", "chat"), demand.to_bytes())
        yield h
    finally:
        stop.set()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.mark.looptime
@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.parametrize(
    ("measured", "fitting", "warnings", "why"),
    [
        pytest.param(
            6 * GiB, 6 * GiB, 1, "fitting counts what the model really holds", id="above-replaces-it-and-warns"
        ),
        pytest.param(2 * GiB, 4 * GiB, 0, "a model may grow into what it declares", id="below-does-not-lower-it"),
    ],
)
async def test_a_measurement_is_shown_and_fitted_with_where_it_exceeds_the_declaration(
    measured: int, fitting: int, warnings: int, why: str
) -> None:
    async with scheduling("4Gi", measured=measured) as h:
        await h.until(lambda: h.memory() == (measured, "measured"))
        assert await h.fitting() == fitting, why
        await h.until(lambda: len(h.warnings()) == warnings)


@pytest.mark.looptime
@pytest.mark.asyncio(loop_scope="function")
async def test_a_measurement_above_the_declaration_warns_once_however_often_it_is_measured() -> None:
    async with scheduling("4Gi", measured=6 * GiB) as h:
        await h.until(lambda: len(h.warnings()) == 1)
        warning = h.warnings()[0]
        assert warning.status.memory is not None and warning.status.memory.bytes == 6 * GiB
        assert "declared" in warning.status.message and str(4 * GiB) in warning.status.message
        h.measured = 6 * GiB + 1  # measured again while it runs, still above: no second warning
        await h.report(h.store.models[CHAT].command_generation)
        await h.until(lambda: h.memory() == (6 * GiB + 1, "measured"))
        assert len(h.warnings()) == 1


# ---------------------------------------------------------------------------------------------- discovery


@pytest.mark.asyncio(loop_scope="function")
@pytest.mark.parametrize(
    ("backend", "devices", "capacity"),
    [
        pytest.param("local", [24 * GiB, 16 * GiB], Capacity(2, 16 * GiB), id="local-two-cards-smallest-counts"),
        pytest.param("local", [], None, id="local-no-gpu-one-model-at-a-time"),
        pytest.param("kubernetes", [24 * GiB], None, id="kubernetes-not-discovered"),
    ],
)
async def test_a_group_without_a_capacity_gets_the_local_machines_gpus(
    backend: str, devices: list[int], capacity: Capacity | None
) -> None:
    store = MemoryStore()
    scheduler = Scheduler(
        store=store, bus=MemoryBus(), lock=MemoryLeaderLock(), settings=SchedulerSettings(), clock=FakeClock(START)
    )
    await store.put_model(model(None), START)
    hello = ActuatorHello(actuator="a1", backend=backend, time=START, gpu_devices=devices)
    await scheduler.intake.on_actuator_hello(hello, None)
    world, _ = await store.load_world(START, timedelta(minutes=1))
    group = world.group("gpu")
    assert group is not None and group.capacity == capacity


@pytest.mark.asyncio(loop_scope="function")
async def test_a_declared_capacity_wins_over_the_discovered_one() -> None:
    store = MemoryStore()
    scheduler = Scheduler(
        store=store, bus=MemoryBus(), lock=MemoryLeaderLock(), settings=SchedulerSettings(), clock=FakeClock(START)
    )
    await store.put_model(model(None), START)
    group = GPUGroup.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "GPUGroup",
            "metadata": {"name": "gpu"},
            "spec": {"capacity": {"devices": 1, "memoryPerDevice": "8Gi"}},
        }
    )
    await store.put_gpugroup(group, START)
    hello = ActuatorHello(actuator="a1", backend="local", time=START, gpu_devices=[24 * GiB, 24 * GiB])
    await scheduler.intake.on_actuator_hello(hello, None)
    world, _ = await store.load_world(START, timedelta(minutes=1))
    snapshot = world.group("gpu")
    assert snapshot is not None and snapshot.capacity == Capacity(1, 8 * GiB)


@pytest.mark.asyncio(loop_scope="function")
async def test_with_two_groups_on_the_machine_neither_gets_its_gpus_and_a_warning_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Each group counting both cards could load twice what they hold together: one model at a time each, as before.
    store = MemoryStore()
    scheduler = Scheduler(
        store=store, bus=MemoryBus(), lock=MemoryLeaderLock(), settings=SchedulerSettings(), clock=FakeClock(START)
    )
    await store.put_model(model(None), START)
    embed = model(None).model_copy(deep=True)
    embed.metadata.name = "embed"
    embed.spec.gpu.shared = "embeddings"  # type: ignore[union-attr]
    await store.put_model(embed, START)
    hello = ActuatorHello(actuator="a1", backend="local", time=START, gpu_devices=[24 * GiB, 24 * GiB])
    with caplog.at_level(logging.WARNING):
        await scheduler.intake.on_actuator_hello(hello, None)
    world, _ = await store.load_world(START, timedelta(minutes=1))
    assert [(g.name, g.capacity) for g in world.groups] == [("embeddings", None), ("gpu", None)]
    (warning,) = [r for r in caplog.records if "several groups share this machine" in r.getMessage()]
    assert warning.groups == ["embeddings", "gpu"]  # type: ignore[attr-defined]
