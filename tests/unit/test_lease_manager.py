"""The lease manager's decisions, one table row per rule (the seed's "Training on a shared card (GPU lease)" and
issue 9), and what it exposes: its settings and its metrics."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_common.enums import LeasePhase
from flexinfer_common.messages import LeaseRef
from flexinfer_common.notes import EventType
from flexinfer_common.settings import SettingsError, load_settings
from flexinfer_lease_manager.domain.carriers import (
    ADMITTED_ANNOTATION,
    JOB_GROUP_LABEL,
    JOB_TTL_ANNOTATION,
    LEGACY_LABEL,
    carrier_wants,
)
from flexinfer_lease_manager.domain.gpulease_plan import (
    MANAGED_BY_LABEL,
    MANAGER,
    SOURCE_LABEL,
    KubePlan,
    KubeWorld,
    lease_status,
    plan_kubernetes,
)
from flexinfer_lease_manager.domain.leases import (
    Lease,
    LeaseRequest,
    LeaseSource,
    MemberState,
    ParkVerdict,
    default_lease_name,
    lease_is_expired,
    new_lease,
    park_verdict,
    renewal_due,
    renewed,
    request_problems,
    with_verdict,
)
from flexinfer_lease_manager.settings import LeaseManagerSettings

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
HOUR = 3600


def lease(
    name: str = "train",
    *,
    group: str = "gpu",
    owner: str = "trainer",
    namespace: str = "default",
    ttl: int = 600,
    acquired: datetime = NOW - timedelta(minutes=1),
    renewed_at: datetime | None = None,
    source: LeaseSource = LeaseSource.API,
    held: bool = False,
    uid: str | None = None,
) -> Lease:
    base = new_lease(
        name=name,
        namespace=namespace,
        group=group,
        owner=owner,
        node=None,
        ttl_seconds=ttl,
        source=source,
        now=acquired,
        resource_uid=uid,
    )
    if renewed_at is not None:
        base = renewed(base, renewed_at)
    if held:
        base = dataclasses.replace(base, phase=LeasePhase.HELD, held_at=acquired, message="parked")
    return base


def member(name: str, phase: str = "Preempted", by: str | None = "gpu-lease/trainer") -> MemberState:
    return MemberState("default", name, phase, by)


# ------------------------------------------------------------------------------------------ leases


def test_a_lease_lapses_at_expires_at_and_a_renewal_moves_it_forward() -> None:
    taken = lease(ttl=60, acquired=NOW)
    assert taken.expires_at == NOW + timedelta(seconds=60) and taken.holder == "gpu-lease/trainer"
    assert not lease_is_expired(taken, NOW + timedelta(seconds=59.999))
    assert lease_is_expired(taken, NOW + timedelta(seconds=60))  # the seed: ignored once now >= expiresAt
    later = renewed(taken, NOW + timedelta(seconds=30))
    assert later.expires_at == NOW + timedelta(seconds=90) and later.renew_time == NOW + timedelta(seconds=30)
    assert later.acquired_at == taken.acquired_at
    longer = renewed(taken, NOW + timedelta(seconds=30), ttl_seconds=600)
    assert (longer.ttl_seconds, longer.expires_at) == (600, NOW + timedelta(seconds=630))


@pytest.mark.parametrize(
    ("renew_time", "due"),
    [
        pytest.param(NOW - timedelta(seconds=31), True, id="a-refresh-interval-ago-is-due"),
        pytest.param(NOW - timedelta(seconds=15), True, id="half-an-interval-ago-is-due"),
        pytest.param(NOW - timedelta(seconds=5), False, id="just-renewed-is-not-due"),
    ],
)
def test_renewal_is_due_once_per_refresh_interval(renew_time: datetime, due: bool) -> None:
    assert renewal_due(lease(renewed_at=renew_time), NOW, timedelta(seconds=30)) is due


@pytest.mark.parametrize(
    ("request_", "problems"),
    [
        pytest.param(LeaseRequest(group="gpu", owner="trainer", ttl_seconds=60), [], id="valid-at-the-minimum-ttl"),
        pytest.param(
            LeaseRequest(group="gpu", owner="trainer", ttl_seconds=59),
            ["ttlSeconds: must be at least 60 (got 59)"],
            id="ttl-under-60",
        ),
        pytest.param(
            LeaseRequest(group="gpu", owner="a/b", name="Bad_Name", ttl_seconds=1),
            [
                "owner: 'a/b' is not a valid owner",
                "ttlSeconds: must be at least 60 (got 1)",
                "name: 'Bad_Name' is not a valid name",
            ],
            id="every-problem-collected",
        ),
        pytest.param(
            LeaseRequest(group="gpu", owner="trainer", namespace="other"),
            ["namespace: 'other' is not watched by the lease manager"],
            id="namespace-not-watched",
        ),
    ],
)
def test_request_problems_name_each_field(request_: LeaseRequest, problems: list[str]) -> None:
    found = request_problems(request_, namespaces=["default", "ml"])
    assert len(found) == len(problems)
    for message, expected in zip(found, problems, strict=True):
        assert message.startswith(expected), message


@pytest.mark.parametrize(
    ("memory", "per_device", "problems"),
    [
        pytest.param(8 << 30, 24 << 30, [], id="memory-that-fits-one-device"),
        pytest.param(8 << 30, None, [], id="memory-in-a-group-without-a-capacity-leases-the-whole-group"),
        pytest.param(
            30 << 30,
            24 << 30,
            ["memory: 32212254720 bytes is more than one device of group gpu holds"],
            id="memory-over-a-device-is-refused-where-the-capacity-is-known",
        ),
        pytest.param(0, 24 << 30, ["memory: must be a positive amount of memory"], id="memory-not-positive"),
    ],
)
def test_a_lease_with_memory_must_fit_one_device_of_a_known_capacity(
    memory: int, per_device: int | None, problems: list[str]
) -> None:
    found = request_problems(LeaseRequest(group="gpu", owner="trainer", memory=memory), memory_per_device=per_device)
    assert len(found) == len(problems)
    for message, expected in zip(found, problems, strict=True):
        assert message.startswith(expected), message


@pytest.mark.parametrize(
    ("owner", "name"),
    [
        pytest.param("qwen3-1p7b-lora", "qwen3-1p7b-lora-gpu-lease", id="the-seed's-name"),
        pytest.param("Alice_Smith", "alice-smith-gpu-lease", id="made-a-kubernetes-name"),
        pytest.param("x" * 300, "x" * 243 + "-gpu-lease", id="truncated-to-253"),
    ],
)
def test_a_lease_without_a_name_is_named_after_its_owner(owner: str, name: str) -> None:
    assert default_lease_name(owner) == name


HONOURED = LeaseRef(name="train", owner="trainer", acquired_at=NOW - timedelta(minutes=1))


@pytest.mark.parametrize(
    ("members", "honoured", "verdict"),
    [
        pytest.param(
            [member("a"), member("b")],
            HONOURED,
            ParkVerdict(True, "2 serving models of group gpu parked; the GPU is gpu-lease/trainer's"),
            id="every-member-preempted-by-the-lease-is-held",
        ),
        pytest.param(
            [member("a", "Ready", None), member("b")],
            HONOURED,
            ParkVerdict(False, "waiting for a (Ready) to park"),
            id="a-member-still-serving-is-parking",
        ),
        pytest.param(
            [member("a", "Draining"), member("b", "Loading", None)],
            HONOURED,
            ParkVerdict(False, "waiting for a (Draining), b (Loading) to park"),
            id="draining-is-not-parked-yet",
        ),
        pytest.param(
            [member("a", "Preempted", "b")],
            HONOURED,
            ParkVerdict(False, "waiting for a (Preempted) to park"),
            id="preempted-by-a-model-is-not-the-lease",
        ),
        pytest.param(
            [member("a", "Preempted", "gpu-lease/someone-else")],
            HONOURED,
            ParkVerdict(False, "waiting for a (Preempted) to park"),
            id="preempted-by-another-lease-is-not-this-one",
        ),
        pytest.param(
            [member("a")],
            None,
            ParkVerdict(False, "waiting for the scheduler to honour the lease on group gpu"),
            id="not-yet-honoured-by-the-election",
        ),
        pytest.param(
            [member("a")],
            LeaseRef(name="train", owner="trainer", acquired_at=NOW - timedelta(hours=1)),
            ParkVerdict(False, "waiting for the scheduler to honour the lease on group gpu"),
            id="an-earlier-lease-of-that-name-does-not-count",
        ),
        pytest.param(
            [], None, ParkVerdict(True, "group gpu has no serving model to park"), id="no-members-is-held-at-once"
        ),
    ],
)
def test_a_lease_is_held_only_once_every_serving_member_is_parked_for_it(
    members: list[MemberState], honoured: LeaseRef | None, verdict: ParkVerdict
) -> None:
    assert park_verdict(lease(), members, honoured) == verdict


@pytest.mark.parametrize(
    ("honoured", "verdict"),
    [
        pytest.param(
            HONOURED.model_copy(update={"device": 1, "free": False}),
            ParkVerdict(False, f"freeing {8 << 30} bytes on device 1 of group gpu", 1),
            id="memory-reserved-not-yet-free-is-parking",
        ),
        pytest.param(
            HONOURED.model_copy(update={"device": 1, "free": True}),
            ParkVerdict(True, f"{8 << 30} bytes free on device 1 of group gpu; they are gpu-lease/trainer's", 1),
            id="memory-free-is-held-while-other-members-serve",
        ),
        pytest.param(
            HONOURED,
            ParkVerdict(False, "waiting for a (Ready) to park"),
            id="memory-without-a-reserved-device-is-a-whole-group-lease",
        ),
    ],
)
def test_a_lease_with_memory_is_held_once_the_scheduler_says_it_is_free(
    honoured: LeaseRef, verdict: ParkVerdict
) -> None:
    members = [member("a", "Ready", None), member("b")]
    assert park_verdict(dataclasses.replace(lease(), memory=8 << 30), members, honoured) == verdict


def test_held_at_is_when_the_group_was_first_seen_parked() -> None:
    parking = lease()
    held = with_verdict(parking, ParkVerdict(True, "parked"), NOW)
    assert (held.phase, held.held_at) == (LeasePhase.HELD, NOW)
    again = with_verdict(held, ParkVerdict(False, "waiting for a (Loading) to park"), NOW + timedelta(seconds=5))
    assert (again.phase, again.held_at) == (LeasePhase.PARKING, NOW)  # a Job admitted then stays admitted
    assert with_verdict(again, ParkVerdict(True, "parked"), NOW + timedelta(seconds=9)).held_at == NOW


# ------------------------------------------------------------------------------------------ Kubernetes: carriers


def meta(name: str, uid: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "namespace": "default", "uid": uid, "creationTimestamp": "2026-06-01T11:00:00Z", **extra}


def modelcache(
    name: str = "lora", *, lease: dict[str, Any] | None = None, timeout: int | None = 600, uid: str = "mc-1"
) -> dict[str, Any]:
    finetune: dict[str, Any] = {"gpuLease": lease if lease is not None else {"group": "gpu"}}
    if timeout is not None:
        finetune["timeoutSeconds"] = timeout
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "ModelCache",
        "metadata": meta(name, uid),
        "spec": {"nodeSelector": {"kubernetes.io/hostname": "box"}, "finetune": finetune},
    }


def k8s_job(
    name: str,
    *,
    uid: str = "job-1",
    owner_uid: str | None = None,
    suspend: bool = True,
    done: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    deadline: int | None = None,
) -> dict[str, Any]:
    extra: dict[str, Any] = {}
    if owner_uid:
        extra["ownerReferences"] = [{"kind": "ModelCache", "name": "lora", "uid": owner_uid}]
    if labels:
        extra["labels"] = labels
    if annotations:
        extra["annotations"] = annotations
    spec: dict[str, Any] = {
        "suspend": suspend,
        "template": {"spec": {"nodeSelector": {"kubernetes.io/hostname": "n1"}}},
    }
    if deadline is not None:
        spec["activeDeadlineSeconds"] = deadline
    status = {"conditions": [{"type": "Complete", "status": "True"}]} if done else {}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": meta(name, uid, **extra),
        "spec": spec,
        "status": status,
    }


def configmap(group: str = "gpu", data: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": meta(f"gpu-lease-{group}", "cm-1", labels={LEGACY_LABEL: group}),
        "data": data or {},
    }


def wants_of(**objects: Any) -> list[tuple[str, str, str, str | None, int, LeaseSource, tuple[str, ...]]]:
    found, _ = carrier_wants(
        caches=objects.get("caches", []),
        jobs=objects.get("jobs", []),
        configmaps=objects.get("configmaps", []),
        default_ttl=HOUR,
    )
    return [(w.name, w.group, w.owner, w.node, w.ttl_seconds, w.source, w.jobs) for w in found]


@pytest.mark.parametrize(
    ("objects", "wants"),
    [
        pytest.param(
            {"caches": [modelcache()], "jobs": [k8s_job("lora-ft", owner_uid="mc-1")]},
            [("lora-gpu-lease", "gpu", "lora", "box", 1200, LeaseSource.MODELCACHE, ("lora-ft",))],
            id="finetune-job-wants-a-lease-ttl-timeout-plus-10m-node-from-selector",
        ),
        pytest.param(
            {
                "caches": [modelcache(lease={"group": "gpu", "ttlSeconds": 300})],
                "jobs": [k8s_job("x", owner_uid="mc-1")],
            },
            [("lora-gpu-lease", "gpu", "lora", "box", 300, LeaseSource.MODELCACHE, ("x",))],
            id="gpuLease-ttlSeconds-wins",
        ),
        pytest.param(
            {"caches": [modelcache(timeout=None)], "jobs": [k8s_job("x", owner_uid="mc-1")]},
            [("lora-gpu-lease", "gpu", "lora", "box", HOUR, LeaseSource.MODELCACHE, ("x",))],
            id="no-finetune-timeout-takes-the-default-ttl",
        ),
        pytest.param({"caches": [modelcache()]}, [], id="no-finetune-job-yet-no-lease"),
        pytest.param(
            {"caches": [modelcache()], "jobs": [k8s_job("x", owner_uid="mc-1", done=True)]},
            [],
            id="finished-finetune-job-no-lease",
        ),
        pytest.param(
            {
                "caches": [{**modelcache(), "spec": {"finetune": {"timeoutSeconds": 5}}}],
                "jobs": [k8s_job("x", owner_uid="mc-1")],
            },
            [],
            id="without-gpuLease-the-job-contends-as-before",
        ),
        pytest.param(
            {"caches": [modelcache()], "jobs": [k8s_job("x", owner_uid="mc-1", suspend=False)]},
            [("lora-gpu-lease", "gpu", "lora", "box", 1200, LeaseSource.MODELCACHE, ())],
            id="a-running-finetune-job-keeps-its-lease",
        ),
        pytest.param(
            {"jobs": [k8s_job("train", labels={JOB_GROUP_LABEL: "gpu"})]},
            [("train-gpu-lease", "gpu", "train", "n1", HOUR, LeaseSource.JOB, ("train",))],
            id="labelled-suspended-job",
        ),
        pytest.param(
            {"jobs": [k8s_job("train", labels={JOB_GROUP_LABEL: "gpu"}, deadline=1800)]},
            [("train-gpu-lease", "gpu", "train", "n1", 2400, LeaseSource.JOB, ("train",))],
            id="job-ttl-active-deadline-plus-10m",
        ),
        pytest.param(
            {"jobs": [k8s_job("train", labels={JOB_GROUP_LABEL: "gpu"}, annotations={JOB_TTL_ANNOTATION: "120"})]},
            [("train-gpu-lease", "gpu", "train", "n1", 120, LeaseSource.JOB, ("train",))],
            id="job-ttl-annotation",
        ),
        pytest.param({"jobs": [k8s_job("train", labels={JOB_GROUP_LABEL: "gpu"}, done=True)]}, [], id="finished-job"),
        pytest.param({"jobs": [k8s_job("train")]}, [], id="unlabelled-job-is-not-ours"),
        pytest.param(
            {"caches": [modelcache()], "jobs": [k8s_job("x", owner_uid="mc-1", labels={JOB_GROUP_LABEL: "other"})]},
            [("lora-gpu-lease", "gpu", "lora", "box", 1200, LeaseSource.MODELCACHE, ("x",))],
            id="the-modelcache-wins-over-the-label",
        ),
        pytest.param(
            {"configmaps": [configmap(data={"owner": "old-trainer", "node": "n2"})]},
            [("gpu-lease-gpu", "gpu", "old-trainer", "n2", HOUR, LeaseSource.CONFIGMAP, ())],
            id="legacy-configmap",
        ),
        pytest.param(
            {"configmaps": [configmap()]},
            [("gpu-lease-gpu", "gpu", "gpu-lease-gpu", None, HOUR, LeaseSource.CONFIGMAP, ())],
            id="legacy-configmap-owner-is-its-name",
        ),
    ],
)
def test_carriers_want_a_lease(objects: dict[str, Any], wants: list[Any]) -> None:
    assert wants_of(**objects) == wants


@pytest.mark.parametrize(
    ("objects", "reason"),
    [
        pytest.param(
            {"jobs": [k8s_job("t", labels={JOB_GROUP_LABEL: "gpu"}, suspend=False)]},
            "StartedWithoutGPULease",
            id="a-labelled-job-not-created-suspended-is-warned",
        ),
        pytest.param(
            {"jobs": [k8s_job("t", labels={JOB_GROUP_LABEL: "gpu"}, annotations={JOB_TTL_ANNOTATION: "10"})]},
            "InvalidGPULeaseTTL",
            id="a-ttl-annotation-under-60",
        ),
        pytest.param(
            {"caches": [modelcache(lease={"group": "gpu", "ttlSeconds": 5})], "jobs": [k8s_job("x", owner_uid="mc-1")]},
            "InvalidGPULease",
            id="an-invalid-gpuLease",
        ),
        pytest.param(
            {"configmaps": [configmap(data={"owner": "has space"})]}, "InvalidGPULease", id="a-bad-legacy-owner"
        ),
    ],
)
def test_carriers_that_cannot_have_a_lease_are_warned(objects: dict[str, Any], reason: str) -> None:
    _, notes = carrier_wants(
        caches=objects.get("caches", []),
        jobs=objects.get("jobs", []),
        configmaps=objects.get("configmaps", []),
        default_ttl=HOUR,
    )
    assert [(n.type, n.reason) for n in notes] == [(EventType.WARNING, reason)]


def test_an_admitted_job_is_not_warned_as_started_without_its_lease() -> None:
    admitted = k8s_job(
        "t", labels={JOB_GROUP_LABEL: "gpu"}, suspend=False, annotations={ADMITTED_ANNOTATION: "t-gpu-lease"}
    )
    _, notes = carrier_wants(caches=[], jobs=[admitted], configmaps=[], default_ttl=HOUR)
    assert notes == []


# ------------------------------------------------------------------------------------------ Kubernetes: the plan


def gpulease_obj(
    name: str,
    *,
    group: str = "gpu",
    owner: str = "trainer",
    uid: str = "gl-1",
    source: LeaseSource | None = None,
    owned_by: str | None = None,
    status: dict[str, Any] | None = None,
    created: str = "2026-06-01T11:00:00Z",
    namespace: str = "default",
    ttl: int | None = 600,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "uid": uid, "creationTimestamp": created}
    if source is not None:
        metadata["labels"] = {MANAGED_BY_LABEL: MANAGER, SOURCE_LABEL: source.value}
    if owned_by is not None:
        metadata["ownerReferences"] = [{"uid": owned_by, "kind": "Job", "name": "x"}]
    spec: dict[str, Any] = {"group": group, "owner": owner}
    if ttl is not None:
        spec["ttlSeconds"] = ttl
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPULease",
        "metadata": metadata,
        "spec": spec,
        "status": status or {},
    }


def plan(
    *,
    gpuleases: list[dict[str, Any]] = (),  # type: ignore[assignment]
    rows: list[Lease] = (),  # type: ignore[assignment]
    jobs: list[dict[str, Any]] = (),  # type: ignore[assignment]
    caches: list[dict[str, Any]] = (),  # type: ignore[assignment]
    configmaps: list[dict[str, Any]] = (),  # type: ignore[assignment]
    groups: frozenset[str] = frozenset({"gpu"}),
    memory_per_device: dict[str, int] | None = None,
) -> KubePlan:
    return plan_kubernetes(
        KubeWorld(
            gpuleases=list(gpuleases),
            caches=list(caches),
            jobs=list(jobs),
            configmaps=list(configmaps),
            rows={row.name: row for row in rows},
            known_groups=groups,
            now=NOW,
            default_ttl=HOUR,
            refresh=timedelta(seconds=30),
            memory_per_device=memory_per_device or {},
        )
    )


def statuses(result: KubePlan) -> dict[str, dict[str, Any]]:
    return {name: status for _, name, status in result.statuses}


def test_a_carrier_without_its_gpulease_gets_one_owner_referenced_to_it() -> None:
    result = plan(jobs=[k8s_job("train", uid="job-7", labels={JOB_GROUP_LABEL: "gpu"})])
    (body,) = result.create
    assert body["metadata"]["name"] == "train-gpu-lease"
    assert body["metadata"]["ownerReferences"] == [
        {"apiVersion": "batch/v1", "kind": "Job", "name": "train", "uid": "job-7"}
    ]
    assert body["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGER, SOURCE_LABEL: "job"}
    assert body["spec"] == {"group": "gpu", "owner": "train", "node": "n1", "ttlSeconds": HOUR}
    assert not result.admit


def test_a_new_gpulease_is_acquired_when_its_group_is_free() -> None:
    result = plan(gpuleases=[gpulease_obj("mine", uid="gl-9")])
    (acquire,) = result.acquire
    assert (acquire.lease.name, acquire.lease.group, acquire.lease.owner) == ("mine", "gpu", "trainer")
    assert (acquire.lease.source, acquire.lease.resource_uid, acquire.lease.ttl_seconds) == (
        LeaseSource.GPULEASE,
        "gl-9",
        600,
    )
    assert acquire.lease.acquired_at == NOW


def test_a_gpulease_with_memory_is_acquired_with_it_and_shows_the_device_reserved() -> None:
    obj = gpulease_obj("mine", uid="gl-9")
    obj["spec"]["memory"] = "4Gi"
    (acquire,) = plan(gpuleases=[obj]).acquire
    assert acquire.lease.memory == 4 << 30
    held = dataclasses.replace(acquire.lease, device=1)
    assert lease_status(held)["device"] == 1
    assert "device" not in lease_status(dataclasses.replace(held, memory=None)), "a whole-group lease has none"


def test_a_gpulease_asking_more_memory_than_one_device_holds_waits_with_a_warning_and_is_never_acquired() -> None:
    # What the REST API refuses with 422 (a reservation that can never fit on one device of a declared capacity).
    obj = gpulease_obj("big", uid="gl-9")
    obj["spec"]["memory"] = "30Gi"
    result = plan(gpuleases=[obj], memory_per_device={"gpu": 24 << 30})
    assert not result.acquire
    assert statuses(result)["big"]["phase"] == "Pending"
    assert statuses(result)["big"]["message"].startswith(
        f"invalid spec: spec.memory: {30 << 30} bytes is more than one device of group gpu holds"
    )
    assert [(n.kind, n.reason) for n in result.notes] == [("GPULease", "InvalidSpec")]
    # At most one device's memory, or a group that declares no capacity (the whole group is leased): acquired.
    for fits in ("24Gi", "8Gi"):
        obj["spec"]["memory"] = fits
        assert [a.lease.name for a in plan(gpuleases=[obj], memory_per_device={"gpu": 24 << 30}).acquire] == ["big"]
    obj["spec"]["memory"] = "30Gi"
    assert [a.lease.name for a in plan(gpuleases=[obj]).acquire] == ["big"]


def test_gpuleases_for_a_held_group_wait_pending_and_the_oldest_goes_first() -> None:
    holder = lease("first", owner="alice", uid="gl-1", held=True)
    result = plan(
        gpuleases=[
            gpulease_obj("first", owner="alice", uid="gl-1"),
            gpulease_obj("late", owner="bob", uid="gl-3", created="2026-06-01T11:30:00Z"),
            gpulease_obj("early", owner="carol", uid="gl-2", created="2026-06-01T11:10:00Z"),
        ],
        rows=[holder],
    )
    assert not result.acquire
    pending = statuses(result)
    assert pending["early"]["phase"] == pending["late"]["phase"] == "Pending"
    assert pending["early"]["message"].startswith("waiting: group gpu is leased by first (owner alice, held, expires")
    assert pending["early"]["acquiredAt"] is None  # a merge patch that removes the lease times

    freed = plan(
        gpuleases=[
            gpulease_obj("late", owner="bob", uid="gl-3", created="2026-06-01T11:30:00Z"),
            gpulease_obj("early", owner="carol", uid="gl-2", created="2026-06-01T11:10:00Z"),
        ]
    )
    assert [a.lease.name for a in freed.acquire] == ["early"]
    assert statuses(freed)["late"]["message"] == "waiting: group gpu is being acquired by an older GPULease"


def test_a_gpulease_for_an_unknown_group_waits_with_a_warning_naming_it() -> None:
    result = plan(gpuleases=[gpulease_obj("typo", group="gpus")])
    assert not result.acquire
    assert statuses(result)["typo"]["message"].startswith("group 'gpus' is not a GPU group")
    assert [(n.kind, n.reason) for n in result.notes] == [("GPULease", "UnknownGroup")]


def test_a_held_gpulease_shows_its_lease_and_a_carriers_is_renewed_every_refresh() -> None:
    row = lease(
        "train-gpu-lease",
        owner="train",
        uid="gl-1",
        source=LeaseSource.JOB,
        renewed_at=NOW - timedelta(seconds=20),
        held=True,
    )
    job = k8s_job(
        "train", uid="job-1", labels={JOB_GROUP_LABEL: "gpu"}, suspend=False, annotations={ADMITTED_ANNOTATION: "x"}
    )
    obj = gpulease_obj("train-gpu-lease", owner="train", uid="gl-1", source=LeaseSource.JOB, owned_by="job-1", ttl=HOUR)
    obj["spec"]["node"] = "n1"
    result = plan(gpuleases=[obj], rows=[row], jobs=[job])
    (update,) = result.update
    assert (
        update.renewed and update.lease.renew_time == NOW and update.lease.expires_at == NOW + timedelta(seconds=HOUR)
    )
    status = statuses(result)["train-gpu-lease"]
    assert status == {
        "acquiredAt": "2026-06-01T11:59:00Z",
        "expiresAt": "2026-06-01T13:00:00Z",
        "renewTime": "2026-06-01T12:00:00Z",
        "phase": "Held",
        "message": "parked",
    }
    # a user's GPULease (no carrier) is not renewed by the lease manager: it lapses at its TTL unless renewed
    user = lease("mine", uid="gl-2", source=LeaseSource.GPULEASE, renewed_at=NOW - timedelta(seconds=20))
    assert not plan(gpuleases=[gpulease_obj("mine", uid="gl-2")], rows=[user]).update


@pytest.mark.parametrize(
    ("objects", "rows", "released", "deleted", "created"),
    [
        pytest.param(
            [],
            [lease("gone", uid="gl-1", source=LeaseSource.GPULEASE)],
            ["gone"],
            [],
            [],
            id="deleting-a-gpulease-releases-its-lease",
        ),
        pytest.param(
            [gpulease_obj("gone", uid="gl-2")],
            [lease("gone", uid="gl-1", source=LeaseSource.GPULEASE)],
            ["gone"],
            [],
            [],
            id="a-gpulease-made-again-under-the-same-name-is-a-new-request",
        ),
        pytest.param([], [lease("api-lease")], [], [], ["api-lease"], id="an-api-lease-gets-a-mirror"),
        pytest.param(
            [gpulease_obj("api-lease", source=LeaseSource.API)],
            [],
            [],
            ["api-lease"],
            [],
            id="a-mirror-without-its-lease-is-deleted",
        ),
        pytest.param(
            [gpulease_obj("old", status={"acquiredAt": "2026-06-01T10:00:00Z", "phase": "Held"})],
            [],
            [],
            ["old"],
            [],
            id="a-user-gpulease-whose-lease-lapsed-is-deleted",
        ),
        pytest.param(
            [gpulease_obj("train-gpu-lease", source=LeaseSource.JOB, owned_by="job-1")],
            [],
            [],
            ["train-gpu-lease"],
            [],
            id="a-carriers-gpulease-it-no-longer-wants-is-deleted",
        ),
    ],
)
def test_gpuleases_and_lease_rows_converge(
    objects: list[dict[str, Any]], rows: list[Lease], released: list[str], deleted: list[str], created: list[str]
) -> None:
    result = plan(gpuleases=objects, rows=rows)
    assert [r.lease.name for r in result.release] == released
    assert [name for _, name, _ in result.delete] == deleted
    assert [body["metadata"]["name"] for body in result.create] == created


def test_a_carriers_lapsed_lease_is_taken_again_while_its_job_runs() -> None:
    job = k8s_job(
        "train", uid="job-1", labels={JOB_GROUP_LABEL: "gpu"}, suspend=False, annotations={ADMITTED_ANNOTATION: "x"}
    )
    obj = gpulease_obj(
        "train-gpu-lease",
        owner="train",
        uid="gl-1",
        source=LeaseSource.JOB,
        owned_by="job-1",
        ttl=HOUR,
        status={"acquiredAt": "2026-06-01T10:00:00Z", "phase": "Held"},
    )
    obj["spec"]["node"] = "n1"
    result = plan(gpuleases=[obj], jobs=[job])
    assert [a.lease.name for a in result.acquire] == ["train-gpu-lease"] and not result.delete


def test_a_gpulease_moved_to_another_group_releases_the_first() -> None:
    row = lease("mine", uid="gl-1", source=LeaseSource.GPULEASE, held=True)
    result = plan(
        gpuleases=[gpulease_obj("mine", group="lab", uid="gl-1")], rows=[row], groups=frozenset({"gpu", "lab"})
    )
    assert [r.reason for r in result.release] == ["its GPULease now names group lab"]
    assert statuses(result)["mine"]["phase"] == "Pending"


def test_a_lease_name_taken_in_another_namespace_waits() -> None:
    row = lease("shared-name", namespace="ml", uid="gl-1", source=LeaseSource.GPULEASE)
    theirs = gpulease_obj("shared-name", uid="gl-1", namespace="ml")
    result = plan(gpuleases=[theirs, gpulease_obj("shared-name", uid="gl-2")], rows=[row])
    assert statuses(result)["shared-name"]["message"] == "waiting: the lease name shared-name is taken by namespace ml"
    assert not result.acquire and not result.release


def test_an_api_mirror_follows_its_lease_row() -> None:
    row = dataclasses.replace(lease("carol-gpu-lease", ttl=900), resource_uid="gl-1")
    mirror = gpulease_obj("carol-gpu-lease", uid="gl-1", source=LeaseSource.API, ttl=600)
    result = plan(gpuleases=[mirror], rows=[row])
    assert result.patch_spec == [
        ("default", "carol-gpu-lease", {"group": "gpu", "owner": "trainer", "ttlSeconds": 900})
    ]
    assert not result.update and not result.release


@pytest.mark.parametrize(
    ("held", "admitted"),
    [pytest.param(False, [], id="suspended-while-parking"), pytest.param(True, ["train"], id="started-once-held")],
)
def test_a_suspended_job_starts_only_once_its_lease_is_held(held: bool, admitted: list[str]) -> None:
    job = k8s_job("train", uid="job-1", labels={JOB_GROUP_LABEL: "gpu"})
    row = lease("train-gpu-lease", owner="train", uid="gl-1", source=LeaseSource.JOB, held=held, renewed_at=NOW)
    obj = gpulease_obj("train-gpu-lease", owner="train", uid="gl-1", source=LeaseSource.JOB, owned_by="job-1", ttl=HOUR)
    obj["spec"]["node"] = "n1"
    result = plan(gpuleases=[obj], rows=[row], jobs=[job])
    assert [job for _, job, _ in result.admit] == admitted
    reasons = {n.reason for n in result.notes if n.kind == "Job"}
    assert reasons == ({"GPULeaseHeld"} if held else {"WaitingForGPULease"})


# ------------------------------------------------------------------------------------------ settings, metrics


@pytest.mark.parametrize(
    ("env", "message"),
    [
        pytest.param(
            {"FLEXINFER_LEASE_REFRESH_INTERVAL": "1m"},
            "FLEXINFER_LEASE_REFRESH_INTERVAL must be above 0 and below 60s",
            id="refresh-not-below-the-minimum-ttl",
        ),
        pytest.param(
            {"FLEXINFER_LEASE_DEFAULT_TTL": "30s"},
            "FLEXINFER_LEASE_DEFAULT_TTL: must be at least 60s",
            id="default-ttl-under-60s",
        ),
    ],
)
def test_bad_lease_settings_stop_the_start_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(SettingsError, match=message):
        load_settings(LeaseManagerSettings)


def test_only_the_lease_manager_exposes_the_seeds_lease_metrics() -> None:
    script = (
        "import flexinfer_scheduler.main, flexinfer_proxy.main, flexinfer_actuator.main\n"
        "from prometheus_client import generate_latest\n"
        "print(b'flexinfer_gpu_lease' in generate_latest())\n"
        "import flexinfer_lease_manager.main\n"
        "text = generate_latest()\n"
        "print(b'flexinfer_gpu_lease_active' in text, b'flexinfer_gpu_lease_acquired_total' in text)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.split() == ["False", "True", "True"]
