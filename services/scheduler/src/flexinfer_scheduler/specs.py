"""Specs handed over the bus: in Kubernetes mode the actuator watches Model and GPUGroup resources and publishes
each change (``SpecChange``) and, after every list, what exists (``SpecResync``). They are applied exactly as the
admin API applies a PUT or DELETE, marked as owned by their source, so a stale or repeated message changes nothing
and a deletion nobody saw is found by the next resync. What the admin API refuses with a 409 because it would
move a model that may hold its group's GPU (a GPUGroup, or ``spec.gpu.shared``, changed) cannot be refused here: it
is in the cluster already. It is applied, and the model stays in its group, leaving it as in a swap, until it is
confirmed parked there; then it moves (the loop's ``_finish_moves``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from flexinfer_common import subjects
from flexinfer_common.bus import BadMessage, Delivery, decode_json
from flexinfer_common.clock import Clock
from flexinfer_common.db import ModelRow
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.manifests import GPUGroup, ManifestError, Model, parse_resource
from flexinfer_common.messages import SpecChange, SpecResync
from flexinfer_scheduler.ports import GroupChangeRefused, Origin

log = get_logger("flexinfer.scheduler.specs")

SpecMessage = SpecChange | SpecResync


def decode_spec_message(subject: str, data: bytes) -> SpecMessage:
    """A resync list or a change whose manifest is a valid resource of its kind naming the same object."""
    if subject.startswith(subjects.SPEC_RESYNC_PREFIX + "."):
        return decode_json(SpecResync, subject, data)
    change = decode_json(SpecChange, subject, data)
    if change.action == "apply":
        if change.manifest is None:
            raise BadMessage("manifest: required when action is apply")
        try:
            resource = parse_resource(change.manifest)
        except ManifestError as exc:
            raise BadMessage(f"manifest: {exc}") from None
        if resource.kind != change.kind:
            raise BadMessage(f"manifest: a {resource.kind}, but kind says {change.kind}")
        namespace = resource.metadata.namespace or change.namespace
        if (namespace, resource.metadata.name) != (change.namespace, change.name):
            named = f"{namespace}/{resource.metadata.name}"
            raise BadMessage(f"manifest names {named}, not {change.namespace}/{change.name}")
    return change


class SpecStore(Protocol):
    """What applying specs needs from the store (``adapters.store.Store`` and the in-memory store fit)."""

    async def put_model(self, model: Model, now: datetime, origin: Origin = ...) -> tuple[ModelRow, bool]: ...

    async def request_deletion(
        self, namespace: str, name: str, now: datetime, origin: Origin = ...
    ) -> tuple[ModelRow, bool] | None: ...

    async def put_gpugroup(self, group: GPUGroup, now: datetime, origin: Origin = ...) -> bool: ...

    async def delete_group(self, name: str, origin: Origin = ...) -> bool: ...

    async def resync_models(
        self, *, source: str, namespaces: list[str] | None, present: set[ModelKey], listed_at: datetime
    ) -> list[ModelRow]: ...

    async def resync_groups(
        self, *, source: str, namespaces: list[str] | None, present: set[str], listed_at: datetime
    ) -> list[str]: ...


class SchedulerHooks(Protocol):
    """What applying a spec needs from the scheduler loop."""

    def kick(self, group: str | None = None) -> None: ...

    async def announce(self, row: ModelRow) -> None: ...

    async def forget_route(self, namespace: str, name: str) -> None: ...


class SpecInbox:
    """Applies spec messages to the store and tells the loop."""

    def __init__(self, *, store: SpecStore, hooks: SchedulerHooks, clock: Clock) -> None:
        self.store = store
        self.hooks = hooks
        self.clock = clock

    async def handle(self, message: SpecMessage, delivery: Delivery) -> None:
        if isinstance(message, SpecResync):
            await self._resync(message)
        elif message.kind == "Model":
            await self._model(message)
        else:
            await self._group(message)

    async def _model(self, change: SpecChange) -> None:
        origin = Origin(change.source, change.observed_at, change.generation)
        fields: dict[str, Any] = {"model": f"{change.namespace}/{change.name}", "source": change.source}
        if change.action == "delete":
            # as the admin API's DELETE: a model that may hold the GPU is parked first, its row goes after
            deleted = await self.store.request_deletion(change.namespace, change.name, self.clock.now(), origin)
            if deleted is not None:
                log.info("model deleted" if deleted[1] else "model being deleted: parking it first", extra=fields)
                if deleted[1]:
                    await self.hooks.forget_route(change.namespace, change.name)
                self.hooks.kick()
            return
        model = Model.model_validate(change.manifest)
        try:
            row, created = await self.store.put_model(model, self.clock.now(), origin)
        except GroupChangeRefused as exc:
            # (only the admin API is refused: a change from Kubernetes moves a loaded model once it is parked)
            log.error("model change refused", extra={**fields, "error": str(exc)})
            return
        log.info("model created" if created else "model applied", extra={**fields, "generation": change.generation})
        if created:
            await self.hooks.announce(row)
        self.hooks.kick()

    async def _group(self, change: SpecChange) -> None:
        origin = Origin(change.source, change.observed_at, change.generation)
        fields: dict[str, Any] = {"gpugroup": f"{change.namespace}/{change.name}", "source": change.source}
        if change.action == "delete":
            if await self.store.delete_group(change.name, origin):
                log.info("GPUGroup deleted", extra=fields)
                self.hooks.kick()
            return
        group = GPUGroup.model_validate(change.manifest)
        created = await self.store.put_gpugroup(group, self.clock.now(), origin)
        log.info("GPUGroup created" if created else "GPUGroup applied", extra=fields)
        self.hooks.kick()

    async def _resync(self, resync: SpecResync) -> None:
        fields: dict[str, Any] = {"kind": resync.kind, "source": resync.source, "listed": len(resync.names)}
        if resync.kind == "Model":
            present = {ModelKey(*name.split("/", 1)) for name in resync.names if "/" in name}
            rows = await self.store.resync_models(
                source=resync.source, namespaces=resync.namespaces, present=present, listed_at=resync.observed_at
            )
            for row in rows:
                await self.hooks.forget_route(row.namespace, row.name)
            deleted = [f"{row.namespace}/{row.name}" for row in rows]
        else:
            names = {name.split("/", 1)[-1] for name in resync.names}
            deleted = await self.store.resync_groups(
                source=resync.source, namespaces=resync.namespaces, present=names, listed_at=resync.observed_at
            )
        if deleted:
            log.info("resync removed what no longer exists", extra={**fields, "deleted": deleted})
            self.hooks.kick()
        else:
            log.debug("resync: nothing to remove", extra=fields)
