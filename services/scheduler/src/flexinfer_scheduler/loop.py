"""The scheduler's loop: observe (bus inputs into Postgres) -> decide (plan_group, pure) -> apply (one
transaction, then commands, routes, statuses and events on the bus).

Event-driven for speed (a demand or a runtime report starts a pass at once) and level-triggered for safety (a
pass runs every reconcile interval anyway). Only the replica holding the Postgres advisory lock leads: it alone
consumes the bus and runs passes. Everything a pass needs is in Postgres, so a new leader resumes any swap.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

import asyncpg
from sqlalchemy.engine import make_url

from flexinfer_common import subjects
from flexinfer_common.bus import Bus, Delivery, decode_demand, decode_json
from flexinfer_common.clock import Clock
from flexinfer_common.db import ModelRow
from flexinfer_common.enums import ModelPhase, ScaleAction, SharedState, SwapPhase
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import (
    WOKEN,
    ActuatorHello,
    Demand,
    GroupStatusUpdate,
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
from flexinfer_common.metrics import (
    ELECTION_DURATION,
    GROUP_ACTIVE_MODEL,
    LEASE_READ_ERRORS,
    SCHEDULER_LEADER,
    SWAP_DURATION,
    SWAPS,
)
from flexinfer_scheduler.adapters.store import Store, spec_facts, visible_group
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import ModelKey
from flexinfer_scheduler.domain.plan import Command, GroupPlan, StatusView, plan_group
from flexinfer_scheduler.settings import SchedulerSettings
from flexinfer_scheduler.specs import SpecInbox, decode_spec_message

log = get_logger("flexinfer.scheduler")

# Groups per slice of the periodic reconcile (about 1,000 models: a few tens of milliseconds).
RECONCILE_CHUNK = 100


@dataclass
class PassResult:
    plans: list[GroupPlan]
    seconds: float


class Scheduler:
    def __init__(self, *, store: Store, bus: Bus, settings: SchedulerSettings, clock: Clock) -> None:
        self.store = store
        self.bus = bus
        self.settings = settings
        self.clock = clock
        self.params = ElectionParams(
            demand_window=settings.shared_demand_window,
            recent_window=settings.recent_leader_window,
            default_swap_cooldown=settings.default_swap_cooldown,
        )
        self.is_leader = False
        self._kick = asyncio.Event()
        self._dirty: set[str] = set()
        self._full_pass_due = True
        self._last_full_pass = 0.0
        # what was last published per model, to publish only changes
        self._routes: dict[ModelKey, tuple[Any, ...]] = {}
        self._statuses: dict[ModelKey, tuple[Any, ...]] = {}
        self._group_statuses: dict[str, tuple[Any, ...]] = {}
        self._active_metric: dict[str, str] = {}
        self._kv: Any = None
        self._consumers: list[Any] = []
        self._last_prune = 0.0

    def kick(self, group: str | None = None) -> None:
        """Ask for an election pass now: of one group (an event named it) or of every group (``None``)."""
        if group is None:
            self._full_pass_due = True
        else:
            self._dirty.add(group)
        self._kick.set()

    # ---- leadership --------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        lock_conn: asyncpg.Connection | None = None
        try:
            while not stop.is_set():
                if not self.is_leader:
                    lock_conn = await self._try_lead(lock_conn)
                    if not self.is_leader:
                        await _wait(stop, self.settings.reconcile_interval.total_seconds())
                        continue
                    try:
                        await self._become_leader()
                    except Exception:
                        log.exception("could not start leading (bus?); releasing the lock and retrying")
                        await self._step_down()
                        if lock_conn is not None:
                            with contextlib.suppress(Exception):
                                await lock_conn.close()
                        lock_conn = None
                        await _wait(stop, self.settings.reconcile_interval.total_seconds())
                        continue
                try:
                    await asyncio.wait_for(lock_conn.fetchval("SELECT 1"), timeout=5)  # type: ignore[union-attr]
                except Exception as exc:
                    log.error("lost the leader lock's connection; stepping down", extra={"error": repr(exc)})
                    await self._step_down()
                    lock_conn = None
                    continue
                full = self._full_pass_due or (
                    time.monotonic() - self._last_full_pass >= self.settings.reconcile_interval.total_seconds()
                )
                self._full_pass_due = False
                try:
                    if full:
                        await self.reconcile()
                        self._last_full_pass = time.monotonic()
                    else:
                        await self._pass_dirty()
                except Exception:
                    log.exception("election pass failed; retrying at the next tick")
                    self._full_pass_due = True
                await self._wait_for_kick(stop)
        finally:
            await self._step_down()
            if lock_conn is not None:
                with contextlib.suppress(Exception):
                    await lock_conn.close()

    async def _try_lead(self, conn: asyncpg.Connection | None) -> asyncpg.Connection | None:
        try:
            if conn is None or conn.is_closed():
                url = make_url(self.settings.database_url).set(drivername="postgresql")
                conn = await asyncpg.connect(url.render_as_string(hide_password=False), timeout=5)
            self.is_leader = bool(await conn.fetchval("SELECT pg_try_advisory_lock($1)", self.settings.leader_lock_id))
        except Exception as exc:
            log.warning("cannot reach Postgres for the leader lock", extra={"error": repr(exc)})
            self.is_leader = False
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
            return None
        return conn

    async def _become_leader(self) -> None:
        log.info("leading: consuming the bus and running elections")
        SCHEDULER_LEADER.set(1)
        self._routes.clear()  # publish every route once as the new leader
        self._statuses.clear()
        self._group_statuses.clear()
        self._kv = await self.bus.routes()
        self._consumers = [
            await self.bus.consume(
                stream=subjects.DEMAND_STREAM,
                durable="scheduler-demand",
                filter_subject=subjects.DEMAND_PREFIX + ".>",
                decode=decode_demand,
                handler=self.on_demand,
            ),
            await self.bus.consume(
                stream=subjects.RUNTIME_STATUS_STREAM,
                durable="scheduler-runtime",
                filter_subject=subjects.RUNTIME_STATUS_PREFIX + ".>",
                decode=partial(decode_json, RuntimeStatus),
                handler=self.on_runtime_status,
            ),
            await self.bus.consume(
                stream=subjects.SPEC_STREAM,
                durable="scheduler-specs",
                filter_subject=subjects.SPEC_PREFIX + ".>",
                decode=decode_spec_message,
                handler=SpecInbox(store=self.store, hooks=self, clock=self.clock).handle,
            ),
            await self.bus.consume(
                stream=subjects.RUNTIME_STATUS_STREAM,
                durable="scheduler-hello",
                filter_subject=subjects.ACTUATOR_HELLO_PREFIX + ".>",
                decode=partial(decode_json, ActuatorHello),
                handler=self.on_actuator_hello,
            ),
        ]
        self.kick()

    async def _step_down(self) -> None:
        if self.is_leader:
            log.info("no longer leading")
        self.is_leader = False
        SCHEDULER_LEADER.set(0)
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
    async def _pass_dirty(self) -> None:
        if self._dirty:
            groups = set(self._dirty)
            self._dirty.clear()
            await self.election_pass(groups)

    async def reconcile(self) -> None:
        """The periodic full pass, in chunks of groups; groups an event touched meanwhile go first after each
        chunk, so a large installation's reconcile does not hold up the reaction to a demand."""
        names = await self.store.group_names()
        for start in range(0, max(len(names), 1), RECONCILE_CHUNK):
            await self._pass_dirty()
            await self.election_pass(set(names[start : start + RECONCILE_CHUNK]))
        await self._pass_dirty()
        await self._forget_deleted(await self.store.model_keys())
        if time.monotonic() - self._last_prune > 60:
            self._last_prune = time.monotonic()
            await self.store.prune(self.clock.now(), self.settings.prune_after)

    async def election_pass(self, groups: set[str] | None = None) -> PassResult:
        """Elect and apply for every group, or only for ``groups`` (those an event touched)."""
        started = time.perf_counter()
        now = self.clock.now()
        world, leases_ok = await self.store.load_world(now, self.settings.shared_demand_window, groups)
        if not leases_ok:
            LEASE_READ_ERRORS.inc()
            log.warning("lease read failed; electing as if unleased (fail open toward serving)")
        plans = [
            plan_group(
                group,
                now,
                self.params,
                command_retry=self.settings.command_retry,
                new_swap_id=new_id(),
                restart_backoff=self.settings.restart_backoff,
            )
            for group in world.groups
        ]
        elapsed = time.perf_counter() - started
        ELECTION_DURATION.observe(elapsed)
        await self.store.apply_plans(world, plans, now)
        rows = world.models
        await _bounded_gather([self._publish(plan, rows, now) for plan in plans])
        if groups is None:
            await self._forget_deleted(set(rows))
        return PassResult(plans, elapsed)

    async def _publish(self, plan: GroupPlan, rows: dict[ModelKey, ModelRow], now: datetime) -> None:
        for update in plan.swap_updates:
            swap = update.swap
            if update.created:
                SWAPS.labels(
                    group=plan.group,
                    from_model=swap.from_model.name if swap.from_model else "",
                    to_model=swap.to_model.name if swap.to_model else "",
                    reason=swap.reason.value,
                ).inc()
            if update.finished_at is not None:
                for phase, seconds in swap.phases.items():
                    SWAP_DURATION.labels(group=plan.group, phase=phase).observe(seconds)
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
            await self._safe_publish(subjects.event_subject("swap", plan.group), event, f"{swap.id}:{swap.phase}")
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
        active_name = plan.active.name if plan.active else ""
        previous = self._active_metric.get(plan.group)
        if previous != active_name:
            if previous:
                GROUP_ACTIVE_MODEL.labels(group=plan.group, model=previous).set(0)
            if active_name:
                GROUP_ACTIVE_MODEL.labels(group=plan.group, model=active_name).set(1)
            self._active_metric[plan.group] = active_name
        for key, view in plan.statuses.items():
            row = rows.get(key)
            if row is not None:
                await self._publish_route(key, plan.group, row, view, now)
                await self._publish_status(key, row, now)
        await self._publish_group_status(plan, now)
        # Commands last: a model being parked has just been published as not ready, so the proxies stop sending
        # it new requests before it is told to stop.
        for command in plan.commands:
            row = rows.get(command.key)
            if row is not None:
                await self._send(command, plan, row, now)

    async def _send(self, command: Command, plan: GroupPlan, row: ModelRow, now: datetime) -> None:
        runtime = self.store.spec_facts(row).runtime(row.namespace, row.name)
        if plan.drain_timeout is not None:
            runtime = runtime.model_copy(update={"drain_seconds": plan.drain_timeout.total_seconds()})
        message = ScaleCommand(
            group=plan.group,
            namespace=row.namespace,
            model=row.name,
            action=command.action,
            generation=command.generation,
            swap_id=command.swap_id,
            runtime=runtime,
            issued_at=now,
        )
        log.info(
            "command",
            extra={
                "model": f"{row.namespace}/{row.name}",
                "action": command.action.value,
                "generation": command.generation,
                "reissue": command.reissue,
            },
        )
        await self._safe_publish(
            subjects.command_subject(row.namespace, row.name),
            message,
            msg_id=message_id("scheduler"),
        )

    async def _publish_route(self, key: ModelKey, group: str, row: ModelRow, view: StatusView, now: datetime) -> None:
        facts = self.store.spec_facts(row)
        ready = view.ready and row.desired_action == ScaleAction.ACTIVATE.value
        fields = (
            visible_group(group),
            row.priority,
            facts.service_labels,
            view.phase,
            view.state,
            ready,
            row.endpoint if ready else None,
            view.failure,
            row.command_generation,
            ready and row.runtime_message == WOKEN,
        )
        if self._routes.get(key) == fields:
            return  # write only what changed: a quiet system publishes nothing
        route = Route(
            namespace=key.namespace,
            name=key.name,
            group=fields[0],
            priority=row.priority,
            service_labels=list(facts.service_labels),
            phase=view.phase,
            state=view.state,
            ready=ready,
            endpoint=fields[6],
            failure=view.failure,
            generation=row.command_generation,
            woken=fields[9],
            updated_at=now,
        )
        try:
            await self._kv.put(subjects.route_key(key.namespace, key.name), route.to_bytes())
            self._routes[key] = fields
        except Exception as exc:
            log.warning("route publish failed; retrying next pass", extra={"model": str(key), "error": repr(exc)})

    async def _publish_status(self, key: ModelKey, row: ModelRow, now: datetime) -> None:
        fields = (
            row.phase,
            row.last_active_time,
            row.shared_state,
            row.queue_position,
            row.preempted_at,
            row.preempted_by,
            row.message,
            row.observed_generation,
        )
        if self._statuses.get(key) == fields:
            return
        update = ModelStatusUpdate(namespace=key.namespace, model=key.name, status=model_status(row), time=now)
        await self._safe_publish(subjects.model_status_subject(key.namespace, key.name), update, None)
        self._statuses[key] = fields

    async def _publish_group_status(self, plan: GroupPlan, now: datetime) -> None:
        """A shared group's holder and queue (a GPUGroup's status in Kubernetes), when they changed."""
        if visible_group(plan.group) is None:
            return
        queued = sorted(
            (view.queue_position, key)
            for key, view in plan.statuses.items()
            if view.state is SharedState.QUEUED and view.queue_position is not None
        )
        lease = (plan.lease.name, plan.lease.owner, plan.lease.acquired_at) if plan.lease else None
        fields = (plan.active, tuple(key for _, key in queued), lease)
        if self._group_statuses.get(plan.group) == fields:
            return
        update = GroupStatusUpdate(
            group=plan.group,
            active_model=ModelRef(namespace=plan.active.namespace, name=plan.active.name) if plan.active else None,
            queue=[ModelRef(namespace=key.namespace, name=key.name) for _, key in queued],
            lease=LeaseRef(name=lease[0], owner=lease[1], acquired_at=lease[2]) if lease else None,
            time=now,
        )
        await self._safe_publish(subjects.group_status_subject(plan.group), update, None)
        self._group_statuses[plan.group] = fields

    async def _forget_deleted(self, present: set[ModelKey]) -> None:
        for key in [k for k in self._routes if k not in present]:
            with contextlib.suppress(Exception):
                await self._kv.delete(subjects.route_key(key.namespace, key.name))
            self._routes.pop(key, None)
            self._statuses.pop(key, None)

    async def _routes_kv(self) -> Any:
        if self._kv is None:
            self._kv = await self.bus.routes()
        return self._kv

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
            await (await self._routes_kv()).create(subjects.route_key(row.namespace, row.name), route.to_bytes())
        except Exception as exc:
            log.debug("route already announced", extra={"model": f"{row.namespace}/{row.name}", "error": repr(exc)})

    async def forget_route(self, namespace: str, name: str) -> None:
        """A model was deleted through the admin API: the proxy must stop knowing it at once."""
        key = ModelKey(namespace, name)
        with contextlib.suppress(Exception):
            await (await self._routes_kv()).delete(subjects.route_key(namespace, name))
        self._routes.pop(key, None)
        self._statuses.pop(key, None)

    async def _safe_publish(self, subject: str, message: Any, msg_id: str | None) -> None:
        try:
            await self.bus.publish(subject, message, msg_id=msg_id)
        except Exception as exc:
            # A lost command is re-sent by the reconcile (command_retry); routes and statuses are re-published.
            log.warning("publish failed", extra={"subject": subject, "error": repr(exc)})


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


async def _bounded_gather(coroutines: list[Coroutine[Any, Any, None]], limit: int = 64) -> None:
    """Run publishes concurrently (JetStream acks pipeline), at most ``limit`` at a time."""
    semaphore = asyncio.Semaphore(limit)

    async def one(coroutine: Coroutine[Any, Any, None]) -> None:
        async with semaphore:
            await coroutine

    await asyncio.gather(*(one(c) for c in coroutines))


async def _wait(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)
