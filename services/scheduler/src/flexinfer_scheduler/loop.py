"""The scheduler's loop: observe (bus inputs into the store) -> decide (plan_group, pure) -> apply (one
statement, written while the routes that do not make a model ready go out; once it is stored, the routes that do,
then commands, statuses, group statuses and swap events together, commands first).

Event-driven for speed (a demand, an in-flight report or a runtime report starts a pass at once) and
level-triggered for safety (a pass runs every reconcile interval anyway). Only the replica holding the leader lock
leads: it alone consumes the bus and runs passes. Everything a pass needs is in the store, so a new leader resumes
any swap. The loop sees the world only through its ports (``ports.py``): a store, a bus, a leader lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any, overload

from flexinfer_common import subjects
from flexinfer_common.bus import decode_demand, decode_json
from flexinfer_common.clock import Clock
from flexinfer_common.db import ModelRow
from flexinfer_common.enums import ModelPhase, SharedState
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import (
    ActuatorHello,
    InFlightReport,
    ModelStatus,
    RuntimeStatus,
    SharedGroupStatus,
    new_id,
)
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.plan import GroupPlan, plan_group
from flexinfer_scheduler.intake import BusIntake
from flexinfer_scheduler.metrics import (
    ELECTION_DURATION,
    LEASE_READ_ERRORS,
    SCHEDULER_LEADER,
    GroupGauges,
    group_view,
)
from flexinfer_scheduler.ports import (
    LeaderLock,
    SchedulerBus,
    SchedulerStore,
    Stoppable,
    World,
)
from flexinfer_scheduler.publishing import PassPublisher
from flexinfer_scheduler.settings import SchedulerSettings
from flexinfer_scheduler.specs import SpecInbox, SpecStore, decode_spec_message

log = get_logger("flexinfer.scheduler")

# The shortest wait for a group's recheck (a deadline reached a hair early is not due yet: no busy loop).
RECHECK_FLOOR = 0.01
# Groups per slice of the periodic reconcile (about 250 models: a few milliseconds). An event recorded while a slice
# loads makes the slice give way (it is planned again after the event's pass); one that arrives later waits for the
# slice's planning and writing, so a slice bounds the reaction to a demand from above.
RECONCILE_CHUNK = 25
# How often one slice gives way before it runs regardless, and how long (and for how many event passes) it waits
# for the events recorded meanwhile: a steady stream of events cannot starve the reconcile.
SLICE_YIELDS = 3
SLICE_PATIENCE = 0.2
SLICE_PATIENCE_PASSES = 20


_paused_passes = 0


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a pass runs; it resumes when the last pass running ends. A pass allocates
    a great deal that lives until it ends and makes no cycles to speak of (rows, members, plans, messages): at
    10,000 models the young generation filled 44 times in a first pass, and each collection traversed what had
    survived so far (0.12 s of a 1 s pass). Afterwards, one collection takes what the pass left."""
    global _paused_passes
    if _paused_passes == 0 and not gc.isenabled():
        yield  # paused by someone else (a test, a debugger): leave it so
        return
    _paused_passes += 1
    gc.disable()
    try:
        yield
    finally:
        _paused_passes -= 1
        if _paused_passes == 0:
            gc.enable()


@dataclass
class PassResult:
    plans: list[GroupPlan]
    seconds: float


