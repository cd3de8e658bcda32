"""The scheduler's loop on its in-memory ports (store, bus, leader lock): no PostgreSQL, no NATS, and time
fast-forwarded (looptime), so drains, timeouts and reconcile periods cost nothing to wait for."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_common import subjects
from flexinfer_common.db import SwapRow
from flexinfer_common.enums import RuntimePhase, ScaleAction, SwapPhase
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import Model
from flexinfer_common.messages import Demand, InFlightCount, InFlightReport, RuntimeStatus, ScaleCommand
from flexinfer_scheduler.adapters.memory import MemoryBus, MemoryLeaderLock, MemoryLocks, MemoryStore
from flexinfer_scheduler.loop import Scheduler
from flexinfer_scheduler.ports import DemandReport, RuntimeReport, World
from flexinfer_scheduler.settings import SchedulerSettings
from tests.support.actuator import done, reported
from tests.support.waiting import wait_for

A, B = ModelKey("default", "a"), ModelKey("default", "b")
START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)

# A loop of their own: looptime fast-forwards only while no real I/O is pending, and the session loop of the
# integration tests may still hold sockets.
pytestmark = [pytest.mark.looptime, pytest.mark.asyncio(loop_scope="function")]


class LoopClock:
    """Wall time that follows the event loop's (fast-forwarded) clock."""

    def __init__(self) -> None:
        self.zero = asyncio.get_running_loop().time()

    def now(self) -> datetime:
        return START + timedelta(seconds=asyncio.get_running_loop().time() - self.zero)


def manifest(name: str, **gpu: Any) -> Model:
    return Model.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"gpu": {"shared": "gpu", "priority": 10, **gpu}, "local": {"command": ["serve", "{port}"]}},
        }
    )


@dataclass
class Harness:
    store: MemoryStore
    bus: MemoryBus
    scheduler: Scheduler
    clock: LoopClock
    seen: int = 0

    async def say(self, subject: str, message: Any) -> None:
        assert await self.bus.deliver(subject, message.to_bytes())

    async def demand(self, key: ModelKey, queued: int = 1) -> None:
        message = Demand(model=key.name, namespace=key.namespace, queued=queued, source="p1", time=self.clock.now())
        await self.say(subjects.demand_subject(key.namespace, key.name), message)

    async def in_flight(self, counts: dict[ModelKey, int]) -> None:
        models = [InFlightCount(namespace=k.namespace, model=k.name, in_flight=n) for k, n in counts.items()]
        report = InFlightReport(source="p1", models=models, time=self.clock.now())
        await self.say(subjects.in_flight_subject("p1"), report)

    def commands(self) -> list[ScaleCommand]:
        return [m for m in self.bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]

    async def actuator(self) -> None:
        """Answers every command at once: Ready for an activate, Parked for a park."""
        while True:
            for command in self.commands()[self.seen :]:
                self.seen += 1
                phase = done(command)
                await self.say(*reported(command.namespace, command.model, phase, command.generation, self.clock.now()))
            await asyncio.sleep(0.05)

    async def until(self, predicate: Any, within: float = 60) -> float:
        """How long ``predicate`` took to hold (polled every 50 ms; fails after ``within`` s)."""
        start = asyncio.get_running_loop().time()
        await wait_for(predicate, within=within)
        return asyncio.get_running_loop().time() - start


@contextlib.asynccontextmanager
async def running(b_priority: int = 10, max_wait: str | None = "30s", **settings_: Any) -> AsyncIterator[Harness]:
    """The scheduler and a prompt actuator, started inside the test (so on its fast-forwarded clock). Both models
    set ``spec.gpu.maxWait`` to ``max_wait`` (None: neither sets it)."""
    store, bus, clock = MemoryStore(), MemoryBus(), LoopClock()
    settings = SchedulerSettings(
        **{"reconcile_interval": 3, "drain_timeout": 20, "activity_report_interval": 1, **settings_}
    )
    scheduler = Scheduler(store=store, bus=bus, lock=MemoryLeaderLock(), settings=settings, clock=clock)
    h = Harness(store, bus, scheduler, clock)
    bound = {"maxWait": max_wait} if max_wait is not None else {}
    await store.put_model(manifest("a", **bound), clock.now())
    await store.put_model(manifest("b", **bound, priority=b_priority), clock.now())
    stop = asyncio.Event()
    tasks = [asyncio.create_task(scheduler.run(stop)), asyncio.create_task(h.actuator())]
    try:
        await h.until(lambda: len(bus.subscriptions) == 4, within=1)  # leading, consuming
        yield h
    finally:
        stop.set()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def ready(h: Harness, key: ModelKey) -> bool:
    route = h.bus.routes.get(key)
    return route is not None and route.ready


