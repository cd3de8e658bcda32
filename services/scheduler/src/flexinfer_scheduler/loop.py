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
from datetime import datetime, timedelta
from functools import partial
from typing import Any, overload

from pydantic import BaseModel, ValidationError

from flexinfer_common import subjects
from flexinfer_common.bus import Delivery, decode_demand, decode_json
from flexinfer_common.clock import Clock
from flexinfer_common.db import ModelRow
from flexinfer_common.enums import ModelPhase, ScaleAction, SharedState, SwapPhase
from flexinfer_common.logs import get_logger
from flexinfer_common.manifests import describe_validation_error
from flexinfer_common.messages import (
    WOKEN,
    ActuatorHello,
    Demand,
    GroupStatusUpdate,
    InFlightReport,
    LeaseRef,
    ModelRef,
    ModelStatus,
    ModelStatusUpdate,
    Route,
    RuntimeStatus,
    ScaleCommand,
    SharedGroupStatus,
    SwapEvent,
    message_id,
    new_id,
)
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.manifests import spec_facts, visible_group
from flexinfer_scheduler.domain.model import Member, ModelKey
from flexinfer_scheduler.domain.plan import Command, GroupPlan, StatusView, plan_group
from flexinfer_scheduler.metrics import (
    ELECTION_DURATION,
    LEASE_READ_ERRORS,
    SCHEDULER_LEADER,
    SWAP_DURATION,
    SWAPS,
    GroupGauges,
    group_view,
)
from flexinfer_scheduler.ports import LeaderLock, SchedulerBus, SchedulerStore, Stoppable, World
from flexinfer_scheduler.settings import SchedulerSettings
from flexinfer_scheduler.specs import SpecInbox, SpecStore, decode_spec_message

