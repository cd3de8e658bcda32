"""The scheduler's ports in memory: a store, a bus and a leader lock that behave like the real ones (the same
contract tests run against both), so the whole loop runs in a test without PostgreSQL or NATS.

The store keeps the same row types as PostgreSQL (``ModelRow``, ``GroupRow``, ``SwapRow``, as plain objects) and
builds snapshots with the same functions, so the two cannot drift apart in what a pass sees.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from pydantic import BaseModel

from flexinfer_common.bus import BadMessage, Delivery
from flexinfer_common.db import GroupRow, ModelRow, SwapRow
from flexinfer_common.enums import GroupPolicy
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GPUGroup, Model
from flexinfer_common.messages import Route, RuntimeSpec, encode
from flexinfer_common.subjects import route_key
from flexinfer_scheduler.adapters.rows import (
    ACTIVE_SWAP_PHASES,
    gpugroup_policy,
    group_snapshot,
    member_from_row,
    member_values,
    row_parked,
    stored_status,
)
from flexinfer_scheduler.adapters.weights import facts_of
from flexinfer_scheduler.domain.manifests import (
    GroupMove,
    SpecFacts,
    discovered_capacity,
    machine_capacity,
    membership,
    place,
)
from flexinfer_scheduler.domain.model import Capacity, Lease, Member
from flexinfer_scheduler.domain.plan import GroupPlan
from flexinfer_scheduler.ports import (
    API_ORIGIN,
    LOCAL_BACKEND,
    Decoder,
    DemandReport,
    GroupChangeRefused,
    Handler,
    M,
    MeasuredMemory,
    MembershipChangeRefused,
    Origin,
    RuntimeReport,
    StoredStatus,
    World,
    changes_of,
)

_MODEL_DEFAULTS: dict[str, Any] = {
    "phase": "Pending",
    "message": "",
    "runtime_generation": 0,
    "runtime_message": "",
    "command_generation": 0,
    "source": "api",
}


def _blank_model(namespace: str, name: str, manifest: dict[str, Any], now: datetime) -> ModelRow:
    row = ModelRow(namespace=namespace, name=name, manifest=manifest, spec_generation=1, **_MODEL_DEFAULTS)
    for column in ModelRow.__table__.columns:
        if column.name not in row.__dict__:
            setattr(row, column.name, None)
    row.created_at = row.updated_at = now
    return row


class MemoryStore:
    """:class:`~flexinfer_scheduler.ports.SchedulerStore` (and the spec store) in memory."""

    def __init__(self) -> None:
        self.models: dict[ModelKey, ModelRow] = {}
        self.groups: dict[str, GroupRow] = {}
        self.swaps: dict[str, SwapRow] = {}
        self.leases: dict[str, Lease] = {}
        self.lease_error: Exception | None = None  # set to make lease reads fail
        self._demand: dict[tuple[ModelKey, str], tuple[int, datetime, datetime | None]] = {}
        self._in_flight: dict[tuple[ModelKey, str], tuple[int, datetime]] = {}
        self._seen: dict[str, datetime] = {}
        self._facts: dict[ModelKey, tuple[int, SpecFacts]] = {}
        self.command_generations: dict[ModelKey, int] = {}  # what outlives a deleted model's row
        self.discovered: dict[str, Capacity] = {}  # backend -> the capacity of the GPUs its actuator found

    def _spec(self, row: ModelRow) -> SpecFacts:
        key = ModelKey(row.namespace, row.name)
        cached = self._facts.get(key)
        if cached is None or cached[0] != row.spec_generation:
            cached = self._facts[key] = (row.spec_generation, facts_of(row.manifest))
        return cached[1]

    def _runtime(self, key: ModelKey) -> RuntimeSpec | None:
        row = self.models.get(key)
        return None if row is None else self._spec(row).runtime(key.namespace, key.name)

    # ---- the election's snapshot -------------------------------------------------------------------------
    async def load_world(
        self,
        now: datetime,
        queued_ttl: timedelta,
        groups_only: set[str] | None = None,
        *,
        in_flight_ttl: timedelta = timedelta(seconds=5),
    ) -> tuple[World, bool]:
        queued: dict[ModelKey, int] = {}
        for (key, _), (count, when, valid_until) in self._demand.items():
            # as Store.load_world: a count stands until 0, or its message's validity (else the TTL) ends
            if (when >= now - queued_ttl) if valid_until is None else valid_until >= now:
                queued[key] = queued.get(key, 0) + count
        in_flight: dict[ModelKey, int] = {}
        for (key, _), (count, when) in self._in_flight.items():
            if when >= now - in_flight_ttl:
                in_flight[key] = in_flight.get(key, 0) + count
        by_group: dict[str, list[Member]] = {}
        statuses: dict[ModelKey, StoredStatus] = {}
        for key, row in sorted(self.models.items()):
            if not row.group_name or (groups_only is not None and row.group_name not in groups_only):
                continue
            values = member_values(row, queued.get(key, 0), in_flight.get(key, 0))
            statuses[key] = stored_status(values)
            member = member_from_row(values, self._spec(row))
            by_group.setdefault(row.group_name, []).append(member)
        names = set(by_group) | {n for n in self.groups if groups_only is None or n in groups_only}
        active_swaps = {s.group_name: s for s in self.swaps.values() if s.phase in ACTIVE_SWAP_PHASES}
        all_groups = {row.group_name for row in self.models.values() if row.group_name} | set(self.groups)
        snapshots = []
        for name in sorted(names):
            lease = self.leases.get(name)
            live = lease if lease is not None and lease.expires_at > now else None
            snapshots.append(
                group_snapshot(
                    name,
                    by_group.get(name, []),
                    self.groups.get(name),
                    active_swaps.get(name),
                    live,
                    machine_capacity(self.discovered.get(LOCAL_BACKEND), len(all_groups)),
                )
            )
        if self.lease_error is not None:
            snapshots = [dataclasses.replace(s, lease=None) for s in snapshots]
        return World(snapshots, statuses, self._runtime), self.lease_error is None

    async def apply_plans(self, world: World, plans: Sequence[GroupPlan], now: datetime) -> set[ModelKey]:
        stale: set[ModelKey] = set()
        for plan in plans:
            changes = changes_of(plan, world)
            # as the SQL store: a model that left the plan's group since the world was read is not written
            stale.update(k for k in changes if (row := self.models.get(k)) is None or row.group_name != plan.group)
            group = self.groups.get(plan.group)
            if group is None and not any(row.group_name == plan.group for row in self.models.values()):
                continue  # deleted while the pass ran: not written back, nor its swaps (as the SQL store)
            if group is None:
                group = self.groups[plan.group] = GroupRow(name=plan.group, policy=GroupPolicy.V1ALPHA2.value)
                group.manifest = group.namespace = group.source_observed_at = None
                group.source = API_ORIGIN.source
            group.active_namespace = plan.active.namespace if plan.active else None
            group.active_name = plan.active.name if plan.active else None
            group.leader_since = plan.leader_since
            group.current_swap_id = plan.swap_id
            for key, changed in changes.items():
                if key not in stale:
                    row = self.models[key]
                    for name, value in changed.items():
                        setattr(row, name, value)
                    row.updated_at = now
            for update in plan.swap_updates:
                sw = update.swap
                self.swaps[sw.id] = SwapRow(
                    id=sw.id,
                    group_name=plan.group,
                    from_namespace=sw.from_model.namespace if sw.from_model else None,
                    from_name=sw.from_model.name if sw.from_model else None,
                    to_namespace=sw.to_model.namespace if sw.to_model else None,
                    to_name=sw.to_model.name if sw.to_model else None,
                    reason=sw.reason.value,
                    phase=sw.phase.value,
                    started_at=sw.started_at,
                    phase_started_at=sw.phase_started_at,
                    phases=dict(sw.phases),
                    finished_at=update.finished_at,
                    message=update.message,
                )
        return stale

    async def group_names(self) -> list[str]:
        return sorted({r.group_name for r in self.models.values() if r.group_name} | set(self.groups))

    async def model_keys(self) -> set[ModelKey]:
        return set(self.models)

    async def model(self, namespace: str, name: str) -> ModelRow | None:
        return self.models.get(ModelKey(namespace, name))

    # ---- bus inputs --------------------------------------------------------------------------------------
    async def record_demand(self, report: DemandReport) -> str | None:
        if report.message_id in self._seen:
            return None
        key, when = ModelKey(report.namespace, report.name), report.when
        row = self.models.get(key)
        if row is None:
            return None
        self._seen[report.message_id] = when
        row.last_active_time = when if row.last_active_time is None else max(row.last_active_time, when)
        slot = (key, report.source)
        if slot not in self._demand or self._demand[slot][1] <= when:
            self._demand[slot] = (report.queued, when, report.valid_until)
        return row.group_name

    async def record_runtime(self, report: RuntimeReport) -> str | None:
        row = self.models.get(ModelKey(report.namespace, report.name))
        if row is None or not row.runtime_generation <= report.generation <= row.command_generation:
            return None
        row.runtime_phase, row.runtime_generation, row.runtime_updated_at = report.phase, report.generation, report.when
        row.endpoint, row.runtime_message = report.endpoint, report.message
        return row.group_name

    async def record_measured_memory(self, *, namespace: str, name: str, measured: int) -> MeasuredMemory | None:
        row = self.models.get(ModelKey(namespace, name))
        if row is None:
            return None
        facts = self._spec(row)
        found = MeasuredMemory(row.group_name, row.measured_memory, facts.memory, facts.memory_estimated)
        row.measured_memory = measured
        return found

    async def record_gpu_inventory(
        self, *, backend: str, actuator: str, device_memory: Sequence[int], when: datetime
    ) -> bool:
        capacity, before = discovered_capacity(device_memory), self.discovered.get(backend)
        if capacity is None:
            self.discovered.pop(backend, None)
        else:
            self.discovered[backend] = capacity
        return before != capacity

    async def note_crash(self, *, namespace: str, name: str, generation: int) -> tuple[int, str | None] | None:
        row = self.models.get(ModelKey(namespace, name))
        if (
            row is None
            or row.ready_since is None
            or row.desired_action != "activate"
            or row.command_generation != generation
            or row.runtime_generation != generation
            or row.runtime_phase != "Ready"
        ):
            return None
        row.restarts = (row.restarts or 0) + 1
        return row.restarts, row.group_name

    async def record_in_flight(self, *, source: str, counts: Mapping[ModelKey, int], when: datetime) -> set[str]:
        dropped = set()
        for slot in [s for s in self._in_flight if s[1] == source and s[0] not in counts]:
            if self._in_flight[slot][1] <= when:
                del self._in_flight[slot]
                dropped.add(slot[0])
        for key, count in counts.items():
            slot = (key, source)
            if slot not in self._in_flight or self._in_flight[slot][1] <= when:
                self._in_flight[slot] = (count, when)
        return {row.group_name for key in dropped if (row := self.models.get(key)) is not None and row.group_name}

    async def forget_runtime(self) -> int:
        rows = [r for r in self.models.values() if r.desired_action is not None]
        for row in rows:
            row.runtime_phase, row.command_issued_at, row.endpoint = "Unknown", None, None
        return len(rows)

    async def prune(self, now: datetime, keep: timedelta) -> None:
        for slot in [s for s, (_, when, until) in self._demand.items() if when < now - keep and (until or now) <= now]:
            del self._demand[slot]
        for slot in [s for s, (_, when) in self._in_flight.items() if when < now - keep]:
            del self._in_flight[slot]
        for message_id in [m for m, when in self._seen.items() if when < now - keep]:
            del self._seen[message_id]

    # ---- manifests (the spec inbox, and tests) -----------------------------------------------------------
    async def put_model(self, model: Model, now: datetime, origin: Origin = API_ORIGIN) -> tuple[ModelRow, bool]:
        manifest = model.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude={"status": True, "metadata": {"deletion_timestamp"}}
        )
        manifest["metadata"]["namespace"] = model.namespace
        key = ModelKey(model.namespace, model.name)
        row = self.models.get(key)
        created = row is None
        if row is None:
            row = self.models[key] = _blank_model(key.namespace, key.name, manifest, now)
            row.command_generation = self.command_generations.get(key, 0)
        elif origin.is_older_than(row.source_observed_at):
            return row, False
        else:
            gpu = model.spec.gpu
            group, _ = membership(key, gpu.shared, gpu.priority, self._listed())
            moving_to = place(current=row.group_name, desired=group, parked=row_parked(row)).moving_to
            if moving_to not in (None, row.moving_to) and origin.answers_refusals:
                raise GroupChangeRefused(key, row.group_name, group)
            if row.manifest != manifest:
                row.manifest, row.spec_generation = manifest, row.spec_generation + 1
        row.deleting_at = None
        row.source, row.source_observed_at, row.observed_generation = (
            origin.source,
            origin.observed_at,
            origin.generation,
        )
        row.updated_at = now
        self._assign(row, self._listed(), created=created)
        return row, created

    async def delete_model(self, namespace: str, name: str, origin: Origin = API_ORIGIN) -> ModelRow | None:
        key = ModelKey(namespace, name)
        row = self.models.get(key)
        if row is None or not origin.may_delete(row.source, row.source_observed_at):
            return None
        self._delete(row)
        return row

    def _delete(self, row: ModelRow) -> None:
        key = ModelKey(row.namespace, row.name)
        del self.models[key]
        self.command_generations[key] = max(self.command_generations.get(key, 0), row.command_generation)
        for table in (self._demand, self._in_flight):
            for slot in [s for s in table if s[0] == key]:
                del table[slot]
        group = self.groups.get(row.group_name or "")
        if (
            group is not None
            and group.policy == GroupPolicy.V1ALPHA2.value
            and group.manifest is None  # a GPUGroup declares it: kept for the models to come
            and not any(r.group_name == group.name for r in self.models.values())
        ):
            del self.groups[group.name]

    async def set_promoted(self, namespace: str, name: str, now: datetime) -> ModelRow | None:
        """As the admin API's promote call (``Store.set_promoted``)."""
        row = self.models.get(ModelKey(namespace, name))
        if row is None:
            return None
        row.promoted_at, row.idle_parked_at, row.failed_at = now, None, None
        return row

    async def set_parked(self, namespace: str, name: str, now: datetime) -> ModelRow | None:
        """As the status page's Park (``Store.set_parked``): parked as its idle timeout would."""
        row = self.models.get(ModelKey(namespace, name))
        if row is None:
            return None
        row.idle_parked_at, row.promoted_at = now, None
        return row

    async def request_deletion(
        self, namespace: str, name: str, now: datetime, origin: Origin = API_ORIGIN
    ) -> tuple[ModelRow, bool] | None:
        row = self.models.get(ModelKey(namespace, name))
        if row is None or not origin.may_delete(row.source, row.source_observed_at):
            return None
        if row_parked(row):
            self._delete(row)
            return row, True
        if row.deleting_at is None:
            row.deleting_at = row.updated_at = now
        return row, False

    async def finish_deletions(self, keys: Sequence[ModelKey]) -> list[ModelRow]:
        rows = [r for k in keys if (r := self.models.get(k)) is not None and r.deleting_at is not None]
        rows = [r for r in rows if row_parked(r)]
        for row in rows:
            self._delete(row)
        return rows

    async def put_gpugroup(self, group: GPUGroup, now: datetime, origin: Origin = API_ORIGIN) -> bool:
        existing = self.groups.get(group.name)
        if existing is not None and origin.is_older_than(existing.source_observed_at):
            return False
        manifest = group.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
        listing = GroupRow(name=group.name, policy=gpugroup_policy(group).value, manifest=manifest)
        action = "changed" if existing is not None and existing.policy == GroupPolicy.V1ALPHA1.value else "created"
        self._recompute({**self.groups, group.name: listing}, origin, group.name, action)  # (may refuse: unchanged)
        row = existing or GroupRow(name=group.name)
        if existing is None:
            row.active_namespace = row.active_name = row.leader_since = row.current_swap_id = None
        row.policy = gpugroup_policy(group).value
        row.manifest = manifest
        row.source, row.source_observed_at = origin.source, origin.observed_at
        row.namespace = group.metadata.namespace or None
        row.updated_at = now
        self.groups[group.name] = row
        return existing is None

    async def delete_group(self, name: str, origin: Origin = API_ORIGIN) -> bool:
        row = self.groups.get(name)
        if row is None or row.manifest is None:
            return False
        if not origin.may_delete(row.source, row.source_observed_at):
            return False
        if row.policy == GroupPolicy.V1ALPHA1.value:
            self._remove_groups([name], origin)
        else:
            self._forget_gpugroup(row)  # a declaration: the group and its models stay, the setting decides again
        return True

    def _forget_gpugroup(self, row: GroupRow) -> None:
        """As the SQL store's: a v1alpha1 group goes; a v1alpha2 group keeps its row and loses the declaration."""
        if row.policy == GroupPolicy.V1ALPHA1.value:
            del self.groups[row.name]
        else:
            row.manifest = row.namespace = row.source_observed_at = None
            row.source = API_ORIGIN.source

    async def resync_models(
        self, *, source: str, namespaces: list[str] | None, present: set[ModelKey], listed_at: datetime
    ) -> list[ModelRow]:
        gone = [
            row
            for key, row in self.models.items()
            if key not in present and _unlisted(row, key.namespace, source, namespaces, listed_at)
        ]
        gone_now = [row for row in gone if row_parked(row)]
        for row in gone:
            if row in gone_now:
                self._delete(row)
            elif row.deleting_at is None:
                row.deleting_at = listed_at
        return gone_now

    async def resync_groups(
        self, *, source: str, namespaces: list[str] | None, present: set[str], listed_at: datetime
    ) -> list[str]:
        gone = [
            name
            for name, row in self.groups.items()
            if row.manifest is not None
            and name not in present
            and _unlisted(row, row.namespace, source, namespaces, listed_at)
        ]
        for name in [n for n in gone if self.groups[n].policy != GroupPolicy.V1ALPHA1.value]:
            self._forget_gpugroup(self.groups[name])  # a declaration: its group stays
        gone_v1 = [n for n in gone if n in self.groups and self.groups[n].policy == GroupPolicy.V1ALPHA1.value]
        if gone_v1:
            self._remove_groups(gone_v1, Origin(source, listed_at))
        return gone

    def _listed(self, groups: Mapping[str, GroupRow] | None = None) -> dict[ModelKey, tuple[str, int]]:
        listed: dict[ModelKey, tuple[str, int]] = {}
        for g in (self.groups if groups is None else groups).values():
            if g.policy == GroupPolicy.V1ALPHA1.value and g.manifest:
                group = GPUGroup.model_validate(g.manifest)
                home = group.metadata.namespace or "default"
                for m in group.members:
                    listed[ModelKey(m.namespace or home, m.name)] = (g.name, m.priority)
        return listed

    def _assign(self, row: ModelRow, listed: dict[ModelKey, tuple[str, int]], *, created: bool = False) -> None:
        gpu = self._spec(row).model.spec.gpu
        group, row.priority = membership(ModelKey(row.namespace, row.name), gpu.shared, gpu.priority, listed)
        placement = place(current=None if created else row.group_name, desired=group, parked=row_parked(row))
        row.group_name, row.moving_to = placement

    def _remove_groups(self, names: Sequence[str], origin: Origin) -> None:
        """As ``Store``: a group that keeps a model moving out of it stays, as a v1alpha2 group without a
        manifest, until the model is parked and has moved."""
        self._recompute({n: g for n, g in self.groups.items() if n not in names}, origin, ", ".join(names), "deleted")
        for name in names:
            if any(r.group_name == name for r in self.models.values()):
                row = self.groups[name]
                row.policy, row.manifest, row.source, row.source_observed_at = (
                    GroupPolicy.V1ALPHA2.value,
                    None,
                    API_ORIGIN.source,
                    None,
                )
            else:
                del self.groups[name]

    def _recompute(self, groups: Mapping[str, GroupRow], origin: Origin, gpugroup: str, action: str) -> None:
        """As ``Store._recompute_membership``, with the GPUGroups as they will be (``groups``): refused for the
        admin API (nothing changed) when a model that may hold its group's GPU would move; otherwise every model's
        group and priority again, a loaded one moving once parked."""
        listed = self._listed(groups)
        moves = []
        for key, row in sorted(self.models.items()):
            gpu = self._spec(row).model.spec.gpu
            group, _ = membership(key, gpu.shared, gpu.priority, listed)
            moving_to = place(current=row.group_name, desired=group, parked=row_parked(row)).moving_to
            if moving_to not in (None, row.moving_to):
                moves.append(GroupMove(key, row.group_name or "", moving_to))
        if moves and origin.answers_refusals:
            raise MembershipChangeRefused(gpugroup, action, moves)
        for row in self.models.values():
            self._assign(row, listed)

    async def finish_moves(self, keys: Sequence[ModelKey]) -> list[GroupMove]:
        moves = []
        for key in keys:
            row = self.models.get(key)
            if row is not None and row.moving_to is not None and row_parked(row):
                moves.append(GroupMove(key, row.group_name or "", row.moving_to))
                row.group_name, row.moving_to = row.moving_to, None
        for old in {m.old for m in moves}:
            group = self.groups.get(old)
            in_use = any(r.group_name == old for r in self.models.values())
            if group is not None and group.policy == GroupPolicy.V1ALPHA2.value and not in_use:
                del self.groups[old]
        return moves


