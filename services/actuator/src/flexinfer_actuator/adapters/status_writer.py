"""Status write-back: what the scheduler publishes reaches the Kubernetes resources users look at.

- ``Model.status`` (phase, lastActiveTime, sharedGroup, preemptedBy, message, observedGeneration, conditions
  ``Ready`` and ``Active``) through the ``status`` subresource, as a merge patch of only what changed, conditional on
  the resourceVersion read (409: read again, patch again);
- ``GPUGroup.status`` (activeModel, queue);
- the ``ai.flexinfer/active-services`` annotation on each model's Service (its serviceLabels while Active, an empty
  value otherwise);
- Events for swaps on the Models they touch.

Level-triggered: the scheduler's latest status per model (the last-value stream, replayed from its last message per
subject whenever this actuator starts leading) is compared with the resource whenever either changes, so a Model that
was re-created, or a status or annotation someone edited, is put right.
"""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from nats.js.api import DeliverPolicy

from flexinfer_actuator.adapters.spec_sync import ResourceKey, SpecErrors
from flexinfer_actuator.domain.resources import (
    active_services_value,
    gpugroup_status_document,
    merge_patch,
    model_status_document,
    service_annotation_patch,
    swap_notes,
)
from flexinfer_common import subjects
from flexinfer_common.bus import BadMessage, Bus, Consumer, Delivery, decode_json
from flexinfer_common.clock import Clock
from flexinfer_common.enums import SharedState
from flexinfer_common.kube.client import GPUGROUPS, MODELS, SERVICES, KubeClient, KubeError, Object
from flexinfer_common.kube.events import EventRecorder
from flexinfer_common.kube.informer import Informer, object_key
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import GroupStatusUpdate, ModelStatus, ModelStatusUpdate, SwapEvent
from flexinfer_common.tasks import Background

log = get_logger("flexinfer.actuator.status")

_CONFLICT_ATTEMPTS = 5
_PARALLEL_WRITES = 8
_STALE_EVENT = timedelta(minutes=10)

# What needs writing: ("model", namespace, name) or ("group", "", group name)
Target = tuple[str, str, str]

StatusMessage = ModelStatusUpdate | GroupStatusUpdate


def decode_status(subject: str, data: bytes) -> StatusMessage:
    if subject.startswith(subjects.GROUP_STATUS_PREFIX + "."):
        return decode_json(GroupStatusUpdate, subject, data)
    if subject.startswith(subjects.MODEL_STATUS_PREFIX + "."):
        return decode_json(ModelStatusUpdate, subject, data)
    raise BadMessage(f"not a status subject: {subject}")


