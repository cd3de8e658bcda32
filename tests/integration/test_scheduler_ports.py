"""One contract for each of the scheduler's ports, run against the in-memory implementation and the real one
(PostgreSQL, NATS), so the loop tests that use the in-memory ports say something about production."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncConnection

from flexinfer_common.enums import GroupPolicy, ModelPhase, ScaleAction, SchedulingPolicy, SharedState, SwapReason
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GPUGroup, Model
from flexinfer_common.messages import Demand, Route
from flexinfer_scheduler.adapters.bus import AdvisoryLock, NatsSchedulerBus
from flexinfer_scheduler.adapters.memory import MemoryBus, MemoryLocks, MemoryStore
from flexinfer_scheduler.adapters.store import Store
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.manifests import GroupMove, estimate_memory
from flexinfer_scheduler.domain.plan import GroupPlan, plan_group
from flexinfer_scheduler.ports import (
    DemandReport,
    LeaderLock,
    MembershipChangeRefused,
    Origin,
    RuntimeReport,
    SchedulerBus,
    SchedulerStore,
    World,
)
from flexinfer_testbed.servers import TestServers, fresh_database
from tests.conftest import reset_nats
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
WINDOW = timedelta(minutes=2)
A, B, C, D = ModelKey("default", "a"), ModelKey("default", "b"), ModelKey("ml", "c"), ModelKey("ml", "d")


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
    assert await s.record_demand(
        DemandReport(namespace="default", name="b", source="p1", queued=2, when=NOW, message_id="1")
    )
    assert await s.record_demand(
        DemandReport(namespace="default", name="b", source="p2", queued=1, when=NOW, message_id="2")
    )
    assert (
        await s.record_demand(
            DemandReport(namespace="default", name="b", source="p2", queued=5, when=NOW, message_id="2")
        )
        is None
    )
    earlier = NOW - timedelta(seconds=30)
    await s.record_demand(
        DemandReport(namespace="default", name="b", source="p3", queued=0, when=earlier, message_id="3")
    )
    assert (
        await s.record_demand(
            DemandReport(namespace="default", name="zz", source="p1", queued=1, when=NOW, message_id="4")
        )
        is None
    )
    world, _ = await s.load_world(NOW, WINDOW)
    b = world.group("gpu").member(B)  # type: ignore[union-attr]
    assert b is not None and b.queued == 3 and b.last_active_time == NOW  # never moved backwards
    world, _ = await s.load_world(NOW + WINDOW + timedelta(seconds=1), WINDOW)
    assert world.group("gpu").member(B).queued == 0  # type: ignore[union-attr]


async def test_store_keeps_a_count_for_as_long_as_its_message_says_then_prunes_it(store: Any) -> None:
    """A proxy renewing every 10 minutes sends validFor = 3 x 10 min + 5 s: its waiting requests keep their demand
    past the scheduler's own TTL (built from the scheduler's refresh setting), and pruning never drops it early."""
    s = await seeded(store)
    valid_for = timedelta(minutes=30, seconds=5)
    await s.record_demand(
        DemandReport(
            namespace="default", name="b", source="slow-proxy", queued=2, when=NOW, message_id="1", valid_for=valid_for
        )
    )
    await s.record_demand(
        DemandReport(namespace="default", name="b", source="external", queued=1, when=NOW, message_id="2")
    )

    async def queued(at: datetime) -> int:
        world, _ = await s.load_world(at, WINDOW)
        return world.group("gpu").member(B).queued  # type: ignore[union-attr]

    assert await queued(NOW) == 3
    later = NOW + WINDOW + timedelta(seconds=1)  # past the TTL: only the message without a validity of its own lapsed
    assert await queued(later) == 2
    await s.prune(later + timedelta(minutes=10), keep=timedelta(minutes=5))
    assert await queued(NOW + valid_for) == 2
    assert await queued(NOW + valid_for + timedelta(seconds=1)) == 0
    await s.prune(NOW + valid_for + timedelta(seconds=1), keep=timedelta(minutes=5))
    assert await s.record_demand(
        DemandReport(namespace="default", name="b", source="slow-proxy", queued=1, when=NOW, message_id="3")
    ), "the pruned slot takes a new count (an older time than the pruned one is no conflict)"
    assert await queued(NOW) == 1


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
    await s.record_demand(DemandReport(namespace="default", name="a", source="p1", queued=1, when=NOW, message_id="1"))
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
        RuntimeReport(
            namespace="default", name="a", phase="Ready", generation=1, endpoint="http://x", message="", when=NOW
        )
    )
    assert not await s.record_runtime(
        RuntimeReport(namespace="default", name="a", phase="Parked", generation=0, endpoint=None, message="", when=NOW)
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


async def test_a_pass_read_before_its_group_was_deleted_does_not_write_the_group_back(store: Any) -> None:
    """A GPUGroup deleted through the API while a pass ran: the pass's write must not bring the group back as an
    empty group (its view stayed in `GET /api/v1/groups` for good; a CI run waited 20 s for its 404)."""
    s, world, plans = await a_pass_starting_c_in_v1(store)
    assert await store.delete_group("v1")  # c was never started: it moves to a group of its own at once
    await s.apply_plans(world, plans, NOW)
    assert "v1" not in await s.group_names()
    again, _ = await s.load_world(NOW, WINDOW)
    assert again.group("v1") is None
    gpu = again.group("gpu")
    assert gpu is not None  # the other groups' writes went through


@pytest.mark.parametrize("store", ["postgres"], indirect=True)  # two transactions at once (the memory store has none)
async def test_a_pass_writing_while_its_group_is_being_deleted_does_not_write_the_group_back(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As above, but the pass's write starts while the deletion's transaction is still open: the write's snapshot
    still shows the group's row, and the write waits for the deletion's locks. Once the deletion commits, the write
    must not insert the group again (a `DELETE /api/v1/gpugroups/g1` left an empty g1 for good under load:
    test_scheduler_policies waited 20 s for its 404)."""
    s, world, plans = await a_pass_starting_c_in_v1(store)

    removed, commit = asyncio.Event(), asyncio.Event()
    remove_groups = Store._remove_groups

    async def remove_then_hold(self: Store, *args: Any, **kwargs: Any) -> None:
        await remove_groups(self, *args, **kwargs)
        removed.set()
        await commit.wait()  # the deletion's transaction stays open: v1's row deleted, the models locked

    monkeypatch.setattr(Store, "_remove_groups", remove_then_hold)
    deletion = asyncio.create_task(store.delete_group("v1"))
    await removed.wait()
    write = asyncio.create_task(s.apply_plans(world, plans, NOW))

    async def write_waits_for_the_deletion() -> bool:
        async with store.sessions() as session:
            waiting = await session.scalar(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            )
        return bool(waiting)

    await wait_for(write_waits_for_the_deletion, within=10, what="the pass's write waiting for the deletion's locks")
    commit.set()
    assert await deletion
    assert await write == {C}  # c moved to a group of its own: not written in v1
    assert "v1" not in await s.group_names()
    again, _ = await s.load_world(NOW, WINDOW)
    assert again.group("v1") is None


