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
from flexinfer_common.manifests import GPUGroup, Model
from flexinfer_common.messages import Route, RuntimeSpec, encode
from flexinfer_common.subjects import route_key
from flexinfer_scheduler.adapters.store import (
    ACTIVE_SWAP_PHASES,
    group_snapshot,
    member_from_row,
    member_values,
    stored_status,
)
from flexinfer_scheduler.domain.manifests import SpecFacts, solo_group, spec_facts
from flexinfer_scheduler.domain.model import Lease, Member, ModelKey
from flexinfer_scheduler.domain.plan import GroupPlan
from flexinfer_scheduler.ports import API_ORIGIN, Decoder, Handler, M, Origin, StoredStatus, World, changes_of

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
        self._demand: dict[tuple[ModelKey, str], tuple[int, datetime]] = {}
        self._in_flight: dict[tuple[ModelKey, str], tuple[int, datetime]] = {}
        self._seen: dict[str, datetime] = {}
        self._facts: dict[ModelKey, tuple[int, SpecFacts]] = {}

    def _spec(self, row: ModelRow) -> SpecFacts:
        key = ModelKey(row.namespace, row.name)
        cached = self._facts.get(key)
        if cached is None or cached[0] != row.spec_generation:
            cached = self._facts[key] = (row.spec_generation, spec_facts(row.manifest))
        return cached[1]

    def _runtime(self, key: ModelKey) -> RuntimeSpec | None:
        row = self.models.get(key)
        return None if row is None else self._spec(row).runtime(key.namespace, key.name)

    # ---- the election's snapshot -------------------------------------------------------------------------
    async def load_world(
        self,
        now: datetime,
        demand_window: timedelta,
        groups_only: set[str] | None = None,
        *,
        in_flight_ttl: timedelta = timedelta(seconds=5),
    ) -> tuple[World, bool]:
        queued: dict[ModelKey, int] = {}
        for (key, _), (count, when) in self._demand.items():
            if when >= now - demand_window:
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
        snapshots = []
        for name in sorted(names):
            lease = self.leases.get(name)
            live = lease if lease is not None and lease.expires_at > now else None
            snapshots.append(
                group_snapshot(name, by_group.get(name, []), self.groups.get(name), active_swaps.get(name), live)
            )
        if self.lease_error is not None:
            snapshots = [dataclasses.replace(s, lease=None) for s in snapshots]
        return World(snapshots, statuses, self._runtime), self.lease_error is None

    async def apply_plans(self, world: World, plans: Sequence[GroupPlan], now: datetime) -> None:
        for plan in plans:
            group = self.groups.get(plan.group)
            if group is None:
                group = self.groups[plan.group] = GroupRow(name=plan.group, policy=GroupPolicy.V1ALPHA2.value)
                group.manifest = group.namespace = group.source_observed_at = None
                group.source = API_ORIGIN.source
            group.active_namespace = plan.active.namespace if plan.active else None
            group.active_name = plan.active.name if plan.active else None
            group.leader_since = plan.leader_since
            group.current_swap_id = plan.swap_id
            for key, changed in changes_of(plan, world).items():
                row = self.models.get(key)
                if row is not None:
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

    async def group_names(self) -> list[str]:
        return sorted({r.group_name for r in self.models.values() if r.group_name} | set(self.groups))

    async def model_keys(self) -> set[ModelKey]:
        return set(self.models)

    # ---- bus inputs --------------------------------------------------------------------------------------
    async def record_demand(
        self, *, namespace: str, name: str, source: str, queued: int, when: datetime, message_id: str
    ) -> str | None:
        if message_id in self._seen:
            return None
        row = self.models.get(ModelKey(namespace, name))
        if row is None:
            return None
        self._seen[message_id] = when
        row.last_active_time = when if row.last_active_time is None else max(row.last_active_time, when)
        slot = (ModelKey(namespace, name), source)
        if slot not in self._demand or self._demand[slot][1] <= when:
            self._demand[slot] = (queued, when)
        return row.group_name

    async def record_runtime(
        self,
        *,
        namespace: str,
        name: str,
        phase: str,
        generation: int,
        endpoint: str | None,
        message: str,
        when: datetime,
    ) -> str | None:
        row = self.models.get(ModelKey(namespace, name))
        if row is None or not row.runtime_generation <= generation <= row.command_generation:
            return None
        row.runtime_phase, row.runtime_generation, row.runtime_updated_at = phase, generation, when
        row.endpoint, row.runtime_message = endpoint, message
        return row.group_name

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
        for table in (self._demand, self._in_flight):
            for slot in [s for s, (_, when) in table.items() if when < now - keep]:
                del table[slot]
        for message_id in [m for m, when in self._seen.items() if when < now - keep]:
            del self._seen[message_id]

    # ---- manifests (the spec inbox, and tests) -----------------------------------------------------------
    async def put_model(self, model: Model, now: datetime, origin: Origin = API_ORIGIN) -> tuple[ModelRow, bool]:
        manifest = model.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
        manifest["metadata"]["namespace"] = model.namespace
        key = ModelKey(model.namespace, model.name)
        row = self.models.get(key)
        created = row is None
        if row is None:
            row = self.models[key] = _blank_model(key.namespace, key.name, manifest, now)
        elif origin.is_older_than(row.source_observed_at):
            return row, False
        elif row.manifest != manifest:
            row.manifest, row.spec_generation = manifest, row.spec_generation + 1
        row.source, row.source_observed_at, row.observed_generation = (
            origin.source,
            origin.observed_at,
            origin.generation,
        )
        row.updated_at = now
        self._assign(row, self._listed())
        return row, created

    async def delete_model(self, namespace: str, name: str, origin: Origin = API_ORIGIN) -> ModelRow | None:
        key = ModelKey(namespace, name)
        row = self.models.get(key)
        if row is None or not origin.may_delete(row.source, row.source_observed_at):
            return None
        del self.models[key]
        for table in (self._demand, self._in_flight):
            for slot in [s for s in table if s[0] == key]:
                del table[slot]
        return row

    async def put_gpugroup(self, group: GPUGroup, now: datetime, origin: Origin = API_ORIGIN) -> bool:
        existing = self.groups.get(group.name)
        if existing is not None and origin.is_older_than(existing.source_observed_at):
            return False
        row = existing or GroupRow(name=group.name)
        if existing is None:
            row.active_namespace = row.active_name = row.leader_since = row.current_swap_id = None
        row.policy = GroupPolicy.V1ALPHA1.value
        row.manifest = group.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
        row.source, row.source_observed_at = origin.source, origin.observed_at
        row.namespace = group.metadata.namespace or None
        row.updated_at = now
        self.groups[group.name] = row
        self._recompute()
        return existing is None

    async def delete_group(self, name: str, origin: Origin = API_ORIGIN) -> bool:
        row = self.groups.get(name)
        if row is None or row.policy != GroupPolicy.V1ALPHA1.value:
            return False
        if not origin.may_delete(row.source, row.source_observed_at):
            return False
        del self.groups[name]
        self._recompute()
        return True

    async def resync_models(
        self, *, source: str, namespaces: list[str] | None, present: set[ModelKey], listed_at: datetime
    ) -> list[ModelRow]:
        gone = [
            row
            for key, row in self.models.items()
            if row.source == source
            and (namespaces is None or key.namespace in namespaces)
            and key not in present
            and (row.source_observed_at is None or row.source_observed_at < listed_at)
        ]
        for row in gone:
            await self.delete_model(row.namespace, row.name)
        return gone

    async def resync_groups(
        self, *, source: str, namespaces: list[str] | None, present: set[str], listed_at: datetime
    ) -> list[str]:
        gone = [
            name
            for name, row in self.groups.items()
            if row.source == source
            and row.policy == GroupPolicy.V1ALPHA1.value
            and (namespaces is None or row.namespace in namespaces)
            and name not in present
            and (row.source_observed_at is None or row.source_observed_at < listed_at)
        ]
        for name in gone:
            del self.groups[name]
        if gone:
            self._recompute()
        return gone

    def _listed(self) -> dict[ModelKey, tuple[str, int]]:
        listed: dict[ModelKey, tuple[str, int]] = {}
        for g in self.groups.values():
            if g.policy == GroupPolicy.V1ALPHA1.value and g.manifest:
                group = GPUGroup.model_validate(g.manifest)
                home = group.metadata.namespace or "default"
                for m in group.spec.models:
                    listed[ModelKey(m.namespace or home, m.name)] = (g.name, m.priority)
        return listed

    def _assign(self, row: ModelRow, listed: dict[ModelKey, tuple[str, int]]) -> None:
        key = ModelKey(row.namespace, row.name)
        spec = self._spec(row).model.spec
        group, priority = spec.gpu.shared, spec.gpu.priority
        if group is None and key in listed:
            group, priority = listed[key]
        row.group_name = group or solo_group(key)
        row.priority = priority

    def _recompute(self) -> None:
        listed = self._listed()
        for row in self.models.values():
            self._assign(row, listed)


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
        self.routes.pop(key, None)

    def route_keys(self) -> list[str]:
        return sorted(route_key(k.namespace, k.name) for k in self.routes)

    def messages(self, prefix: str) -> list[BaseModel]:
        return [m for s, m in self.published if s.startswith(prefix)]


class MemoryLocks:
    """The lock table several in-memory scheduler replicas share (one holder at a time)."""

    def __init__(self) -> None:
        self.holder: object | None = None

    def lock(self) -> MemoryLeaderLock:
        return MemoryLeaderLock(self)


class MemoryLeaderLock:
    """:class:`~flexinfer_scheduler.ports.LeaderLock` over a :class:`MemoryLocks` table; ``lose()`` plays a
    dropped connection."""

    def __init__(self, table: MemoryLocks | None = None) -> None:
        self.table = table or MemoryLocks()

    async def try_acquire(self) -> bool:
        if self.table.holder is None:
            self.table.holder = self
        await asyncio.sleep(0)
        return self.table.holder is self

    async def still_held(self) -> bool:
        return self.table.holder is self

    async def release(self) -> None:
        if self.table.holder is self:
            self.table.holder = None

    def lose(self) -> None:
        if self.table.holder is self:
            self.table.holder = None
