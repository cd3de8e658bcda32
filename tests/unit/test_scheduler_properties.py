"""Properties of the scheduler's pure domain, and the whole control loop simulated in memory.

``Sim`` plays every part around ``plan_group``: the store (a ``GroupSnapshot`` that plans and actuator reports are
written into, with the same filters as ``adapters/store.py``), the bus (commands in flight, which may be delivered
late, out of order, or never), the actuator (one process per model, the last generation it applied, reports that
carry the generation they answer) and the proxy (demand). The state machine below drives it with random steps and
checks, after every step, that two models never run at once, that a GPU lease empties the card, that a demanded
model gets the GPU in bounded time, and that the statuses users see are consistent.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from flexinfer_cli.simulation import after_command
from flexinfer_common.enums import GroupPolicy, ModelPhase, RuntimePhase, ScaleAction, SharedState, SwapPhase
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import (
    ElectionParams,
    ElectionReason,
    choose_shared_group_leader,
    cooldown_remaining,
    determine_active_model,
    group_cooldown,
    rank,
    seed_cooldown_remaining,
)
from flexinfer_scheduler.domain.model import (
    RUNTIME_UNKNOWN,
    GroupSnapshot,
    Lease,
    Member,
    Swap,
    V1Alpha1Policy,
    lease_is_active,
)
from flexinfer_scheduler.domain.plan import Command, GroupPlan, apply_plan, plan_group

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PARAMS = ElectionParams()
COMMAND_RETRY = timedelta(seconds=10)
TICK = timedelta(seconds=10)  # the proxy's demand refresh interval, and the simulated reconcile period
# How long a swap may take once the election allows it: park the old model, confirm, load, confirm (with a
# re-issue after a command that was lost before the drive started).
SWAP_ROUNDS = 6
DRAIN_TIMEOUT = timedelta(seconds=60)
IN_FLIGHT_MAX = 20  # seconds a request is answered for at most (so a drain lasts at most that long here)


# ---- the simulated control loop -------------------------------------------------------------------------------


@dataclass
class Process:
    """A model's runtime as the actuator holds it: it exists from an applied activate until its stop completes."""

    phase: RuntimePhase  # LOADING, READY or STOPPING
    generation: int


