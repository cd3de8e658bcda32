"""Postgres access for the scheduler: load the snapshot the election needs, apply a plan in one transaction,
record demand and actuator reports, and keep the admin API's manifests.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, cast

import stamina
from sqlalchemy import (
    DateTime,
    Integer,
    Table,
    Text,
    bindparam,
    case,
    delete,
    exists,
    func,
    or_,
    select,
    text,
    tuple_,
    union,
    update,
)
from sqlalchemy.dialects.postgresql import JSONB, insert
from sqlalchemy.dialects.postgresql.base import PGDialect
from sqlalchemy.engine import Dialect
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker
from sqlalchemy.sql import Select
from sqlalchemy.sql.dml import ReturningUpdate
from sqlalchemy.sql.elements import TextClause

from flexinfer_common.db import (
    DemandSignalRow,
    GpuInventoryRow,
    GroupRow,
    InFlightRow,
    LeaseRow,
    ModelRow,
    ProcessedMessageRow,
    SwapRow,
    is_conflict,
)
from flexinfer_common.enums import ScaleAction
from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import RuntimeSpec
from flexinfer_scheduler.adapters.manifest_store import ManifestStore
from flexinfer_scheduler.adapters.rows import (
    ACTIVE_SWAP_PHASES,
    GROUP_COLUMNS,
    GROUP_WRITE,
    MEMBER_COLUMNS,
    MEMBER_GENERATION,
    MEMBER_GROUP,
    MEMBER_NAME,
    MEMBER_NAMESPACE,
    SWAP_COLUMNS,
    SWAP_WRITE,
    autocommit,
    cast_text,
    group_snapshot,
    member_from_row,
    stored_status,
)
from flexinfer_scheduler.adapters.weights import facts_of
from flexinfer_scheduler.domain.manifests import SpecFacts, discovered_capacity, machine_capacity
from flexinfer_scheduler.domain.model import Capacity, Lease, Member
from flexinfer_scheduler.domain.plan import GroupPlan
from flexinfer_scheduler.ports import (
    LOCAL_BACKEND,
    DemandReport,
    MeasuredMemory,
    RuntimeReport,
    StoredStatus,
    World,
    changes_of,
)


def _recent_sum(table: type[DemandSignalRow] | type[InFlightRow], amount: Any, models: Table, standing: Any) -> Any:
    """The sum of ``amount`` over the model's rows of ``table`` (one per source) for which ``standing`` holds."""
    return (
        select(func.coalesce(func.sum(amount), 0))
        .where(table.namespace == models.c.namespace, table.name == models.c.name, standing)
        .scalar_subquery()
    )


def _since(name: str) -> Any:
    return bindparam(name, type_=DateTime(timezone=True))


