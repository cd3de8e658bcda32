"""Leases in Postgres: the ``leases`` table is the lease manager's (the scheduler only reads it), and the scheduler's
``models`` and ``groups`` tables are read for which groups exist and how their members stand.

One lease per group is the database's rule (a unique index), so two replicas or two requests racing for a group
cannot both win. Every change of an existing lease is conditional on its name and ``acquired_at``: a decision made
on a lease that was released (or released and taken again) meanwhile changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from sqlalchemy import and_, delete, or_, select, update
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flexinfer_common.db import GroupRow, LeaseRow, ModelRow
from flexinfer_common.enums import LeasePhase
from flexinfer_common.quantity import parse_memory
from flexinfer_lease_manager.domain.leases import Lease, LeaseSource, MemberState


def to_lease(row: LeaseRow) -> Lease:
    return Lease(
        name=row.name,
        namespace=row.namespace,
        group=row.group_name,
        owner=row.owner,
        node=row.node,
        ttl_seconds=row.ttl_seconds,
        acquired_at=row.acquired_at,
        expires_at=row.expires_at,
        renew_time=row.renew_time,
        source=LeaseSource(row.source) if row.source in LeaseSource._value2member_map_ else LeaseSource.API,
        phase=LeasePhase(row.phase) if row.phase in LeasePhase._value2member_map_ else LeasePhase.PARKING,
        message=row.message,
        held_at=row.held_at,
        resource_uid=row.resource_uid,
        memory=row.memory,
        device=row.device,
    )


def _values(lease: Lease) -> dict[str, object]:
    return {
        "name": lease.name,
        "namespace": lease.namespace,
        "group_name": lease.group,
        "owner": lease.owner,
        "node": lease.node,
        "ttl_seconds": lease.ttl_seconds,
        "acquired_at": lease.acquired_at,
        "expires_at": lease.expires_at,
        "renew_time": lease.renew_time,
        "source": lease.source.value,
        "phase": lease.phase.value,
        "message": lease.message,
        "held_at": lease.held_at,
        "resource_uid": lease.resource_uid,
        "memory": lease.memory,
        "device": lease.device,
    }


def _same(lease: Lease):  # type: ignore[no-untyped-def]  # a SQL condition
    return and_(LeaseRow.name == lease.name, LeaseRow.acquired_at == lease.acquired_at)


class LeaseStore:
    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self.sessions = sessions

    async def leases(self) -> list[Lease]:
        async with self.sessions() as session:
            rows = (await session.scalars(select(LeaseRow).order_by(LeaseRow.group_name))).all()
        return [to_lease(r) for r in rows]

    async def lease(self, name: str) -> Lease | None:
        async with self.sessions() as session:
            row = await session.get(LeaseRow, name)
        return to_lease(row) if row is not None else None

    async def insert(self, lease: Lease, now: datetime) -> tuple[Lease | None, Lease | None, list[Lease]]:
        """Take the lease if its group and its name are free (a lapsed lease in the way is removed first).

        Returns ``(taken, in_the_way, lapsed)``: the lease when taken; else the lease that holds the group or the
        name; and the lapsed leases removed on the way (for their ``lease.expired`` events)."""
        async with self.sessions.begin() as session:
            lapsed = (
                await session.scalars(
                    delete(LeaseRow)
                    .where(or_(LeaseRow.group_name == lease.group, LeaseRow.name == lease.name))
                    .where(LeaseRow.expires_at <= now)
                    .returning(LeaseRow)
                )
            ).all()
            inserted = await session.scalar(
                insert(LeaseRow).values(**_values(lease)).on_conflict_do_nothing().returning(LeaseRow.name)
            )
            if inserted is not None:
                return lease, None, [to_lease(r) for r in lapsed]
            # When both are in the way, the lease holding the name is the answer: waiting for the group would not
            # free the name (the caller is told to pick another), so it must not depend on the rows' order.
            holder = (
                await session.scalars(
                    select(LeaseRow)
                    .where(or_(LeaseRow.group_name == lease.group, LeaseRow.name == lease.name))
                    .order_by((LeaseRow.name == lease.name).desc())
                    .limit(1)
                )
            ).first()
            return None, to_lease(holder) if holder is not None else None, [to_lease(r) for r in lapsed]

    async def replace(self, old: Lease, new: Lease) -> bool:
        """Write ``new`` over ``old``; False when ``old`` is no longer the lease of that name."""
        values = _values(new)
        del values["name"], values["acquired_at"]
        async with self.sessions.begin() as session:
            result = await session.execute(update(LeaseRow).where(_same(old)).values(**values))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def remove(self, lease: Lease) -> bool:
        async with self.sessions.begin() as session:
            result = await session.execute(delete(LeaseRow).where(_same(lease)))
        return bool(result.rowcount)  # type: ignore[attr-defined]

    async def expire(self, now: datetime) -> list[Lease]:
        """Remove every lease that lapsed (``now >= expiresAt``) and return them."""
        async with self.sessions.begin() as session:
            rows = (await session.scalars(delete(LeaseRow).where(LeaseRow.expires_at <= now).returning(LeaseRow))).all()
        return [to_lease(r) for r in rows]

    async def known_groups(self) -> frozenset[str]:
        """The GPU groups that exist: a model's ``spec.gpu.shared``, or a GPUGroup (v1alpha1, or one declaring a
        v1alpha2 group)."""
        shared = ModelRow.manifest["spec"]["gpu"]["shared"].astext
        models = select(ModelRow.group_name).where(ModelRow.group_name == shared).distinct()
        groups = select(GroupRow.name).where(GroupRow.manifest.is_not(None))
        async with self.sessions() as session:
            names = set((await session.scalars(models)).all()) | set((await session.scalars(groups)).all())
        return frozenset(n for n in names if n)

    async def memory_per_device(self, group: str) -> int | None:
        """The group's declared ``spec.capacity.memoryPerDevice`` in bytes (a GPUGroup of that name), if any."""
        async with self.sessions() as session:
            manifest = await session.scalar(select(GroupRow.manifest).where(GroupRow.name == group))
        capacity = ((manifest or {}).get("spec") or {}).get("capacity")
        if not isinstance(capacity, dict) or "memoryPerDevice" not in capacity:
            return None
        try:
            return parse_memory(capacity["memoryPerDevice"])
        except ValueError:
            return None  # validated when stored; an unreadable one is as none (the whole group is leased then)

    async def members(self, groups: Iterable[str]) -> dict[str, list[MemberState]]:
        """The serving members of each group, as the scheduler last wrote their status."""
        names: Sequence[str] = sorted(set(groups))
        out: dict[str, list[MemberState]] = {name: [] for name in names}
        if not names:
            return out
        query = select(ModelRow.group_name, ModelRow.namespace, ModelRow.name, ModelRow.phase, ModelRow.preempted_by)
        async with self.sessions() as session:
            for group, namespace, name, phase, preempted_by in await session.execute(
                query.where(ModelRow.group_name.in_(names))
            ):
                if group is not None:
                    out[group].append(MemberState(namespace, name, phase, preempted_by))
        return out