class _Subscription:
    def __init__(self, bus: MemoryBus, prefix: str, decode: Decoder[Any], handler: Handler[Any]) -> None:
        self.bus, self.prefix, self.decode, self.handler = bus, prefix, decode, handler

    async def stop(self) -> None:
        with contextlib.suppress(ValueError):
            self.bus.subscriptions.remove(self)


class MemoryBus:
    """:class:`~flexinfer_scheduler.ports.SchedulerBus` in memory: published messages are kept in order
    (``published``) and delivered to the matching consumers (``deliver`` runs their handlers, as a consumer's
    loop would); routes live in a dict. A message id seen before is dropped, as JetStream de-duplicates."""

    def __init__(self) -> None:
        self.published: list[tuple[str, BaseModel]] = []
        self.routes: dict[ModelKey, Route] = {}
        self.subscriptions: list[_Subscription] = []
        self.fail_publish: Exception | None = None
        self.fail_delete_route: Exception | None = None  # set to make route deletions fail
        self._ids: set[str] = set()
        self._sequence = 0

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None:
        if self.fail_publish is not None:
            raise self.fail_publish
        if msg_id is not None:
            if msg_id in self._ids:
                return
            self._ids.add(msg_id)
        self.published.append((subject, message))
        await self.deliver(subject, encode(message), message_id=msg_id)

    async def consume(
        self, *, stream: str, durable: str | None, filter_subject: str, decode: Decoder[M], handler: Handler[M]
    ) -> _Subscription:
        subscription = _Subscription(self, filter_subject.removesuffix(">"), decode, handler)
        self.subscriptions.append(subscription)
        return subscription

    async def deliver(self, subject: str, data: bytes, *, message_id: str | None = None) -> bool:
        """A message arrives from outside (a proxy, the actuator): the matching consumer handles it. False when no
        consumer takes the subject or the message is malformed (it is then dropped, as the real consumer does)."""
        for subscription in list(self.subscriptions):
            if subject.startswith(subscription.prefix):
                self._sequence += 1
                try:
                    message = subscription.decode(subject, data)
                except BadMessage:
                    return False
                await subscription.handler(message, Delivery(subject, message_id or f"mem:{self._sequence}", 1))
                return True
        return False

    async def publish_many(self, items: list[tuple[str, BaseModel, str | None]]) -> list[bool]:
        out = []
        for subject, message, msg_id in items:
            try:
                await self.publish(subject, message, msg_id=msg_id)
            except Exception:
                out.append(False)
            else:
                out.append(True)
        return out

    async def put_routes(self, routes: list[Route]) -> list[bool]:
        if self.fail_publish is not None:
            return [False] * len(routes)
        for route in routes:
            self.routes[ModelKey(route.namespace, route.name)] = route
        return [True] * len(routes)

    async def create_route(self, route: Route) -> bool:
        key = ModelKey(route.namespace, route.name)
        if key in self.routes:
            return False
        self.routes[key] = route
        return True

    async def delete_route(self, key: ModelKey) -> None:
        if self.fail_delete_route is not None:
            raise self.fail_delete_route
        self.routes.pop(key, None)

    def route_keys(self) -> list[str]:
        return sorted(route_key(k.namespace, k.name) for k in self.routes)

    def messages(self, prefix: str) -> list[BaseModel]:
        return [m for s, m in self.published if s.startswith(prefix)]


