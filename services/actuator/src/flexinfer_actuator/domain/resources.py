"""FlexInfer's own resources in Kubernetes, as pure functions: which spec to hand the scheduler (or which field is
wrong), which status to write back (only what changed, with standard conditions), the ``ai.flexinfer/active-services``
annotation of a model's Service, and the Events a swap leaves on the Models it touched.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flexinfer_common.enums import ModelPhase, SharedState, SwapReason
from flexinfer_common.manifests import GPUGroup, ManifestError, dump_resource, parse_resource
from flexinfer_common.messages import GroupStatusUpdate, ModelRef, ModelStatus, SwapEvent
from flexinfer_common.notes import EventType as EventType
from flexinfer_common.notes import Note as Note

Object = Mapping[str, Any]

LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
ACTIVE_SERVICES = "ai.flexinfer/active-services"


# ------------------------------------------------------------------------------------------ specs


@dataclass(frozen=True)
class SpecVerdict:
    """A resource's spec as the scheduler takes it (``manifest``), or why it cannot be used (``error`` names the
    field)."""

    manifest: dict[str, Any] | None
    error: str | None = None
    generation: int | None = None


def _document(obj: Object) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    annotations = {k: v for k, v in (meta.get("annotations") or {}).items() if k != LAST_APPLIED}
    metadata: dict[str, Any] = {"name": meta.get("name"), "namespace": meta.get("namespace")}
    if meta.get("labels"):
        metadata["labels"] = dict(meta["labels"])
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "metadata": metadata, "spec": obj.get("spec")}


def _generation(obj: Object) -> int | None:
    value = (obj.get("metadata") or {}).get("generation")
    return int(value) if isinstance(value, int) else None


def model_spec(obj: Object) -> SpecVerdict:
    """A Model object's spec for the scheduler: only what users wrote (no status, resourceVersion or kubectl's
    bookkeeping, so a status write is not a spec change)."""
    document = _document(obj)
    if document["spec"] is None:
        document["spec"] = {}
    try:
        model = parse_resource(document)
    except ManifestError as exc:
        return SpecVerdict(None, str(exc), _generation(obj))
    return SpecVerdict(dump_resource(model), None, _generation(obj))


def gpugroup_spec(obj: Object, *, conflict_with: str | None = None) -> SpecVerdict:
    """A GPUGroup object's spec for the scheduler, its members' namespaces filled in (a member without one is in
    the GPUGroup's namespace). ``conflict_with``: another GPUGroup already uses the name (group names are global)."""
    document = _document(obj)
    namespace = document["metadata"]["namespace"] or "default"
    if conflict_with is not None:
        name = document["metadata"]["name"]
        return SpecVerdict(
            None,
            f"GPUGroup metadata.name: the group name {name!r} is already used by GPUGroup {conflict_with} "
            "(group names are shared by every namespace); rename one of them",
            _generation(obj),
        )
    try:
        group = parse_resource(document)
    except ManifestError as exc:
        return SpecVerdict(None, str(exc), _generation(obj))
    assert isinstance(group, GPUGroup)
    manifest = dump_resource(group)
    for member in manifest["spec"].get("models", []):  # none: a v1alpha2 group's declaration
        member.setdefault("namespace", namespace)
    return SpecVerdict(manifest, None, _generation(obj))


def gpugroup_owners(objects: Iterable[Object]) -> dict[tuple[str, str], str | None]:
    """For each GPUGroup object (namespace, name): None when it owns its group name, else the ``namespace/name`` of
    the GPUGroup that does (the oldest; ties by namespace)."""

    def age(obj: Object) -> tuple[str, str]:
        meta = obj.get("metadata") or {}
        return (str(meta.get("creationTimestamp") or ""), str(meta.get("namespace") or ""))

    owners: dict[str, tuple[str, str]] = {}
    result: dict[tuple[str, str], str | None] = {}
    for obj in sorted(objects, key=age):
        meta = obj.get("metadata") or {}
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        owner = owners.setdefault(key[1], key)
        result[key] = None if owner == key else f"{owner[0]}/{owner[1]}"
    return result


# ------------------------------------------------------------------------------------------ status


class ConditionType(StrEnum):
    READY = "Ready"
    ACTIVE = "Active"


INVALID_SPEC = "InvalidSpec"


def _condition(kind: ConditionType, ok: bool, reason: str, message: str, generation: int | None) -> dict[str, Any]:
    condition: dict[str, Any] = {"type": kind.value, "status": "True" if ok else "False", "reason": reason}
    condition["message"] = message
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def conditions_for(status: ModelStatus, *, spec_error: str | None) -> list[dict[str, Any]]:
    """``Ready`` (the model serves) and ``Active`` (it holds its group's GPU), so ``kubectl wait`` works."""
    generation = status.observed_generation
    if spec_error is not None:
        ready = _condition(ConditionType.READY, False, INVALID_SPEC, spec_error, generation)
    else:
        phase = status.phase
        ready = _condition(ConditionType.READY, phase is ModelPhase.READY, phase.value, status.message, generation)
    state = status.shared_group.state
    active = _condition(
        ConditionType.ACTIVE,
        state is SharedState.ACTIVE,
        state.value if state is not None else "Unknown",
        _active_message(status),
        generation,
    )
    return [ready, active]


def _active_message(status: ModelStatus) -> str:
    state = status.shared_group.state
    if state is SharedState.ACTIVE:
        return "holds the GPU of its group"
    if state is SharedState.QUEUED:
        return f"waiting for the GPU (queue position {status.shared_group.queue_position})"
    if status.preempted_by:
        return f"parked; preempted by {status.preempted_by}"
    return "parked" if state is SharedState.PARKED else ""


def model_status_document(
    status: ModelStatus,
    *,
    current: Object | None,
    now: str,
    spec_error: str | None = None,
    generation: int | None = None,
) -> dict[str, Any]:
    """The whole ``status`` to show: the scheduler's view, the spec error if any, and conditions whose
    ``lastTransitionTime`` moves only when their ``status`` changes."""
    if spec_error is not None:  # we looked at this generation, and it is wrong
        status = status.model_copy(update={"message": spec_error, "observed_generation": generation})
    document = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    if not document.get("sharedGroup"):
        document.pop("sharedGroup", None)
    previous = {c.get("type"): c for c in (current or {}).get("conditions") or [] if isinstance(c, Mapping)}
    conditions = []
    for condition in conditions_for(status, spec_error=spec_error):
        before = previous.get(condition["type"])
        unchanged = before is not None and before.get("status") == condition["status"]
        condition["lastTransitionTime"] = before.get("lastTransitionTime", now) if unchanged and before else now
        conditions.append(condition)
    document["conditions"] = conditions
    return document


def merge_patch(current: Object | None, desired: Mapping[str, Any]) -> dict[str, Any]:
    """An RFC 7386 merge patch that turns ``current`` into ``desired`` (null removes a field; lists are replaced).
    Empty when they are equal: write only what changed."""
    current = current or {}
    patch: dict[str, Any] = {}
    for key, value in desired.items():
        old = current.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            inner = merge_patch(old, value)
            if inner:
                patch[key] = inner
        elif old != value:
            patch[key] = value
    for key in current:
        if key not in desired:
            patch[key] = None
    return patch


def group_reference(ref: ModelRef, group_namespace: str) -> str:
    """A member as a GPUGroup's status names it: its name, or ``namespace/name`` outside the group's namespace."""
    return ref.name if ref.namespace == group_namespace else f"{ref.namespace}/{ref.name}"


def gpugroup_status_document(
    update: GroupStatusUpdate | None, *, namespace: str, generation: int | None, spec_error: str | None
) -> dict[str, Any]:
    document: dict[str, Any] = {}
    if update is not None and spec_error is None:
        if update.active_model is not None:
            document["activeModel"] = group_reference(update.active_model, namespace)
        document["queue"] = [group_reference(ref, namespace) for ref in update.queue]
    if spec_error is not None:
        document["message"] = spec_error
    if generation is not None:
        document["observedGeneration"] = generation
    return document


# ------------------------------------------------------------------------------------------ services


def active_services_value(service_labels: Iterable[str], *, active: bool) -> str:
    """The seed's annotation: the model's serviceLabels while it is Active, an empty value (not absent) otherwise, so
    the proxy knows the model is managed but not serving."""
    return ",".join(service_labels) if active else ""


def service_annotation_patch(service: Object, value: str) -> dict[str, Any] | None:
    annotations = (service.get("metadata") or {}).get("annotations") or {}
    if annotations.get(ACTIVE_SERVICES) == value:
        return None
    return {"metadata": {"annotations": {ACTIVE_SERVICES: value}}}


# ------------------------------------------------------------------------------------------ events


def _ref(text: str | None) -> tuple[str, str] | None:
    if not text or "/" not in text:
        return None
    namespace, _, name = text.partition("/")
    return namespace, name


def _phases(phases: Mapping[str, float]) -> str:
    return ", ".join(f"{phase} {seconds:g}s" for phase, seconds in phases.items())


def swap_notes(event: SwapEvent) -> list[Note]:
    """What ``kubectl describe model`` should show of a swap: on the model that gets the GPU and on the one that
    gives it up."""
    target, source = _ref(event.to_model), _ref(event.from_model)
    group, reason = event.group, event.reason.value
    notes: list[Note] = []
    if event.kind == "swap.started":
        if target is not None:
            given = f" from {event.from_model}" if event.from_model else ""
            notes.append(
                Note(*target, EventType.NORMAL, "SwapStarted", f"taking the GPU of group {group}{given} ({reason})")
            )
        if source is not None and event.reason == SwapReason.GROUP_CHANGE:
            # a GPUGroup (or spec.gpu.shared) moved a loaded model: the move waits until it is off this card
            message = f"moved to another group while it holds the GPU of group {group}: parked here first, then moved"
            notes.append(Note(*source, EventType.WARNING, "GroupChangeDeferred", message))
        elif source is not None:
            by = event.to_model or "nobody"
            notes.append(
                Note(*source, EventType.NORMAL, "Preempted", f"parking: group {group} goes to {by} ({reason})")
            )
    elif event.kind == "swap.finished" and target is not None:
        took = sum(event.phases.values())
        detail = f" ({_phases(event.phases)})" if event.phases else ""
        notes.append(
            Note(*target, EventType.NORMAL, "Activated", f"holds the GPU of group {group} after {took:g}s{detail}")
        )
    elif event.kind == "swap.failed" and target is not None:
        message = event.message or "the swap did not complete"
        notes.append(Note(*target, EventType.WARNING, "SwapAborted", f"group {group}: {message}"))
    return notes