class Scheduler:
    def __init__(
        self,
        *,
        store: SchedulerStore,
        bus: SchedulerBus,
        lock: LeaderLock,
        settings: SchedulerSettings,
        clock: Clock,
        spec_store: SpecStore | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.lock = lock
        self.spec_store = spec_store
        self.settings = settings
        self.clock = clock
        self.params = ElectionParams(
            demand_window=settings.shared_demand_window,
            recent_window=settings.recent_leader_window,
            default_swap_cooldown=settings.default_swap_cooldown,
            policy=settings.scheduling_policy,
            explicit_swap_cooldown=settings.explicit_swap_cooldown,
        ).fitted_to(settings.queue_timeout, settings.quiet_yield, settings.drain_timeout)
        # The proxies report in-flight counts every activity interval: a report older than a few is from a proxy
        # that is gone, and a drain waits one interval for the counts of a model that served lately.
        self.drain_settle = settings.activity_report_interval
        self.in_flight_ttl = settings.in_flight_ttl
        # A source's queued count stands until it reports 0 or misses a few demand refreshes (whatever the demand
        # window): a model with requests waiting wants the GPU until they are answered or gone.
        self.queued_ttl = settings.queued_ttl
        self.is_leader = False
        self._kick = asyncio.Event()
        self._dirty: set[str] = set()
        # per group, when its last plan said a rule of time ends (``GroupPlan.recheck_at``): it is passed again then
        self._rechecks: dict[str, datetime] = {}
        self._full_pass_due = True
        self._last_full_pass = -float("inf")
        # what a pass publishes, and what was last published, to publish only changes
        self.publisher = PassPublisher(bus=bus, lock=lock, clock=clock)
        self.intake = BusIntake(store=store, publisher=self.publisher, clock=clock, kick=self.kick)
        self._moves_told: dict[ModelKey, str | None] = {}  # the deferred moves logged (a warning once per move)
        self._group_gauges = GroupGauges()
        self._consumers: list[Stoppable] = []
        self._last_prune = -float("inf")

    def kick(self, group: str | None = None) -> None:
        """Ask for an election pass now: of one group (an event named it) or of every group (``None``)."""
        if group is None:
            self._full_pass_due = True
        else:
            self._dirty.add(group)
        self._kick.set()

    @staticmethod
    def _monotonic() -> float:
        return asyncio.get_running_loop().time()  # the loop's clock: tests fast-forward it

    # ---- leadership --------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        interval = self.settings.reconcile_interval.total_seconds()
        try:
            while not stop.is_set():
                if not self.is_leader:
                    self.is_leader = await self.lock.try_acquire()
                    if not self.is_leader:
                        await _wait(stop, interval)
                        continue
                    try:
                        await self._become_leader()
                    except Exception:
                        log.exception("could not start leading (bus?); releasing the lock and retrying")
                        await self._step_down()
                        await self.lock.release()
                        await _wait(stop, interval)
                        continue
                if not await self.lock.still_held():
                    log.error("lost the leader lock; stepping down")
                    await self._step_down()
                    continue
                full = self._full_pass_due or self._monotonic() - self._last_full_pass >= interval
                self._full_pass_due = False
                try:
                    if full:
                        await self.reconcile()
                        self._last_full_pass = self._monotonic()
                    else:
                        await self._pass_dirty()
                except Exception:
                    log.exception("election pass failed; retrying at the next tick")
                    self._full_pass_due = True
                await self._wait_for_kick(stop)
        finally:
            await self._step_down()
            await self.lock.release()

    async def _become_leader(self) -> None:
        log.info("leading: consuming the bus and running elections")
        SCHEDULER_LEADER.set(1)
        self.publisher.reset()  # publish every route and status once as the new leader
        consumers: list[Any] = [
            (subjects.DEMAND_STREAM, "scheduler-demand", subjects.DEMAND_PREFIX, decode_demand, self.intake.on_demand),
            (
                subjects.IN_FLIGHT_STREAM,
                "scheduler-in-flight",
                subjects.IN_FLIGHT_PREFIX,
                partial(decode_json, InFlightReport),
                self.intake.on_in_flight,
            ),
            (
                subjects.RUNTIME_STATUS_STREAM,
                "scheduler-runtime",
                subjects.RUNTIME_STATUS_PREFIX,
                partial(decode_json, RuntimeStatus),
                self.intake.on_runtime_status,
            ),
            (
                subjects.RUNTIME_STATUS_STREAM,
                "scheduler-hello",
                subjects.ACTUATOR_HELLO_PREFIX,
                partial(decode_json, ActuatorHello),
                self.intake.on_actuator_hello,
            ),
        ]
        if self.spec_store is not None:
            inbox = SpecInbox(store=self.spec_store, hooks=self, clock=self.clock)
            consumers.append(
                (subjects.SPEC_STREAM, "scheduler-specs", subjects.SPEC_PREFIX, decode_spec_message, inbox.handle)
            )
        for stream, durable, prefix, decode, handler in consumers:
            self._consumers.append(
                await self.bus.consume(
                    stream=stream, durable=durable, filter_subject=prefix + ".>", decode=decode, handler=handler
                )
            )
        self.kick()

    async def _step_down(self) -> None:
        if self.is_leader:
            log.info("no longer leading")
        self.is_leader = False
        SCHEDULER_LEADER.set(0)
        self._group_gauges.clear()
        for consumer in self._consumers:
            await consumer.stop()
        self._consumers = []

    async def _wait_for_kick(self, stop: asyncio.Event) -> None:
        """Until an event, the reconcile interval or the first recheck of a group (then due: dirty)."""
        timeout = self.settings.reconcile_interval.total_seconds()
        if self._rechecks:
            until = (min(self._rechecks.values()) - self.clock.now()).total_seconds()
            timeout = min(timeout, max(RECHECK_FLOOR, until))
        kicked = asyncio.ensure_future(self._kick.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({kicked, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            kicked.cancel()
            stopped.cancel()
        self._kick.clear()
        now = self.clock.now()
        due = [group for group, at in self._rechecks.items() if at <= now]
        for group in due:
            del self._rechecks[group]
        self._dirty.update(due)

    def _note_rechecks(self, groups: set[str] | None, plans: list[GroupPlan]) -> None:
        """Keep each planned group's ``recheck_at``; a group passed but not planned (deleted) has none."""
        if groups is None:
            self._rechecks.clear()
        else:
            for group in groups:
                self._rechecks.pop(group, None)
        for plan in plans:
            if plan.recheck_at is not None:
                self._rechecks[plan.group] = plan.recheck_at

    # ---- one pass ----------------------------------------------------------------------------------------
    async def _pass_dirty(self) -> PassResult | None:
        if not self._dirty:
            return None
        groups = set(self._dirty)
        self._dirty.clear()
        return await self.election_pass(groups)

    async def reconcile(self) -> None:
        """The periodic full pass, in chunks of groups; groups an event touched meanwhile go first after each
        chunk, so a large installation's reconcile does not hold up the reaction to a demand."""
        names = await self.store.group_names()
        seen: set[ModelKey] = set()  # every model a pass of this reconcile planned

        def saw(result: PassResult | None) -> bool:
            if result is None:
                return False
            for plan in result.plans:
                seen.update(plan.members)
            return True

        for start in range(0, max(len(names), 1), RECONCILE_CHUNK):
            chunk = set(names[start : start + RECONCILE_CHUNK])
            for yields in range(SLICE_YIELDS, -1, -1):
                # events recorded during an event's pass go before the slice too (events beget events: a park
                # command's answer, then the activate's), for a while at most
                patience = self._monotonic() + SLICE_PATIENCE
                for _ in range(SLICE_PATIENCE_PASSES):
                    if self._monotonic() > patience or not saw(await self._pass_dirty()):
                        break
                if saw(await self.election_pass(chunk, give_way=yields > 0)):
                    break
        saw(await self._pass_dirty())
        # Models published before but planned by no pass of this reconcile were deleted (or moved to a group that
        # appeared meanwhile): only then are all the models' keys read, to be sure (at 10,000 models the read holds
        # the loop for milliseconds, and the reconcile runs every few seconds).
        if self.publisher.published_any_but(seen):
            await self._announce_if_back(await self.publisher.forget_deleted(await self.store.model_keys()))
        if self._monotonic() - self._last_prune > 60:
            self._last_prune = self._monotonic()
            await self.store.prune(self.clock.now(), self.settings.prune_after)

    def plan(self, world: World, now: datetime) -> list[GroupPlan]:
        """The decision of one pass: a plan per group (pure)."""
        return [
            plan_group(
                group,
                now,
                self.params,
                command_retry=self.settings.command_retry,
                new_swap_id=new_id(),
                restart_backoff=self.settings.restart_backoff,
                drain_timeout=self.settings.drain_timeout,
                drain_settle=self.drain_settle,
            )
            for group in world.groups
        ]

    @overload
    async def election_pass(self, groups: set[str] | None = None) -> PassResult: ...

    @overload
    async def election_pass(self, groups: set[str] | None = None, *, give_way: bool) -> PassResult | None: ...

    async def election_pass(self, groups: set[str] | None = None, *, give_way: bool = False) -> PassResult | None:
        """Elect and apply for every group, or only for ``groups`` (those an event touched). With ``give_way``
        (a slice of the reconcile), a pass during whose load an event was recorded stops before planning and
        returns None: the event's pass goes first, then the slice is loaded again."""
        with collector_paused():
            return await self._election_pass(groups, give_way=give_way)

    async def _election_pass(self, groups: set[str] | None, *, give_way: bool) -> PassResult | None:
        started = time.perf_counter()
        now = self.clock.now()
        world, leases_ok = await self.store.load_world(now, self.queued_ttl, groups, in_flight_ttl=self.in_flight_ttl)
        if give_way and self._dirty:
            return None
        if not leases_ok:
            LEASE_READ_ERRORS.inc()
            log.warning("lease read failed; electing as if unleased (fail open toward serving)")
        plans = self.plan(world, now)
        self._note_rechecks(groups, plans)
        elapsed = time.perf_counter() - started
        ELECTION_DURATION.observe(elapsed)
        # The write runs while the routes are built and sent (on a first pass over 10,000 models Postgres took
        # 0.2 s over it, the routes 0.25 s of Python), all but those that make a model ready: a proxy serves the
        # model once it reads one, and by then the admin API must show it Ready. They, and everything else, wait
        # until the plan is stored.
        write = asyncio.create_task(self.store.apply_plans(world, plans, now))
        routes = self.publisher.changed_routes(plans, now)
        ready = [r for r in routes if r[2].ready]
        try:
            await self.publisher.put_routes([r for r in routes if not r[2].ready])
            unwritten = await write  # a failed write raises here: no command nor status goes out for a plan not stored
        except BaseException:
            if not write.cancel() and not write.cancelled():
                write.exception()  # (retrieved: its failure is not what is raised)
            raise
        if unwritten:  # moved to another group (or deleted) while the pass ran: that group's pass commands them
            log.info(
                "models left their group during the pass: not commanded", extra={"models": sorted(map(str, unwritten))}
            )
        await self.publisher.put_routes([r for r in ready if r[0] not in unwritten])
        for group, plan in zip(world.groups, plans, strict=True):
            self._group_gauges.show(plan.group, group_view(group, plan))
        if groups is None:
            self._group_gauges.retain(plan.group for plan in plans)
        await self.publisher.publish(plans, world, now, unwritten)
        await self._finish_deletions(world, plans)
        await self._finish_moves(world, plans)
        if groups is None:
            await self._announce_if_back(
                await self.publisher.forget_deleted({key for plan in plans for key in plan.members})
            )
        return PassResult(plans, elapsed)

    async def _finish_deletions(self, world: World, plans: list[GroupPlan]) -> None:
        """Deleted models the actuator confirmed parked (and this pass commands nothing) lose their row and route."""
        commanded = {command.key for plan in plans for command in plan.commands}
        keys = [m.key for g in world.groups for m in g.members if m.deleting and m.parked and m.key not in commanded]
        if not keys:
            return
        for row in await self.store.finish_deletions(keys):
            log.info("model deleted: parked", extra={"model": f"{row.namespace}/{row.name}"})
            await self.forget_route(row.namespace, row.name)
            if row.group_name:
                self.kick(row.group_name)

    async def _finish_moves(self, world: World, plans: list[GroupPlan]) -> None:
        """Models a membership change from Kubernetes moves out of their group join the new one once the actuator
        confirmed them parked in the old (and this pass commands nothing to them); both groups are elected again."""
        commanded = {command.key for plan in plans for command in plan.commands}
        moving = [(g.name, m) for g in world.groups for m in g.members if m.moving_to is not None]
        for group, m in moving:
            if self._moves_told.get(m.key) != m.moving_to and not m.parked:
                self._moves_told[m.key] = m.moving_to
                log.warning(
                    "model moved to another group while it may hold its GPU: parked in its group first",
                    extra={"model": str(m.key), "group": group, "moving_to": m.moving_to},
                )
        keys = [m.key for _, m in moving if m.parked and m.key not in commanded]
        if not keys:
            return
        for move in await self.store.finish_moves(keys):
            self._moves_told.pop(move.key, None)
            log.info("model moved: parked", extra={"model": str(move.key), "group": move.old, "moving_to": move.new})
            self.kick(move.old)
            self.kick(move.new)

    async def announce(self, row: ModelRow) -> None:
        """A new model: tell the proxies at once that it exists (``PassPublisher.announce``)."""
        await self.publisher.announce(row)

    async def forget_route(self, namespace: str, name: str) -> None:
        """A model was deleted: the proxy must stop knowing it at once."""
        await self.publisher.forget_route(namespace, name)
        await self._announce_if_back([ModelKey(namespace, name)])

    async def _announce_if_back(self, keys: list[ModelKey]) -> None:
        """Models whose route was just removed but which were applied again meanwhile (by this replica's admin API
        or another's) are announced again: their own announcement may have come before the removal (and found the
        old route there, or been deleted with it), and a request sent right after the apply must queue, not 404.
        The row is read after the removal, and a new row is written before its announcement, so one or the other
        leaves the route in place."""
        for key in keys:
            row = await self.store.model(key.namespace, key.name)
            if row is not None and row.deleting_at is None:
                model = f"{key.namespace}/{key.name}"
                log.info("model applied again while its route was removed: announced again", extra={"model": model})
                await self.publisher.announce(row)


def model_status(row: ModelRow) -> ModelStatus:
    return ModelStatus(
        phase=ModelPhase(row.phase),
        last_active_time=row.last_active_time,
        shared_group=SharedGroupStatus(
            state=SharedState(row.shared_state) if row.shared_state else None,
            queue_position=row.queue_position,
            preempted_at=row.preempted_at,
        ),
        preempted_by=row.preempted_by,
        message=row.message,
        restarts=row.restarts or 0,
        observed_generation=row.observed_generation,
    )


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