class StatusWriter:
    def __init__(
        self,
        *,
        bus: Bus,
        client: KubeClient,
        models: Informer,
        groups: Informer,
        services: Informer,
        errors: SpecErrors,
        events: EventRecorder,
        clock: Clock,
    ) -> None:
        self.bus = bus
        self.client = client
        self.models = models
        self.groups = groups
        self.services = services
        self.errors = errors
        self.events = events
        self.clock = clock
        self.model_statuses: dict[tuple[str, str], ModelStatus] = {}
        self.group_statuses: dict[str, GroupStatusUpdate] = {}
        self._dirty: set[Target] = set()
        self._wake = asyncio.Event()
        self._worker = Background("status-writer", self._run)
        self._consumers: list[Consumer[Any]] = []
        self.writes = 0
        # Told of every model status the scheduler publishes (the Kubernetes back-end keeps idle models parked).
        self.on_model_status: list[Callable[[str, str, ModelStatus], None]] = []
        models.on_change(lambda _, obj: self._mark(("model", *object_key(obj))))
        groups.on_change(lambda _, obj: self._mark(("group", "", object_key(obj)[1])))
        services.on_change(self._service_changed)
        errors.on_change.append(self._error_changed)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        self._consumers = [
            # The current status of every model and group, then each new one.
            Consumer(
                self.bus,
                stream=subjects.MODEL_STATUS_STREAM,
                durable=None,
                filter_subject=subjects.STATUS_PREFIX + ".>",
                decode=decode_status,
                handler=self._on_status,
                deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ),
            Consumer(
                self.bus,
                stream=subjects.EVENTS_STREAM,
                durable="actuator-swap-events",
                filter_subject=subjects.EVENTS_PREFIX + ".swap.>",
                decode=functools.partial(decode_json, SwapEvent),
                handler=self._on_swap,
                deliver_new_only=True,
            ),
        ]
        for consumer in self._consumers:
            await consumer.start()
        self._worker.start()

    async def stop(self) -> None:
        for consumer in self._consumers:
            await consumer.stop()
        self._consumers = []
        await self._worker.stop()

    # ------------------------------------------------------------------ inputs

    async def _on_status(self, message: StatusMessage, _: Delivery) -> None:
        if isinstance(message, ModelStatusUpdate):
            self.model_statuses[(message.namespace, message.model)] = message.status
            self._mark(("model", message.namespace, message.model))
            for callback in self.on_model_status:
                callback(message.namespace, message.model, message.status)
        else:
            self.group_statuses[message.group] = message
            self._mark(("group", "", message.group))

    async def _on_swap(self, event: SwapEvent, _: Delivery) -> None:
        if self.clock.now() - event.time > _STALE_EVENT:
            return  # news from before this actuator led: the swap table keeps it, an Event would mislead
        for note in swap_notes(event):
            self.events.record(note)

    def _service_changed(self, _: str, obj: Object) -> None:
        namespace, name = object_key(obj)
        for (ns, model_name), model in list(self.models.cache.items()):
            if ns == namespace and name in (model_name, (model.get("spec") or {}).get("deployment")):
                self._mark(("model", ns, model_name))

    def _error_changed(self, key: ResourceKey) -> None:
        kind, namespace, name = key
        self._mark(("model", namespace, name) if kind in ("Model", "Workload") else ("group", "", name))

    def _mark(self, target: Target) -> None:
        self._dirty.add(target)
        self._wake.set()

    # ------------------------------------------------------------------ writing

    async def _run(self) -> None:
        in_flight: dict[Target, asyncio.Task[None]] = {}
        while True:
            await self._wake.wait()
            self._wake.clear()
            ready = [t for t in self._dirty if t not in in_flight]
            self._dirty.difference_update(ready)
            for target in ready:
                while len(in_flight) >= _PARALLEL_WRITES:
                    done, _ = await asyncio.wait(set(in_flight.values()), return_when=asyncio.FIRST_COMPLETED)
                    for finished in [t for t, task in in_flight.items() if task in done]:
                        del in_flight[finished]
                task = asyncio.create_task(self._write(target), name=f"status:{target}")
                in_flight[target] = task
                task.add_done_callback(functools.partial(self._done, in_flight, target))

    def _done(self, in_flight: dict[Target, asyncio.Task[None]], target: Target, _: asyncio.Task[None]) -> None:
        in_flight.pop(target, None)
        if target in self._dirty:
            self._wake.set()

    async def _write(self, target: Target) -> None:
        kind, namespace, name = target
        try:
            if kind == "model":
                await self._write_model(namespace, name)
                await self._write_service(namespace, name)
            else:
                await self._write_groups(name)
        except KubeError as exc:
            log.warning("status not written; retrying", extra={"target": "/".join(target), "error": str(exc)})
            await asyncio.sleep(1.0)
            self._mark(target)
        except Exception:
            log.exception("status not written", extra={"target": "/".join(target)})

    async def _write_model(self, namespace: str, name: str) -> None:
        obj = self.models.get(namespace, name)
        for _ in range(_CONFLICT_ATTEMPTS):
            if obj is None:
                return
            error = self.errors.get(("Model", namespace, name)) or self.errors.get(("Workload", namespace, name))
            desired = self.model_statuses.get((namespace, name))
            if desired is None:
                if error is None:
                    return  # the scheduler has said nothing about it yet
                desired = ModelStatus()
            meta = obj.get("metadata") or {}
            current = obj.get("status") or {}
            document = model_status_document(
                desired,
                current=current,
                now=self.clock.now().strftime("%Y-%m-%dT%H:%M:%SZ"),
                spec_error=error[0] if error else None,
                generation=error[1] if error else meta.get("generation"),
            )
            if not await self._patch_status(MODELS, namespace, name, meta, current, document):
                obj = await self.client.get_or_none(MODELS, namespace, name)  # 409: read it again
                continue
            return
        log.warning("status kept conflicting; will try again", extra={"model": f"{namespace}/{name}"})
        self._mark(("model", namespace, name))

    async def _write_groups(self, group: str) -> None:
        for (namespace, name), obj in list(self.groups.cache.items()):
            if name != group:
                continue
            current_obj: Object | None = obj
            for _ in range(_CONFLICT_ATTEMPTS):
                if current_obj is None:
                    break
                obj = current_obj
                meta = obj.get("metadata") or {}
                error = self.errors.get(("GPUGroup", namespace, name))
                document = gpugroup_status_document(
                    None if error else self.group_statuses.get(group),
                    namespace=namespace,
                    generation=meta.get("generation"),
                    spec_error=error[0] if error else None,
                )
                current = obj.get("status") or {}
                if await self._patch_status(GPUGROUPS, namespace, name, meta, current, document):
                    break
                current_obj = await self.client.get_or_none(GPUGROUPS, namespace, name)

    async def _patch_status(
        self, resource: Any, namespace: str, name: str, meta: Object, current: Object, document: dict[str, Any]
    ) -> bool:
        """Write what differs; False on a 409 (the object changed since it was read)."""
        patch = merge_patch(current, document)
        if not patch:
            return True
        body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": patch}
        try:
            await self.client.patch(resource, namespace, name, body, subresource="status")
        except KubeError as exc:
            if exc.conflict:
                log.info("status conflict; reading again", extra={"resource": f"{resource.plural}/{namespace}/{name}"})
                return False
            if exc.not_found:
                return True  # deleted meanwhile
            raise
        self.writes += 1
        log.debug(
            "status written", extra={"resource": f"{resource.plural}/{namespace}/{name}", "patch": json.dumps(patch)}
        )
        return True

    async def _write_service(self, namespace: str, name: str) -> None:
        model = self.models.get(namespace, name)
        if model is None:
            return
        spec = model.get("spec") or {}
        service = self.services.get(namespace, name)
        if service is None and spec.get("deployment"):
            service = self.services.get(namespace, str(spec["deployment"]))
        if service is None:
            return
        status = self.model_statuses.get((namespace, name))
        active = status is not None and status.shared_group.state is SharedState.ACTIVE
        value = active_services_value(spec.get("serviceLabels") or [], active=active)
        patch = service_annotation_patch(service, value)
        if patch is None:
            return
        service_name = (service.get("metadata") or {}).get("name", name)
        await self.client.patch(SERVICES, namespace, service_name, patch)
        log.info(
            "active-services annotation", extra={"service": f"{namespace}/{service_name}", "value": value or "(empty)"}
        )