@dataclass
class Sim:
    snapshot: GroupSnapshot
    now: datetime = START
    params: ElectionParams = PARAMS
    command_retry: timedelta = COMMAND_RETRY
    # the bus
    inflight: list[Command] = field(default_factory=list)
    # the actuator
    processes: dict[ModelKey, Process] = field(default_factory=dict)
    applied: dict[ModelKey, int] = field(default_factory=dict)
    last_report: dict[ModelKey, tuple[RuntimePhase, int, str]] = field(default_factory=dict)
    # the proxy's demand signals (queued, when), summed by the store over the demand window
    signals: dict[ModelKey, tuple[int, datetime]] = field(default_factory=dict)
    # requests being answered per model, as the proxies report them: (how many, when the last one ends)
    in_flight: dict[ModelKey, tuple[int, datetime]] = field(default_factory=dict)
    # what happened
    plans: int = 0
    swaps: list[Swap] = field(default_factory=list)
    last_plan: GroupPlan | None = None
    # The lease oracle: once a pass has seen the current lease and then the bus has delivered everything in flight,
    # with no command lost that a later one has not superseded, no process may run until the lease ends.
    lease_planned: bool = False
    lease_enforced: bool = False
    lost: dict[ModelKey, int] = field(default_factory=dict)  # per model: the highest generation lost on the bus

    # -- the store ----------------------------------------------------------------------------------------------
    def member(self, key: ModelKey) -> Member:
        found = self.snapshot.member(key)
        assert found is not None
        return found

    @property
    def keys(self) -> list[ModelKey]:
        return [m.key for m in self.snapshot.members]

    def write(self, key: ModelKey, **fields: object) -> None:
        """Change a member as an operator or the proxy would (``forcePromotion``, a promote call, a demand)."""
        members = tuple(dataclasses.replace(m, **fields) if m.key == key else m for m in self.snapshot.members)
        self.snapshot = dataclasses.replace(self.snapshot, members=members)

    def record_runtime(self, key: ModelKey, phase: RuntimePhase, generation: int, message: str = "") -> None:
        """``Store.record_runtime``: a report older than the last one seen, or newer than the last command, is
        dropped."""
        m = self.member(key)
        if m.runtime_generation <= generation <= m.command_generation:
            self.write(key, runtime=phase.value, runtime_generation=generation, runtime_message=message)

    def forget_runtime(self) -> None:
        """``Store.forget_runtime``: the actuator restarted, so nothing it reported before is known to be true."""
        for m in self.snapshot.members:
            if m.desired_action is not None:
                self.write(m.key, runtime=RUNTIME_UNKNOWN, command_issued_at=None, endpoint=None)

    def answering(self, key: ModelKey) -> int:
        """Requests the model is answering now (they end by themselves; a stopped process ends them)."""
        count, until = self.in_flight.get(key, (0, self.now))
        return count if self.now < until and key in self.processes else 0

    def queued(self, key: ModelKey) -> int:
        queued, when = self.signals.get(key, (0, START))
        return queued if self.now - when <= self.params.demand_window else 0

    # -- the scheduler --------------------------------------------------------------------------------------------
    def plan(self) -> GroupPlan:
        members = tuple(
            dataclasses.replace(m, queued=self.queued(m.key), in_flight=self.answering(m.key))
            for m in self.snapshot.members
        )
        snapshot = dataclasses.replace(self.snapshot, members=members)
        self.plans += 1
        p = plan_group(
            snapshot,
            self.now,
            self.params,
            command_retry=self.command_retry,
            new_swap_id=f"swap-{self.plans}",
            drain_timeout=DRAIN_TIMEOUT,
        )
        for command in p.commands:
            before = snapshot.member(command.key)
            if command.action == ScaleAction.PARK and not command.reissue and before is not None and before.ready:
                # the drain: a serving model is parked only once its requests finished, or the drain timed out
                started = max((sw.started_at for sw in self.swaps), default=None)
                drained = self.answering(command.key) == 0
                assert drained or (started is not None and self.now - started >= DRAIN_TIMEOUT), (
                    f"{command.key} parked with {self.answering(command.key)} requests in flight"
                )
        self.snapshot = apply_plan(snapshot, p)
        self.inflight.extend(p.commands)
        self.swaps.extend(u.swap for u in p.swap_updates if u.created)
        self.last_plan = p
        draining = self.snapshot.swap is not None and self.snapshot.swap.phase == SwapPhase.DRAINING
        if lease_is_active(self.snapshot.lease, self.now) and not draining:
            self.lease_planned = True
        return p

    # -- the proxy ----------------------------------------------------------------------------------------------
    def demand(self, key: ModelKey, queued: int = 1) -> None:
        """A request for ``key`` reached the proxy: forwarded (queued 0) when the route says ready, else queued."""
        m = self.member(key)
        routed = self.snapshot.active == key and m.ready
        self.signals[key] = (0 if routed else queued, self.now)
        last = m.last_active_time
        self.write(key, last_active_time=self.now if last is None else max(last, self.now))

    # -- the actuator -------------------------------------------------------------------------------------------
    def _report(self, key: ModelKey, phase: RuntimePhase, generation: int, message: str = "") -> None:
        self.last_report[key] = (phase, generation, message)
        self.record_runtime(key, phase, generation, message)

    def deliver(self, command: Command) -> None:
        """The actuator applies one command: stale generations are ignored, a repeated one re-reports."""
        key, generation = command.key, command.generation
        if generation >= self.lost.get(key, generation + 1):
            del self.lost[key]
        last = self.applied.get(key)
        if last is not None and generation < last:
            return
        if last is not None and generation == last:
            if key in self.last_report:
                self._report(key, *self.last_report[key])
            return
        self.applied[key] = generation
        process = self.processes.get(key)
        phase, fresh = after_command(process.phase if process is not None else None, command.action)
        if fresh:
            process = self.processes[key] = Process(RuntimePhase.LOADING, generation)
        if process is not None:
            process.phase, process.generation = phase, generation
        self._report(key, phase, generation)

    def progress(self, key: ModelKey) -> None:
        """A loading model passes its readiness probe; a stopping one is reaped."""
        process = self.processes.get(key)
        if process is None:
            return
        if process.phase == RuntimePhase.LOADING:
            process.phase = RuntimePhase.READY
            self._report(key, RuntimePhase.READY, process.generation)
        elif process.phase == RuntimePhase.STOPPING:
            del self.processes[key]
            self._report(key, RuntimePhase.PARKED, process.generation)

    def crash(self, key: ModelKey, message: str = "process exited after it was Ready (exit code 1)") -> None:
        """The process exits (after it was Ready, or, with another message, while it loads)."""
        process = self.processes.pop(key, None)
        if process is not None:
            self._report(key, RuntimePhase.FAILED, process.generation, message)

    def restart_actuator(self) -> None:
        """Every process is gone, the actuator remembers no generation, and what was in flight to it is lost; its
        hello makes the scheduler forget every runtime it knew."""
        self.processes.clear()
        self.applied.clear()
        self.last_report.clear()
        self.inflight.clear()
        self.lost.clear()
        self.forget_runtime()

    def lose(self, index: int) -> None:
        command = self.inflight.pop(index)
        self.lost[command.key] = max(self.lost.get(command.key, 0), command.generation)

    def settle(self) -> None:
        """The bus delivers everything in flight, in order, and every runtime finishes its transition."""
        commands, self.inflight = self.inflight, []
        for command in commands:
            self.deliver(command)
        for key in list(self.processes):
            self.progress(key)
        if self.lease_planned and not self.lost and lease_is_active(self.snapshot.lease, self.now):
            self.lease_enforced = True

    def round(self) -> GroupPlan:
        """One reconcile: a pass, the actuator catches up, and the reports it stored kick another pass."""
        self.plan()
        self.settle()
        return self.plan()

    # -- operators ----------------------------------------------------------------------------------------------
    def set_lease(self, lease: Lease | None) -> None:
        self.snapshot = dataclasses.replace(self.snapshot, lease=lease)
        self.lease_planned = self.lease_enforced = False

    def clear_overrides(self) -> None:
        """The lease is released and every ``forcePromotion`` turned off. (A promote call is one-shot: it ends by
        itself, when the promoted model is Ready or has failed to load.)"""
        self.set_lease(None)
        for key in self.keys:
            self.write(key, force_promotion=False)

    # -- observations -------------------------------------------------------------------------------------------
    @property
    def running(self) -> list[ModelKey]:
        return sorted(self.processes)

    def serving(self, key: ModelKey) -> bool:
        process = self.processes.get(key)
        return process is not None and process.phase == RuntimePhase.READY

    def advance(self, delta: timedelta) -> None:
        self.now += delta

    def drive(self, key: ModelKey, *, until: datetime, queued: int = 1, busy: ModelKey | None = None) -> bool:
        """The proxy keeps a request for ``key`` waiting (demand refreshed every tick) while the scheduler and a
        healthy actuator run, and (``busy``) another model gets a request every tick; True once ``key`` serves,
        False if it does not by ``until``."""
        while True:
            self.demand(key, queued)
            if busy is not None and busy != key:
                self.demand(busy)
            self.round()
            if self.serving(key):
                return True
            if self.now >= until:
                return False
            self.advance(TICK)


