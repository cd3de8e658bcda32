"""What a stored pass publishes, and only what changed since the last time (the caches of what was published):
routes (the proxies route by them), scale commands, model and group statuses, swap events. Owned by the
:class:`~flexinfer_scheduler.loop.Scheduler`, which decides; this module only tells the bus."""

from __future__ import annotations

from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ValidationError

from flexinfer_common import subjects
from flexinfer_common.clock import Clock
from flexinfer_common.db import ModelRow
from flexinfer_common.enums import ScaleAction, SwapPhase
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.manifests import describe_validation_error
from flexinfer_common.messages import (
    WOKEN,
    GroupStatusUpdate,
    LeaseRef,
    MemoryStatus,
    ModelRef,
    ModelStatus,
    ModelStatusUpdate,
    PlacementStatus,
    Route,
    ScaleCommand,
    SharedGroupStatus,
    SwapEvent,
    message_id,
)
from flexinfer_scheduler.domain.manifests import spec_facts, visible_group
from flexinfer_scheduler.domain.model import Member
from flexinfer_scheduler.domain.plan import Command, GroupPlan, StatusView
from flexinfer_scheduler.metrics import (
    SWAP_DURATION,
    SWAPS,
)
from flexinfer_scheduler.ports import LeaderLock, SchedulerBus, World

log = get_logger("flexinfer.scheduler")


