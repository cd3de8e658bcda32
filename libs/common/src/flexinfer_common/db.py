"""Postgres state: SQLAlchemy 2 async models, the engine, and migrations.

The scheduler is the only writer of model, group and swap rows; the lease manager writes leases.
Schema changes go through Alembic (``flexinfer_common/migrations``); ``upgrade_database`` applies them.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import BigInteger, CheckConstraint, DateTime, Index, Integer, String, Text, event, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.pool import ConnectionPoolEntry, PoolProxiedConnection

from flexinfer_common.settings import normalize_database_url

MIGRATIONS_DIR = Path(__file__).parent / "migrations"


class Base(DeclarativeBase):
    type_annotation_map = {datetime: DateTime(timezone=True), dict[str, Any]: JSONB}


class ModelRow(Base):
    __tablename__ = "models"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    manifest: Mapped[dict[str, Any]] = mapped_column(JSONB)
    group_name: Mapped[str | None] = mapped_column(String(253), index=True)
    priority: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    spec_generation: Mapped[int] = mapped_column(Integer, default=1, server_default="1")
    # status (docs/reference.md section 1)
    phase: Mapped[str] = mapped_column(String(32), default="Pending", server_default="Pending")
    last_active_time: Mapped[datetime | None]
    shared_state: Mapped[str | None] = mapped_column(String(32))
    queue_position: Mapped[int | None] = mapped_column(Integer)
    preempted_at: Mapped[datetime | None]
    preempted_by: Mapped[str | None] = mapped_column(Text)
    message: Mapped[str] = mapped_column(Text, default="", server_default="")
    # how often its server crashed after it was Ready (each is restarted): status.restarts
    restarts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # what the actuator last reported
    runtime_phase: Mapped[str | None] = mapped_column(String(32))
    runtime_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    runtime_updated_at: Mapped[datetime | None]
    endpoint: Mapped[str | None] = mapped_column(Text)
    runtime_message: Mapped[str] = mapped_column(Text, default="", server_default="")
    last_failure: Mapped[str | None] = mapped_column(Text)
    # what the scheduler last asked for
    desired_action: Mapped[str | None] = mapped_column(String(16))
    command_generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    command_issued_at: Mapped[datetime | None]
    ready_since: Mapped[datetime | None]
    idle_parked_at: Mapped[datetime | None]
    failed_at: Mapped[datetime | None]
    promoted_at: Mapped[datetime | None]
    # since when the model has wanted the GPU without interruption (hysteresis delay, bounded wait)
    demand_since: Mapped[datetime | None]
    # a group with a capacity: the devices the model was placed on ("0,1"; NULL: not placed), and since when it is
    # being evicted to make room for another
    placement: Mapped[str | None] = mapped_column(String(64))
    evicting_since: Mapped[datetime | None]
    # where the manifest comes from: "api" (the admin API, local mode) or "kubernetes" (the actuator's spec sync)
    source: Mapped[str] = mapped_column(String(32), default="api", server_default="api")
    source_observed_at: Mapped[datetime | None]
    observed_generation: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(server_default=text("now()"))
    updated_at: Mapped[datetime] = mapped_column(server_default=text("now()"))
    # deleted (the deletion timestamp): the model is parked as for a swap, and its row goes once it is confirmed
    deleting_at: Mapped[datetime | None]
    # the group a membership change from Kubernetes (a GPUGroup, or spec.gpu.shared) moves the model to: it stays
    # in group_name, left out of its election, until it is confirmed parked there, and then moves (never two groups
    # scheduling one loaded model)
    moving_to: Mapped[str | None] = mapped_column(String(253))
    # local mode with a GPU: the GPU memory the model's processes held when last measured (bytes, on the device where
    # they hold most): status.memory shows it, and fitting uses it where it exceeds the declared or estimated figure
    measured_memory: Mapped[int | None] = mapped_column(BigInteger)


class GpuInventoryRow(Base):
    """The GPU devices an actuator of ``backend`` found on its machine when it started (local mode: NVML or
    amdsmi): a v1alpha2 shared group without a declared ``spec.capacity`` gets this capacity. No row: no GPU seen."""

    __tablename__ = "gpu_inventory"

    backend: Mapped[str] = mapped_column(String(32), primary_key=True)
    devices: Mapped[int] = mapped_column(Integer)
    memory_per_device: Mapped[int] = mapped_column(BigInteger)
    actuator: Mapped[str] = mapped_column(Text, default="", server_default="")
    reported_at: Mapped[datetime]


class CommandGenerationRow(Base):
    """The highest command generation a model was given, kept after its row is deleted: a model applied again
    continues from it, so the actuator (which remembers the last generation it applied) never takes its commands
    for stale ones."""

    __tablename__ = "command_generations"

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    generation: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class GroupRow(Base):
    __tablename__ = "groups"

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    policy: Mapped[str] = mapped_column(String(16), default="v1alpha2", server_default="v1alpha2")
    manifest: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    active_namespace: Mapped[str | None] = mapped_column(String(253))
    active_name: Mapped[str | None] = mapped_column(String(253))
    leader_since: Mapped[datetime | None]
    current_swap_id: Mapped[str | None] = mapped_column(String(64))
    # a v1alpha1 GPUGroup's origin, as for models; ``namespace`` is the GPUGroup object's (Kubernetes mode)
    source: Mapped[str] = mapped_column(String(32), default="api", server_default="api")
    source_observed_at: Mapped[datetime | None]
    namespace: Mapped[str | None] = mapped_column(String(253))
    updated_at: Mapped[datetime] = mapped_column(server_default=text("now()"))


class SwapRow(Base):
    __tablename__ = "swaps"
    __table_args__ = (Index("ix_swaps_group_started", "group_name", "started_at"),)

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    group_name: Mapped[str] = mapped_column(String(253))
    from_namespace: Mapped[str | None] = mapped_column(String(253))
    from_name: Mapped[str | None] = mapped_column(String(253))
    to_namespace: Mapped[str | None] = mapped_column(String(253))
    to_name: Mapped[str | None] = mapped_column(String(253))
    reason: Mapped[str] = mapped_column(String(32))
    phase: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime]
    phase_started_at: Mapped[datetime]
    finished_at: Mapped[datetime | None]
    phases: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict, server_default=text("'{}'::jsonb"))
    message: Mapped[str] = mapped_column(Text, default="", server_default="")


class LeaseRow(Base):
    """A GPU lease that holds its group (one per group: the unique index decides a race). The lease manager writes
    these; the scheduler's election honours every row until ``expires_at``."""

    __tablename__ = "leases"
    __table_args__ = (CheckConstraint("ttl_seconds >= 60", name="ck_leases_ttl_seconds_min"),)

    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    namespace: Mapped[str] = mapped_column(String(253), default="default", server_default="default")
    group_name: Mapped[str] = mapped_column(String(253), index=True, unique=True)
    owner: Mapped[str] = mapped_column(String(253))
    node: Mapped[str | None] = mapped_column(String(253))
    ttl_seconds: Mapped[int] = mapped_column(Integer)
    acquired_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    renew_time: Mapped[datetime]
    # api (the REST API), gpulease (a GPULease written with kubectl), modelcache, job or configmap
    source: Mapped[str] = mapped_column(String(32), default="api", server_default="api")
    # Parking until every serving member of the group is seen parked, then Held (held_at: when first seen)
    phase: Mapped[str] = mapped_column(String(16), default="Parking", server_default="Parking")
    message: Mapped[str] = mapped_column(Text, default="", server_default="")
    held_at: Mapped[datetime | None]
    # the uid of the GPULease resource that carries it (Kubernetes mode): its deletion releases the lease
    resource_uid: Mapped[str | None] = mapped_column(String(64))
    # spec.memory: bytes to free on one device of a group with a capacity (None: the whole group is leased)
    memory: Mapped[int | None] = mapped_column(BigInteger)
    # the device the scheduler reserved that memory on (as its group status last said; None: none yet, or the
    # whole group)
    device: Mapped[int | None] = mapped_column(Integer)