log = get_logger("flexinfer.scheduler")

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
            quiet_after=settings.quiet_yield,
        )
        # The proxies report in-flight counts every activity interval: a report older than a few is from a proxy
        # that is gone, and a drain waits one interval for the counts of a model that served lately.
        self.drain_settle = settings.activity_report_interval
        self.in_flight_ttl = max(3 * settings.activity_report_interval, timedelta(seconds=5))
        self.is_leader = False
        self._kick = asyncio.Event()
        self._dirty: set[str] = set()
        self._full_pass_due = True
        self._last_full_pass = -float("inf")
        # what was last published per model, to publish only changes
        self._routes: dict[ModelKey, tuple[Any, ...]] = {}
        self._statuses: dict[ModelKey, tuple[Any, ...]] = {}
        self._group_statuses: dict[str, tuple[Any, ...]] = {}
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
        self._routes.clear()  # publish every route once as the new leader
        self._statuses.clear()
        self._group_statuses.clear()
        consumers: list[Any] = [
            (subjects.DEMAND_STREAM, "scheduler-demand", subjects.DEMAND_PREFIX, decode_demand, self.on_demand),
            (
                subjects.IN_FLIGHT_STREAM,
                "scheduler-in-flight",
                subjects.IN_FLIGHT_PREFIX,
                partial(decode_json, InFlightReport),
                self.on_in_flight,
            ),
            (
                subjects.RUNTIME_STATUS_STREAM,
                "scheduler-runtime",
                subjects.RUNTIME_STATUS_PREFIX,
                partial(decode_json, RuntimeStatus),
                self.on_runtime_status,
            ),
            (
                subjects.RUNTIME_STATUS_STREAM,
                "scheduler-hello",
                subjects.ACTUATOR_HELLO_PREFIX,
                partial(decode_json, ActuatorHello),
                self.on_actuator_hello,
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
        kicked = asyncio.ensure_future(self._kick.wait())
        stopped = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait(
                {kicked, stopped},
                timeout=self.settings.reconcile_interval.total_seconds(),
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            kicked.cancel()
            stopped.cancel()
        self._kick.clear()

    # ---- bus inputs --------------------------------------------------------------------------------------
    async def on_demand(self, demand: Demand, delivery: Delivery) -> None:
        now = self.clock.now()
        when = min(demand.time, now) if demand.time else now
        group = await self.store.record_demand(
            namespace=demand.namespace,
            name=demand.model,
            source=demand.source,
            queued=demand.queued,
            when=when,
            message_id=delivery.message_id,
        )
        if group is not None:
            self.kick(group)
        else:
            log.info(
                "demand ignored (unknown model or repeated message)",
                extra={"model": f"{demand.namespace}/{demand.model}"},
            )

    async def on_in_flight(self, report: InFlightReport, _: Delivery) -> None:
        now = self.clock.now()
        counts = {ModelKey(c.namespace, c.model): c.in_flight for c in report.models}
        for group in await self.store.record_in_flight(source=report.source, counts=counts, when=min(report.time, now)):
            self.kick(group)  # a count fell to zero: a drain may be over

    async def on_runtime_status(self, status: RuntimeStatus, _: Delivery) -> None:
        group = await self.store.record_runtime(
            namespace=status.namespace,
            name=status.model,
            phase=status.phase.value,
            generation=status.generation,
            endpoint=status.endpoint,
            message=status.message,
            when=status.time,
        )
        if group is not None:
            self.kick(group)
        else:
            log.debug("stale runtime status ignored", extra={"model": f"{status.namespace}/{status.model}"})

    async def on_actuator_hello(self, hello: ActuatorHello, _: Delivery) -> None:
        count = await self.store.forget_runtime()
        log.info("actuator started; re-issuing commands", extra={"actuator": hello.actuator, "models": count})
        self.kick()

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
        if any(key not in seen for key in self._routes):
            await self._forget_deleted(await self.store.model_keys())
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
        world, leases_ok = await self.store.load_world(
            now, self.settings.shared_demand_window, groups, in_flight_ttl=self.in_flight_ttl
        )
        if give_way and self._dirty:
            return None
        if not leases_ok:
            LEASE_READ_ERRORS.inc()
            log.warning("lease read failed; electing as if unleased (fail open toward serving)")
        plans = self.plan(world, now)
        elapsed = time.perf_counter() - started
        ELECTION_DURATION.observe(elapsed)
        # The write runs while the routes are built and sent (on a first pass over 10,000 models Postgres took
        # 0.2 s over it, the routes 0.25 s of Python), all but those that make a model ready: a proxy serves the
        # model once it reads one, and by then the admin API must show it Ready. They, and everything else, wait
        # until the plan is stored.
        write = asyncio.create_task(self.store.apply_plans(world, plans, now))
        routes = self._changed_routes(plans, now)
        ready = [r for r in routes if r[2].ready]
        try:
            await self._put_routes([r for r in routes if not r[2].ready])
            await write  # a failed write raises here: no command nor status goes out for a plan not stored
        except BaseException:
            if not write.cancel() and not write.cancelled():
                write.exception()  # (retrieved: its failure is not what is raised)
            raise
        await self._put_routes(ready)
        for group, plan in zip(world.groups, plans, strict=True):
            self._group_gauges.show(plan.group, group_view(group, plan))
        if groups is None:
            self._group_gauges.retain(plan.group for plan in plans)
        await self._publish(plans, world, now)
        if groups is None:
            await self._forget_deleted({key for plan in plans for key in plan.members})
        return PassResult(plans, elapsed)

    def _changed_routes(self, plans: list[GroupPlan], now: datetime) -> list[tuple[ModelKey, tuple[Any, ...], Route]]:
        """The routes that changed, the first of what a pass publishes (the proxies read them: a model being parked
        was already published not ready, in the pass that started its drain); those that make a model ready go out
        once the plan is stored. What did not change is left out before any I/O (a quiet pass over 10,000 models
        publishes nothing and costs nothing here)."""
        return [
            r
            for plan in plans
            for k, v in plan.statuses.items()
            if (r := self._route(plan.members[k], plan.group, v, now))
        ]

    async def _put_routes(self, routes: list[tuple[ModelKey, tuple[Any, ...], Route]]) -> None:
        if not routes:
            return
        try:
            written = await self.bus.put_routes([route for _, _, route in routes])
        except Exception as exc:
            log.warning("route publish failed; retrying next pass", extra={"error": repr(exc)})
            written = [False] * len(routes)
        for (key, fields, _), ok in zip(routes, written, strict=True):
            if ok:
                self._routes[key] = fields
        if not all(written):
            log.warning("some routes not written; retrying next pass", extra={"failed": written.count(False)})

    async def _publish(self, plans: list[GroupPlan], world: World, now: datetime) -> None:
        """What the stored plans say to publish after their routes: commands, then what only observers read
        (statuses, the groups' status, swap events), what changed only, together (JetStream acks pipelined)."""
        commands = [c for plan in plans for command in plan.commands if (c := self._command(command, plan, world, now))]
        made: dict[tuple[Any, ...], ModelStatus] = {}
        statuses = [
            u for plan in plans for k, v in plan.statuses.items() if (u := self._status(plan.members[k], v, now, made))
        ]
        groups = [g for plan in plans if (g := self._group_status(plan, now))]
        events = [e for plan in plans for e in self._swap_events(plan, now)]
        # Commands and what observers read go out in one batch, commands first (one round trip for the acks
        # instead of two: it is on the way from every event to the next pass).
        published = await self._publish_all(
            [
                *commands,
                *((subjects.model_status_subject(k.namespace, k.name), u, None) for k, _, u in statuses),
                *((subjects.group_status_subject(g), u, None) for g, _, u in groups),
                *events,
            ]
        )
        published = published[len(commands) :]
        for (key, fields, _), ok in zip(statuses, published, strict=False):
            if ok:
                self._statuses[key] = fields
        for (group, fields, _), ok in zip(groups, published[len(statuses) :], strict=False):
            if ok:
                self._group_statuses[group] = fields

    def _swap_events(self, plan: GroupPlan, now: datetime) -> list[tuple[str, BaseModel, str | None]]:
        """The plan's swap events (and their metrics and log lines)."""
        out: list[tuple[str, BaseModel, str | None]] = []
        for update in plan.swap_updates:
            swap = update.swap
            if update.created:
                SWAPS.inc(
                    plan.group,
                    swap.from_model.name if swap.from_model else "",
                    swap.to_model.name if swap.to_model else "",
                    swap.reason.value,
                )
            if update.finished_at is not None:
                for phase, seconds in swap.phases.items():
                    SWAP_DURATION.observe(seconds, plan.group, phase)
            kind = (
                "swap.started"
                if update.created and update.finished_at is None
                else "swap.failed"
                if swap.phase == SwapPhase.ABORTED
                else "swap.finished"
                if update.finished_at is not None
                else "swap.phase"
            )
            event = SwapEvent(
                kind=kind,
                swap_id=swap.id,
                group=plan.group,
                from_model=str(swap.from_model) if swap.from_model else None,
                to_model=str(swap.to_model) if swap.to_model else None,
                reason=swap.reason,
                phase=swap.phase,
                phases=swap.phases,
                message=update.message,
                time=now,
            )
            out.append((subjects.event_subject("swap", plan.group), event, f"{swap.id}:{swap.phase}"))
            log.info(
                kind,
                extra={
                    "group": plan.group,
                    "swap": swap.id,
                    "phase": swap.phase.value,
                    "from": event.from_model,
                    "to": event.to_model,
                    "reason": swap.reason.value,
                },
            )
        return out

    def _command(
        self, command: Command, plan: GroupPlan, world: World, now: datetime
    ) -> tuple[str, BaseModel, str | None] | None:
        """The scale command to publish (each with a message id of its own: a repeat must not be de-duplicated)."""
        try:
            runtime = world.runtime(command.key)
        except ValidationError as exc:  # a manifest stored by an older version
            # the fields and what is wrong with them, never their values (a manifest's env may hold a secret)
            log.error(
                "stored manifest does not parse; command not sent",
                extra={"model": str(command.key), "error": describe_validation_error(exc, "manifest ")},
            )
            return None
        if runtime is None:
            log.error("no runtime spec for a command; not sent", extra={"model": str(command.key)})
            return None
        if plan.drain_timeout is not None:
            runtime = runtime.model_copy(update={"drain_seconds": plan.drain_timeout.total_seconds()})
        key = command.key
        message = ScaleCommand(
            group=plan.group,
            namespace=key.namespace,
            model=key.name,
            action=command.action,
            generation=command.generation,
            swap_id=command.swap_id,
            runtime=runtime,
            issued_at=now,
        )
        log.info(
            "command",
            extra={
                "model": str(key),
                "action": command.action.value,
                "generation": command.generation,
                "reissue": command.reissue,
            },
        )
        return subjects.command_subject(key.namespace, key.name), message, message_id("scheduler")

    async def _publish_all(self, items: list[tuple[str, BaseModel, str | None]]) -> list[bool]:
        """Publish together; a failure is logged (a lost command is re-sent after command_retry, a status or route
        is published again by the next pass)."""
        if not items:
            return []
        try:
            published = await self.bus.publish_many(items)
        except Exception as exc:
            log.warning("publish failed", extra={"messages": len(items), "error": repr(exc)})
            return [False] * len(items)
        if not all(published):
            failed = sorted({subject for (subject, _, _), ok in zip(items, published, strict=True) if not ok})
            log.warning("publish failed", extra={"failed": published.count(False), "subjects": failed[:5]})
        return published

    def _route(
        self, member: Member, group: str, view: StatusView, now: datetime
    ) -> tuple[ModelKey, tuple[Any, ...], Route] | None:
        """The member's route, when it differs from the one last published."""
        key = member.key
        ready = view.ready and member.desired_action == ScaleAction.ACTIVATE
        fields = (
            visible_group(group),
            member.priority,
            member.service_labels,
            view.phase,
            view.state,
            ready,
            member.endpoint if ready else None,
            view.failure,
            member.command_generation,
            ready and member.runtime_message == WOKEN,
        )
        if self._routes.get(key) == fields:
            return None  # write only what changed: a quiet system publishes nothing
        route = Route(
            namespace=key.namespace,
            name=key.name,
            group=fields[0],
            priority=member.priority,
            service_labels=list(member.service_labels),
            phase=view.phase,
            state=view.state,
            ready=ready,
            endpoint=fields[6],
            failure=view.failure,
            generation=member.command_generation,
            woken=fields[9],
            updated_at=now,
        )
        return key, fields, route

    def _status(
        self, member: Member, view: StatusView, now: datetime, made: dict[tuple[Any, ...], ModelStatus]
    ) -> tuple[ModelKey, tuple[Any, ...], ModelStatusUpdate] | None:
        """The member's status (the contract's Model status), when it differs from the one last published. ``made``
        holds the statuses this pass built, by their fields: most models of a first pass share one (parked, never
        active), and a frozen status may go into many updates (it was a third of building them)."""
        key = member.key
        fields = (
            view.phase,
            member.last_active_time,
            view.state,
            view.queue_position,
            member.preempted_at,
            view.preempted_by,
            view.message,
            member.observed_generation,
        )
        if self._statuses.get(key) == fields:
            return None
        status = made.get(fields)
        if status is None:
            status = made[fields] = ModelStatus(
                phase=view.phase,
                last_active_time=member.last_active_time,
                shared_group=SharedGroupStatus(
                    state=view.state, queue_position=view.queue_position, preempted_at=member.preempted_at
                ),
                preempted_by=view.preempted_by,
                message=view.message,
                observed_generation=member.observed_generation,
            )
        return key, fields, ModelStatusUpdate(namespace=key.namespace, model=key.name, status=status, time=now)

    def _group_status(self, plan: GroupPlan, now: datetime) -> tuple[str, tuple[Any, ...], GroupStatusUpdate] | None:
        """A shared group's holder and queue (a GPUGroup's status in Kubernetes), when they changed."""
        if visible_group(plan.group) is None:
            return None
        queue = plan.queue
        lease = (plan.lease.name, plan.lease.owner, plan.lease.acquired_at) if plan.lease else None
        fields = (plan.active, tuple(queue), lease)
        if self._group_statuses.get(plan.group) == fields:
            return None
        update = GroupStatusUpdate(
            group=plan.group,
            active_model=ModelRef(namespace=plan.active.namespace, name=plan.active.name) if plan.active else None,
            queue=[ModelRef(namespace=key.namespace, name=key.name) for key in queue],
            lease=LeaseRef(name=lease[0], owner=lease[1], acquired_at=lease[2]) if lease else None,
            time=now,
        )
        return plan.group, fields, update

    async def _forget_deleted(self, present: set[ModelKey]) -> None:
        for key in [k for k in self._routes if k not in present]:
            with contextlib.suppress(Exception):
                await self.bus.delete_route(key)
            self._routes.pop(key, None)
            self._statuses.pop(key, None)

    async def announce(self, row: ModelRow) -> None:
        """A new model: tell the proxies at once that it exists (not ready yet), so a request sent right after
        ``flexinfer apply`` queues instead of getting 404. Only for new models: an existing route is the
        leader's to change."""
        facts = spec_facts(row.manifest)  # a fresh row from the admin API: the manifest is loaded
        route = Route(
            namespace=row.namespace,
            name=row.name,
            group=visible_group(row.group_name),
            priority=row.priority,
            service_labels=list(facts.service_labels),
            updated_at=self.clock.now(),
        )
        try:
            await self.bus.create_route(route)
        except Exception as exc:
            log.warning("route not announced", extra={"model": f"{row.namespace}/{row.name}", "error": repr(exc)})

    async def forget_route(self, namespace: str, name: str) -> None:
        """A model was deleted through the admin API: the proxy must stop knowing it at once."""
        key = ModelKey(namespace, name)
        with contextlib.suppress(Exception):
            await self.bus.delete_route(key)
        self._routes.pop(key, None)
        self._statuses.pop(key, None)


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
        observed_generation=row.observed_generation,
    )


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
