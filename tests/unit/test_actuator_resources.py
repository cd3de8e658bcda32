"""FlexInfer's resources in Kubernetes, as the actuator reads and writes them: specs handed to the scheduler, the
status written back, the active-services annotation, Events of a swap; and the pure parts of the Kubernetes
client (leader election, informer resync)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from flexinfer_actuator.domain.resources import (
    ACTIVE_SERVICES,
    LAST_APPLIED,
    EventType,
    Note,
    active_services_value,
    gpugroup_owners,
    gpugroup_spec,
    gpugroup_status_document,
    merge_patch,
    model_spec,
    model_status_document,
    service_annotation_patch,
    swap_notes,
)
from flexinfer_common.enums import ModelPhase, SharedState, SwapPhase, SwapReason
from flexinfer_common.kube.informer import ADDED, DELETED, MODIFIED, diff
from flexinfer_common.kube.leader import LeaderAction, LeaseRecord, decide
from flexinfer_common.messages import GroupStatusUpdate, ModelRef, ModelStatus, SharedGroupStatus, SwapEvent

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def model_object(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {
            "name": "qwen",
            "namespace": "ml",
            "generation": 3,
            "resourceVersion": "812",
            "uid": "0b0c",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "managedFields": [{"manager": "kubectl"}],
            **meta,
        },
        "spec": spec,
        "status": {"phase": "Ready"},
    }


# ------------------------------------------------------------------------------------------ specs


def test_model_spec_keeps_only_what_users_wrote() -> None:
    obj = model_object(
        {"backend": "vllm", "gpu": {"shared": "g", "priority": 5}},
        annotations={LAST_APPLIED: "{...}", "team": "ml"},
        labels={"app": "qwen"},
    )
    verdict = model_spec(obj)
    assert verdict.error is None and verdict.generation == 3
    assert verdict.manifest is not None
    metadata = {k: v for k, v in verdict.manifest["metadata"].items() if v not in ([], {}, None)}
    assert metadata == {"name": "qwen", "namespace": "ml", "labels": {"app": "qwen"}, "annotations": {"team": "ml"}}
    assert verdict.manifest["spec"]["gpu"]["priority"] == 5
    assert "status" not in verdict.manifest


def test_a_status_write_is_not_a_spec_change() -> None:
    before = model_spec(model_object({"gpu": {"shared": "g"}}))
    after = model_spec(model_object({"gpu": {"shared": "g"}}, resourceVersion="999") | {"status": {"phase": "Idle"}})
    assert before == after


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({"gpu": {"priority": "high"}}, "spec.gpu.priority", id="priority-not-an-integer"),
        pytest.param({"gpu": {"swapCooldown": "5 minutes"}}, "spec.gpu.swapCooldown", id="duration-unreadable"),
        pytest.param({"endpoint": {"port": 70000}}, "spec.endpoint.port", id="port-out-of-range"),
        pytest.param({"gpu": {"parkStrategy": "Hibernate"}}, "spec.gpu.parkStrategy", id="unknown-park-strategy"),
    ],
)
def test_an_invalid_model_names_the_field(spec: dict[str, Any], field: str) -> None:
    verdict = model_spec(model_object(spec))
    assert verdict.manifest is None
    assert verdict.error is not None and field in verdict.error
    assert verdict.generation == 3


def group_object(name: str, namespace: str, created: str, models: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPUGroup",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created, "generation": 1},
        "spec": {"models": models},
    }


def test_gpugroup_members_default_to_the_groups_namespace() -> None:
    obj = group_object("g", "ml", "2026-01-01T00:00:00Z", [{"name": "a"}, {"name": "b", "namespace": "other"}])
    verdict = gpugroup_spec(obj)
    assert verdict.manifest is not None
    members = [(m["namespace"], m["name"]) for m in verdict.manifest["spec"]["models"]]
    assert members == [("ml", "a"), ("other", "b")]


def test_gpugroup_with_an_empty_models_list_is_invalid() -> None:
    verdict = gpugroup_spec(group_object("g", "ml", "2026-01-01T00:00:00Z", []))
    assert verdict.manifest is None and verdict.error is not None and "spec.models" in verdict.error


def test_gpugroup_without_models_declares_a_v1alpha2_groups_scheduling() -> None:
    obj = group_object("g", "ml", "2026-01-01T00:00:00Z", [])
    obj["spec"] = {"scheduling": "seed"}
    verdict = gpugroup_spec(obj)
    assert verdict.error is None and verdict.manifest is not None
    assert verdict.manifest["spec"]["scheduling"] == "seed" and "models" not in verdict.manifest["spec"]
    obj["spec"] = {"scheduling": "fastest"}
    refused = gpugroup_spec(obj)
    assert refused.manifest is None and refused.error is not None and "spec.scheduling" in refused.error


def test_gpugroup_names_are_owned_by_the_oldest() -> None:
    older = group_object("gpu0", "b", "2026-01-01T00:00:00Z", [{"name": "x"}])
    newer = group_object("gpu0", "a", "2026-02-01T00:00:00Z", [{"name": "y"}])
    other = group_object("gpu1", "a", "2026-03-01T00:00:00Z", [{"name": "z"}])
    owners = gpugroup_owners([newer, other, older])
    assert owners == {("b", "gpu0"): None, ("a", "gpu0"): "b/gpu0", ("a", "gpu1"): None}
    refused = gpugroup_spec(newer, conflict_with="b/gpu0")
    assert refused.manifest is None and refused.error is not None
    assert "metadata.name" in refused.error and "b/gpu0" in refused.error


# ------------------------------------------------------------------------------------------ status


def status(**fields: Any) -> ModelStatus:
    return ModelStatus(**fields)


def conditions(document: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in document["conditions"]}


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        pytest.param(
            status(phase=ModelPhase.READY, shared_group=SharedGroupStatus(state=SharedState.ACTIVE)),
            {"Ready": ("True", "Ready"), "Active": ("True", "Active")},
            id="ready-and-active",
        ),
        pytest.param(
            status(phase=ModelPhase.LOADING, shared_group=SharedGroupStatus(state=SharedState.ACTIVE)),
            {"Ready": ("False", "Loading"), "Active": ("True", "Active")},
            id="active-while-loading",
        ),
        pytest.param(
            status(
                phase=ModelPhase.PENDING,
                shared_group=SharedGroupStatus(state=SharedState.QUEUED, queue_position=1),
            ),
            {"Ready": ("False", "Pending"), "Active": ("False", "Queued")},
            id="queued",
        ),
        pytest.param(
            status(phase=ModelPhase.PREEMPTED, preempted_by="gpu-lease/trainer"),
            {"Ready": ("False", "Preempted"), "Active": ("False", "Unknown")},
            id="preempted-by-a-lease",
        ),
    ],
)
def test_conditions_follow_phase_and_state(given: ModelStatus, expected: dict[str, tuple[str, str]]) -> None:
    assert conditions(model_status_document(given, current=None, now="2026-01-01T00:00:00Z")) == expected


def test_last_transition_time_moves_only_when_the_condition_flips() -> None:
    loading = status(phase=ModelPhase.LOADING, shared_group=SharedGroupStatus(state=SharedState.ACTIVE))
    first = model_status_document(loading, current=None, now="T1")
    ready = loading.model_copy(update={"phase": ModelPhase.READY})
    second = model_status_document(ready, current=first, now="T2")
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert times == {"Ready": "T2", "Active": "T1"}


def test_spec_error_is_shown_with_the_generation_looked_at() -> None:
    document = model_status_document(
        status(phase=ModelPhase.READY, observed_generation=2),
        current=None,
        now="T",
        spec_error="Model spec.gpu.priority: Input should be a valid integer",
        generation=3,
    )
    assert document["message"] == "Model spec.gpu.priority: Input should be a valid integer"
    assert document["observedGeneration"] == 3
    assert conditions(document)["Ready"] == ("False", "InvalidSpec")


def test_observed_generation_is_the_schedulers() -> None:
    document = model_status_document(status(observed_generation=4), current=None, now="T", generation=5)
    assert document["observedGeneration"] == 4


@pytest.mark.parametrize(
    ("current", "desired", "patch"),
    [
        pytest.param({"a": 1}, {"a": 1}, {}, id="equal-writes-nothing"),
        pytest.param({"a": 1}, {"a": 2}, {"a": 2}, id="changed-field"),
        pytest.param({"a": 1, "b": 2}, {"a": 1}, {"b": None}, id="removed-field-is-null"),
        pytest.param(
            {"s": {"state": "Queued", "queuePosition": 1}},
            {"s": {"state": "Active"}},
            {"s": {"state": "Active", "queuePosition": None}},
            id="nested",
        ),
        pytest.param({"l": [1, 2]}, {"l": [1]}, {"l": [1]}, id="lists-are-replaced"),
        pytest.param(None, {"a": 1}, {"a": 1}, id="no-status-yet"),
    ],
)
def test_merge_patch(current: dict[str, Any] | None, desired: dict[str, Any], patch: dict[str, Any]) -> None:
    assert merge_patch(current, desired) == patch


def test_gpugroup_status_names_members_relative_to_the_group() -> None:
    update = GroupStatusUpdate(
        group="g",
        active_model=ModelRef(namespace="ml", name="a"),
        queue=[ModelRef(namespace="ml", name="b"), ModelRef(namespace="other", name="c")],
        time=T0,
    )
    document = gpugroup_status_document(update, namespace="ml", generation=2, spec_error=None)
    assert document == {"activeModel": "a", "queue": ["b", "other/c"], "observedGeneration": 2}


# ------------------------------------------------------------------------------------------ services


@pytest.mark.parametrize(
    ("labels", "active", "value"),
    [
        pytest.param(["chat", "assistant"], True, "chat,assistant", id="active-carries-its-labels"),
        pytest.param(["chat"], False, "", id="inactive-is-empty-not-absent"),
        pytest.param([], True, "", id="no-labels"),
    ],
)
def test_active_services_value(labels: list[str], active: bool, value: str) -> None:
    assert active_services_value(labels, active=active) == value


def test_service_annotation_written_only_when_it_differs() -> None:
    service = {"metadata": {"name": "qwen", "annotations": {ACTIVE_SERVICES: ""}}}
    assert service_annotation_patch(service, "") is None
    assert service_annotation_patch(service, "chat") == {"metadata": {"annotations": {ACTIVE_SERVICES: "chat"}}}
    assert service_annotation_patch({"metadata": {"name": "qwen"}}, "") == {
        "metadata": {"annotations": {ACTIVE_SERVICES: ""}}
    }


# ------------------------------------------------------------------------------------------ events


def swap_event(kind: str, **fields: Any) -> SwapEvent:
    values: dict[str, Any] = {
        "kind": kind,
        "swap_id": "s1",
        "group": "g",
        "from_model": "ml/a",
        "to_model": "ml/b",
        "reason": SwapReason.DEMAND,
        "phase": SwapPhase.DRAINING,
        "time": T0,
    }
    values.update(fields)
    return SwapEvent(**values)


def test_swap_started_notes_both_models() -> None:
    assert swap_notes(swap_event("swap.started")) == [
        Note("ml", "b", EventType.NORMAL, "SwapStarted", "taking the GPU of group g from ml/a (demand)"),
        Note("ml", "a", EventType.NORMAL, "Preempted", "parking: group g goes to ml/b (demand)"),
    ]


def test_swap_finished_tells_how_long_each_phase_took() -> None:
    notes = swap_notes(swap_event("swap.finished", phases={"parking": 0.5, "loading": 2.0}, phase=SwapPhase.READY))
    assert notes == [
        Note("ml", "b", EventType.NORMAL, "Activated", "holds the GPU of group g after 2.5s (parking 0.5s, loading 2s)")
    ]


def test_a_model_moved_out_of_its_group_while_loaded_gets_a_warning() -> None:
    """A GPUGroup (or spec.gpu.shared) changed in Kubernetes moved a loaded model: it is parked in its group first,
    and ``kubectl describe model`` says so with a Warning."""
    notes = swap_notes(swap_event("swap.started", to_model=None, reason=SwapReason.GROUP_CHANGE))
    assert notes == [
        Note(
            "ml",
            "a",
            EventType.WARNING,
            "GroupChangeDeferred",
            "moved to another group while it holds the GPU of group g: parked here first, then moved",
        )
    ]


def test_swap_failed_is_a_warning() -> None:
    notes = swap_notes(swap_event("swap.failed", message="superseded", phase=SwapPhase.ABORTED))
    assert [(n.type, n.reason) for n in notes] == [(EventType.WARNING, "SwapAborted")]


# ------------------------------------------------------------------------------------------ kubernetes client


def lease(holder: str, duration: float = 15) -> LeaseRecord:
    return LeaseRecord(holder=holder, lease_duration=duration, transitions=0, resource_version="1")


@pytest.mark.parametrize(
    ("record", "unchanged_for", "expected"),
    [
        pytest.param(None, 0, LeaderAction.CREATE, id="no-lease-create-it"),
        pytest.param(lease("me"), 100, LeaderAction.RENEW, id="ours-renew"),
        pytest.param(lease("other"), 14.9, LeaderAction.FOLLOW, id="theirs-and-live-follow"),
        pytest.param(lease("other"), 15, LeaderAction.TAKE_OVER, id="theirs-unchanged-for-its-duration-take-over"),
        pytest.param(lease(""), 0, LeaderAction.TAKE_OVER, id="released-take-over-at-once"),
    ],
)
def test_leader_decision(record: LeaseRecord | None, unchanged_for: float, expected: LeaderAction) -> None:
    assert decide(record, me="me", unchanged_for=unchanged_for) is expected


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ml", "name": name, "resourceVersion": version}}


def test_relist_difference_loses_nothing() -> None:
    cache = {("ml", "kept"): obj("kept", "1"), ("ml", "changed"): obj("changed", "1"), ("ml", "gone"): obj("gone", "1")}
    listed = [obj("kept", "1"), obj("changed", "5"), obj("new", "6")]
    changes = [(kind, o["metadata"]["name"]) for kind, o in diff(cache, listed)]
    assert sorted(changes) == sorted([(MODIFIED, "changed"), (ADDED, "new"), (DELETED, "gone")])