async def serving(h: Harness, key: ModelKey) -> None:
    """A request for ``key`` (nothing else asked for): until its route is ready."""
    await h.demand(key)
    await h.until(lambda: ready(h, key))


def swap_to(h: Harness, name: str) -> SwapRow:
    return next(s for s in h.store.swaps.values() if s.to_name == name)


def told_to_park(h: Harness, name: str) -> bool:
    return any(c.model == name and c.action == ScaleAction.PARK for c in h.commands())


async def test_a_busy_model_drains_its_requests_in_flight_before_it_is_parked() -> None:
    async with running() as h:
        await drains_in_flight(h)


async def drains_in_flight(h: Harness) -> None:
    await serving(h, A)
    await h.in_flight({A: 2})  # the proxy is forwarding two requests to a
    for _ in range(40):  # a is busy all along; b waits behind it for its maxWait (30 s)
        await h.demand(B)
        await h.demand(A, queued=0)
        await asyncio.sleep(1)
        await h.in_flight({A: 2})
        if not ready(h, A):
            break
    swap = swap_to(h, "b")
    assert swap.reason == "max-wait" and swap.phase == SwapPhase.DRAINING
    assert not ready(h, A)  # the route takes no new requests for a while it drains
    assert not told_to_park(h, "a")
    await asyncio.sleep(5)
    await h.in_flight({A: 2})
    assert not told_to_park(h, "a")

    await h.in_flight({})  # they finished: the drain is over at once
    await h.until(lambda: told_to_park(h, "a"), within=1)
    await h.until(lambda: ready(h, B))
    assert 5 <= h.store.swaps[swap.id].phases["draining"] < 7
    # each command carries what the actuator needs to run its own model, from that model's manifest
    activate_b = next(c for c in h.commands() if c.model == "b" and c.action == ScaleAction.ACTIVATE)
    assert (activate_b.runtime.name, activate_b.runtime.command) == ("b", ["serve", "{port}"])


async def test_a_drain_ends_at_its_timeout() -> None:
    async with running() as h:
        await drain_times_out(h)


async def drain_times_out(h: Harness) -> None:
    await serving(h, A)
    for _ in range(60):
        await h.demand(B)
        await h.demand(A, queued=0)
        await h.in_flight({A: 1})  # a request that never ends
        await asyncio.sleep(1)
        if ready(h, B):
            break
    swap = swap_to(h, "b")
    assert swap.finished_at is not None and 20 <= swap.phases["draining"] < 22  # FLEXINFER_DRAIN_TIMEOUT


async def test_an_idle_model_is_parked_without_a_drain() -> None:
    async with running() as h:
        await parks_idle_at_once(h)


async def parks_idle_at_once(h: Harness) -> None:
    await serving(h, A)
    await asyncio.sleep(300)  # a idle for longer than the demand window
    await h.demand(B)
    waited = await h.until(lambda: ready(h, B))
    assert waited < 1
    swap = swap_to(h, "b")
    assert swap.reason == "idle" and swap.phases["draining"] == 0  # a quiet holder yields, not preempted