class PassPublisher:
    """Publishes what plans say, remembering what went out so a quiet pass publishes nothing. ``reset`` forgets it
    (a new leader publishes every route and status once)."""

    def __init__(self, *, bus: SchedulerBus, lock: LeaderLock, clock: Clock) -> None:
        self.bus = bus
        self.lock = lock
        self.clock = clock
        self._routes: dict[ModelKey, tuple[Any, ...]] = {}
        self._statuses: dict[ModelKey, tuple[Any, ...]] = {}
        self._group_statuses: dict[str, tuple[Any, ...]] = {}

    def published_any_but(self, keys: set[ModelKey]) -> bool:
        """Whether a route was published for a model not in ``keys`` (one that may have been deleted since)."""
        return any(key not in keys for key in self._routes)

    def reset(self) -> None:
        self._routes.clear()
        self._statuses.clear()
        self._group_statuses.clear()

    def changed_routes(self, plans: list[GroupPlan], now: datetime) -> list[tuple[ModelKey, tuple[Any, ...], Route]]:
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

    async def put_routes(self, routes: list[tuple[ModelKey, tuple[Any, ...], Route]]) -> None:
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

    async def publish(
        self, plans: list[GroupPlan], world: World, now: datetime, unwritten: AbstractSet[ModelKey] = frozenset()
    ) -> None:
        """What the stored plans say to publish after their routes: commands, then what only observers read
        (statuses, the groups' status, swap events), what changed only, together (JetStream acks pipelined).
        Nothing goes out for the ``unwritten`` models (the store did not write their changes: they left the group)."""
        commands = [
            c
            for plan in plans
            for command in plan.commands
            if command.key not in unwritten and (c := self._command(command, plan, world, now))
        ]
        made: dict[tuple[Any, ...], ModelStatus] = {}
        statuses = [
            u
            for plan in plans
            for k, v in plan.statuses.items()
            if k not in unwritten and (u := self._status(plan.members[k], v, now, made))
        ]
        groups = [g for plan in plans if (g := self._group_status(plan, now))]
        events = [e for plan in plans for e in self._swap_events(plan, now)]
        # Commands and what observers read go out in one batch, commands first (one round trip for the acks
        # instead of two: it is on the way from every event to the next pass).
        published = await self.publish_all(
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
                if swap.phase in (SwapPhase.ABORTED, SwapPhase.FAILED)
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
        placed = plan.members.get(command.key)
        if placed is not None and placed.placement is not None and command.action is ScaleAction.ACTIVATE:
            runtime = runtime.model_copy(update={"devices": list(placed.placement)})
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
            leader_epoch=self.lock.epoch,
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

    async def publish_all(self, items: list[tuple[str, BaseModel, str | None]]) -> list[bool]:
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
        shown_group, endpoint = visible_group(group), member.endpoint if ready else None
        woken = ready and member.runtime_message == WOKEN
        fields = (
            shown_group,
            member.priority,
            member.service_labels,
            view.phase,
            view.state,
            ready,
            endpoint,
            view.failure,
            member.command_generation,
            woken,
        )
        if self._routes.get(key) == fields:
            return None  # write only what changed: a quiet system publishes nothing
        route = Route(
            namespace=key.namespace,
            name=key.name,
            group=shown_group,
            priority=member.priority,
            service_labels=list(member.service_labels),
            phase=view.phase,
            state=view.state,
            ready=ready,
            endpoint=endpoint,
            failure=view.failure,
            generation=member.command_generation,
            woken=woken,
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
        placement = member.placement if not member.parked else None  # a parked model holds no device
        fields = (
            view.phase,
            member.last_active_time,
            view.state,
            view.queue_position,
            member.preempted_at,
            view.preempted_by,
            view.message,
            member.observed_generation,
            member.memory,
            member.memory_estimated,
            member.memory_measured,
            placement,
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
                memory=memory_status(member.memory, estimated=member.memory_estimated, measured=member.memory_measured),
                placement=PlacementStatus(devices=list(placement)) if placement is not None else None,
            )
        return key, fields, ModelStatusUpdate(namespace=key.namespace, model=key.name, status=status, time=now)

    def _group_status(self, plan: GroupPlan, now: datetime) -> tuple[str, tuple[Any, ...], GroupStatusUpdate] | None:
        """A shared group's holder and queue (a GPUGroup's status in Kubernetes), when they changed."""
        if visible_group(plan.group) is None:
            return None
        queue = plan.queue
        reserved = plan.reservation
        lease = (
            (
                plan.lease.name,
                plan.lease.owner,
                plan.lease.acquired_at,
                reserved.device if reserved else None,
                reserved.free if reserved else False,
            )
            if plan.lease
            else None
        )
        fields = (plan.active, tuple(queue), lease)
        if self._group_statuses.get(plan.group) == fields:
            return None
        update = GroupStatusUpdate(
            group=plan.group,
            active_model=ModelRef(namespace=plan.active.namespace, name=plan.active.name) if plan.active else None,
            queue=[ModelRef(namespace=key.namespace, name=key.name) for key in queue],
            lease=LeaseRef(name=lease[0], owner=lease[1], acquired_at=lease[2], device=lease[3], free=lease[4])
            if lease
            else None,
            time=now,
        )
        return plan.group, fields, update

    async def forget_deleted(self, present: set[ModelKey]) -> list[ModelKey]:
        """Delete the routes of models that no longer exist, and say whose went. A route whose deletion fails is
        kept in what was published, so the next full pass tries again (the proxies would otherwise route to it for
        ever)."""
        removed = []
        for key in [k for k in self._routes if k not in present]:
            try:
                await self.bus.delete_route(key)
            except Exception as exc:
                log.warning("route of a deleted model not removed; retrying next pass", extra=_failed(key, exc))
                continue
            self._routes.pop(key, None)
            self._statuses.pop(key, None)
            removed.append(key)
        return removed

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
        try:
            await self.bus.delete_route(key)
        except Exception as exc:
            # kept in what was published: the next full pass finds the model gone and deletes the route again
            log.warning("route of a deleted model not removed; retrying next pass", extra=_failed(key, exc))
            self._routes.setdefault(key, ())
            return
        self._routes.pop(key, None)
        self._statuses.pop(key, None)


def _failed(key: ModelKey, exc: BaseException) -> dict[str, str]:
    return {"model": f"{key.namespace}/{key.name}", "error": repr(exc)}


def memory_status(memory: int | None, *, estimated: bool, measured: int | None = None) -> MemoryStatus | None:
    """A model's ``status.memory``: what it was measured to hold when it was (local mode with a GPU; fitting may
    count more: ``fitting_memory``), else its declared or estimated memory (none: it would take a whole device)."""
    if measured is not None:
        return MemoryStatus(bytes=measured, source="measured")
    return MemoryStatus(bytes=memory, source="estimated" if estimated else "declared") if memory is not None else None
