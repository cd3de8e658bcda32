"""Deleting a model parks it first (issue 22, "deleting breaks the one-model invariant"): the scheduler's loop on
its in-memory ports with an actuator that behaves like the real one in what matters here: it runs a process per
activated model, stops it on a park, and ignores a command whose generation is not above the last it applied for
that model (a generation it has seen is stale), remembering that across the model's deletion."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from flexinfer_common import subjects
from flexinfer_common.bus import Delivery
from flexinfer_common.enums import RuntimePhase
from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import ScaleCommand, SpecChange
from flexinfer_scheduler.adapters.memory import MemoryBus, MemoryLeaderLock, MemoryStore
from flexinfer_scheduler.loop import Scheduler
from flexinfer_scheduler.ports import Origin
from flexinfer_scheduler.settings import SchedulerSettings
from flexinfer_scheduler.specs import SpecInbox
from tests.support.actuator import done, reported
from tests.support.waiting import wait_for
from tests.unit.test_scheduler_loop import LoopClock, manifest

A, B = ModelKey("default", "a"), ModelKey("default", "b")
# one priority each: peers load nothing until a request comes, and these tests want a model on the GPU from the start
# (the fallback: the highest priority; once it is deleted, the next)
PRIORITIES = (30, 20, 10)
pytestmark = [pytest.mark.looptime, pytest.mark.asyncio(loop_scope="function")]


@dataclass
class StrictActuator:
    """Processes per model; a command at or below the last generation applied for its model is ignored."""

    bus: MemoryBus
    clock: LoopClock
    running: set[ModelKey] = field(default_factory=set)
    applied: dict[ModelKey, int] = field(default_factory=dict)
    ignored: int = 0
    most_at_once: int = 0
    seen: int = 0

    async def step(self) -> None:
        commands = [m for m in self.bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
        for command in commands[self.seen :]:
            self.seen += 1
            key = ModelKey(command.namespace, command.model)
            if command.generation <= self.applied.get(key, 0):
                self.ignored += 1
                continue
            self.applied[key] = command.generation
            phase = done(command)
            if phase is RuntimePhase.READY:
                self.running.add(key)
            else:
                self.running.discard(key)
            self.most_at_once = max(self.most_at_once, len(self.running))
            subject, status = reported(key.namespace, key.name, phase, command.generation, self.clock.now())
            await self.bus.deliver(subject, status.to_bytes())

    async def run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(0.05)


@dataclass
class World:
    store: MemoryStore
    bus: MemoryBus
    scheduler: Scheduler
    actuator: StrictActuator
    clock: LoopClock

    def serving(self, key: ModelKey) -> bool:
        route = self.bus.routes.get(key)
        return route is not None and route.ready and key in self.actuator.running

    async def until(self, predicate: Any, within: float = 120) -> None:
        await wait_for(predicate, within=within)

    async def delete(self, key: ModelKey) -> bool:
        """What the admin API's DELETE does; True when the row went at once."""
        deleted = await self.store.request_deletion(key.namespace, key.name, self.clock.now())
        assert deleted is not None
        if deleted[1]:
            await self.scheduler.forget_route(key.namespace, key.name)
        self.scheduler.kick()
        return deleted[1]


@contextlib.asynccontextmanager
async def running(*names: str) -> AsyncIterator[World]:
    store, bus, clock = MemoryStore(), MemoryBus(), LoopClock()
    settings = SchedulerSettings(reconcile_interval=3, drain_timeout=20, activity_report_interval=1)
    scheduler = Scheduler(store=store, bus=bus, lock=MemoryLeaderLock(), settings=settings, clock=clock)
    actuator = StrictActuator(bus, clock)
    for name, priority in zip(names, PRIORITIES, strict=False):
        await store.put_model(manifest(name, priority=priority), clock.now())
    stop = asyncio.Event()
    tasks = [asyncio.create_task(scheduler.run(stop)), asyncio.create_task(actuator.run())]
    try:
        yield World(store, bus, scheduler, actuator, clock)
    finally:
        stop.set()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def test_deleting_the_active_model_parks_it_before_the_next_loads_and_before_its_row_goes() -> None:
    async with running("a", "b") as w:
        await w.until(lambda: w.serving(A) or w.serving(B))
        active, other = (A, B) if w.serving(A) else (B, A)
        assert not await w.delete(active)  # it holds the GPU: parked first
        row = w.store.models[active]
        assert row.deleting_at is not None
        await w.until(lambda: w.serving(other))
        assert active not in w.actuator.running
        await w.until(lambda: active not in w.store.models and active not in w.bus.routes)
        assert w.actuator.most_at_once == 1  # never two processes on the card