class _SourceReport:
    """A row a (model, source): what one source (a proxy) last reported about one model, and when."""

    namespace: Mapped[str] = mapped_column(String(253), primary_key=True)
    name: Mapped[str] = mapped_column(String(253), primary_key=True)
    source: Mapped[str] = mapped_column(String(253), primary_key=True)
    time: Mapped[datetime]


class DemandSignalRow(_SourceReport, Base):
    """The latest demand from each source for a model (v1alpha1 sums ``queued`` over sources)."""

    __tablename__ = "demand_signals"

    queued: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # until when ``queued`` stands without a newer message (the message's validFor); NULL: the scheduler's TTL
    valid_until: Mapped[datetime | None]


class InFlightRow(_SourceReport, Base):
    """How many requests each proxy (``source``) is forwarding to a model, as it last reported (the drain waits for
    these to reach zero)."""

    __tablename__ = "in_flight_reports"

    count: Mapped[int] = mapped_column(Integer, default=0, server_default="0")


class ProcessedMessageRow(Base):
    """Ids of bus messages already applied, so a redelivered message changes nothing."""

    __tablename__ = "processed_messages"

    message_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    processed_at: Mapped[datetime] = mapped_column(server_default=text("now()"), index=True)


#: What PostgreSQL answers when it aborted a statement for a concurrent transaction's sake: a deadlock (two
#: transactions each waiting for a row the other locked; it aborts one after ``deadlock_timeout``) or a
#: serialization failure. The same statement run again goes through.
CONFLICT_SQLSTATES = frozenset({"40P01", "40001"})


