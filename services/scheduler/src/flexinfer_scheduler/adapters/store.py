"""Postgres access for the scheduler: load the snapshot the election needs, apply a plan in one transaction,
record demand and actuator reports, and keep the admin API's manifests.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import (
    DateTime,
    Integer,
    Table,
    Text,
    bindparam,
    delete,
    exists,
    func,
    select,
    text,
    tuple_,
    union,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker
from sqlalchemy.sql import Select
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.elements import TextClause

from flexinfer_common.db import (
    DemandSignalRow,
    GroupRow,
    InFlightRow,
    LeaseRow,
    ModelRow,
    ProcessedMessageRow,
    SwapRow,
)
from flexinfer_common.enums import GroupPolicy, ScaleAction, SwapPhase, SwapReason
from flexinfer_common.manifests import GPUGroup, Model
from flexinfer_common.messages import RuntimeSpec
from flexinfer_scheduler.domain.manifests import SpecFacts, solo_group, spec_facts
from flexinfer_scheduler.domain.model import GroupSnapshot, Lease, Member, ModelKey, Swap, V1Alpha1Policy
from flexinfer_scheduler.domain.plan import GroupPlan
from flexinfer_scheduler.ports import API_ORIGIN, Origin, StoredStatus, World, changes_of

ACTIVE_SWAP_PHASES = (SwapPhase.DRAINING.value, SwapPhase.PARKING.value, SwapPhase.LOADING.value)

# The columns of a group and of its running swap a pass reads, as Core rows (the ORM's objects cost 2 ms per
# 25-group reconcile slice); no name is in both, so one row serves as either.
_GROUP_COLUMNS = (
    GroupRow.name,
    GroupRow.policy,
    GroupRow.manifest,
    GroupRow.active_namespace,
    GroupRow.active_name,
    GroupRow.leader_since,
)
_SWAP_COLUMNS = (
    SwapRow.id,
    SwapRow.from_namespace,
    SwapRow.from_name,
    SwapRow.to_namespace,
    SwapRow.to_name,
    SwapRow.reason,
    SwapRow.phase,
    SwapRow.started_at,
    SwapRow.phase_started_at,
    SwapRow.phases,
)

# The ``models`` columns a pass reads, in the order of its rows (then the model's queued and in-flight sums): not
# the manifest, nor bookkeeping such as ``updated_at``, which every write changes (a row read with it never equals
# the one cached, and its member would be built again for nothing). Rows are read by position: reading 22 columns
# of 10,000 rows by name took 0.1 s of a first pass.
MEMBER_COLUMNS = (
    "namespace",
    "name",
    "group_name",
    "spec_generation",
    # the status as stored
    "phase",
    "shared_state",
    "queue_position",
    "preempted_by",
    "message",
    # the member's own
    "priority",
    "last_active_time",
    "preempted_at",
    "promoted_at",
    "runtime_phase",
    "runtime_generation",
    "runtime_message",
    "last_failure",
    "endpoint",
    "desired_action",
    "command_generation",
    "command_issued_at",
    "ready_since",
    "idle_parked_at",
    "failed_at",
    "demand_since",
    "observed_generation",
)
_NAMESPACE, _NAME, _GROUP, _GENERATION = range(4)
_STATUS = slice(4, 9)


def _recent_sum(table: type[DemandSignalRow] | type[InFlightRow], amount: Any, models: Table, *, since: str) -> Any:
    """The sum of ``amount`` over the model's rows of ``table`` (one per source) reported since the parameter
    ``since``."""
    return (
        select(func.coalesce(func.sum(amount), 0))
        .where(
            table.namespace == models.c.namespace,
            table.name == models.c.name,
            table.time >= bindparam(since, type_=DateTime(timezone=True)),
        )
        .scalar_subquery()
    )


@functools.cache
def _world_queries(by_name: bool) -> tuple[Select[Any], Select[Any]]:
    """load_world's queries, built once (building them anew was a millisecond of every pass): the models with
    their demand and in-flight sums (parameters ``demand_since``, ``in_flight_since``), and the groups with their
    running swap; ``by_name``: only the groups of the parameter ``names``."""
    models = cast(Table, ModelRow.__table__)
    queued = _recent_sum(DemandSignalRow, DemandSignalRow.queued, models, since="demand_since")
    in_flight = _recent_sum(InFlightRow, InFlightRow.count, models, since="in_flight_since")
    model_query = select(
        *(models.c[name] for name in MEMBER_COLUMNS),
        queued.label("queued_sum"),
        in_flight.label("in_flight_sum"),
    )
    # The running swap by the group's own pointer (a primary-key lookup), not by scanning the swaps' history for
    # an active phase: the history grows with every swap, and on fresh statistics the planner joined it in a
    # nested loop (1,000 rows per group, 5 ms of every 25-group slice of the reconcile at 1,000 groups).
    group_query = select(*_GROUP_COLUMNS, *_SWAP_COLUMNS).outerjoin_from(
        GroupRow, SwapRow, (SwapRow.id == GroupRow.current_swap_id) & SwapRow.phase.in_(ACTIVE_SWAP_PHASES)
    )
    if by_name:
        model_query = model_query.where(models.c.group_name.in_(bindparam("names", expanding=True)))
        group_query = group_query.where(GroupRow.name.in_(bindparam("names", expanding=True)))
    return model_query, group_query


_ALL_GROUPS = union(
    select(ModelRow.group_name.label("name")).where(ModelRow.group_name.is_not(None)), select(GroupRow.name)
).subquery()
_GROUP_NAMES = select(func.array_agg(_ALL_GROUPS.c.name))
_MODEL_KEYS = select(func.array_agg(ModelRow.namespace.concat("/").concat(ModelRow.name)))


def cast_text(column: Any) -> Any:
    return sql_cast(column, Text)


def _key(row: ModelRow) -> ModelKey:
    return ModelKey(row.namespace, row.name)


def member_values(row: ModelRow, queued: int, in_flight: int) -> tuple[Any, ...]:
    """An ORM row as ``load_world`` reads it: its :data:`MEMBER_COLUMNS`, then queued and in flight."""
    return (*(getattr(row, name) for name in MEMBER_COLUMNS), queued, in_flight)


def stored_status(values: Sequence[Any]) -> StoredStatus:
    """The status columns of a row as ``load_world`` reads it."""
    return StoredStatus(*values[_STATUS])


def member_from_row(values: Sequence[Any], facts: SpecFacts) -> Member:
    """A member from a row as ``load_world`` reads it (:data:`MEMBER_COLUMNS`, then queued and in flight)."""
    (
        namespace,
        name,
        _group,
        _generation,
        _phase,
        _state,
        _position,
        preempted_by,
        _message,
        priority,
        last_active_time,
        preempted_at,
        promoted_at,
        runtime_phase,
        runtime_generation,
        runtime_message,
        last_failure,
        endpoint,
        desired_action,
        command_generation,
        command_issued_at,
        ready_since,
        idle_parked_at,
        failed_at,
        demand_since,
        observed_generation,
        queued,
        in_flight,
    ) = values
    return Member.of(
        {
            "key": ModelKey(namespace, name),
            "priority": priority,
            "last_active_time": last_active_time,
            "preempted_at": preempted_at,
            "preempted_by": preempted_by,
            "swap_cooldown": facts.swap_cooldown,
            "idle_timeout": facts.idle_timeout,
            "force_promotion": facts.force_promotion,
            "promoted_at": promoted_at,
            "runtime": runtime_phase,
            "runtime_generation": runtime_generation,
            "runtime_message": runtime_message,
            "last_failure": last_failure,
            "endpoint": endpoint,
            "desired_action": _ACTIONS[desired_action] if desired_action else None,
            "command_generation": command_generation,
            "command_issued_at": command_issued_at,
            "ready_since": ready_since,
            "idle_parked_at": idle_parked_at,
            "failed_at": failed_at,
            "demand_since": demand_since,
            "queued": int(queued),
            "in_flight": int(in_flight),
            "max_wait": facts.max_wait,
            "service_labels": facts.service_labels,
            "observed_generation": observed_generation,
        }
    )


_ACTIONS = {action.value: action for action in ScaleAction}


def swap_from_row(row: Any) -> Swap:
    """A swap from a ``swaps`` row (an ORM row, or a Core row with its columns)."""
    return Swap(
        id=row.id,
        from_model=ModelKey(row.from_namespace, row.from_name) if row.from_name and row.from_namespace else None,
        to_model=ModelKey(row.to_namespace, row.to_name) if row.to_name and row.to_namespace else None,
        reason=SwapReason(row.reason),
        phase=SwapPhase(row.phase),
        started_at=row.started_at,
        phase_started_at=row.phase_started_at,
        phases=dict(row.phases or {}),
    )


def group_snapshot(name: str, members: list[Member], group: Any, swap: Any, lease: Lease | None) -> GroupSnapshot:
    """A group as the election sees it, from its rows (a group without a row is a v1alpha2 one not elected yet):
    ``group`` and ``swap`` are ORM rows or Core rows with their columns, or None."""
    policy = GroupPolicy(group.policy) if group else GroupPolicy.V1ALPHA2
    return GroupSnapshot(
        name=name,
        members=tuple(members),
        policy=policy,
        v1alpha1=v1alpha1_policy(group.manifest) if group and policy == GroupPolicy.V1ALPHA1 else None,
        active=ModelKey(group.active_namespace, group.active_name)
        if group and group.active_name and group.active_namespace
        else None,
        leader_since=group.leader_since if group else None,
        swap=swap_from_row(swap) if swap else None,
        lease=lease,
    )


def v1alpha1_policy(manifest: dict[str, Any] | None) -> V1Alpha1Policy | None:
    if not manifest:
        return None
    policy = GPUGroup.model_validate(manifest).spec.policy
    return V1Alpha1Policy(
        hysteresis_window=timedelta(seconds=policy.hysteresis_window_seconds),
        request_queue_threshold=policy.request_queue_threshold,
        minimum_run_duration=timedelta(seconds=policy.minimum_run_duration_seconds),
        cooldown_after_preemption=timedelta(seconds=policy.cooldown_after_preemption_seconds),
        drain_timeout=timedelta(seconds=policy.drain_timeout_seconds),
        idle_timeout=timedelta(seconds=policy.idle_timeout_seconds),
    )


@contextlib.asynccontextmanager
async def _autocommit(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncConnection]:
    """A connection whose statements each commit on their own (no BEGIN, COMMIT or ROLLBACK round trips), used
    through Core (a session's ORM execution path costs more than these plain statements take): for a
    read (in READ COMMITTED each statement sees its own snapshot anyway) or a write that is one statement."""
    async with sessions() as session:
        yield await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


_GROUP_WRITE = ("name", "active_namespace", "active_name", "leader_since", "current_swap_id", "updated_at")
_SWAP_WRITE = (
    "id",
    "group_name",
    "from_namespace",
    "from_name",
    "to_namespace",
    "to_name",
    "reason",
    "phase",
    "started_at",
    "phase_started_at",
    "phases",
    "finished_at",
    "message",
)


def _arrays(table: Table, prefix: str, columns: Sequence[str], names: Sequence[str] | None = None) -> str:
    """``unnest(CAST(:<prefix><column> AS <type>[]), ...) AS v(<names>)``: one array parameter per column (JSONB as
    text, cast where it is used: asyncpg has no codec for jsonb[])."""
    dialect = cast(Callable[[], Dialect], PGDialect)()  # SQLAlchemy's dialect class is not annotated
    arrays = []
    for column in columns:
        sql_type = table.c[column].type
        type_name = "TEXT" if isinstance(sql_type, JSONB) else sql_type.compile(dialect=dialect)
        arrays.append(f"CAST(:{prefix}{column} AS {type_name}[])")
    return f"unnest({', '.join(arrays)}) AS v({', '.join(names or columns)})"


@functools.lru_cache(maxsize=256)
def _apply_statement(groups: bool, swaps: bool, shapes: tuple[tuple[str, ...], ...]) -> TextClause:
    """A pass's writes as one statement (data-modifying CTEs, so atomic without BEGIN and COMMIT round trips):
    upsert the groups' rows and the swaps' rows, and update each shape of changed model columns by key, all from
    arrays. Replaced one executemany per table and shape, which the server ran row by row (10,000 single-row
    UPDATEs were a second of a first pass) and which cost six round trips on the way from a demand to its command.
    Column names come from the tables, never from input; the rows of two shapes are distinct models."""
    parts = []
    if groups:
        table = cast(Table, GroupRow.__table__)
        updates = ", ".join(f"{c} = excluded.{c}" for c in _GROUP_WRITE if c != "name")
        parts.append(
            f"g AS (INSERT INTO groups ({', '.join(_GROUP_WRITE)}) SELECT * FROM {_arrays(table, 'g_', _GROUP_WRITE)} "
            f"ON CONFLICT (name) DO UPDATE SET {updates})"
        )
    if swaps:
        table = cast(Table, SwapRow.__table__)
        selected = ", ".join("CAST(v.phases AS JSONB)" if c == "phases" else f"v.{c}" for c in _SWAP_WRITE)
        updates = ", ".join(f"{c} = excluded.{c}" for c in _SWAP_WRITE if c != "id")
        parts.append(
            f"s AS (INSERT INTO swaps ({', '.join(_SWAP_WRITE)}) SELECT {selected} FROM "
            f"{_arrays(table, 's_', _SWAP_WRITE)} ON CONFLICT (id) DO UPDATE SET {updates})"
        )
    table = cast(Table, ModelRow.__table__)
    for index, shape in enumerate(shapes):
        keys = ("namespace", "name")
        arrays = _arrays(table, f"m{index}_", (*keys, *shape), names=("b_namespace", "b_name", *shape))
        parts.append(
            f"m{index} AS (UPDATE models AS m SET {', '.join(f'{c} = v.{c}' for c in shape)} FROM {arrays} "
            "WHERE m.namespace = v.b_namespace AND m.name = v.b_name)"
        )
    return text(f"WITH {', '.join(parts)} SELECT 1")


@functools.cache
def _record_demand_statement() -> Select[tuple[str | None]]:
    """record_demand's statement, built once (building it was most of a demand's cost in Python). The parameters
    are named ``p_*``: an UPDATE takes a parameter named like a column as a value to SET."""
    when = bindparam("p_when", type_=DateTime(timezone=True))
    fresh = (
        insert(ProcessedMessageRow)
        .values(message_id=bindparam("p_message_id"))
        .on_conflict_do_nothing()
        .returning(ProcessedMessageRow.message_id)
        .cte("fresh")
    )
    touched = (
        update(ModelRow)
        .where(
            ModelRow.namespace == bindparam("p_namespace"),
            ModelRow.name == bindparam("p_name"),
            exists(select(fresh.c.message_id)),
        )
        .values(last_active_time=func.greatest(func.coalesce(ModelRow.last_active_time, when), when))
        .returning(ModelRow.namespace, ModelRow.name, ModelRow.group_name)
        .cte("touched")
    )
    signal = insert(DemandSignalRow).from_select(
        ["namespace", "name", "source", "queued", "time"],
        select(
            touched.c.namespace,
            touched.c.name,
            bindparam("p_source", type_=Text),
            bindparam("p_queued", type_=Integer),
            when,
        ),
    )
    upsert = signal.on_conflict_do_update(
        index_elements=[DemandSignalRow.namespace, DemandSignalRow.name, DemandSignalRow.source],
        set_={"queued": signal.excluded.queued, "time": signal.excluded.time},
        where=DemandSignalRow.time <= signal.excluded.time,
    ).cte("signal")
    return select(touched.c.group_name).add_cte(upsert)


@functools.cache
def _record_runtime_statement() -> ReturningUpdate[tuple[str | None]]:
    """record_runtime's statement, built once (parameters ``p_*``, as in :func:`_record_demand_statement`)."""
    generation = bindparam("p_generation", type_=Integer)
    return (
        update(ModelRow)
        .where(
            ModelRow.namespace == bindparam("p_namespace"),
            ModelRow.name == bindparam("p_name"),
            ModelRow.runtime_generation <= generation,
            ModelRow.command_generation >= generation,
        )
        .values(
            runtime_phase=bindparam("p_phase"),
            runtime_generation=generation,
            runtime_updated_at=bindparam("p_when"),
            endpoint=bindparam("p_endpoint"),
            runtime_message=bindparam("p_message"),
        )
        .returning(ModelRow.group_name)
    )


