"""The scheduler's rows as the election reads them (one place for both stores): which ``models`` columns a pass
reads and how a member, a group's snapshot and a swap are built from rows; row predicates and the small
statements the PostgreSQL store's hot path and manifests share."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Sequence
from datetime import timedelta
from typing import Any

from sqlalchemy import (
    Text,
    delete,
    func,
    select,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_sessionmaker

from flexinfer_common.db import (
    CommandGenerationRow,
    DemandSignalRow,
    GroupRow,
    ModelRow,
    SwapRow,
)
from flexinfer_common.enums import GroupPolicy, ScaleAction, SchedulingPolicy, SwapPhase, SwapReason
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GPUGroup
from flexinfer_scheduler.domain.manifests import SpecFacts, declared_capacity
from flexinfer_scheduler.domain.model import (
    Capacity,
    GroupSnapshot,
    Lease,
    Member,
    Swap,
    V1Alpha1Policy,
    fitting_memory,
)
from flexinfer_scheduler.ports import (
    API_ORIGIN,
    StoredStatus,
    decode_placement,
)

ACTIVE_SWAP_PHASES = (SwapPhase.DRAINING.value, SwapPhase.PARKING.value, SwapPhase.LOADING.value)

# The columns of a group and of its running swap a pass reads, as Core rows (the ORM's objects cost 2 ms per
# 25-group reconcile slice); no name is in both, so one row serves as either.
GROUP_COLUMNS = (
    GroupRow.name,
    GroupRow.policy,
    GroupRow.manifest,
    GroupRow.active_namespace,
    GroupRow.active_name,
    GroupRow.leader_since,
)
SWAP_COLUMNS = (
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
    "deleting_at",
    "placement",
    "evicting_since",
    "moving_to",
    "measured_memory",
)
MEMBER_NAMESPACE, MEMBER_NAME, MEMBER_GROUP, MEMBER_GENERATION = range(4)
_STATUS = slice(4, 9)


_PARKED_PHASES = {None, "Parked", "Failed"}


def row_parked(row: ModelRow) -> bool:
    """What ``Member.parked`` says, of a row: never asked to run, or confirmed off the GPU for its last command."""
    if row.desired_action is None:
        return row.runtime_phase in _PARKED_PHASES
    return row.runtime_phase in _PARKED_PHASES and row.runtime_generation >= row.command_generation


async def delete_rows(session: AsyncSession, rows: Sequence[ModelRow]) -> None:
    """Delete models' rows and their demand, keep their command generations, and drop a v1alpha2 group left with
    no model (a GPUGroup stays: it is a resource of its own)."""
    if not rows:
        return
    groups = {row.group_name for row in rows if row.group_name}
    for row in rows:
        await session.execute(
            insert(CommandGenerationRow)
            .values(namespace=row.namespace, name=row.name, generation=row.command_generation)
            .on_conflict_do_update(
                index_elements=[CommandGenerationRow.namespace, CommandGenerationRow.name],
                set_={"generation": func.greatest(CommandGenerationRow.generation, row.command_generation)},
            )
        )
        await session.delete(row)
        await session.execute(
            delete(DemandSignalRow).where(DemandSignalRow.namespace == row.namespace, DemandSignalRow.name == row.name)
        )
    await session.flush()
    if groups:
        await session.execute(
            delete(GroupRow).where(
                GroupRow.name.in_(groups),
                GroupRow.policy == GroupPolicy.V1ALPHA2.value,
                GroupRow.manifest.is_(None),  # a GPUGroup declares it: kept for the models to come
                ~select(ModelRow.name).where(ModelRow.group_name == GroupRow.name).exists(),
            )
        )


async def forget_gpugroup(session: AsyncSession, row: GroupRow) -> None:
    """A GPUGroup deleted: a v1alpha1 group goes with it; a v1alpha2 group keeps its row (who holds the GPU, its
    swap) and loses the declaration (its scheduling falls back to the setting)."""
    if row.policy == GroupPolicy.V1ALPHA1.value:
        await session.delete(row)
    else:
        row.manifest = row.namespace = row.source_observed_at = None
        row.source = API_ORIGIN.source
    await session.flush()


def cast_text(column: Any) -> Any:
    return sql_cast(column, Text)


def row_key(row: ModelRow) -> ModelKey:
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
        deleting_at,
        placement,
        evicting_since,
        moving_to,
        measured_memory,
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
            "memory": fitting_memory(facts.memory, measured_memory),
            "memory_estimated": facts.memory_estimated,
            "memory_measured": measured_memory,
            "devices": facts.devices,
            "pinned": facts.pinned,
            "service_labels": facts.service_labels,
            "observed_generation": observed_generation,
            "deleting": deleting_at is not None,
            "placement": decode_placement(placement),
            "evicting_since": evicting_since,
            "moving_to": moving_to,
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


def group_snapshot(
    name: str,
    members: list[Member],
    group: Any,
    swap: Any,
    lease: Lease | None,
    discovered: Capacity | None = None,
) -> GroupSnapshot:
    """A group as the election sees it, from its rows (a group without a row is a v1alpha2 one not elected yet):
    ``group`` and ``swap`` are ORM rows or Core rows with their columns, or None. ``discovered``: the capacity the
    local actuator found (its GPUs), for a v1alpha2 group that declares none."""
    policy = GroupPolicy(group.policy) if group else GroupPolicy.V1ALPHA2
    capacity = None
    if policy is GroupPolicy.V1ALPHA2:
        capacity = (declared_capacity(group.manifest) if group else None) or discovered
    return GroupSnapshot(
        name=name,
        members=tuple(members),
        policy=policy,
        v1alpha1=v1alpha1_policy(group.manifest) if group and policy == GroupPolicy.V1ALPHA1 else None,
        scheduling=declared_scheduling(group.manifest) if group else None,
        capacity=capacity,
        active=ModelKey(group.active_namespace, group.active_name)
        if group and group.active_name and group.active_namespace
        else None,
        leader_since=group.leader_since if group else None,
        swap=swap_from_row(swap) if swap else None,
        lease=lease,
    )


def declared_scheduling(manifest: dict[str, Any] | None) -> SchedulingPolicy | None:
    """A GPUGroup's ``spec.scheduling`` (validated when it was stored), read without parsing the whole manifest:
    every pass reads it for every group."""
    value = ((manifest or {}).get("spec") or {}).get("scheduling")
    return SchedulingPolicy(value) if value else None


def gpugroup_policy(group: GPUGroup) -> GroupPolicy:
    """A GPUGroup that lists models is a v1alpha1 group; one without declares the v1alpha2 shared group's spec."""
    return GroupPolicy.V1ALPHA1 if group.is_v1alpha1 else GroupPolicy.V1ALPHA2


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
async def autocommit(sessions: async_sessionmaker[AsyncSession]) -> AsyncIterator[AsyncConnection]:
    """A connection whose statements each commit on their own (no BEGIN, COMMIT or ROLLBACK round trips), used
    through Core (a session's ORM execution path costs more than these plain statements take): for a
    read (in READ COMMITTED each statement sees its own snapshot anyway) or a write that is one statement."""
    async with sessions() as session:
        yield await session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


GROUP_WRITE = ("name", "active_namespace", "active_name", "leader_since", "current_swap_id", "updated_at")
SWAP_WRITE = (
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