def member(
    name: str,
    *,
    priority: int = 0,
    swap_cooldown: timedelta | None = None,
    idle_timeout: timedelta | None = None,
) -> Member:
    return Member(ModelKey("default", name), priority=priority, swap_cooldown=swap_cooldown, idle_timeout=idle_timeout)


def load_failed(m: Member) -> bool:
    """The member's current activate ended Failed before the scheduler saw it Ready."""
    return m.desired_action == ScaleAction.ACTIVATE and m.runtime == RuntimePhase.FAILED and m.ready_since is None


def swap_window(snapshot: GroupSnapshot, params: ElectionParams) -> timedelta:
    """How long anti-thrashing may hold the incumbent against a demanded model."""
    if snapshot.v1alpha1 is not None:
        return max(snapshot.v1alpha1.minimum_run_duration, snapshot.v1alpha1.cooldown_after_preemption)
    return group_cooldown(snapshot.members, params.default_swap_cooldown)


# ---- the state machine ----------------------------------------------------------------------------------------

PRIORITIES = st.sampled_from([0, 50, 100, 200])
COOLDOWNS = st.one_of(st.none(), st.sampled_from([timedelta(seconds=s) for s in (0, 30, 120, 300, 600)]))
IDLE_TIMEOUTS = st.one_of(st.none(), st.sampled_from([timedelta(seconds=s) for s in (60, 300, 900)]))
MEMBER_SPECS = st.lists(st.tuples(PRIORITIES, COOLDOWNS, IDLE_TIMEOUTS), min_size=2, max_size=4)