class Store:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions
        self._facts: dict[ModelKey, tuple[int, SpecFacts]] = {}
        self._known_groups: set[str] = set()  # groups with a row (else a plan creates it)
        # each model's row, signals and the objects built from them at the last pass (most rows do not change
        # between passes: building 10,000 members was half of a quiet pass)
        self._members: dict[ModelKey, tuple[Any, StoredStatus, Member]] = {}

    def spec_facts(self, key: ModelKey, generation: int) -> SpecFacts:
        """The parsed spec of a model loaded by ``load_world`` (cached per spec generation)."""
        cached = self._facts.get(key)
        if cached is None or cached[0] != generation:
            raise LookupError(f"spec of {key} generation {generation} not loaded")
        return cached[1]

    def runtime(self, key: ModelKey) -> RuntimeSpec | None:
        """What the actuator needs to run a model loaded by ``load_world`` (None: not loaded). Raises pydantic's
        ValidationError when the stored manifest no longer parses."""
        cached = self._facts.get(key)
        return None if cached is None else cached[1].runtime(key.namespace, key.name)

    async def _load_specs(self, session: AsyncConnection, rows: Sequence[Any], groups: list[str] | None) -> None:
        """Parse the manifests of rows whose spec generation is not cached yet (the manifest column is not read
        on every pass: at 10,000 models decoding it was a fifth of a pass). Read as JSON text, parsed by pydantic
        directly; many at once (a first pass) in one query over the same groups, a few by key."""
        facts = self._facts
        stale = [
            r for r in rows if (f := facts.get(ModelKey(r[_NAMESPACE], r[_NAME]))) is None or f[0] != r[_GENERATION]
        ]
        if not stale:
            return
        columns = (ModelRow.namespace, ModelRow.name, ModelRow.spec_generation, cast_text(ModelRow.manifest))
        queries = []
        if len(stale) > 200:
            query = select(*columns)
            queries.append(query.where(ModelRow.group_name.in_(groups)) if groups is not None else query)
        else:
            queries.append(
                select(*columns).where(
                    tuple_(ModelRow.namespace, ModelRow.name).in_([(r[_NAMESPACE], r[_NAME]) for r in stale])
                )
            )
        wanted = {(r[_NAMESPACE], r[_NAME]): r[_GENERATION] for r in stale}
        for query in queries:
            for namespace, name, generation, manifest in await session.execute(query):
                if wanted.get((namespace, name)) == generation:
                    self._facts[ModelKey(namespace, name)] = (generation, spec_facts(manifest))

    # ---- the election's snapshot -------------------------------------------------------------------------
    async def load_world(
        self,
        now: datetime,
        demand_window: timedelta,
        groups_only: set[str] | None = None,
        *,
        in_flight_ttl: timedelta = timedelta(seconds=5),
    ) -> tuple[World, bool]:
        """Load every group, or only ``groups_only`` (an event touched them). Returns (world, leases_ok): a
        lease read error fails open (no leases).

        Plain column queries, not ORM objects: building 10,000 ORM rows was most of a full pass.
        """
        model_query, group_query = _world_queries(groups_only is not None)
        model_params: dict[str, Any] = {"demand_since": now - demand_window, "in_flight_since": now - in_flight_ttl}
        group_params: dict[str, Any] = {}
        if groups_only is not None:
            model_params["names"] = group_params["names"] = sorted(groups_only)

        # The three reads at once, each on a connection of its own: a pass waits for one round trip instead of
        # three (each statement sees its own snapshot either way, as in READ COMMITTED).
        async def read_models() -> list[Any]:
            async with _autocommit(self.sessions) as session:
                rows = list((await session.execute(model_query, model_params)).all())
                await self._load_specs(session, rows, sorted(groups_only) if groups_only is not None else None)
                return rows

        async def read_groups() -> list[Any]:
            async with _autocommit(self.sessions) as session:
                return list((await session.execute(group_query, group_params)).all())

        async def read_leases() -> dict[str, Lease] | None:
            try:
                async with _autocommit(self.sessions) as session:
                    return await self._leases(session, now)
            except Exception:
                return None  # fail open: no leases

        results = await asyncio.gather(read_models(), read_groups(), read_leases(), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result  # (the database is gone, most likely: the others failed alike)
        rows, group_rows, read = cast(tuple[list[Any], list[Any], dict[str, Lease] | None], tuple(results))
        leases, leases_ok = (read, True) if read is not None else ({}, False)
        groups: dict[str, Any] = {}
        swaps: dict[str, Any] = {}
        for row in group_rows:  # a group's columns and its swap's: no name twice
            groups[row.name] = row
            if row.id is not None:
                swaps[row.name] = row
        by_group: dict[str, list[Member]] = {}
        statuses: dict[ModelKey, StoredStatus] = {}
        cache = self._members
        for row in rows:
            key = ModelKey(row[_NAMESPACE], row[_NAME])
            cached = cache.get(key)
            if cached is not None and cached[0] == row:
                status, member = cached[1], cached[2]  # unchanged since the last pass: the same objects
            else:
                status = stored_status(row)
                member = member_from_row(row, self.spec_facts(key, row[_GENERATION]))
                cache[key] = (row, status, member)
            statuses[key] = status
            if group := row[_GROUP]:
                by_group.setdefault(group, []).append(member)
        if groups_only is None and len(cache) > len(rows):
            for key in set(cache) - set(statuses):  # deleted models
                del cache[key]
        snapshots = [
            group_snapshot(name, by_group.get(name, []), groups.get(name), swaps.get(name), leases.get(name))
            for name in sorted(set(by_group) | set(groups))
        ]
        if groups_only is None:
            self._known_groups = set(groups)
        else:
            self._known_groups = (self._known_groups - groups_only) | set(groups)
        return World(snapshots, statuses, self.runtime), leases_ok

    # (Both read as one array in one row: at 10,000 models, 10,000 result rows took 10-45 ms of the event loop at the
    # end of every reconcile, and a demand that arrived then waited for them.)

    async def group_names(self) -> list[str]:
        async with _autocommit(self.sessions) as conn:
            names: list[str] | None = await conn.scalar(_GROUP_NAMES)
        return sorted(names or [])

    async def model_keys(self) -> set[ModelKey]:
        async with _autocommit(self.sessions) as conn:
            keys: list[str] | None = await conn.scalar(_MODEL_KEYS)
        # (a namespace never holds a "/")
        return {ModelKey(*key.split("/", 1)) for key in keys or []}

    async def load_leases(self, now: datetime) -> dict[str, Lease]:
        async with self.sessions() as session:
            return await self._leases(session, now)

    @staticmethod
    async def _leases(session: AsyncSession | AsyncConnection, now: datetime) -> dict[str, Lease]:
        columns = (LeaseRow.name, LeaseRow.group_name, LeaseRow.owner, LeaseRow.expires_at, LeaseRow.acquired_at)
        rows = (await session.execute(select(*columns).where(LeaseRow.expires_at > now))).all()
        return {r.group_name: Lease(r.name, r.group_name, r.owner, r.expires_at, r.acquired_at) for r in rows}

    # ---- applying a plan ---------------------------------------------------------------------------------
    async def apply_plans(self, world: World, plans: Sequence[GroupPlan], now: datetime) -> None:
        """Write what the plans changed, and only that, in one statement (a quiet system writes nothing)."""
        group_values: list[dict[str, Any]] = []
        model_values: dict[tuple[str, ...], list[dict[str, Any]]] = {}
        swap_values: list[dict[str, Any]] = []
        for plan in plans:
            snapshot = world.group(plan.group)
            before = (
                (snapshot.active, snapshot.leader_since, snapshot.swap.id if snapshot.swap else None)
                if snapshot is not None and plan.group in self._known_groups
                else None
            )
            if before != (plan.active, plan.leader_since, plan.swap_id):
                group_values.append(
                    {
                        "name": plan.group,
                        "active_namespace": plan.active.namespace if plan.active else None,
                        "active_name": plan.active.name if plan.active else None,
                        "leader_since": plan.leader_since,
                        "current_swap_id": plan.swap_id,
                        "updated_at": now,
                    }
                )
            for key, changed in changes_of(plan, world).items():
                changed.update(updated_at=now, b_namespace=key.namespace, b_name=key.name)
                model_values.setdefault(tuple(sorted(changed)), []).append(changed)
            for u in plan.swap_updates:
                sw = u.swap
                swap_values.append(
                    {
                        "id": sw.id,
                        "group_name": plan.group,
                        "from_namespace": sw.from_model.namespace if sw.from_model else None,
                        "from_name": sw.from_model.name if sw.from_model else None,
                        "to_namespace": sw.to_model.namespace if sw.to_model else None,
                        "to_name": sw.to_model.name if sw.to_model else None,
                        "reason": sw.reason.value,
                        "phase": sw.phase.value,
                        "started_at": sw.started_at,
                        "phase_started_at": sw.phase_started_at,
                        "phases": sw.phases,
                        "finished_at": u.finished_at,
                        "message": u.message,
                    }
                )
        if not (group_values or model_values or swap_values):
            return
        params: dict[str, list[Any]] = {}
        if group_values:
            params.update((f"g_{c}", [v[c] for v in group_values]) for c in _GROUP_WRITE)
        if swap_values:
            for value in swap_values:
                value["phases"] = json.dumps(value["phases"])
            params.update((f"s_{c}", [v[c] for v in swap_values]) for c in _SWAP_WRITE)
        shapes = []
        for index, (columns, rows) in enumerate(sorted(model_values.items())):  # the same shapes, the same SQL
            shape = tuple(c for c in columns if not c.startswith("b_"))
            shapes.append(shape)
            params[f"m{index}_namespace"] = [r["b_namespace"] for r in rows]
            params[f"m{index}_name"] = [r["b_name"] for r in rows]
            params.update((f"m{index}_{c}", [r[c] for r in rows]) for c in shape)
        async with _autocommit(self.sessions) as session:  # one statement
            await session.execute(_apply_statement(bool(group_values), bool(swap_values), tuple(shapes)), params)
        self._known_groups.update(v["name"] for v in group_values)

    # ---- bus inputs --------------------------------------------------------------------------------------
    async def record_demand(
        self, *, namespace: str, name: str, source: str, queued: int, when: datetime, message_id: str
    ) -> str | None:
        """Refresh lastActiveTime (never backwards) and this source's queued count. Returns the model's group,
        or None when the model is unknown or the message was seen already.

        One statement (the message id, the model and the signal as data-modifying CTEs): it is on the way from
        every demand to its command, where each round trip to Postgres counts."""
        async with _autocommit(self.sessions) as conn:
            group: str | None = await conn.scalar(
                _record_demand_statement(),
                {
                    "p_message_id": message_id,
                    "p_namespace": namespace,
                    "p_name": name,
                    "p_source": source,
                    "p_queued": queued,
                    "p_when": when,
                },
            )
            return group

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
        """Store an actuator report unless it answers an older command than the last one seen. Returns the
        model's group when stored."""
        async with _autocommit(self.sessions) as conn:  # one statement
            group: str | None = await conn.scalar(
                _record_runtime_statement(),
                {
                    "p_namespace": namespace,
                    "p_name": name,
                    "p_generation": generation,
                    "p_phase": phase,
                    "p_when": when,
                    "p_endpoint": endpoint,
                    "p_message": message,
                },
            )
            return group

    async def record_in_flight(self, *, source: str, counts: Mapping[ModelKey, int], when: datetime) -> set[str]:
        """A proxy's complete in-flight counts: store them, drop the models it no longer names. Returns the groups
        of the models whose count fell to zero (a drain waiting for them may be over)."""
        async with self.sessions.begin() as session:
            gone = (
                await session.execute(
                    delete(InFlightRow)
                    .where(
                        InFlightRow.source == source,
                        InFlightRow.time <= when,
                        tuple_(InFlightRow.namespace, InFlightRow.name).not_in(list(counts))
                        if counts
                        else text("true"),
                    )
                    .returning(InFlightRow.namespace, InFlightRow.name)
                )
            ).all()
            if counts:
                stmt = insert(InFlightRow)
                await session.execute(
                    stmt.on_conflict_do_update(
                        index_elements=[InFlightRow.namespace, InFlightRow.name, InFlightRow.source],
                        set_={"count": stmt.excluded.count, "time": stmt.excluded.time},
                        where=InFlightRow.time <= stmt.excluded.time,
                    ),
                    [
                        {"namespace": k.namespace, "name": k.name, "source": source, "count": n, "time": when}
                        for k, n in counts.items()
                    ],
                )
            if not gone:
                return set()
            result = await session.execute(
                select(ModelRow.group_name).where(
                    tuple_(ModelRow.namespace, ModelRow.name).in_([tuple(g) for g in gone])
                )
            )
            return {name for (name,) in result if name}

    async def forget_runtime(self) -> int:
        """An actuator restarted: what it ran is unknown until it reports again; re-issue every command."""
        async with self.sessions.begin() as session:
            result = await session.execute(
                update(ModelRow)
                .where(ModelRow.desired_action.is_not(None))
                .values(runtime_phase="Unknown", command_issued_at=None, endpoint=None)
            )
            return int(result.rowcount)  # type: ignore[attr-defined]

    async def prune(self, now: datetime, keep: timedelta) -> None:
        async with self.sessions.begin() as session:
            await session.execute(delete(ProcessedMessageRow).where(ProcessedMessageRow.processed_at < now - keep))
            await session.execute(delete(DemandSignalRow).where(DemandSignalRow.time < now - keep))
            await session.execute(delete(InFlightRow).where(InFlightRow.time < now - keep))

    # ---- manifests (admin API and spec sync) -------------------------------------------------------------
    async def put_model(self, model: Model, now: datetime, origin: Origin = API_ORIGIN) -> tuple[ModelRow, bool]:
        """Create or change a model. ``origin`` says who owns it; from Kubernetes, a change older than the one
        stored is ignored (returns the row unchanged)."""
        manifest = model.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
        manifest["metadata"]["namespace"] = model.namespace
        async with self.sessions.begin() as session:
            row = await session.get(ModelRow, (model.namespace, model.name), with_for_update=True)
            created = row is None
            if row is None:
                row = ModelRow(namespace=model.namespace, name=model.name, manifest=manifest, spec_generation=1)
                row.created_at = now
                session.add(row)
            elif origin.is_older_than(row.source_observed_at):
                return row, False
            elif row.manifest != manifest:
                row.manifest = manifest
                row.spec_generation += 1
            row.priority = model.spec.gpu.priority
            row.source = origin.source
            row.source_observed_at = origin.observed_at
            row.observed_generation = origin.generation
            row.updated_at = now
            await self._assign_group(session, row)
            await session.flush()
            await session.refresh(row)
            return row, created

    async def delete_model(self, namespace: str, name: str, origin: Origin = API_ORIGIN) -> ModelRow | None:
        """Delete a model; from Kubernetes only if Kubernetes owns it and the deletion is not older than its state."""
        async with self.sessions.begin() as session:
            row = await session.get(ModelRow, (namespace, name))
            if row is None or not origin.may_delete(row.source, row.source_observed_at):
                return None
            await session.delete(row)
            await session.execute(
                delete(DemandSignalRow).where(DemandSignalRow.namespace == namespace, DemandSignalRow.name == name)
            )
            return row

    async def put_gpugroup(self, group: GPUGroup, now: datetime, origin: Origin = API_ORIGIN) -> bool:
        manifest = group.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
        values = {
            "policy": GroupPolicy.V1ALPHA1.value,
            "manifest": manifest,
            "source": origin.source,
            "source_observed_at": origin.observed_at,
            "namespace": group.metadata.namespace or None,
        }
        async with self.sessions.begin() as session:
            existing = await session.get(GroupRow, group.name, with_for_update=True)
            if existing is not None and origin.is_older_than(existing.source_observed_at):
                return False
            stmt = insert(GroupRow).values(name=group.name, **values)
            result = await session.execute(
                stmt.on_conflict_do_update(
                    index_elements=[GroupRow.name], set_={**values, "updated_at": now}
                ).returning(text("xmax = 0"))
            )
            created = bool(result.scalar())
            await self._recompute_membership(session)
            return created

    async def delete_group(self, name: str, origin: Origin = API_ORIGIN) -> bool:
        async with self.sessions.begin() as session:
            row = await session.get(GroupRow, name)
            if row is None or row.policy != GroupPolicy.V1ALPHA1.value:
                return False
            if not origin.may_delete(row.source, row.source_observed_at):
                return False
            await session.delete(row)
            await session.flush()
            await self._recompute_membership(session)
            return True

    async def resync_models(
        self, *, source: str, namespaces: list[str] | None, present: set[ModelKey], listed_at: datetime
    ) -> list[ModelRow]:
        """Delete the models ``source`` owns in ``namespaces`` (all: None) that its list at ``listed_at`` no longer
        names (deleted while nobody watched); a model changed after the list is kept. Returns the deleted rows."""
        async with self.sessions.begin() as session:
            query = select(ModelRow).where(ModelRow.source == source)
            if namespaces is not None:
                query = query.where(ModelRow.namespace.in_(namespaces))
            gone = [
                row
                for row in (await session.scalars(query)).all()
                if _key(row) not in present and (row.source_observed_at is None or row.source_observed_at < listed_at)
            ]
            for row in gone:
                await session.delete(row)
                await session.execute(
                    delete(DemandSignalRow).where(
                        DemandSignalRow.namespace == row.namespace, DemandSignalRow.name == row.name
                    )
                )
            return gone

    async def resync_groups(
        self, *, source: str, namespaces: list[str] | None, present: set[str], listed_at: datetime
    ) -> list[str]:
        """As :meth:`resync_models`, for v1alpha1 GPUGroups (``present``: their names)."""
        async with self.sessions.begin() as session:
            query = select(GroupRow).where(GroupRow.source == source, GroupRow.policy == GroupPolicy.V1ALPHA1.value)
            if namespaces is not None:
                query = query.where(GroupRow.namespace.in_(namespaces))
            gone = [
                row
                for row in (await session.scalars(query)).all()
                if row.name not in present and (row.source_observed_at is None or row.source_observed_at < listed_at)
            ]
            for row in gone:
                await session.delete(row)
            if gone:
                await session.flush()
                await self._recompute_membership(session)
            return [row.name for row in gone]

    async def _listed(self, session: AsyncSession) -> dict[ModelKey, tuple[str, int]]:
        """Models listed by a v1alpha1 GPUGroup: their group and the priority the group gives them."""
        listed: dict[ModelKey, tuple[str, int]] = {}
        for g in (await session.scalars(select(GroupRow).where(GroupRow.policy == GroupPolicy.V1ALPHA1.value))).all():
            if g.manifest:
                group = GPUGroup.model_validate(g.manifest)
                home = group.metadata.namespace or "default"  # a member without a namespace is in the group's
                for m in group.spec.models:
                    listed[ModelKey(m.namespace or home, m.name)] = (g.name, m.priority)
        return listed

    async def _assign_group(self, session: AsyncSession, row: ModelRow) -> None:
        """One model's group: ``spec.gpu.shared``, or the GPUGroup that lists it, or a group of its own."""
        spec = Model.model_validate(row.manifest).spec
        group, priority = spec.gpu.shared, spec.gpu.priority
        if group is None:
            listed = await self._listed(session)
            if _key(row) in listed:
                group, priority = listed[_key(row)]
        row.group_name = group or solo_group(_key(row))
        row.priority = priority

    async def _recompute_membership(self, session: AsyncSession) -> None:
        """After a GPUGroup changed: every model's group and priority again."""
        listed = await self._listed(session)
        for row in (await session.scalars(select(ModelRow))).all():
            spec = Model.model_validate(row.manifest).spec
            group, priority = spec.gpu.shared, spec.gpu.priority
            if group is None and _key(row) in listed:
                group, priority = listed[_key(row)]
            group = group or solo_group(_key(row))
            if row.group_name != group:
                row.group_name = group
            if row.priority != priority:
                row.priority = priority

    async def set_promoted(self, namespace: str, name: str, now: datetime) -> ModelRow | None:
        async with self.sessions.begin() as session:
            row = await session.get(ModelRow, (namespace, name))
            if row is None:
                return None
            row.promoted_at = now
            row.idle_parked_at = None
            row.failed_at = None
            return row

    async def models(self) -> list[ModelRow]:
        async with self.sessions() as session:
            return list((await session.scalars(select(ModelRow).order_by(ModelRow.namespace, ModelRow.name))).all())

    async def model(self, namespace: str, name: str) -> ModelRow | None:
        async with self.sessions() as session:
            return await session.get(ModelRow, (namespace, name))

    async def group(self, name: str) -> GroupRow | None:
        async with self.sessions() as session:
            return await session.get(GroupRow, name)

    async def groups(self) -> list[GroupRow]:
        async with self.sessions() as session:
            return list((await session.scalars(select(GroupRow).order_by(GroupRow.name))).all())

    async def swaps(self, limit: int = 200) -> list[SwapRow]:
        async with self.sessions() as session:
            rows = await session.scalars(select(SwapRow).order_by(SwapRow.started_at.desc()).limit(limit))
            return list(rows.all())