@pytest.mark.parametrize(("quiet_yield", "window", "after"), [(None, "2m", 48), ("90s", "2m", 90), (None, "4s", 4)])
async def test_a_lower_priority_model_gets_a_quiet_gpu_once_its_wait_is_worth_a_load(
    quiet_yield: str | None, window: str, after: int
) -> None:
    """FlexInfer's policy: b (lower priority, three requests waiting) gets the GPU once a has been quiet for its
    quiet period and b's wait is worth a load: three requests x its wait reaches 240 request-seconds scaled by how
    recently a was asked (1 - a's idle time / the demand window): at 48 s with the defaults, before the patience
    (60 s). a is parked as idle (swap reason idle), not preempted. The quiet period is FLEXINFER_QUIET_YIELD, else
    10 s, or the demand window when that is shorter: with a 4 s window a holder not asked for 4 s is quiet, as the
    seed would call it idle, and b's wait is worth a load at once (a is not coming back soon)."""
    async with running(b_priority=5, quiet_yield=quiet_yield, shared_demand_window=window) as h:
        await serving(h, A)
        await h.demand(A, queued=0)  # a's request was answered
        asked = h.clock.now()
        for _ in range(120):  # b's requests wait; a gets no request
            await h.demand(B, queued=3)
            await asyncio.sleep(1)
            if ready(h, B):
                break
        assert ready(h, B)
        swap = swap_to(h, "b")
        assert swap.reason == "idle" and after <= (swap.started_at - asked).total_seconds() < after + 5


@pytest.mark.parametrize(("queue_timeout", "bound"), [("5m", 240), ("3m", 120), ("60s", 30)])
async def test_the_bounded_wait_ends_before_the_queue_timeout(queue_timeout: str, bound: int) -> None:
    """Without ``spec.gpu.maxWait`` a peer waiting behind a busy holder gets the GPU once FLEXINFER_QUEUE_TIMEOUT
    less the drain (here 20 s) and a load (40 s) has passed, within [half the timeout, 4 min]: 240 s with a 5 min
    timeout, 120 s with 3 min, 30 s with 60 s, so that the holder's drain and the load end before its requests
    time out."""
    async with running(max_wait=None, queue_timeout=queue_timeout) as h:
        await serving(h, A)
        asked = h.clock.now()
        for _ in range(300):  # a is busy all along; b waits behind it
            await h.demand(B)
            await h.demand(A, queued=0)
            await h.in_flight({A: 1})
            await asyncio.sleep(1)
            if any(s.to_name == "b" for s in h.store.swaps.values()):
                break
        swap = swap_to(h, "b")
        assert swap.reason == "max-wait" and bound <= (swap.started_at - asked).total_seconds() < bound + 4


async def test_a_rule_of_time_takes_effect_on_time_not_at_the_next_reconcile() -> None:
    """a served and went quiet; a crowd for its peer b waits. a is quiet 10 s after it was last busy, and yields
    then, though no event comes and the reconcile runs only every minute: the plan's ``recheck_at`` passes the
    group again when the quiet period ends."""
    async with running(max_wait=None, reconcile_interval=60) as h:
        await serving(h, A)
        await h.demand(A, queued=0)  # its request answered
        busy = h.clock.now()
        await h.demand(B, queued=30)
        await h.until(lambda: any(s.to_name == "b" for s in h.store.swaps.values()), within=30)
        swap = swap_to(h, "b")
        assert swap.reason == "idle"
        assert 10 <= (swap.started_at - busy).total_seconds() < 10.5


async def test_one_replica_leads_and_another_takes_over() -> None:
    """Two replicas share a lock: one leads (it alone consumes the bus); a leader that lost its lock steps down
    (its consumers stop) before anyone leads again; when the leader stops, the other takes over."""
    store, bus, clock, locks = MemoryStore(), MemoryBus(), LoopClock(), MemoryLocks()
    settings = SchedulerSettings(reconcile_interval=1)
    await store.put_model(manifest("a"), clock.now())
    first_lock = locks.lock()
    first = Scheduler(store=store, bus=bus, lock=first_lock, settings=settings, clock=clock)
    second = Scheduler(store=store, bus=bus, lock=locks.lock(), settings=settings, clock=clock)
    stop_first, stop_second = asyncio.Event(), asyncio.Event()
    tasks = [asyncio.create_task(first.run(stop_first)), asyncio.create_task(second.run(stop_second))]
    await asyncio.sleep(2)
    assert (first.is_leader, second.is_leader) == (True, False)
    assert len(bus.subscriptions) == 4  # demand, in-flight, runtime status, actuator hello: the leader's only
    first_lock.lose()
    await asyncio.sleep(3)
    assert first.is_leader != second.is_leader and len(bus.subscriptions) == 4
    leader, leader_stop, other = (first, stop_first, second) if first.is_leader else (second, stop_second, first)
    leader_stop.set()
    await asyncio.sleep(3)
    assert other.is_leader and not leader.is_leader and len(bus.subscriptions) == 4
    stop_first.set()
    stop_second.set()
    await asyncio.gather(*tasks)
    assert locks.holder is None