@functools.cache
def _world_queries(by_name: bool) -> tuple[Select[Any], Select[Any]]:
    """load_world's queries, built once (building them anew was a millisecond of every pass): the models with
    their queued and in-flight sums (parameters ``queued_since``, ``in_flight_since``), and the groups with their
    running swap; ``by_name``: only the groups of the parameter ``names``."""
    models = cast(Table, ModelRow.__table__)
    # a count stands until its message's own validity ends, or (a message without one) the scheduler's TTL
    queued_stands = case(
        (DemandSignalRow.valid_until.is_(None), DemandSignalRow.time >= _since("queued_since")),
        else_=DemandSignalRow.valid_until >= _since("now"),
    )
    queued = _recent_sum(DemandSignalRow, DemandSignalRow.queued, models, queued_stands)
    in_flight = _recent_sum(InFlightRow, InFlightRow.count, models, InFlightRow.time >= _since("in_flight_since"))
    model_query = select(
        *(models.c[name] for name in MEMBER_COLUMNS),
        queued.label("queued_sum"),
        in_flight.label("in_flight_sum"),
    )
    # The running swap by the group's own pointer (a primary-key lookup), not by scanning the swaps' history for
    # an active phase: the history grows with every swap, and on fresh statistics the planner joined it in a
    # nested loop (1,000 rows per group, 5 ms of every 25-group slice of the reconcile at 1,000 groups).
    group_query = select(*GROUP_COLUMNS, *SWAP_COLUMNS).outerjoin_from(
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
# The capacity the local actuator discovered (its GPUs), with how many groups the machine has (machine_capacity),
# in the one round trip of the groups' read.
_DISCOVERED = select(
    GpuInventoryRow.devices,
    GpuInventoryRow.memory_per_device,
    select(func.count()).select_from(_ALL_GROUPS).scalar_subquery(),
).where(GpuInventoryRow.backend == LOCAL_BACKEND)
_MODEL_KEYS = select(func.array_agg(ModelRow.namespace.concat("/").concat(ModelRow.name)))


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


# A group a pass may write: it still has its row, or members (the group write: an UPDATE of the row, else an INSERT
# for members).
_GROUP_ROW = "EXISTS (SELECT 1 FROM groups AS present WHERE present.name = {name})"
_GROUP_MEMBERS = "EXISTS (SELECT 1 FROM models AS member WHERE member.group_name = {name})"
_GROUP_PRESENT = f"({_GROUP_ROW} OR {_GROUP_MEMBERS})"


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
        values = _arrays(table, "g_", GROUP_WRITE)
        # A group deleted while the pass ran (a GPUGroup deleted through the API) is not written back: only a group
        # that still has its row, or members, is (the pass read the world before the deletion). A group with a row
        # is written by an UPDATE, not an upsert: this statement's snapshot may predate a deletion that commits
        # while it runs (its EXISTS would still see the row, and the upsert, once the deletion's lock is released,
        # would insert the group again, empty, for good); an UPDATE waits for that lock and then skips a row
        # deleted meanwhile. Only a group without a row in the snapshot is inserted (one that has members).
        parts.append(
            f"gu AS (UPDATE groups AS present SET {', '.join(f'{c} = v.{c}' for c in GROUP_WRITE if c != 'name')} "
            f"FROM {values} WHERE present.name = v.name)"
        )
        updates = ", ".join(f"{c} = excluded.{c}" for c in GROUP_WRITE if c != "name")
        parts.append(
            f"g AS (INSERT INTO groups ({', '.join(GROUP_WRITE)}) SELECT * FROM {values} "
            f"WHERE NOT {_GROUP_ROW.format(name='v.name')} AND {_GROUP_MEMBERS.format(name='v.name')} "
            f"ON CONFLICT (name) DO UPDATE SET {updates})"
        )
    if swaps:
        table = cast(Table, SwapRow.__table__)
        selected = ", ".join("CAST(v.phases AS JSONB)" if c == "phases" else f"v.{c}" for c in SWAP_WRITE)
        updates = ", ".join(f"{c} = excluded.{c}" for c in SWAP_WRITE if c != "id")
        parts.append(  # (nor are its swaps)
            f"s AS (INSERT INTO swaps ({', '.join(SWAP_WRITE)}) SELECT {selected} FROM "
            f"{_arrays(table, 's_', SWAP_WRITE)} WHERE {_GROUP_PRESENT.format(name='v.group_name')} "
            f"ON CONFLICT (id) DO UPDATE SET {updates})"
        )
    # A model is written only while it is in the group the pass elected it for: moved to another group (or deleted)
    # since the world was read, a stale pass must not command it there (two models on one card); what was written
    # is returned, so that nothing is published for the rest.
    table = cast(Table, ModelRow.__table__)
    written = []
    for index, shape in enumerate(shapes):
        keys = ("namespace", "name", "group_name")
        arrays = _arrays(table, f"m{index}_", (*keys, *shape), names=("b_namespace", "b_name", "b_group", *shape))
        parts.append(
            f"m{index} AS (UPDATE models AS m SET {', '.join(f'{c} = v.{c}' for c in shape)} FROM {arrays} "
            "WHERE m.namespace = v.b_namespace AND m.name = v.b_name AND m.group_name = v.b_group "
            "RETURNING m.namespace, m.name)"
        )
        written.append(f"SELECT namespace, name FROM m{index}")
    return text(f"WITH {', '.join(parts)} {' UNION ALL '.join(written) or 'SELECT NULL, NULL WHERE false'}")


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
        ["namespace", "name", "source", "queued", "time", "valid_until"],
        select(
            touched.c.namespace,
            touched.c.name,
            bindparam("p_source", type_=Text),
            bindparam("p_queued", type_=Integer),
            when,
            bindparam("p_valid_until", type_=DateTime(timezone=True)),
        ),
    )
    upsert = signal.on_conflict_do_update(
        index_elements=[DemandSignalRow.namespace, DemandSignalRow.name, DemandSignalRow.source],
        set_={
            "queued": signal.excluded.queued,
            "time": signal.excluded.time,
            "valid_until": signal.excluded.valid_until,
        },
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


class Store(ManifestStore):
    """The PostgreSQL store: the hot path here (a pass's load and write, the bus inputs), the manifests in
    :class:`ManifestStore`."""

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

    def facts(self, row: ModelRow) -> SpecFacts:
        """``ports.AdminStore.facts``: from the cache ``load_world`` fills (parsed and cached here on a replica that
        does not elect)."""
        key, generation = ModelKey(row.namespace, row.name), row.spec_generation
        cached = self._facts.get(key)
        if cached is None or cached[0] != generation:
            cached = self._facts[key] = (generation, facts_of(row.manifest))
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
            r
            for r in rows
            if (f := facts.get(ModelKey(r[MEMBER_NAMESPACE], r[MEMBER_NAME]))) is None or f[0] != r[MEMBER_GENERATION]
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
                    tuple_(ModelRow.namespace, ModelRow.name).in_(
                        [(r[MEMBER_NAMESPACE], r[MEMBER_NAME]) for r in stale]
                    )
                )
            )
        wanted = {(r[MEMBER_NAMESPACE], r[MEMBER_NAME]): r[MEMBER_GENERATION] for r in stale}
        for query in queries:
            for namespace, name, generation, manifest in await session.execute(query):
                if wanted.get((namespace, name)) == generation:
                    self._facts[ModelKey(namespace, name)] = (generation, facts_of(manifest))

    # ---- the election's snapshot -------------------------------------------------------------------------
    async def load_world(
        self,
        now: datetime,
        queued_ttl: timedelta,
        groups_only: set[str] | None = None,
        *,
        in_flight_ttl: timedelta = timedelta(seconds=5),
    ) -> tuple[World, bool]:
        """Load every group, or only ``groups_only`` (an event touched them). Returns (world, leases_ok): a
        lease read error fails open (no leases).

        A member's ``queued`` is the sum of its sources' latest counts reported within ``queued_ttl`` (a source's
        count stands until it reports 0, or misses a few demand refreshes and is presumed gone: not the demand
        window, which governs only ``lastActiveTime``).

        Plain column queries, not ORM objects: building 10,000 ORM rows was most of a full pass.
        """
        model_query, group_query = _world_queries(groups_only is not None)
        model_params: dict[str, Any] = {
            "queued_since": now - queued_ttl,
            "now": now,
            "in_flight_since": now - in_flight_ttl,
        }
        group_params: dict[str, Any] = {}
        if groups_only is not None:
            model_params["names"] = group_params["names"] = sorted(groups_only)

        # The three reads at once, each on a connection of its own: a pass waits for one round trip instead of
        # three (each statement sees its own snapshot either way, as in READ COMMITTED).
        async def read_models() -> list[Any]:
            async with autocommit(self.sessions) as session:
                rows = list((await session.execute(model_query, model_params)).all())
                await self._load_specs(session, rows, sorted(groups_only) if groups_only is not None else None)
                return rows

        async def read_groups() -> tuple[list[Any], Capacity | None]:
            async with autocommit(self.sessions) as session:
                rows = list((await session.execute(group_query, group_params)).all())
                found = (await session.execute(_DISCOVERED)).first()
                if found is None:
                    return rows, None
                return rows, machine_capacity(Capacity(found[0], found[1]), found[2])

        async def read_leases() -> dict[str, Lease] | None:
            try:
                async with autocommit(self.sessions) as session:
                    return await self._leases(session, now)
            except Exception:
                return None  # fail open: no leases

        results = await asyncio.gather(read_models(), read_groups(), read_leases(), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException):
                raise result  # (the database is gone, most likely: the others failed alike)
        rows, (group_rows, discovered), read = cast(
            tuple[list[Any], tuple[list[Any], Capacity | None], dict[str, Lease] | None], tuple(results)
        )
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
            key = ModelKey(row[MEMBER_NAMESPACE], row[MEMBER_NAME])
            cached = cache.get(key)
            if cached is not None and cached[0] == row:
                status, member = cached[1], cached[2]  # unchanged since the last pass: the same objects
            else:
                status = stored_status(row)
                member = member_from_row(row, self.spec_facts(key, row[MEMBER_GENERATION]))
                cache[key] = (row, status, member)
            statuses[key] = status
            if group := row[MEMBER_GROUP]:
                by_group.setdefault(group, []).append(member)
        if groups_only is None and len(cache) > len(rows):
            for key in set(cache) - set(statuses):  # deleted models
                del cache[key]
        snapshots = [
            group_snapshot(
                name, by_group.get(name, []), groups.get(name), swaps.get(name), leases.get(name), discovered
            )
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
        async with autocommit(self.sessions) as conn:
            names: list[str] | None = await conn.scalar(_GROUP_NAMES)
        return sorted(names or [])

    async def model_keys(self) -> set[ModelKey]:
        async with autocommit(self.sessions) as conn:
            keys: list[str] | None = await conn.scalar(_MODEL_KEYS)
        # (a namespace never holds a "/")
        return {ModelKey(*key.split("/", 1)) for key in keys or []}

    async def load_leases(self, now: datetime) -> dict[str, Lease]:
        async with self.sessions() as session:
            return await self._leases(session, now)

    @staticmethod
    async def _leases(session: AsyncSession | AsyncConnection, now: datetime) -> dict[str, Lease]:
        columns = (
            LeaseRow.name,
            LeaseRow.group_name,
            LeaseRow.owner,
            LeaseRow.expires_at,
            LeaseRow.acquired_at,
            LeaseRow.memory,
            LeaseRow.device,
        )
        rows = (await session.execute(select(*columns).where(LeaseRow.expires_at > now))).all()
        return {
            r.group_name: Lease(r.name, r.group_name, r.owner, r.expires_at, r.acquired_at, r.memory, r.device)
            for r in rows
        }

    # ---- applying a plan ---------------------------------------------------------------------------------
    async def apply_plans(self, world: World, plans: Sequence[GroupPlan], now: datetime) -> set[ModelKey]:
        """Write what the plans changed, and only that, in one statement (a quiet system writes nothing). Returns
        the models whose changes were not written: they left the plan's group (moved or deleted) after ``world``
        was read."""
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
                changed.update(updated_at=now, b_namespace=key.namespace, b_name=key.name, b_group=plan.group)
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
            return set()
        params: dict[str, list[Any]] = {}
        if group_values:
            params.update((f"g_{c}", [v[c] for v in group_values]) for c in GROUP_WRITE)
        if swap_values:
            for value in swap_values:
                value["phases"] = json.dumps(value["phases"])
            params.update((f"s_{c}", [v[c] for v in swap_values]) for c in SWAP_WRITE)
        shapes = []
        for index, (columns, rows) in enumerate(sorted(model_values.items())):  # the same shapes, the same SQL
            shape = tuple(c for c in columns if not c.startswith("b_"))
            shapes.append(shape)
            params[f"m{index}_namespace"] = [r["b_namespace"] for r in rows]
            params[f"m{index}_name"] = [r["b_name"] for r in rows]
            params[f"m{index}_group_name"] = [r["b_group"] for r in rows]
            params.update((f"m{index}_{c}", [r[c] for r in rows]) for c in shape)
        statement = _apply_statement(bool(group_values), bool(swap_values), tuple(shapes))
        # One statement, run again when PostgreSQL aborted it for a concurrent transaction (a deadlock with a
        # GPUGroup change through the API): it was rolled back whole, and its guards (a model written only in the
        # plan's group, a deleted group not written back) make it as safe a moment later as it was stale before.
        async for attempt in stamina.retry_context(on=is_conflict, attempts=3, wait_initial=0.05, wait_max=0.5):
            with attempt:
                async with autocommit(self.sessions) as session:
                    result = await session.execute(statement, params)
                    written = {ModelKey(namespace, name) for namespace, name in result.all()}
        self._known_groups.update(v["name"] for v in group_values)
        return {ModelKey(r["b_namespace"], r["b_name"]) for rows in model_values.values() for r in rows} - written

    # ---- bus inputs --------------------------------------------------------------------------------------
    async def record_demand(self, report: DemandReport) -> str | None:
        """One statement (the message id, the model and the signal as data-modifying CTEs): it is on the way from
        every demand to its command, where each round trip to Postgres counts."""
        async with autocommit(self.sessions) as conn:
            group: str | None = await conn.scalar(
                _record_demand_statement(),
                {
                    "p_message_id": report.message_id,
                    "p_namespace": report.namespace,
                    "p_name": report.name,
                    "p_source": report.source,
                    "p_queued": report.queued,
                    "p_when": report.when,
                    "p_valid_until": report.valid_until,
                },
            )
            return group

    async def record_runtime(self, report: RuntimeReport) -> str | None:
        async with autocommit(self.sessions) as conn:  # one statement
            group: str | None = await conn.scalar(
                _record_runtime_statement(),
                {
                    "p_namespace": report.namespace,
                    "p_name": report.name,
                    "p_generation": report.generation,
                    "p_phase": report.phase,
                    "p_when": report.when,
                    "p_endpoint": report.endpoint,
                    "p_message": report.message,
                },
            )
            return group

    async def record_measured_memory(self, *, namespace: str, name: str, measured: int) -> MeasuredMemory | None:
        async with self.sessions.begin() as session:
            row = await session.get(ModelRow, (namespace, name), with_for_update=True)
            if row is None:
                return None
            facts = self.facts(row)
            found = MeasuredMemory(row.group_name, row.measured_memory, facts.memory, facts.memory_estimated)
            if row.measured_memory != measured:
                row.measured_memory = measured
            return found

    async def record_gpu_inventory(
        self, *, backend: str, actuator: str, device_memory: Sequence[int], when: datetime
    ) -> bool:
        capacity = discovered_capacity(device_memory)
        async with self.sessions.begin() as session:
            row = await session.get(GpuInventoryRow, backend, with_for_update=True)
            before = Capacity(row.devices, row.memory_per_device) if row is not None else None
            if capacity is None:
                if row is not None:
                    await session.delete(row)
            elif row is None:
                session.add(
                    GpuInventoryRow(
                        backend=backend,
                        devices=capacity.devices,
                        memory_per_device=capacity.memory_per_device,
                        actuator=actuator,
                        reported_at=when,
                    )
                )
            else:
                row.devices, row.memory_per_device = capacity.devices, capacity.memory_per_device
                row.actuator, row.reported_at = actuator, when
            return before != capacity

    async def note_crash(self, *, namespace: str, name: str, generation: int) -> tuple[int, str | None] | None:
        """See :meth:`SchedulerStore.note_crash`: one statement, before the report is recorded (so a repeat, which
        finds the runtime Failed already, counts nothing)."""
        statement = (
            update(ModelRow)
            .where(
                ModelRow.namespace == namespace,
                ModelRow.name == name,
                ModelRow.ready_since.is_not(None),
                ModelRow.desired_action == ScaleAction.ACTIVATE.value,
                ModelRow.command_generation == generation,
                ModelRow.runtime_generation == generation,
                ModelRow.runtime_phase == "Ready",
            )
            .values(restarts=ModelRow.restarts + 1)
            .returning(ModelRow.restarts, ModelRow.group_name)
        )
        async with self.sessions.begin() as session:
            row = (await session.execute(statement)).first()
            return (int(row[0]), row[1]) if row is not None else None

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
            await session.execute(
                delete(DemandSignalRow).where(
                    DemandSignalRow.time < now - keep,
                    or_(DemandSignalRow.valid_until.is_(None), DemandSignalRow.valid_until < now),
                )
            )
            await session.execute(delete(InFlightRow).where(InFlightRow.time < now - keep))
