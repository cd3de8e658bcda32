"""The PostgreSQL store's manifests: Models and GPUGroups in (admin API and the Kubernetes spec sync), membership
worked out again, deletions and moves finished, and the reads the admin API serves. The hot path (a pass's load
and write, the bus inputs) is ``adapters/store.py``; ``Store`` is both."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    delete,
    select,
    text,
)
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flexinfer_common.db import (
    CommandGenerationRow,
    GroupRow,
    ModelRow,
    SwapRow,
)
from flexinfer_common.enums import GroupPolicy
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GPUGroup, Model
from flexinfer_scheduler.adapters.rows import (
    delete_rows,
    forget_gpugroup,
    gpugroup_policy,
    row_key,
    row_parked,
)
from flexinfer_scheduler.domain.manifests import GroupMove, membership, place
from flexinfer_scheduler.ports import (
    API_ORIGIN,
    GroupChangeRefused,
    MembershipChangeRefused,
    Origin,
)


class ManifestStore:
    """Manifests in, membership, and the admin reads (``ports.AdminStore``, ``specs.SpecStore``)."""

    sessions: async_sessionmaker[AsyncSession]

    async def put_model(self, model: Model, now: datetime, origin: Origin = API_ORIGIN) -> tuple[ModelRow, bool]:
        """Create or change a model. ``origin`` says who owns it; from Kubernetes, a change older than the one
        stored is ignored (returns the row unchanged)."""
        manifest = model.model_dump(
            mode="json", by_alias=True, exclude_none=True, exclude={"status": True, "metadata": {"deletion_timestamp"}}
        )
        manifest["metadata"]["namespace"] = model.namespace
        async with self.sessions.begin() as session:
            row = await session.get(ModelRow, (model.namespace, model.name), with_for_update=True)
            created = row is None
            if row is None:
                row = ModelRow(namespace=model.namespace, name=model.name, manifest=manifest, spec_generation=1)
                row.created_at = now
                # a model applied again continues its command generations where the deleted one left them
                mark = await session.get(CommandGenerationRow, (model.namespace, model.name))
                row.command_generation = mark.generation if mark is not None else 0
                session.add(row)
            elif origin.is_older_than(row.source_observed_at):
                return row, False
            elif row.manifest != manifest:
                row.manifest = manifest
                row.spec_generation += 1
            if row.deleting_at is not None:
                row.deleting_at = None  # applied again while its deletion waited for the park: the deletion is off
            row.source = origin.source
            row.source_observed_at = origin.observed_at
            row.observed_generation = origin.generation
            row.updated_at = now
            spec = model.spec.gpu
            group, row.priority = membership(row_key(row), spec.shared, spec.priority, await self._listed(session))
            placement = place(current=None if created else row.group_name, desired=group, parked=row_parked(row))
            if placement.moving_to not in (None, row.moving_to) and origin.answers_refusals:
                raise GroupChangeRefused(row_key(row), row.group_name, group)  # (rolled back)
            row.group_name, row.moving_to = placement
            await session.flush()
            await session.refresh(row)
            return row, created

    async def delete_model(self, namespace: str, name: str, origin: Origin = API_ORIGIN) -> ModelRow | None:
        """Delete a model's row at once (its command generation is kept); from Kubernetes only if Kubernetes owns
        it and the deletion is not older than its state. What the APIs call is :meth:`request_deletion`."""
        async with self.sessions.begin() as session:
            row = await session.get(ModelRow, (namespace, name), with_for_update=True)
            if row is None or not origin.may_delete(row.source, row.source_observed_at):
                return None
            await delete_rows(session, [row])
            return row

    async def request_deletion(
        self, namespace: str, name: str, now: datetime, origin: Origin = API_ORIGIN
    ) -> tuple[ModelRow, bool] | None:
        """Delete a model the safe way: a model that may hold the GPU is marked (``deleting_at``) and leaves the
        election, and its row goes once the actuator confirmed it parked (:meth:`finish_deletions`); one that never
        ran goes at once. Returns the row and whether it is gone; None when there is none (or ``origin`` may not
        delete it)."""
        async with self.sessions.begin() as session:
            row = await session.get(ModelRow, (namespace, name), with_for_update=True)
            if row is None or not origin.may_delete(row.source, row.source_observed_at):
                return None
            if row_parked(row):
                await delete_rows(session, [row])
                return row, True
            if row.deleting_at is None:
                row.deleting_at = now
                row.updated_at = now
            await session.flush()
            await session.refresh(row)
            return row, False

    async def finish_deletions(self, keys: Sequence[ModelKey]) -> list[ModelRow]:
        """Delete the rows of these models that are still being deleted and are confirmed parked (a model applied
        again meanwhile is kept). Returns the rows deleted."""
        if not keys:
            return []
        async with self.sessions.begin() as session:
            rows = await _parked_rows(session, keys, lambda row: row.deleting_at is not None)
            await delete_rows(session, rows)
            return rows

    async def put_gpugroup(self, group: GPUGroup, now: datetime, origin: Origin = API_ORIGIN) -> bool:
        manifest = group.model_dump(mode="json", by_alias=True, exclude_none=True, exclude={"status"})
        values = {
            "policy": gpugroup_policy(group).value,
            "manifest": manifest,
            "source": origin.source,
            "source_observed_at": origin.observed_at,
            "namespace": group.metadata.namespace or None,
        }
        async with self.sessions.begin() as session:
            await _lock_models(session)
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
            await self._recompute_membership(session, origin, group.name, "created" if created else "changed")
            return created

    async def delete_group(self, name: str, origin: Origin = API_ORIGIN) -> bool:
        async with self.sessions.begin() as session:
            await _lock_models(session)
            row = await session.get(GroupRow, name)
            if row is None or row.manifest is None:
                return False
            if not origin.may_delete(row.source, row.source_observed_at):
                return False
            if row.policy == GroupPolicy.V1ALPHA1.value:
                await self._remove_groups(session, [row], origin, "deleted")
            else:
                await forget_gpugroup(session, row)  # a declaration: the group and its models stay
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
                if row_key(row) not in present
                and (row.source_observed_at is None or row.source_observed_at < listed_at)
            ]
            gone_now = [row for row in gone if row_parked(row)]
            for row in gone:
                if row not in gone_now and row.deleting_at is None:
                    row.deleting_at = listed_at  # parked first, as a deletion through the API
            await delete_rows(session, gone_now)
            return gone_now

    async def resync_groups(
        self, *, source: str, namespaces: list[str] | None, present: set[str], listed_at: datetime
    ) -> list[str]:
        """As :meth:`resync_models`, for GPUGroups (``present``: their names)."""
        async with self.sessions.begin() as session:
            await _lock_models(session)
            query = select(GroupRow).where(GroupRow.source == source, GroupRow.manifest.is_not(None))
            if namespaces is not None:
                query = query.where(GroupRow.namespace.in_(namespaces))
            gone = [
                row
                for row in (await session.scalars(query)).all()
                if row.name not in present and (row.source_observed_at is None or row.source_observed_at < listed_at)
            ]
            for row in [r for r in gone if r.policy != GroupPolicy.V1ALPHA1.value]:
                await forget_gpugroup(session, row)  # a declaration: its group stays
            listing = [r for r in gone if r.policy == GroupPolicy.V1ALPHA1.value]
            if listing:
                await self._remove_groups(session, listing, origin=Origin(source, listed_at), action="deleted")
            return [row.name for row in gone]

    async def _listed(self, session: AsyncSession) -> dict[ModelKey, tuple[str, int]]:
        """Models listed by a v1alpha1 GPUGroup: their group and the priority the group gives them."""
        listed: dict[ModelKey, tuple[str, int]] = {}
        query = select(GroupRow).where(GroupRow.policy == GroupPolicy.V1ALPHA1.value)
        # as written in this transaction (a GPUGroup is upserted in SQL: its ORM object may hold the old manifest)
        for g in (await session.scalars(query.execution_options(populate_existing=True))).all():
            if g.manifest:
                group = GPUGroup.model_validate(g.manifest)
                home = group.metadata.namespace or "default"  # a member without a namespace is in the group's
                for m in group.members:
                    listed[ModelKey(m.namespace or home, m.name)] = (g.name, m.priority)
        return listed

    async def _remove_groups(
        self, session: AsyncSession, rows: Sequence[GroupRow], origin: Origin, action: str
    ) -> None:
        """Delete v1alpha1 GPUGroups and work their models' membership out again. A group that keeps a model
        moving out of it (from Kubernetes: loaded, parked there first) stays as a v1alpha2 group without a manifest,
        keeping its holder and swap so the model drains as in a swap; it goes with the last such model."""
        names = {row.name for row in rows}
        for row in rows:  # it no longer lists anyone, and nobody manages it
            row.policy, row.manifest, row.source, row.source_observed_at = GroupPolicy.V1ALPHA2.value, None, "api", None
        await session.flush()
        await self._recompute_membership(session, origin, ", ".join(sorted(names)), action)
        kept = set((await session.scalars(select(ModelRow.group_name).where(ModelRow.group_name.in_(names)))).all())
        for row in rows:
            if row.name not in kept:
                await session.delete(row)
        await session.flush()

    async def _recompute_membership(self, session: AsyncSession, origin: Origin, gpugroup: str, action: str) -> None:
        """After a GPUGroup changed: every model's group and priority again. A model that may hold its group's GPU
        is not moved: the admin API refuses the change (``MembershipChangeRefused``, rolled back), and a change from
        Kubernetes leaves it in its group, moving (``moving_to``) until it is parked there (:meth:`finish_moves`)."""
        listed = await self._listed(session)
        placements = []
        moves = []
        models = select(ModelRow).order_by(ModelRow.namespace, ModelRow.name).with_for_update()
        for row in (await session.scalars(models)).all():
            spec = Model.model_validate(row.manifest).spec.gpu
            group, priority = membership(row_key(row), spec.shared, spec.priority, listed)
            placement = place(current=row.group_name, desired=group, parked=row_parked(row))
            if placement.moving_to not in (None, row.moving_to):
                moves.append(GroupMove(row_key(row), row.group_name or "", placement.moving_to))
            placements.append((row, placement, priority))
        if moves and origin.answers_refusals:
            raise MembershipChangeRefused(gpugroup, action, moves)  # (rolled back)
        for row, (group, moving_to), priority in placements:
            if (row.group_name, row.moving_to, row.priority) != (group, moving_to, priority):
                row.group_name, row.moving_to, row.priority = group, moving_to, priority

    async def finish_moves(self, keys: Sequence[ModelKey]) -> list[GroupMove]:
        """Move the models among these that are still moving and are confirmed parked into the group they move to,
        and drop a v1alpha2 group left without a model. Returns the moves made."""
        if not keys:
            return []
        async with self.sessions.begin() as session:
            moves = []
            for row in await _parked_rows(session, keys, lambda row: row.moving_to is not None):
                assert row.moving_to is not None
                moves.append(GroupMove(ModelKey(row.namespace, row.name), row.group_name or "", row.moving_to))
                row.group_name, row.moving_to = row.moving_to, None
            if moves:
                await session.flush()
                await session.execute(
                    delete(GroupRow).where(
                        GroupRow.name.in_(sorted({m.old for m in moves})),
                        GroupRow.policy == GroupPolicy.V1ALPHA2.value,
                        ~select(ModelRow.name).where(ModelRow.group_name == GroupRow.name).exists(),
                    )
                )
            return moves

    async def set_promoted(self, namespace: str, name: str, now: datetime) -> ModelRow | None:
        return await self._update_model(namespace, name, promoted_at=now, idle_parked_at=None, failed_at=None)

    async def set_parked(self, namespace: str, name: str, now: datetime) -> ModelRow | None:
        """Park a model as its idle timeout would (the status page's Park): left out of the election until a
        request or demand names it again; a promotion of it ends."""
        return await self._update_model(namespace, name, idle_parked_at=now, promoted_at=None)

    async def _update_model(self, namespace: str, name: str, **columns: Any) -> ModelRow | None:
        """Set these columns of a model's row; None when there is no such model."""
        async with self.sessions.begin() as session:
            row = await session.get(ModelRow, (namespace, name))
            if row is not None:
                for column, value in columns.items():
                    setattr(row, column, value)
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


async def _parked_rows(
    session: AsyncSession, keys: Sequence[ModelKey], pending: Callable[[ModelRow], bool]
) -> list[ModelRow]:
    """The rows of these models, locked, that are still ``pending`` (a deletion, a move) and confirmed parked."""
    rows = []
    for key in keys:
        row = await session.get(ModelRow, tuple(key), with_for_update=True)
        if row is not None and pending(row) and row_parked(row):
            rows.append(row)
    return rows


async def _lock_models(session: AsyncSession) -> None:
    """Lock every model row, before any group row: a GPUGroup change works out every model's membership again, and
    takes the locks in the order a scheduler pass's write does (its models, then their groups). Taken the other
    way round (the group first, as before), a pass writing the group's models at the same moment deadlocked with
    it, and PostgreSQL aborted one of the two after a second: the pass, or the admin call with a 500."""
    await session.execute(
        select(ModelRow.namespace, ModelRow.name).order_by(ModelRow.namespace, ModelRow.name).with_for_update()
    )