class SchedulerMachine(RuleBasedStateMachine):
    """A v1alpha2 group (``spec.gpu.shared``) under random demand, time, faults and operator actions."""

    def __init__(self) -> None:
        super().__init__()
        self.sim = Sim(GroupSnapshot("gpu", ()))

    def make_group(self, members: tuple[Member, ...], data: st.DataObject) -> GroupSnapshot:
        return GroupSnapshot("gpu", members)

    @initialize(specs=MEMBER_SPECS, data=st.data())
    def create_group(self, specs: list[tuple[int, timedelta | None, timedelta | None]], data: st.DataObject) -> None:
        members = tuple(
            member(f"m{i}", priority=p, swap_cooldown=c, idle_timeout=t) for i, (p, c, t) in enumerate(specs)
        )
        self.sim = Sim(self.make_group(members, data))

    def pick(self, data: st.DataObject) -> ModelKey:
        return data.draw(st.sampled_from(self.sim.keys), label="model")

    # -- the proxy ----------------------------------------------------------------------------------------------
    @rule(data=st.data(), queued=st.integers(1, 5))
    def request(self, data: st.DataObject, queued: int) -> None:
        self.sim.demand(self.pick(data), queued)

    @rule(data=st.data(), count=st.integers(0, 3), seconds=st.integers(1, IN_FLIGHT_MAX))
    def requests_in_flight(self, data: st.DataObject, count: int, seconds: int) -> None:
        """The proxies report how many requests a model is answering, for up to ``seconds`` (0: they finished)."""
        key = self.pick(data)
        if self.sim.serving(key):
            self.sim.in_flight[key] = (count, self.sim.now + timedelta(seconds=seconds))

    # -- time ---------------------------------------------------------------------------------------------------
    @rule(seconds=st.integers(1, 30))
    def small_clock_step(self, seconds: int) -> None:
        self.sim.advance(timedelta(seconds=seconds))

    @rule(minutes=st.integers(1, 30))
    def large_clock_jump(self, minutes: int) -> None:
        self.sim.advance(timedelta(minutes=minutes))

    # -- the scheduler ------------------------------------------------------------------------------------------
    @rule()
    def plan(self) -> None:
        p = self.sim.plan()
        for key, view in p.statuses.items():
            if view.ready:  # the proxy forwards to a ready route: something must be there to answer
                assert self.sim.serving(key), f"{key} shown ready but its runtime is {self.sim.processes.get(key)}"

    # -- the bus and the actuator -------------------------------------------------------------------------------
    @precondition(lambda self: self.sim.inflight)
    @rule(data=st.data())
    def actuator_applies_some(self, data: st.DataObject) -> None:
        order = data.draw(
            st.lists(st.sampled_from(range(len(self.sim.inflight))), unique=True, min_size=1), label="delivery order"
        )
        commands = [self.sim.inflight[i] for i in order]
        self.sim.inflight = [c for i, c in enumerate(self.sim.inflight) if i not in order]
        for command in commands:
            self.sim.deliver(command)

    @precondition(lambda self: self.sim.inflight)
    @rule(data=st.data())
    def command_lost(self, data: st.DataObject) -> None:
        self.sim.lose(data.draw(st.sampled_from(range(len(self.sim.inflight))), label="lost command"))

    @precondition(lambda self: self.sim.processes)
    @rule(data=st.data())
    def runtime_progresses(self, data: st.DataObject) -> None:
        self.sim.progress(data.draw(st.sampled_from(self.sim.running), label="progressing"))

    @rule()
    def actuator_settles(self) -> None:
        self.sim.settle()

    def crashable(self) -> list[ModelKey]:
        """Processes the scheduler has seen serving. (A Ready report kicks a pass at once, so a crash before that
        pass is a crash during the load, which the planner rightly treats as a failed load.)"""
        return sorted(
            key
            for key, process in self.sim.processes.items()
            if process.phase == RuntimePhase.READY
            and (
                self.sim.member(key).ready_since is not None
                or self.sim.member(key).desired_action != ScaleAction.ACTIVATE
            )
        )

    @precondition(lambda self: self.crashable())
    @rule(data=st.data())
    def model_crashes(self, data: st.DataObject) -> None:
        self.sim.crash(data.draw(st.sampled_from(self.crashable()), label="crashed"))

    def loading(self) -> list[ModelKey]:
        """Processes the scheduler has not seen serving yet: to it, their exit is a failed load."""
        running = {k for k, p in self.sim.processes.items() if p.phase != RuntimePhase.STOPPING}
        return sorted(running - set(self.crashable()))

    @precondition(lambda self: self.loading())
    @rule(data=st.data())
    def model_fails_to_load(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(self.loading()), label="failed to load")
        self.sim.crash(key, "process exited before it was ready (exit code 1)")

    @rule()
    def actuator_restarts(self) -> None:
        self.sim.restart_actuator()

    # -- operators ----------------------------------------------------------------------------------------------
    @rule(ttl=st.integers(60, 3600))
    def lease_acquired(self, ttl: int) -> None:
        self.sim.set_lease(Lease("trainer-gpu-lease", "gpu", "trainer", self.sim.now + timedelta(seconds=ttl)))

    @precondition(lambda self: self.sim.snapshot.lease is not None)
    @rule()
    def lease_released(self) -> None:
        self.sim.set_lease(None)

    @precondition(lambda self: lease_is_active(self.sim.snapshot.lease, self.sim.now))
    @rule()
    def lease_expires(self) -> None:
        assert self.sim.snapshot.lease is not None
        self.sim.now = self.sim.snapshot.lease.expires_at

    @rule(data=st.data())
    def promote(self, data: st.DataObject) -> None:
        self.sim.write(self.pick(data), promoted_at=self.sim.now)

    @rule(data=st.data())
    def toggle_force_promotion(self, data: st.DataObject) -> None:
        key = self.pick(data)
        self.sim.write(key, force_promotion=not self.sim.member(key).force_promotion)

    # -- (c) liveness -------------------------------------------------------------------------------------------
    @rule(data=st.data())
    def demanded_model_gets_the_gpu(self, data: st.DataObject) -> None:
        """Once nothing interferes (no lease, no forcePromotion, no other demand, the incumbent idle), a demanded
        model whose priority is at least the incumbent's (and a pending promoted model's, which takes the GPU
        first) serves within the group's anti-thrashing window plus a few rounds, whatever state the earlier steps
        left behind (lost commands, crashes, failed loads, an actuator restart)."""
        sim = self.sim
        sim.clear_overrides()
        # Every other demand expires, and the incumbent goes idle, while nothing runs the election.
        sim.advance(sim.params.demand_window + timedelta(seconds=1))
        incumbent = sim.snapshot.member(sim.snapshot.active)
        # the models the priority gate protects: the incumbent, a pending promotion, and any model still loaded (a
        # lease that just ended may have left one running that the next election keeps as the ready leader)
        holders = [m for m in sim.snapshot.members if m.promoted_at is not None or m == incumbent or m.loaded]
        floor = max((m.priority for m in holders), default=min(m.priority for m in sim.snapshot.members))
        if incumbent is not None and load_failed(incumbent):
            # A model that failed to load is left out (until asked again) and the GPU may go to a fallback, which
            # the priority gate then protects: only a model at the top priority is sure to get the GPU back.
            floor = max(m.priority for m in sim.snapshot.members)
        target = data.draw(
            st.sampled_from([m.key for m in sim.snapshot.members if m.priority >= floor]), label="demanded"
        )
        promotion = any(m.promoted_at is not None for m in sim.snapshot.members)
        deadline = (
            sim.now
            + swap_window(sim.snapshot, sim.params)
            + (2 if promotion else 1) * SWAP_ROUNDS * TICK
            + timedelta(seconds=IN_FLIGHT_MAX)  # the drain
        )
        queued = sim.snapshot.v1alpha1.request_queue_threshold if sim.snapshot.v1alpha1 else 1
        assert sim.drive(target, until=deadline, queued=queued), (
            f"{target} still not serving at {sim.now - START} (deadline {deadline - START}); "
            f"running={sim.running} snapshot={sim.snapshot}"
        )

    @precondition(lambda self: self.sim.snapshot.v1alpha1 is None)
    @rule(data=st.data())
    def busy_incumbent_yields_within_the_bound(self, data: st.DataObject) -> None:
        """The bounded wait (v1alpha2): with the incumbent kept busy (a request every tick), a demanded model whose
        priority is at least the incumbent's serves within its maxWait (default 4 min) plus what the
        swap cooldown has left and a few rounds (drain included), whatever the earlier steps left behind."""
        sim = self.sim
        sim.clear_overrides()
        sim.in_flight.clear()
        sim.advance(sim.params.demand_window + timedelta(seconds=1))  # other demand expires
        incumbent = sim.snapshot.member(sim.snapshot.active)
        if incumbent is None or not sim.serving(incumbent.key) or any(m.promoted_at for m in sim.snapshot.members):
            return  # nothing busy to wait behind (the idle case is demanded_model_gets_the_gpu's)
        target = data.draw(
            st.sampled_from([m.key for m in sim.snapshot.members if m.priority >= incumbent.priority]),
            label="demanded behind a busy incumbent",
        )
        bound = sim.params.max_wait(sim.member(target)) or timedelta(0)
        deadline = (
            sim.now
            + cooldown_remaining(sim.snapshot, sim.now, sim.params)
            + bound
            + SWAP_ROUNDS * TICK
            + timedelta(seconds=IN_FLIGHT_MAX)
        )
        assert sim.drive(target, until=deadline, busy=incumbent.key), (
            f"{target} still waits behind busy {incumbent.key} at {sim.now - START}; snapshot={sim.snapshot}"
        )

    # -- (b) a lease, driven to its end state ---------------------------------------------------------------------
    @rule(ttl=st.integers(60, 3600))
    def lease_parks_the_group(self, ttl: int) -> None:
        """A training Job acquires a lease: after one round (a pass, the actuator applying what it sent) nothing
        runs, or after two when a command lost earlier waits for its ``command_retry``."""
        sim = self.sim
        sim.set_lease(Lease("trainer-gpu-lease", "gpu", "trainer", sim.now + timedelta(seconds=ttl)))
        for _ in range(2 + IN_FLIGHT_MAX // int(sim.command_retry.total_seconds())):  # a drain may come first
            sim.round()
            if not sim.processes:
                break
            sim.advance(sim.command_retry)
        assert not sim.processes, f"{sim.running} still runs {sim.now - START} into a GPU lease"

    # -- invariants ---------------------------------------------------------------------------------------------
    @invariant()
    def at_most_one_model_runs(self) -> None:
        assert len(self.sim.processes) <= 1, f"two models on one GPU: {self.sim.processes}"

    @invariant()
    def a_lease_empties_the_gpu(self) -> None:
        if self.sim.lease_enforced and lease_is_active(self.sim.snapshot.lease, self.sim.now):
            assert not self.sim.processes, f"{self.sim.running} runs while a GPU lease holds the group"

    @invariant()
    def statuses_are_consistent(self) -> None:
        p = self.sim.last_plan
        if p is None:
            return
        assert p.active == p.election.leader
        active = [k for k, v in p.statuses.items() if v.state == SharedState.ACTIVE]
        assert active == ([p.active] if p.active is not None else []), (active, p.active)
        if p.active is not None:
            assert p.statuses[p.active].queue_position == 0
        queued = sorted(v.queue_position for v in p.statuses.values() if v.state == SharedState.QUEUED)
        assert queued == list(range(1, len(queued) + 1)), f"queue positions {queued}"
        for key, view in p.statuses.items():
            if view.phase == ModelPhase.FAILED:
                assert view.message and view.failure, f"{key} Failed without a message"
            if view.ready:
                assert key == p.active


class SchedulerV1Alpha1Machine(SchedulerMachine):
    """The same loop for a v1alpha1 ``GPUGroup`` (its own anti-thrashing knobs)."""

    def make_group(self, members: tuple[Member, ...], data: st.DataObject) -> GroupSnapshot:
        policy = V1Alpha1Policy(
            request_queue_threshold=data.draw(st.integers(1, 3), label="requestQueueThreshold"),
            minimum_run_duration=timedelta(seconds=data.draw(st.sampled_from([0, 30, 90]), label="minimumRun")),
            cooldown_after_preemption=timedelta(seconds=data.draw(st.sampled_from([0, 60, 180]), label="cooldown")),
            idle_timeout=timedelta(seconds=data.draw(st.sampled_from([60, 300]), label="idleTimeout")),
        )
        return GroupSnapshot("gpu", members, policy=GroupPolicy.V1ALPHA1, v1alpha1=policy)


MACHINE_SETTINGS = settings(max_examples=150, stateful_step_count=50, deadline=None)
TestSchedulerLoop = SchedulerMachine.TestCase
TestSchedulerLoop.settings = MACHINE_SETTINGS
TestSchedulerLoopV1Alpha1 = SchedulerV1Alpha1Machine.TestCase
TestSchedulerLoopV1Alpha1.settings = MACHINE_SETTINGS


# ---- properties of the elections ------------------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "c", "d", "e"])
AGES = st.one_of(st.none(), st.integers(0, 3600))


@st.composite
def members(draw: st.DrawFn, *, min_size: int = 1, max_size: int = 5) -> list[Member]:
    names = draw(st.lists(NAMES, min_size=min_size, max_size=max_size, unique=True))
    out = []
    for name in names:
        age = draw(AGES)
        out.append(
            Member(
                ModelKey(draw(st.sampled_from(["default", "ml"])), name),
                priority=draw(PRIORITIES),
                last_active_time=None if age is None else START - timedelta(seconds=age),
                swap_cooldown=draw(COOLDOWNS),
            )
        )
    return out


def ready(m: Member, *, since: timedelta = timedelta(hours=1)) -> Member:
    return dataclasses.replace(
        m,
        desired_action=ScaleAction.ACTIVATE,
        command_generation=1,
        runtime_generation=1,
        runtime=RuntimePhase.READY.value,
        ready_since=START - since,
    )


@settings(max_examples=300)
@given(
    others=members(min_size=0, max_size=3),
    incumbent_priority=st.integers(1, 300),
    demanded_priority=st.integers(0, 299),
    incumbent_idle_for=st.one_of(st.none(), st.integers(121, 36000)),
    demand_age=st.integers(0, 120),
    preempted_ago=st.one_of(st.none(), st.integers(0, 3600)),
)
def test_lower_priority_demand_never_preempts_an_idle_ready_incumbent(
    others: list[Member],
    incumbent_priority: int,
    demanded_priority: int,
    incumbent_idle_for: int | None,
    demand_age: int,
    preempted_ago: int | None,
) -> None:
    """v1alpha2 priority gate: without force or promotion, a demanded model below the incumbent's priority never
    wins, whatever the other members, the cooldown or the demand's age."""
    incumbent = ready(
        Member(
            ModelKey("default", "incumbent"),
            priority=incumbent_priority,
            last_active_time=None if incumbent_idle_for is None else START - timedelta(seconds=incumbent_idle_for),
            preempted_at=None if preempted_ago is None else START - timedelta(seconds=preempted_ago),
        )
    )
    demanded = Member(
        ModelKey("default", "demanded"),
        priority=min(demanded_priority, incumbent_priority - 1),
        last_active_time=START - timedelta(seconds=demand_age),
    )
    snapshot = GroupSnapshot("gpu", (incumbent, demanded, *others), active=incumbent.key)
    election = choose_shared_group_leader(snapshot, START, PARAMS)
    assert election.leader != demanded.key


@settings(max_examples=300)
@given(
    others=members(min_size=0, max_size=3),
    incumbent_priority=st.integers(1, 300),
    demanded_priority=st.integers(0, 299),
    incumbent_active_ago=st.integers(0, 10),
    run_for=st.integers(0, 3600),
    queued=st.integers(0, 10),
)
def test_v1alpha1_lower_priority_demand_never_preempts_a_busy_incumbent(
    others: list[Member],
    incumbent_priority: int,
    demanded_priority: int,
    incumbent_active_ago: int,
    run_for: int,
    queued: int,
) -> None:
    """v1alpha1 priority gate: demanded models sort by priority, and a busy incumbent (a request within the
    hysteresis window) takes part in that sort, so a lower-priority demand waits until the incumbent goes idle."""
    incumbent = ready(
        Member(
            ModelKey("default", "incumbent"),
            priority=incumbent_priority,
            last_active_time=START - timedelta(seconds=incumbent_active_ago),
        )
    )
    demanded = Member(
        ModelKey("default", "demanded"),
        priority=min(demanded_priority, incumbent_priority - 1),
        last_active_time=START,
        queued=queued,
    )
    snapshot = GroupSnapshot(
        "gpu",
        (incumbent, demanded, *others),
        policy=GroupPolicy.V1ALPHA1,
        v1alpha1=V1Alpha1Policy(),
        active=incumbent.key,
        leader_since=START - timedelta(seconds=run_for),
    )
    assert determine_active_model(snapshot, START, V1Alpha1Policy()).leader != demanded.key


@settings(max_examples=300)
@given(group=members(min_size=1, max_size=5), data=st.data())
def test_tie_break_is_a_total_order(group: list[Member], data: st.DataObject) -> None:
    """Priority, then most recent lastActiveTime, then name (then namespace): no two members tie, and the order
    (and so every election) does not depend on the order the store listed the members in."""
    ranks = [rank(m) for m in group]
    assert len(set(ranks)) == len(group)
    shuffled = data.draw(st.permutations(group))
    assert sorted(shuffled, key=rank) == sorted(group, key=rank)
    for a, b in itertools.combinations(group, 2):
        assert (rank(a) < rank(b)) != (rank(b) < rank(a))
        if a.priority != b.priority:
            assert (rank(a) < rank(b)) == (a.priority > b.priority)
    active = data.draw(st.sampled_from([None, *[m.key for m in group]]))
    elections = {
        choose_shared_group_leader(GroupSnapshot("gpu", tuple(order), active=active), START, PARAMS)
        for order in (group, shuffled)
    }
    assert len(elections) == 1


@settings(max_examples=300)
@given(group=members(min_size=1, max_size=5), default=COOLDOWNS, preempted_ago=st.integers(0, 1200))
def test_cooldown_is_the_maximum_over_members(
    group: list[Member], default: timedelta | None, preempted_ago: int
) -> None:
    """The group's cooldown is the largest ``swapCooldown`` of its members (the default for one without), and
    Stage 1 holds the Active model exactly while it runs."""
    default = default if default is not None else PARAMS.default_swap_cooldown
    params = ElectionParams(default_swap_cooldown=default)
    expected = max(m.swap_cooldown if m.swap_cooldown is not None else default for m in group)
    assert group_cooldown(group, default) == expected

    incumbent = ready(Member(ModelKey("zz", "incumbent"), priority=-1))
    others = [dataclasses.replace(m, last_active_time=None) for m in group]
    others[0] = dataclasses.replace(others[0], priority=1000, last_active_time=START)  # demand that would win
    others[-1] = dataclasses.replace(others[-1], preempted_at=START - timedelta(seconds=preempted_ago))
    snapshot = GroupSnapshot("gpu", (incumbent, *others), active=incumbent.key)
    window = group_cooldown(snapshot.members, default)
    election = choose_shared_group_leader(snapshot, START, params)
    holds = timedelta(seconds=preempted_ago) < window
    assert (election.reason == ElectionReason.COOLDOWN) == holds
    remaining = max(timedelta(0), window - timedelta(seconds=preempted_ago))
    assert seed_cooldown_remaining(snapshot, START, params) == remaining
    assert cooldown_remaining(snapshot, START, params.seed()) == remaining


# ---- regressions the state machine found ----------------------------------------------------------------------

A, B = ModelKey("default", "a"), ModelKey("default", "b")


def test_actuator_restart_reissues_every_command_and_keeps_the_leader() -> None:
    """After ``Store.forget_runtime`` every runtime is "Unknown" but its generation still matches the command: the
    planner must re-send the commands at once (they used to count as confirmed, and nothing ran again), and the
    leader must keep the GPU slot (a lower-priority demand used to take it while the leader was unknown)."""
    # (the seed's election: under FlexInfer's, a quiet holder yields to b, restart or not)
    sim = Sim(GroupSnapshot("gpu", (member("a", priority=100), member("b", priority=50))), params=PARAMS.seed())
    assert sim.drive(A, until=sim.now + timedelta(minutes=1))
    sim.round()
    sim.advance(timedelta(minutes=3))
    sim.restart_actuator()
    sim.demand(B)
    p = sim.plan()
    assert p.active == A
    assert [(c.key, c.action, c.reissue) for c in p.commands] == [(A, ScaleAction.ACTIVATE, True)]
    sim.settle()
    sim.plan()
    assert sim.serving(A) and sim.running == [A]


def fails_to_load(sim: Sim, key: ModelKey) -> GroupPlan:
    """A pass activates ``key``, the actuator carries out what the pass sent, and ``key``'s process exits while it
    loads: the next pass."""
    sim.plan()
    for command in sim.inflight:
        sim.deliver(command)
    sim.inflight.clear()
    sim.crash(key, "process exited before it was ready (exit code 1)")
    return sim.plan()


def test_a_promotion_that_fails_to_load_releases_the_group() -> None:
    """A promote call is one-shot: when the promoted model fails to load, the promotion is over and the group goes
    back to its election (it used to stay pinned on the dead model, with demand for the others ignored)."""
    sim = Sim(GroupSnapshot("gpu", (member("a"), member("b"))))
    sim.write(A, promoted_at=sim.now)
    p = fails_to_load(sim, A)
    assert sim.member(A).promoted_at is None and sim.member(A).failed_at == sim.now
    assert p.statuses[A].phase == ModelPhase.FAILED and p.statuses[A].failure
    assert sim.drive(B, until=sim.now + 6 * TICK)


def test_a_forced_model_that_failed_to_load_shows_failed_until_asked_again() -> None:
    """forcePromotion pins the group on its model even when that model cannot load: it shows Failed with the
    reason (so its queue is answered), and a new request for it starts it again."""
    sim = Sim(GroupSnapshot("gpu", (member("a"), member("b"))))
    sim.write(A, force_promotion=True)
    p = fails_to_load(sim, A)
    assert p.active == A
    assert p.statuses[A].phase == ModelPhase.FAILED
    assert p.statuses[A].failure == "process exited before it was ready (exit code 1)"
    assert p.commands == []
    sim.advance(TICK)
    assert sim.drive(A, until=sim.now + 3 * TICK)