@pytest.mark.parametrize("store", ["postgres"], indirect=True)  # two transactions at once (the memory store has none)
async def test_a_gpugroup_deletion_and_a_pass_writing_its_models_at_once_both_go_through(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The deletion holds its group's row while it works out every model's membership; a pass writes the group's
    model and then its group. Both must go through, one after the other: with the deletion locking the group before
    the models, the two deadlocked and PostgreSQL aborted one of them after a second (here the pass, whose
    traceback was the scheduler's log line; an admin call aborted answers 500)."""
    s, world, plans = await a_pass_starting_c_in_v1(store)  # it writes c, then v1's new holder

    holding, go_on = asyncio.Event(), asyncio.Event()
    recompute = Store._recompute_membership

    async def hold_then_recompute(self: Store, *args: Any, **kwargs: Any) -> None:
        holding.set()  # the group's row is written (locked) and not committed
        await go_on.wait()
        await recompute(self, *args, **kwargs)

    monkeypatch.setattr(Store, "_recompute_membership", hold_then_recompute)
    deletion = asyncio.create_task(store.delete_group("v1"))
    await holding.wait()
    write = asyncio.create_task(s.apply_plans(world, plans, NOW))
    await wait_for(lambda: _lock_waits(store), within=10, what="the pass's write waiting for the deletion's locks")
    go_on.set()
    assert await deletion
    assert await write == {C}  # c moved to a group of its own meanwhile: not written in v1
    assert "v1" not in await s.group_names()


@pytest.mark.parametrize("store", ["postgres"], indirect=True)
async def test_a_pass_write_postgres_aborted_for_another_transaction_is_written_again(
    store: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deadlock or a serialization failure rolls the pass's write back whole: it is run again, not lost until
    the next pass (the election's outcome delayed by a reconcile interval, and a traceback in the log)."""
    s = await seeded(store)
    await s.record_demand(DemandReport(namespace="default", name="b", source="p1", queued=2, when=NOW, message_id="1"))
    world, _ = await s.load_world(NOW, WINDOW)
    plans = planned(world, NOW)
    aborted = []
    execute = AsyncConnection.execute

    async def deadlocked_once(self: AsyncConnection, statement: Any, *args: Any, **kwargs: Any) -> Any:
        if not aborted and "RETURNING" in str(statement):
            aborted.append(statement)
            raise DBAPIError(str(statement), None, _PgError("40P01"))
        return await execute(self, statement, *args, **kwargs)

    monkeypatch.setattr(AsyncConnection, "execute", deadlocked_once)
    assert await s.apply_plans(world, plans, NOW) == set()
    assert aborted  # the first run was aborted
    gpu = next(p for p in plans if p.group == "gpu")
    assert gpu.active is not None  # the pass writes a new holder
    again, _ = await s.load_world(NOW, WINDOW)
    written = again.group("gpu")
    assert written is not None and written.active == gpu.active


class _PgError(Exception):
    """What the asyncpg dialect puts under a DBAPIError: the server's SQLSTATE."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


async def _lock_waits(store: Any) -> bool:
    async with store.sessions() as session:
        waiting = await session.scalar(
            text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
            )
        )
    return bool(waiting)


async def test_a_pass_read_before_a_model_moved_neither_writes_nor_commands_it_in_its_new_group(store: Any) -> None:
    """A parked model moved into a group whose GPU is held (its Model changed through the API) while a pass of its
    old group elected it: the stale pass must not activate it there (two models on one card). The store writes
    nothing of it, says so, and writes the rest of the pass."""
    s = await seeded(store)
    await load(store, A, NOW)  # a holds gpu's card
    at = NOW + timedelta(seconds=1)
    await store.put_model(model("d", "ml"), at)  # a new model: its own group's next pass loads it
    world, _ = await s.load_world(at, WINDOW)
    plans = planned(world, at)
    assert any(p.group == "solo.ml.d" and any(c.key == D for c in p.commands) for p in plans)  # the pass starts d
    await store.put_model(model("d", "ml", shared="gpu"), at)  # d was never started: it joins gpu at once
    assert await s.apply_plans(world, plans, at) == {D}
    rows = {(r.namespace, r.name): r for r in await store_models(store)}
    d = rows[("ml", "d")]
    assert d.group_name == "gpu" and d.desired_action is None and d.command_generation == 0
    assert rows[("default", "a")].desired_action == ScaleAction.ACTIVATE.value
    assert "solo.ml.d" not in await s.group_names()  # nor is the group it left written back
    again, _ = await s.load_world(at, WINDOW)
    gpu = again.group("gpu")
    assert gpu is not None and [m.key for m in gpu.members if m.loaded] == [A]  # a still alone on the card


def gpugroup(name: str, *members: tuple[str, str]) -> GPUGroup:
    return GPUGroup.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "GPUGroup",
            "metadata": {"name": name},
            "spec": {"models": [{"namespace": ns, "name": n, "priority": 70} for ns, n in members]},
        }
    )


def planned(world: World, at: datetime) -> list[GroupPlan]:
    """What one election pass plans for every group of ``world``, not written yet."""
    return [
        plan_group(g, at, ElectionParams(), command_retry=timedelta(seconds=10), new_swap_id=f"s-{g.name}")
        for g in world.groups
    ]


async def a_pass_starting_c_in_v1(store: Any) -> tuple[SchedulerStore, World, list[GroupPlan]]:
    """The seeded store with c listed by the v1alpha1 GPUGroup v1 and asked for, and a pass that read it and plans
    to start c there, not written yet (the tests change the world before or while it writes)."""
    s = await seeded(store)
    assert await store.put_gpugroup(gpugroup("v1", ("ml", "c")), NOW)
    await s.record_demand(DemandReport(namespace="ml", name="c", source="p1", queued=1, when=NOW, message_id="1"))
    world, _ = await s.load_world(NOW, WINDOW)
    plans = planned(world, NOW)
    assert any(p.group == "v1" and p.active == C for p in plans)
    return s, world, plans


async def elect(store: Any, at: datetime) -> list[GroupPlan]:
    """One election pass over every group, stored (what the loop does)."""
    world, _ = await store.load_world(at, WINDOW)
    plans = [
        plan_group(g, at, ElectionParams(), command_retry=timedelta(seconds=10), new_swap_id=f"s-{g.name}-{at:%H%M%S}")
        for g in world.groups
    ]
    await store.apply_plans(world, plans, at)
    return plans


async def report(store: Any, key: ModelKey, phase: str, at: datetime) -> None:
    """The actuator confirms the model's last command."""
    row = next(r for r in await store_models(store) if (r.namespace, r.name) == key)
    assert await store.record_runtime(
        RuntimeReport(
            namespace=key.namespace,
            name=key.name,
            phase=phase,
            generation=row.command_generation,
            endpoint="http://x" if phase == "Ready" else None,
            message="",
            when=at,
        )
    )


async def store_models(store: Any) -> list[Any]:
    return list(store.models.values()) if isinstance(store, MemoryStore) else await store.models()


async def load(store: Any, key: ModelKey, at: datetime) -> None:
    """Promote the model, elect, and have the actuator report it Ready: it holds its group's GPU."""
    await store.set_promoted(key.namespace, key.name, at)
    await elect(store, at)
    await report(store, key, "Ready", at)


async def park(store: Any, key: ModelKey, at: datetime) -> list[GroupPlan]:
    """Park the model as the status page's Park does, elect (a park command), and have the actuator confirm it."""
    await store.set_parked(key.namespace, key.name, at)
    plans = await elect(store, at)
    await report(store, key, "Parked", at)
    return plans


async def where(store: Any, key: ModelKey, at: datetime) -> tuple[str, Any]:
    world, _ = await store.load_world(at, WINDOW)
    (group,) = [g for g in world.groups if g.member(key) is not None]
    return group.name, group.member(key)


async def test_store_refuses_a_gpugroup_change_that_would_move_a_loaded_model_until_it_is_parked(
    store: Any,
) -> None:
    """Admin API: creating, changing or deleting a GPUGroup that would move a model which may hold its group's GPU
    is refused (the API answers 409 with this message) and changes nothing; once the model is parked it goes
    through."""
    s = await seeded(store)
    await load(store, C, NOW)
    with pytest.raises(MembershipChangeRefused) as refused:
        await store.put_gpugroup(gpugroup("v1", ("ml", "c")), NOW)
    assert str(refused.value).startswith(
        "GPUGroup 'v1' cannot be created: it would move model ml/c from a group of its own to group 'v1' while it "
        "may still hold the GPU of a group of its own"
    )
    assert "v1" not in await s.group_names()
    group, c = await where(store, C, NOW)
    assert group == "solo.ml.c" and c.ready and c.moving_to is None
    world, _ = await s.load_world(NOW, WINDOW)
    assert world.statuses[C].shared_state == SharedState.ACTIVE.value

    later = NOW + timedelta(seconds=5)
    await park(store, C, later)
    assert await store.put_gpugroup(gpugroup("v1", ("ml", "c")), later)
    assert (await where(store, C, later))[0] == "v1"

    # loaded in v1: neither a change that drops it from the list nor the GPUGroup's deletion moves it
    later += timedelta(seconds=5)
    await load(store, C, later)
    with pytest.raises(MembershipChangeRefused, match=r"'v1' cannot be changed: it would move model ml/c from group"):
        await store.put_gpugroup(gpugroup("v1", ("ml", "other")), later)
    with pytest.raises(MembershipChangeRefused, match=r"'v1' cannot be deleted: it would move model ml/c from group"):
        await store.delete_group("v1")
    group, c = await where(store, C, later)
    assert group == "v1" and c.ready and c.priority == 70
    world, _ = await s.load_world(later, WINDOW)
    assert world.statuses[C].shared_state == SharedState.ACTIVE.value
    assert world.group("v1").active == C  # type: ignore[union-attr]

    later += timedelta(seconds=5)
    await park(store, C, later)
    assert await store.delete_group("v1")
    assert (await where(store, C, later))[0] == "solo.ml.c" and "v1" not in await s.group_names()


async def test_store_gpugroup_from_kubernetes_moves_a_loaded_model_once_it_is_parked(store: Any) -> None:
    """Kubernetes: the change is in the cluster already, so it is applied; the loaded model stays in its group,
    which parks it as in a swap (reason group-change), and it moves once the actuator confirmed the park."""
    s = await seeded(store)
    kubernetes = Origin("kubernetes", NOW, 1)
    await load(store, C, NOW)
    assert await store.put_gpugroup(gpugroup("v1", ("ml", "c")), NOW, kubernetes)
    group, c = await where(store, C, NOW)
    assert group == "solo.ml.c" and c.moving_to == "v1" and c.leaving
    assert await s.finish_moves([C]) == []  # not parked yet

    plans = {p.group: p for p in await elect(store, NOW)}
    solo = plans["solo.ml.c"]
    assert solo.election.leader is None
    (swap,) = [u.swap for u in solo.swap_updates]
    assert swap.reason == SwapReason.GROUP_CHANGE and swap.from_model == C
    assert "moving to group 'v1' once parked in a group of its own" in solo.statuses[C].message
    commands = [(c.key, c.action) for c in solo.commands]
    for seconds in range(1, 5):  # the drain settles, then the park is sent
        commands += [
            (c.key, c.action) for p in await elect(store, NOW + timedelta(seconds=seconds)) for c in p.commands
        ]
    assert commands == [(C, ScaleAction.PARK)]
    assert await s.finish_moves([C]) == []  # commanded, not confirmed
    later = NOW + timedelta(seconds=5)
    await report(store, C, "Parked", later)
    assert await s.finish_moves([C]) == [GroupMove(C, "solo.ml.c", "v1")]
    group, c = await where(store, C, later)
    assert group == "v1" and c.moving_to is None and c.priority == 70
    assert "solo.ml.c" not in await s.group_names()

    # deleted in Kubernetes while c holds v1's GPU: v1 stays (as a group without a manifest) until c has left it
    later += timedelta(seconds=5)
    await load(store, C, later)
    assert await store.delete_group("v1", Origin("kubernetes", later, 2))
    group, c = await where(store, C, later)
    assert group == "v1" and c.moving_to == "solo.ml.c"
    later += timedelta(seconds=5)
    await park(store, C, later)
    assert await s.finish_moves([C]) == [GroupMove(C, "v1", "solo.ml.c")]
    assert (await where(store, C, later))[0] == "solo.ml.c" and "v1" not in await s.group_names()


async def test_store_a_model_moved_by_kubernetes_while_loaded_keeps_its_group_until_parked(store: Any) -> None:
    """The same for a Model's own spec.gpu.shared changed in Kubernetes (the admin API refuses it with 409)."""
    s = await seeded(store)
    kubernetes = Origin("kubernetes", NOW, 1)
    await store.put_model(model("c", "ml"), NOW, kubernetes)
    await load(store, C, NOW)
    await store.put_model(model("c", "ml", shared="gpu", priority=3), NOW, Origin("kubernetes", NOW, 2))
    group, c = await where(store, C, NOW)
    assert group == "solo.ml.c" and c.moving_to == "gpu"
    later = NOW + timedelta(seconds=5)
    await park(store, C, later)
    assert await s.finish_moves([C]) == [GroupMove(C, "solo.ml.c", "gpu")]
    group, c = await where(store, C, later)
    assert group == "gpu" and c.priority == 3


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
        # a later message, delivered after whatever the duplicate would have been: once it is here, so would it be
        later = Demand(model="b", namespace="default", queued=2, source="p", time=NOW)
        await bus.publish("flexinfer.demand.default.b", later, msg_id="later")
        async with asyncio.timeout(10):
            while not any(d.model == "b" for d in got):
                arrived.clear()
                await arrived.wait()
        assert [(d.model, d.queued) for d in got] == [("a", 1), ("b", 2)]
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


def declaration(name: str, **spec: Any) -> GPUGroup:
    """A GPUGroup without models: the spec of the v1alpha2 shared group ``name``."""
    return GPUGroup.model_validate(
        {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup", "metadata": {"name": name}, "spec": spec}
    )


async def test_store_gpugroup_declares_the_scheduling_of_a_v1alpha2_group(store: Any) -> None:
    s = await seeded(store)
    assert await store.put_gpugroup(declaration("gpu", scheduling="seed"), NOW)
    world, _ = await s.load_world(NOW, WINDOW)
    gpu = world.group("gpu")
    assert gpu is not None and gpu.policy == GroupPolicy.V1ALPHA2 and gpu.v1alpha1 is None
    assert gpu.scheduling == SchedulingPolicy.SEED
    assert {m.key for m in gpu.members} == {A, B}  # the members stay the models that name it
    # an election writes the group's row; the declaration stays
    await s.record_demand(DemandReport(namespace="default", name="a", source="p1", queued=1, when=NOW, message_id="1"))
    world, _ = await s.load_world(NOW, WINDOW, {"gpu"})
    (plan,) = [
        plan_group(g, NOW, ElectionParams(), command_retry=timedelta(seconds=10), new_swap_id="s1")
        for g in world.groups
    ]
    await s.apply_plans(world, [plan], NOW)
    world, _ = await s.load_world(NOW, WINDOW, {"gpu"})
    gpu = world.group("gpu")
    assert gpu is not None and gpu.active == A and gpu.scheduling == SchedulingPolicy.SEED
    assert not await store.put_gpugroup(declaration("gpu", scheduling="flexinfer"), NOW)  # updated, not created
    world, _ = await s.load_world(NOW, WINDOW, {"gpu"})
    assert world.group("gpu").scheduling == SchedulingPolicy.FLEXINFER  # type: ignore[union-attr]
    # deleted: the setting decides again, and the group keeps its holder
    assert await store.delete_group("gpu")
    assert not await store.delete_group("gpu")
    world, _ = await s.load_world(NOW, WINDOW, {"gpu"})
    gpu = world.group("gpu")
    assert gpu is not None and gpu.scheduling is None and gpu.active == A


async def test_store_keeps_a_declared_group_without_models(store: Any) -> None:
    s = await seeded(store)
    assert await store.put_gpugroup(declaration("later", scheduling="seed"), NOW)
    await store.put_model(model("d", shared="later"), NOW)
    await store.delete_model("default", "d")
    world, _ = await s.load_world(NOW, WINDOW)
    later = world.group("later")
    assert later is not None and later.members == () and later.scheduling == SchedulingPolicy.SEED


async def test_store_estimates_an_undeclared_memory_from_local_weights(store: Any, tmp_path: Path) -> None:
    weights = tmp_path / "model.gguf"
    with weights.open("wb") as out:
        out.truncate(3 << 30)
    s: SchedulerStore = store
    declared = model("small", shared="card", memory="2Gi")
    local = Model.model_validate(
        {
            **model("local", shared="card").model_dump(by_alias=True),
            "spec": {**model("local", shared="card").model_dump(by_alias=True)["spec"], "source": str(weights)},
        }
    )
    for m in (declared, local, model("remote", shared="card")):
        await store.put_model(m, NOW)
    world, _ = await s.load_world(NOW, WINDOW)
    card = world.group("card")
    assert card is not None
    by_name = {m.key.name: m for m in card.members}
    assert (by_name["small"].memory, by_name["small"].memory_estimated) == (2 << 30, False)
    assert (by_name["local"].memory, by_name["local"].memory_estimated) == (estimate_memory(3 << 30), True)
    assert (by_name["remote"].memory, by_name["remote"].memory_estimated) == (None, False)


async def test_store_keeps_a_measured_memory_and_fits_with_it_only_above_the_declaration(store: Any) -> None:
    s: SchedulerStore = store
    await store.put_model(model("chat", shared="card", memory="4Gi"), NOW)
    key = ModelKey("default", "chat")
    assert await s.record_measured_memory(namespace="default", name="nobody", measured=1) is None
    first = await s.record_measured_memory(namespace="default", name="chat", measured=6 << 30)
    assert first is not None and (first.group, first.previous, first.reference) == ("card", None, 4 << 30)
    world, _ = await s.load_world(NOW, WINDOW)
    member = world.group("card").member(key)  # type: ignore[union-attr]
    assert member is not None and (member.memory, member.memory_measured) == (6 << 30, 6 << 30)
    again = await s.record_measured_memory(namespace="default", name="chat", measured=2 << 30)
    assert again is not None and again.previous == 6 << 30
    world, _ = await s.load_world(NOW, WINDOW)
    member = world.group("card").member(key)  # type: ignore[union-attr]
    assert member is not None and (member.memory, member.memory_measured) == (4 << 30, 2 << 30)


async def test_store_gives_the_local_machines_gpus_to_its_one_group_that_declares_no_capacity(store: Any) -> None:
    s: SchedulerStore = store
    await store.put_model(model("chat", shared="card"), NOW)
    assert await s.record_gpu_inventory(backend="local", actuator="a1", device_memory=[24 << 30, 16 << 30], when=NOW)
    assert not await s.record_gpu_inventory(
        backend="local", actuator="a2", device_memory=[24 << 30, 16 << 30], when=NOW
    ), "the same devices again: nothing changed"
    world, _ = await s.load_world(NOW, WINDOW)
    card = world.group("card")
    assert card is not None and card.capacity is not None
    assert (card.capacity.devices, card.capacity.memory_per_device) == (2, 16 << 30)
    assert (await s.load_world(NOW, WINDOW, {"card"}))[0].group("card").capacity == card.capacity  # type: ignore[union-attr]

    # A second group on the machine: each would count every device, so neither gets them (one model at a time
    # until the group declares its capacity); a declared one keeps its own.
    await store.put_gpugroup(declaration("sized", capacity={"devices": 1, "memoryPerDevice": "8Gi"}), NOW)
    for only in (None, {"card"}):
        world, _ = await s.load_world(NOW, WINDOW, only)
        assert world.group("card").capacity is None  # type: ignore[union-attr]
    sized = (await s.load_world(NOW, WINDOW))[0].group("sized")
    assert sized is not None and sized.capacity is not None and sized.capacity.memory_per_device == 8 << 30

    assert await s.record_gpu_inventory(backend="local", actuator="a3", device_memory=[], when=NOW)
    world, _ = await s.load_world(NOW, WINDOW)
    assert world.group("card").capacity is None  # type: ignore[union-attr]