class RecordingStore(MemoryStore):
    """Records which groups each load asked for; ``during_load`` runs inside a load (as an event handled while
    the load's query is in flight)."""

    def __init__(self) -> None:
        super().__init__()
        self.loads: list[frozenset[str] | None] = []
        self.during_load: Any = None

    async def load_world(
        self, now: datetime, demand_window: timedelta, groups_only: set[str] | None = None, **kw: Any
    ) -> tuple[World, bool]:
        self.loads.append(frozenset(groups_only) if groups_only is not None else None)
        if self.during_load is not None:
            await self.during_load(groups_only)
        return await super().load_world(now, demand_window, groups_only, **kw)


async def many_groups(store: MemoryStore, clock: LoopClock, groups: int) -> tuple[Scheduler, MemoryBus]:
    for g in range(groups):
        await store.put_model(manifest(f"m{g:02}", shared=f"g{g:02}"), clock.now())
    settings, bus = SchedulerSettings(reconcile_interval=3), MemoryBus()
    return Scheduler(store=store, bus=bus, lock=MemoryLeaderLock(), settings=settings, clock=clock), bus


async def test_a_demand_recorded_while_a_reconcile_slice_loads_is_elected_before_that_slice() -> None:
    """At 10,000 models the reconcile runs in slices for most of each period; a demand must not wait for the
    slice it arrived in: the slice gives way, the demand's group is elected, then the slice is loaded again."""
    store, clock = RecordingStore(), LoopClock()
    scheduler, bus = await many_groups(store, clock, 60)  # three slices of 25 groups
    demanded = ModelKey("default", "m59")

    async def demand_once(groups: set[str] | None) -> None:
        if groups is not None and "g00" in groups and store.during_load is not None:
            store.during_load = None
            await store.record_demand(
                DemandReport(namespace="default", name="m59", source="p1", queued=1, when=clock.now(), message_id="d1")
            )
            scheduler.kick("g59")

    store.during_load = demand_once
    await scheduler.reconcile()

    first_slice = frozenset(f"g{g:02}" for g in range(25))
    assert store.loads[:3] == [first_slice, frozenset({"g59"}), first_slice]
    commands = [m for m in bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
    assert commands[0].model == demanded.name and commands[0].action == ScaleAction.ACTIVATE
    assert {c.model for c in commands} == {f"m{g:02}" for g in range(60)}  # every slice was still elected


async def test_a_stream_of_events_cannot_starve_a_reconcile_slice() -> None:
    """Every load of the first slice records another event: the slice gives way a few times, then runs."""
    store, clock = RecordingStore(), LoopClock()
    scheduler, bus = await many_groups(store, clock, 30)

    async def event_every_time(groups: set[str] | None) -> None:
        if groups is not None and "g00" in groups:
            scheduler.kick("g29")

    store.during_load = event_every_time
    await scheduler.reconcile()

    first_slice = frozenset(f"g{g:02}" for g in range(25))
    assert store.loads.count(first_slice) == 4  # it gave way three times (SLICE_YIELDS), then ran
    commands = [m for m in bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
    assert {c.model for c in commands} == {f"m{g:02}" for g in range(30)}


async def test_the_reconcile_forgets_the_route_of_a_model_deleted_behind_its_back() -> None:
    """A model deleted without the scheduler hearing of it (another replica's API, a lost event): the next reconcile
    plans nobody of that name, so it reads the models' keys and deletes the route; the others keep theirs."""
    store, clock = RecordingStore(), LoopClock()
    scheduler, bus = await many_groups(store, clock, 30)
    await scheduler.reconcile()
    assert set(bus.routes) == {ModelKey("default", f"m{g:02}") for g in range(30)}
    await store.delete_model("default", "m07")
    await scheduler.reconcile()
    assert set(bus.routes) == {ModelKey("default", f"m{g:02}") for g in range(30) if g != 7}


async def test_a_route_whose_deletion_fails_is_deleted_by_a_later_reconcile(caplog: pytest.LogCaptureFixture) -> None:
    """The bus refuses the deletion of a deleted model's route: it is logged, and the next reconcile deletes it (the
    key is not forgotten, else the proxies would route to the model for ever)."""
    store, clock = RecordingStore(), LoopClock()
    scheduler, bus = await many_groups(store, clock, 3)
    await scheduler.reconcile()
    bus.fail_delete_route = ConnectionError("bus down")
    await store.delete_model("default", "m01")
    await scheduler.forget_route("default", "m01")  # what the admin API does: it fails
    await scheduler.reconcile()
    assert ModelKey("default", "m01") in bus.routes
    assert "route of a deleted model not removed" in caplog.text
    bus.fail_delete_route = None
    await scheduler.reconcile()
    assert set(bus.routes) == {ModelKey("default", "m00"), ModelKey("default", "m02")}


class FailingWriteStore(MemoryStore):
    """A store whose writes fail (Postgres gone mid-pass) until ``failing`` is cleared."""

    failing = True

    async def apply_plans(self, world: World, plans: Any, now: datetime) -> set[ModelKey]:
        await asyncio.sleep(0.01)  # the routes go out meanwhile
        if self.failing:
            raise ConnectionError("database went away")
        return await super().apply_plans(world, plans, now)


async def test_no_command_or_status_goes_out_for_a_plan_that_was_not_stored() -> None:
    """A pass writes its plan while it sends the routes, but a command (a new generation the actuator acts on) or
    a status only once the plan is stored: a failed write sends neither, and the next pass sends both."""
    store, clock = FailingWriteStore(), LoopClock()
    scheduler, bus = await many_groups(store, clock, 2)
    with pytest.raises(ConnectionError):
        await scheduler.election_pass()
    assert bus.messages(subjects.COMMAND_PREFIX) == [] and bus.messages(subjects.STATUS_PREFIX) == []
    assert store.groups == {}  # nothing stored
    store.failing = False
    await scheduler.election_pass()
    commands = [m for m in bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
    assert sorted((c.model, c.action, c.generation) for c in commands) == [
        ("m00", ScaleAction.ACTIVATE, 1),
        ("m01", ScaleAction.ACTIVATE, 1),
    ]
    assert len(bus.messages(subjects.MODEL_STATUS_PREFIX)) == 2


class MovingStore(MemoryStore):
    """A store in which m01, never started, is moved into g00 (its Model changed through the API) while a pass
    writes."""

    async def apply_plans(self, world: World, plans: Any, now: datetime) -> set[ModelKey]:
        await self.put_model(manifest("m01", shared="g00"), now)
        return await super().apply_plans(world, plans, now)


async def test_no_command_goes_out_for_a_model_that_left_its_group_during_the_pass() -> None:
    """A pass read m01 in its own group and started it; m01 moved meanwhile into g00, whose m00 the same pass
    started: activating m01 too would put two models on g00's card. Only m00 is commanded; m01 waits for g00."""
    store, clock = MovingStore(), LoopClock()
    scheduler, bus = await many_groups(store, clock, 2)
    await scheduler.election_pass()
    commands = [m for m in bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
    assert [(c.model, c.action) for c in commands] == [("m00", ScaleAction.ACTIVATE)]
    assert [m.model for m in bus.messages(subjects.MODEL_STATUS_PREFIX)] == ["m00"]
    assert store.models[ModelKey("default", "m01")].desired_action is None


async def test_a_stored_manifest_that_no_longer_parses_stops_only_its_own_command(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The election reads a part of each manifest; the whole manifest is parsed when a command needs it. One that
    an older version stored and this one refuses (here: port 0) costs only that model's command, with a logged
    reason: the pass goes on and the other groups get theirs."""
    store, clock = MemoryStore(), LoopClock()
    scheduler, bus = await many_groups(store, clock, 2)
    row = store.models[ModelKey("default", "m01")]
    row.manifest = {**row.manifest, "spec": {**row.manifest["spec"], "endpoint": {"port": 0}}}
    row.spec_generation += 1
    await scheduler.election_pass()
    commands = [m for m in bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
    assert [(c.model, c.action) for c in commands] == [("m00", ScaleAction.ACTIVATE)]
    assert any("does not parse" in r.getMessage() and getattr(r, "model", "") == "default/m01" for r in caplog.records)


async def test_the_garbage_collector_waits_out_every_pass_running_and_resumes_after_the_last() -> None:
    """A pass allocates much and makes no cycles: the cyclic collector pauses while any pass runs (two may overlap:
    an event's pass and a test's), resumes when the last one ends, also when a pass fails, and a collector paused
    by someone else before stays paused."""
    store, clock = RecordingStore(), LoopClock()
    scheduler, _ = await many_groups(store, clock, 2)
    seen: list[bool] = []
    hold, holding = asyncio.Event(), asyncio.Event()

    async def record(groups: set[str] | None) -> None:
        seen.append(gc.isenabled())
        if groups == {"g00"}:
            holding.set()
            await hold.wait()

    store.during_load = record
    assert gc.isenabled()
    first = asyncio.create_task(scheduler.election_pass({"g00"}))
    await holding.wait()
    await scheduler.election_pass({"g01"})  # starts and ends while the first is in its load
    assert seen == [False, False] and not gc.isenabled()  # the first still runs
    hold.set()
    await first
    assert gc.isenabled()

    failing = FailingWriteStore()
    scheduler, _ = await many_groups(failing, clock, 1)
    with pytest.raises(ConnectionError):
        await scheduler.election_pass()
    assert gc.isenabled()

    failing.failing = False
    gc.disable()
    try:
        await scheduler.election_pass()
        assert not gc.isenabled()
    finally:
        gc.enable()


async def test_a_route_that_makes_a_model_ready_goes_out_only_once_the_plan_is_stored() -> None:
    """Routes go out while a pass writes its plan, but not one that makes a model ready: a proxy serves the model as
    soon as it reads that route, and by then the admin API (the stored plan) must say Ready."""
    store, clock = FailingWriteStore(), LoopClock()
    store.failing = False
    scheduler, bus = await many_groups(store, clock, 1)
    await scheduler.election_pass()  # m00 is told to activate
    key = ModelKey("default", "m00")
    activate = [m for m in bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)][-1]
    await store.record_runtime(
        RuntimeReport(
            namespace="default",
            name="m00",
            phase=RuntimePhase.READY.value,
            generation=activate.generation,
            endpoint="http://127.0.0.1:9000",
            message=None,
            when=clock.now(),
        )
    )
    store.failing = True
    with pytest.raises(ConnectionError):
        await scheduler.election_pass()
    assert not bus.routes[key].ready
    store.failing = False
    await scheduler.election_pass()
    assert bus.routes[key].ready and bus.routes[key].endpoint == "http://127.0.0.1:9000"


async def test_a_crash_after_ready_is_an_event_with_its_reason_a_restart_count_and_a_metric() -> None:
    """Issue 24: a model server killed after it was Ready left no event, no message and no count."""
    from flexinfer_common.messages import ModelEvent
    from flexinfer_scheduler.loop import model_status
    from flexinfer_scheduler.metrics import MODEL_RESTARTS

    def restarts_metric() -> float:
        return MODEL_RESTARTS.value("default", "a")

    async with running(restart_backoff=1) as h:
        before = restarts_metric()
        await serving(h, A)
        generation = h.store.models[A].command_generation
        crash = RuntimeStatus(
            namespace="default",
            model="a",
            phase=RuntimePhase.FAILED,
            generation=generation,
            message="killed by signal 9",
            time=h.clock.now(),
        )
        await h.say(subjects.runtime_status_subject("default", "a"), crash)
        await h.say(subjects.runtime_status_subject("default", "a"), crash)  # a redelivery counts once

        def crashed() -> list[ModelEvent]:
            return [m for m in h.bus.messages(subjects.EVENTS_PREFIX + ".model") if isinstance(m, ModelEvent)]

        await h.until(lambda: len(crashed()) == 1)
        (event,) = crashed()
        assert event.kind == "model.crashed" and event.restarts == 1
        assert event.status.message == "crashed: killed by signal 9"
        assert model_status(h.store.models[A]).restarts == 1
        assert restarts_metric() == before + 1
        # and it is restarted (a fresh activate after the back-off), Ready again
        await h.until(lambda: h.store.models[A].command_generation > generation and ready(h, A))
        assert len(crashed()) == 1
