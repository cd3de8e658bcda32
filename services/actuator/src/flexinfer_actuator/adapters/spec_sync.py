"""Spec sync: the Model and GPUGroup resources users ``kubectl apply`` reach the scheduler over the bus, so a
Kubernetes user never calls the admin API.

Each watched change becomes a ``SpecChange`` (published only when the spec itself changed: a status write is not a
spec change); each (re)list becomes a ``SpecResync`` naming everything that exists, so a deletion that happened
while nobody watched is found. A resource that fails validation is not handed on (the scheduler keeps the last
valid spec, if any): it gets a ``status.message`` and a Warning Event naming the field, and the others go on.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from flexinfer_actuator.domain.resources import SpecVerdict, gpugroup_owners, gpugroup_spec, model_spec
from flexinfer_common import subjects
from flexinfer_common.clock import Clock
from flexinfer_common.kube.client import Object
from flexinfer_common.kube.informer import DELETED, Informer, object_key
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import SpecChange, SpecResync, message_id
from flexinfer_common.notes import EventType, Note
from flexinfer_common.ports import Publisher
from flexinfer_common.tasks import Background

log = get_logger("flexinfer.actuator.specs")

Kind = Literal["Model", "GPUGroup"]
ResourceKey = tuple[str, str, str]  # kind, namespace, name


@dataclass
class SpecErrors:
    """Resources whose spec is invalid: the error naming the field, and the generation it was found in. The status
    writer shows them; ``on_change`` tells it which resource to write again."""

    errors: dict[ResourceKey, tuple[str, int | None]] = field(default_factory=dict)
    on_change: list[Callable[[ResourceKey], None]] = field(default_factory=list)

    def get(self, key: ResourceKey) -> tuple[str, int | None] | None:
        return self.errors.get(key)

    def set(self, key: ResourceKey, error: str, generation: int | None) -> bool:
        """Record an error; True when it is new (not the same error for the same generation)."""
        if self.errors.get(key) == (error, generation):
            return False
        self.errors[key] = (error, generation)
        self._changed(key)
        return True

    def clear(self, key: ResourceKey) -> None:
        if self.errors.pop(key, None) is not None:
            self._changed(key)

    def _changed(self, key: ResourceKey) -> None:
        for callback in self.on_change:
            callback(key)


class SpecSync:
    def __init__(
        self,
        *,
        bus: Publisher,
        models: Informer,
        groups: Informer,
        namespaces: list[str] | None,
        errors: SpecErrors,
        clock: Clock,
        note: Callable[[Note], None],
    ) -> None:
        self.bus = bus
        self.models = models
        self.groups = groups
        self.namespaces = namespaces
        self.errors = errors
        self.clock = clock
        self._note = note
        self._published: dict[ResourceKey, tuple[dict[str, Any], int | None]] = {}
        self._outbox: asyncio.Queue[tuple[str, BaseModel]] = asyncio.Queue()
        self._worker = Background("spec-sync", self._send)
        models.on_change(self._model_changed)
        models.on_sync(self._models_listed)
        groups.on_change(self._group_changed)
        groups.on_sync(self._groups_listed)

    def start(self) -> None:
        self._worker.start()

    async def stop(self) -> None:
        await self._worker.stop()

    @property
    def pending(self) -> int:
        return self._outbox.qsize()

    # ------------------------------------------------------------------ watched changes

    def _model_changed(self, event: str, obj: Object) -> None:
        namespace, name = object_key(obj)
        key: ResourceKey = ("Model", namespace, name)
        if event == DELETED:
            self._delete(key)
            return
        self._apply(key, model_spec(obj))

    def _group_changed(self, event: str, obj: Object) -> None:
        if event == DELETED:
            namespace, name = object_key(obj)
            self._delete(("GPUGroup", namespace, name))
        # Group names are shared by every namespace: any change can move a name's ownership, so judge them all.
        owners = gpugroup_owners(self.groups.objects())
        for other in self.groups.objects():
            namespace, name = object_key(other)
            verdict = gpugroup_spec(other, conflict_with=owners.get((namespace, name)))
            self._apply(("GPUGroup", namespace, name), verdict)

    def _apply(self, key: ResourceKey, verdict: SpecVerdict) -> None:
        kind, namespace, name = key
        if verdict.manifest is None:
            assert verdict.error is not None
            if self.errors.set(key, verdict.error, verdict.generation):
                log.warning(
                    "invalid resource", extra={"resource": f"{kind} {namespace}/{name}", "error": verdict.error}
                )
                self._note(Note(namespace, name, EventType.WARNING, "InvalidSpec", verdict.error, kind=kind))
            return
        self.errors.clear(key)
        published = (verdict.manifest, verdict.generation)
        if self._published.get(key) == published:
            return  # a status write, or a label kubectl keeps: not a spec change
        self._published[key] = published
        change = SpecChange(
            kind=kind,
            action="apply",
            namespace=namespace,
            name=name,
            manifest=verdict.manifest,
            generation=verdict.generation,
            observed_at=self.clock.now(),
        )
        self._outbox.put_nowait((subjects.spec_subject(kind, namespace, name), change))

    def _delete(self, key: ResourceKey) -> None:
        kind, namespace, name = key
        self.errors.clear(key)
        self._published.pop(key, None)
        change = SpecChange(
            kind=kind,
            action="delete",
            namespace=namespace,
            name=name,
            observed_at=self.clock.now(),
        )
        self._outbox.put_nowait((subjects.spec_subject(kind, namespace, name), change))

    def _models_listed(self, namespace: str | None, objects: list[Object]) -> None:
        self._resync("Model", namespace, objects)

    def _groups_listed(self, namespace: str | None, objects: list[Object]) -> None:
        self._resync("GPUGroup", namespace, objects)

    def _resync(self, kind: Kind, namespace: str | None, objects: list[Object]) -> None:
        names = sorted(f"{ns}/{name}" for ns, name in map(object_key, objects))
        resync = SpecResync(
            kind=kind,
            namespaces=[namespace] if namespace is not None else None,
            names=names,
            observed_at=self.clock.now(),
        )
        self._outbox.put_nowait((subjects.spec_resync_subject(kind), resync))

    # ------------------------------------------------------------------ publishing, in order

    async def _send(self) -> None:
        while True:
            subject, message = await self._outbox.get()
            msg_id = message_id("spec-sync")  # the same id for every retry of this one publish
            delay = 0.2
            while True:
                try:
                    await self.bus.publish(subject, message, msg_id=msg_id)
                    break
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    log.warning("cannot publish a spec; retrying", extra={"subject": subject, "error": repr(exc)})
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, 5.0)
