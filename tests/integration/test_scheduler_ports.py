"""One contract for each of the scheduler's ports, run against the in-memory implementation and the real one
(PostgreSQL, NATS), so the loop tests that use the in-memory ports say something about production."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_common.enums import ModelPhase, ScaleAction, SharedState
from flexinfer_common.manifests import GPUGroup, Model
from flexinfer_common.messages import Demand, Route
from flexinfer_scheduler.adapters.bus import AdvisoryLock, NatsSchedulerBus
from flexinfer_scheduler.adapters.memory import MemoryBus, MemoryLocks, MemoryStore
from flexinfer_scheduler.adapters.store import Store
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import ModelKey
from flexinfer_scheduler.domain.plan import plan_group
from flexinfer_scheduler.ports import LeaderLock, SchedulerBus, SchedulerStore
from tests.conftest import fresh_database, reset_nats
from tests.support.servers import TestServers

pytestmark = pytest.mark.integration

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=2)
A, B, C = ModelKey("default", "a"), ModelKey("default", "b"), ModelKey("ml", "c")


def model(name: str, namespace: str = "default", **gpu: Any) -> Model:
    return Model.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"gpu": gpu, "serviceLabels": [f"{name}-label"], "local": {"command": ["serve", "{port}"]}},
        }
    )


@pytest.fixture(params=["memory", "postgres"])
async def store(request: pytest.FixtureRequest, servers: TestServers) -> AsyncIterator[Any]:
    if request.param == "memory":
        yield MemoryStore()
        return
    from flexinfer_common.db import create_engine, session_factory

    async with fresh_database(servers) as url:
        engine = create_engine(url)
        try:
            yield Store(session_factory(engine))
        finally:
            await engine.dispose()


async def seeded(store: Any) -> SchedulerStore:
    await store.put_model(model("a", shared="gpu", priority=10), NOW)
    await store.put_model(model("b", shared="gpu", priority=5), NOW)
    await store.put_model(model("c", "ml"), NOW)
    s: SchedulerStore = store
    return s


async def test_store_groups_members_and_keeps_what_the_election_reads(store: Any) -> None:
    s = await seeded(store)
    world, leases_ok = await s.load_world(NOW, WINDOW)
    assert leases_ok
    groups = {g.name: g for g in world.groups}
    assert sorted(groups) == ["gpu", "solo.ml.c"]
    a = groups["gpu"].member(A)
    assert a is not None and a.priority == 10 and a.service_labels == ("a-label",)
    runtime = world.runtime(A)  # what a command to it carries
    assert runtime is not None and runtime.command == ["serve", "{port}"] and runtime.name == "a"
    assert world.runtime(ModelKey("default", "unknown")) is None
    assert await s.group_names() == ["gpu", "solo.ml.c"] and await s.model_keys() == {A, B, C}


async def test_store_sums_demand_over_sources_and_ignores_a_repeated_message(store: Any) -> None:
    s = await seeded(store)
    assert await s.record_demand(namespace="default", name="b", source="p1", queued=2, when=NOW, message_id="1")
    assert await s.record_demand(namespace="default", name="b", source="p2", queued=1, when=NOW, message_id="2")
    assert await s.record_demand(namespace="default", name="b", source="p2", queued=5, when=NOW, message_id="2") is None
    earlier = NOW - timedelta(seconds=30)
    await s.record_demand(namespace="default", name="b", source="p3", queued=0, when=earlier, message_id="3")
    assert (
        await s.record_demand(namespace="default", name="zz", source="p1", queued=1, when=NOW, message_id="4") is None
    )
    world, _ = await s.load_world(NOW, WINDOW)
    b = world.group("gpu").member(B)  # type: ignore[union-attr]
    assert b is not None and b.queued == 3 and b.last_active_time == NOW  # never moved backwards
    world, _ = await s.load_world(NOW + WINDOW + timedelta(seconds=1), WINDOW)
    assert world.group("gpu").member(B).queued == 0  # type: ignore[union-attr]


async def test_store_in_flight_counts_per_proxy_fall_to_zero_and_age_out(store: Any) -> None:
    s = await seeded(store)
    assert await s.record_in_flight(source="p1", counts={A: 2, C: 1}, when=NOW) == set()
    assert await s.record_in_flight(source="p2", counts={A: 1}, when=NOW) == set()
    world, _ = await s.load_world(NOW, WINDOW, in_flight_ttl=timedelta(seconds=5))
    assert world.group("gpu").member(A).in_flight == 3  # type: ignore[union-attr]
    # p1's next report names c only: a fell to zero there, so a drain in a's group may be over
    assert await s.record_in_flight(source="p1", counts={C: 1}, when=NOW + timedelta(seconds=1)) == {"gpu"}
    world, _ = await s.load_world(NOW + timedelta(seconds=1), WINDOW, in_flight_ttl=timedelta(seconds=5))
    assert world.group("gpu").member(A).in_flight == 1  # type: ignore[union-attr]
    # a proxy not heard from for longer than the ttl counts as gone
    world, _ = await s.load_world(NOW + timedelta(seconds=10), WINDOW, in_flight_ttl=timedelta(seconds=5))
    assert world.group("gpu").member(A).in_flight == 0  # type: ignore[union-attr]


async def test_store_applies_a_plan_and_writes_only_what_changed(store: Any) -> None:
    s = await seeded(store)
    await s.record_demand(namespace="default", name="a", source="p1", queued=1, when=NOW, message_id="1")
    world, _ = await s.load_world(NOW, WINDOW, {"gpu"})
    (plan,) = [
        plan_group(g, NOW, ElectionParams(), command_retry=timedelta(seconds=10), new_swap_id="s1")
        for g in world.groups
    ]
    assert [(c.key, c.action) for c in plan.commands] == [(A, ScaleAction.ACTIVATE)]
    await s.apply_plans(world, [plan], NOW)
    again, _ = await s.load_world(NOW, WINDOW, {"gpu"})
    group = again.group("gpu")
    assert group is not None and group.active == A and group.swap is not None and group.swap.id == "s1"
    a = group.member(A)
    assert a is not None and a.desired_action == ScaleAction.ACTIVATE and a.command_generation == 1
    assert a.demand_since == NOW
    assert again.statuses[A].phase == ModelPhase.LOADING.value and again.statuses[A].shared_state == "Active"
    # an actuator report for that command is kept; one for an older generation is not
    assert await s.record_runtime(
        namespace="default", name="a", phase="Ready", generation=1, endpoint="http://x", message="", when=NOW
    )
    assert not await s.record_runtime(
        namespace="default", name="a", phase="Parked", generation=0, endpoint=None, message="", when=NOW
    )
    assert await s.forget_runtime() == 1
    world, _ = await s.load_world(NOW, WINDOW, {"gpu"})
    assert world.group("gpu").member(A).runtime == "Unknown"  # type: ignore[union-attr]
    assert world.statuses[B].shared_state in (None, SharedState.PARKED.value)


async def test_store_gpugroup_lists_its_members_with_their_priorities(store: Any) -> None:
    s = await seeded(store)
    group = GPUGroup.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "GPUGroup",
            "metadata": {"name": "v1"},
            "spec": {
                "models": [{"name": "c", "namespace": "ml", "priority": 70}],
                "policy": {"drainTimeoutSeconds": 9},
            },
        }
    )
    assert await store.put_gpugroup(group, NOW)
    world, _ = await s.load_world(NOW, WINDOW)
    v1 = world.group("v1")
    assert v1 is not None and v1.v1alpha1 is not None and v1.v1alpha1.drain_timeout == timedelta(seconds=9)
    c = v1.member(C)
    assert c is not None and c.priority == 70
    assert await store.delete_group("v1")
    assert "solo.ml.c" in await s.group_names()


@pytest.fixture(params=["memory", "nats"])
async def bus(request: pytest.FixtureRequest, nats_url: str) -> AsyncIterator[SchedulerBus]:
    if request.param == "memory":
        yield MemoryBus()
        return
    from flexinfer_common.bus import Bus

    await reset_nats(nats_url)
    connected = Bus(nats_url, name="contract")
    await connected.connect()
    await connected.ensure_streams()
    try:
        yield NatsSchedulerBus(connected)
    finally:
        await connected.close()


def route(name: str, ready: bool) -> Route:
    return Route(namespace="default", name=name, ready=ready, updated_at=NOW)


async def test_bus_routes_are_created_once_then_replaced_and_deleted(bus: SchedulerBus) -> None:
    assert await bus.create_route(route("a", False))
    assert not await bus.create_route(route("a", True))
    assert await bus.put_routes([route("a", True), route("b", True)]) == [True, True]
    await bus.delete_route(A)
    assert await bus.create_route(route("a", False))


async def test_bus_publishes_many_at_once_and_says_which_went_out(bus: SchedulerBus) -> None:
    demand = Demand(model="a", namespace="default", queued=1, source="p", time=NOW)
    items = [(f"flexinfer.demand.default.m{i}", demand, f"many-{i}") for i in range(50)]
    assert await bus.publish_many(items) == [True] * 50  # type: ignore[arg-type]


async def test_bus_delivers_a_message_to_its_consumer_once_per_message_id(bus: SchedulerBus) -> None:
    from flexinfer_common.bus import decode_demand

    got: list[Demand] = []
    arrived = asyncio.Event()

    async def handler(message: Demand, _: Any) -> None:
        got.append(message)
        arrived.set()

    consumer = await bus.consume(
        stream="FLEXINFER_DEMAND",
        durable="contract",
        filter_subject="flexinfer.demand.>",
        decode=decode_demand,
        handler=handler,
    )
    try:
        demand = Demand(model="a", namespace="default", queued=1, source="p", time=NOW)
        await bus.publish("flexinfer.demand.default.a", demand, msg_id="once")
        await bus.publish("flexinfer.demand.default.a", demand, msg_id="once")
        await asyncio.wait_for(arrived.wait(), 10)
        await asyncio.sleep(0.3)
        assert [(d.model, d.queued) for d in got] == [("a", 1)]
    finally:
        await consumer.stop()


@pytest.fixture(params=["memory", "postgres"])
async def locks(request: pytest.FixtureRequest, servers: TestServers) -> AsyncIterator[tuple[LeaderLock, LeaderLock]]:
    if request.param == "memory":
        table = MemoryLocks()
        yield table.lock(), table.lock()
        return
    async with fresh_database(servers) as url:
        first, second = AdvisoryLock(url, 4242), AdvisoryLock(url, 4242)
        try:
            yield first, second
        finally:
            await first.release()
            await second.release()


async def test_lock_one_holder_at_a_time(locks: tuple[LeaderLock, LeaderLock]) -> None:
    first, second = locks
    assert await first.try_acquire() and await first.try_acquire()  # keeping it is idempotent
    assert not await second.try_acquire()
    assert await first.still_held() and not await second.still_held()
    await first.release()
    assert not await first.still_held()
    assert await second.try_acquire()