async def test_a_model_that_never_ran_is_deleted_at_once() -> None:
    async with running("a", "b") as w:
        await w.until(lambda: w.serving(A) or w.serving(B))
        idle = B if w.serving(A) else A
        assert await w.delete(idle)
        assert idle not in w.store.models


async def test_deleting_and_applying_the_active_model_again_serves_it_each_time() -> None:
    """The generation goes on from where the deleted model left it: the actuator ignores none of its commands."""
    async with running("a") as w:
        await w.until(lambda: w.serving(A))
        for _ in range(3):
            generation = w.store.models[A].command_generation
            await w.delete(A)
            await w.until(lambda: A not in w.store.models)
            assert A not in w.actuator.running
            assert "gpu" not in w.store.groups  # the group went with its last model
            await w.store.put_model(manifest("a"), w.clock.now())
            w.scheduler.kick()
            await w.until(lambda: w.serving(A))
            assert w.store.models[A].command_generation > generation
        assert w.actuator.ignored == 0


async def test_applying_a_model_again_while_it_is_being_deleted_cancels_the_deletion() -> None:
    async with running("a", "b") as w:
        await w.until(lambda: w.serving(A) or w.serving(B))
        active = A if w.serving(A) else B
        await w.delete(active)
        await w.store.put_model(manifest(active.name), w.clock.now())
        w.scheduler.kick()
        assert w.store.models[active].deleting_at is None
        await w.until(lambda: w.serving(A) or w.serving(B))
        await asyncio.sleep(10)  # (fast-forwarded) several reconciles: the model stays
        assert active in w.store.models
        assert w.actuator.most_at_once == 1


async def test_a_model_deleted_in_kubernetes_is_parked_before_its_row_goes() -> None:
    """Kubernetes mode: the deletion arrives as a spec message and takes the same path as the admin API's DELETE."""
    async with running() as w:
        inbox = SpecInbox(store=w.store, hooks=w.scheduler, clock=w.clock)
        for name, priority in zip(("a", "b"), PRIORITIES, strict=False):
            origin = Origin("kubernetes", w.clock.now(), 1)
            await w.store.put_model(manifest(name, priority=priority), w.clock.now(), origin)
        w.scheduler.kick()
        await w.until(lambda: w.serving(A) or w.serving(B))
        active, other = (A, B) if w.serving(A) else (B, A)
        change = SpecChange(
            kind="Model",
            action="delete",
            namespace=active.namespace,
            name=active.name,
            observed_at=w.clock.now(),
            time=w.clock.now(),
        )
        await inbox.handle(change, Delivery("flexinfer.spec.model.default.x", "1", 1))
        assert w.store.models[active].deleting_at is not None  # still there: parked first
        await w.until(lambda: w.serving(other) and active not in w.store.models)
        assert w.actuator.most_at_once == 1


async def test_a_model_applied_again_just_before_its_old_route_is_removed_is_still_routed() -> None:
    """The row of a deleted model went; the admin API applies it again (its announcement finds the old route still
    there) just before the scheduler removes that route. A request sent right after the apply must find the model
    (and queue), not get 404: once the scheduler has removed the old route, the model applied again has one."""
    async with running("a") as w:
        await w.until(lambda: w.serving(A))
        removing, forgetting = w.bus.delete_route, w.scheduler.forget_route
        routed_after_removal: list[bool] = []

        async def delete_route_after_a_reapply(key: ModelKey) -> None:
            if key == A and not routed_after_removal:
                row, created = await w.store.put_model(manifest("a"), w.clock.now())
                assert created
                await w.scheduler.announce(row)  # what the admin API's PUT does: the old route is still there
            await removing(key)

        async def forget_route(namespace: str, name: str) -> None:
            await forgetting(namespace, name)
            routed_after_removal.append(A in w.bus.routes)

        w.bus.delete_route = delete_route_after_a_reapply  # type: ignore[method-assign]
        w.scheduler.forget_route = forget_route  # type: ignore[method-assign]
        await w.delete(A)
        await w.until(lambda: bool(routed_after_removal))
        assert A in w.store.models
        assert routed_after_removal == [True], "the model applied again had no route: a request would get 404"
        await w.until(lambda: w.serving(A))