def is_conflict(exc: BaseException) -> bool:
    """Whether ``exc`` is PostgreSQL aborting a statement for a concurrent transaction's sake (run it again)."""
    return isinstance(exc, DBAPIError) and getattr(exc.orig, "sqlstate", None) in CONFLICT_SQLSTATES


#: A pooled connection that sat idle longer than this (seconds) is pinged before it is used again.
PING_AFTER_IDLE = 1.0


def create_engine(url: str, **kwargs: Any) -> AsyncEngine:
    """The async engine. Pooled connections are checked before use as with ``pool_pre_ping``, but only those idle
    for over :data:`PING_AFTER_IDLE`: one that served a moment ago is alive, and pinging it put a round trip on
    every transaction (three of them on the scheduler's way from a demand to its command). Pass
    ``pool_pre_ping=True`` to ping on every checkout."""
    if kwargs.get("pool_pre_ping"):
        return create_async_engine(normalize_database_url(url), **kwargs)
    engine = create_async_engine(normalize_database_url(url), **kwargs)
    _ping_when_idle(engine, PING_AFTER_IDLE)
    return engine


def _ping_when_idle(engine: AsyncEngine, idle: float) -> None:
    pool = engine.sync_engine.pool
    dialect = engine.dialect

    def checked_in(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["checked_in"] = time.monotonic()

    def checked_out(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: PoolProxiedConnection) -> None:
        since = record.info.get("checked_in")
        if since is None or time.monotonic() - since <= idle:
            return  # new, or in use a moment ago
        try:
            dialect.do_ping(dbapi_connection)
        except Exception as exc:  # the server restarted, or the connection was dropped: the pool reconnects
            raise DisconnectionError(f"pooled connection is dead: {exc!r}") from exc

    event.listen(pool, "checkin", checked_in)
    event.listen(pool, "checkout", checked_out)


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    return async_sessionmaker(engine, expire_on_commit=False)


def _alembic_config(url: str) -> Any:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", normalize_database_url(url).replace("%", "%%"))
    return config


def upgrade_database_sync(url: str, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(_alembic_config(url), revision)


async def upgrade_database(url: str, revision: str = "head") -> None:
    """Apply migrations (Alembic runs its own event loop for the async driver, so it goes to a thread)."""
    await asyncio.to_thread(upgrade_database_sync, url, revision)


async def ensure_database_exists(url: str) -> None:
    """Create the URL's database when it is missing (connects to the ``postgres`` database to do so)."""
    import asyncpg
    from sqlalchemy.engine import make_url

    target = make_url(normalize_database_url(url))
    database = target.database or "postgres"
    admin = target.set(drivername="postgresql", database="postgres")
    conn = await asyncpg.connect(admin.render_as_string(hide_password=False))
    try:
        exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database)
        if not exists:
            await conn.execute(f'CREATE DATABASE "{database}"')
    finally:
        await conn.close()