class MemoryLocks:
    """The lock table several in-memory scheduler replicas share (one holder at a time)."""

    def __init__(self) -> None:
        self.holder: object | None = None
        self.epochs = 0  # the last epoch taken (the database sequence)

    def lock(self) -> MemoryLeaderLock:
        return MemoryLeaderLock(self)


class MemoryLeaderLock:
    """:class:`~flexinfer_scheduler.ports.LeaderLock` over a :class:`MemoryLocks` table; ``lose()`` plays a
    dropped connection."""

    def __init__(self, table: MemoryLocks | None = None) -> None:
        self.table = table or MemoryLocks()
        self.epoch = 0

    async def try_acquire(self) -> bool:
        if self.table.holder is None:
            self.table.holder = self
            self.table.epochs += 1
            self.epoch = self.table.epochs
        await asyncio.sleep(0)
        return self.table.holder is self

    async def still_held(self) -> bool:
        return self.table.holder is self

    async def release(self) -> None:
        if self.table.holder is self:
            self.table.holder = None
        self.epoch = 0

    def lose(self) -> None:
        if self.table.holder is self:
            self.table.holder = None


def _unlisted(
    row: ModelRow | GroupRow, namespace: str | None, source: str, namespaces: list[str] | None, listed_at: datetime
) -> bool:
    """Whether a row ``source`` made, in a namespace its listing covers, went unseen since the listing began (the
    caller checks that the listing did not name it)."""
    return (
        row.source == source
        and (namespaces is None or namespace in namespaces)
        and (row.source_observed_at is None or row.source_observed_at < listed_at)
    )
