"""Which objects want a GPU lease now: the carriers. Pure: the watched objects in; the GPULeases they need (each a
:class:`Want`) and Warnings about carriers that cannot have one out.

A carrier is an object a lease is taken for; its GPULease is owner-referenced to it, so deleting the carrier
garbage-collects the lease (the seed's first backstop). :data:`CARRIER_KINDS` is the table of them: one entry per
kind, saying what it is and how its want is read, in the order they are read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from flexinfer_common.manifests import MIN_LEASE_TTL_SECONDS, V1ALPHA1, ModelCache, describe_validation_error
from flexinfer_common.notes import EventType, Note
from flexinfer_lease_manager.domain.leases import LeaseRequest, LeaseSource, request_problems
from flexinfer_lease_manager.domain.objects import (
    Key,
    Object,
    being_deleted,
    key_of,
    labels_of,
    meta,
    owned_by,
    uid_of,
)

JOB_GROUP_LABEL = "ai.flexinfer/gpu-lease-group"
JOB_TTL_ANNOTATION = "ai.flexinfer/gpu-lease-ttl-seconds"
ADMITTED_ANNOTATION = "ai.flexinfer/admitted-by-gpu-lease"  # set with spec.suspend: false when a Job is admitted
LEGACY_LABEL = "ai.flexinfer/gpu-lease"
HOSTNAME_LABEL = "kubernetes.io/hostname"
FINETUNE_MARGIN_SECONDS = 600  # the seed: "the finetune timeout plus a 10-minute margin"


# ------------------------------------------------------------------------------------------ jobs


def job_finished(job: Object) -> bool:
    """A terminal state: the Job controller set ``Complete`` or ``Failed``."""
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("Complete", "Failed") and condition.get("status") == "True":
            return True
    return False


def job_suspended(job: Object) -> bool:
    return bool((job.get("spec") or {}).get("suspend"))


def _job_node(job: Object) -> str | None:
    template = ((job.get("spec") or {}).get("template") or {}).get("spec") or {}
    node = (template.get("nodeSelector") or {}).get(HOSTNAME_LABEL)
    return str(node) if node else None


def _positive_int(text: Any) -> int | None:
    try:
        value = int(str(text))
    except ValueError:
        return None
    return value if value > 0 else None


# ------------------------------------------------------------------------------------------ wants


@dataclass(frozen=True)
class Carrier:
    """The object a lease is taken for; its GPULease is owner-referenced to it."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str

    def owner_reference(self) -> dict[str, Any]:
        return {"apiVersion": self.api_version, "kind": self.kind, "name": self.name, "uid": self.uid}


def lease_spec(group: str, owner: str, node: str | None, ttl_seconds: int, memory: int | None = None) -> dict[str, Any]:
    """A GPULease's ``spec``, as the lease manager writes it (``memory`` in bytes)."""
    spec: dict[str, Any] = {"group": group, "owner": owner, "ttlSeconds": ttl_seconds}
    if node:
        spec["node"] = node
    if memory is not None:
        spec["memory"] = memory
    return spec


@dataclass(frozen=True)
class Want:
    """A GPULease a carrier needs now; ``jobs``: its suspended Jobs, admitted once the lease is Held."""

    namespace: str
    name: str
    group: str
    owner: str
    node: str | None
    ttl_seconds: int
    source: LeaseSource
    carrier: Carrier
    jobs: tuple[str, ...] = ()

    def spec(self) -> dict[str, Any]:
        return lease_spec(self.group, self.owner, self.node, self.ttl_seconds)


@dataclass(frozen=True)
class Wanted:
    """What one carrier's object asks for: its GPULease's name and spec, and the suspended Jobs the lease admits."""

    name: str
    group: str
    owner: str
    node: str | None
    ttl_seconds: int
    jobs: tuple[str, ...] = ()


@dataclass
class Reading:
    """What the readers share while they read the carriers, in the order of :data:`CARRIER_KINDS`."""

    jobs: Sequence[Object]  # every Job not being deleted: a ModelCache's finetune Jobs are among them
    default_ttl: int
    opted_in: set[str] = field(default_factory=set)  # the ModelCaches that want leases: their Jobs are not carriers
    notes: list[Note] = field(default_factory=list)

    def warn(self, obj: Object, kind: str, reason: str, message: str) -> None:
        namespace, name = key_of(obj)
        self.notes.append(Note(namespace, name, EventType.WARNING, reason, message, kind=kind))


Reader = Callable[[Object, Reading], Wanted | None]


def _read_modelcache(cache: Object, reading: Reading) -> Wanted | None:
    namespace, name = key_of(cache)
    if not ((cache.get("spec") or {}).get("finetune") or {}).get("gpuLease"):
        return None
    try:
        parsed = ModelCache.model_validate(cache)
    except ValidationError as exc:
        message = "spec.finetune.gpuLease is ignored: " + describe_validation_error(exc)
        reading.warn(cache, "ModelCache", "InvalidGPULease", message)
        return None
    finetune = parsed.spec.finetune
    assert finetune is not None and finetune.gpu_lease is not None
    uid = uid_of(cache)
    reading.opted_in.add(uid)
    active = [j for j in reading.jobs if key_of(j)[0] == namespace and owned_by(j, uid) and not job_finished(j)]
    if not active:
        return None  # no finetune Job running or waiting: nothing to hold the GPU for
    ttl = finetune.gpu_lease.ttl_seconds or (
        finetune.timeout_seconds + FINETUNE_MARGIN_SECONDS if finetune.timeout_seconds else reading.default_ttl
    )
    waiting = tuple(sorted(key_of(j)[1] for j in active if job_suspended(j)))
    node = parsed.spec.node_selector.get(HOSTNAME_LABEL)
    return Wanted(f"{name}-gpu-lease", finetune.gpu_lease.group, name, node, ttl, waiting)


def _read_job(job: Object, reading: Reading) -> Wanted | None:
    name = key_of(job)[1]
    group = labels_of(job).get(JOB_GROUP_LABEL)
    if not group or any(owned_by(job, uid) for uid in reading.opted_in) or job_finished(job):
        return None
    ttl = reading.default_ttl
    annotations = meta(job).get("annotations") or {}
    deadline = _positive_int((job.get("spec") or {}).get("activeDeadlineSeconds"))
    if JOB_TTL_ANNOTATION in annotations:
        given = _positive_int(annotations[JOB_TTL_ANNOTATION])
        if given is None or given < MIN_LEASE_TTL_SECONDS:
            message = (
                f"annotation {JOB_TTL_ANNOTATION}={annotations[JOB_TTL_ANNOTATION]!r} is not a whole number "
                f">= {MIN_LEASE_TTL_SECONDS}; the lease uses {reading.default_ttl}s"
            )
            reading.warn(job, "Job", "InvalidGPULeaseTTL", message)
        else:
            ttl = given
    elif deadline is not None:
        ttl = deadline + FINETUNE_MARGIN_SECONDS
    if not job_suspended(job) and ADMITTED_ANNOTATION not in annotations:
        message = (
            f"created without spec.suspend: true, so it may run before group {group} is parked; create it "
            "suspended and it is started once the group is parked"
        )
        reading.warn(job, "Job", "StartedWithoutGPULease", message)
    return Wanted(f"{name}-gpu-lease", group, name, _job_node(job), ttl, (name,) if job_suspended(job) else ())


def _read_configmap(configmap: Object, reading: Reading) -> Wanted | None:
    name = key_of(configmap)[1]
    group = labels_of(configmap).get(LEGACY_LABEL)
    if not group:
        return None
    data = configmap.get("data") or {}
    owner = str(data.get("owner") or name)
    problems = request_problems(LeaseRequest(group=group, owner=owner))
    if problems:
        reading.warn(configmap, "ConfigMap", "InvalidGPULease", "; ".join(problems))
        return None
    node = str(data["node"]) if data.get("node") else None
    return Wanted(name, group, owner, node, reading.default_ttl, ())


@dataclass(frozen=True)
class CarrierKind:
    """One kind of carrier: what it is (its Kubernetes kind, the lease source it is recorded as) and how its want is
    read (``read``: the object -> what it asks for, or None, with Warnings noted on the way)."""

    kind: str
    api_version: str
    source: LeaseSource
    read: Reader
    read_while_deleting: bool  # False: an object being deleted wants nothing


CARRIER_KINDS: tuple[CarrierKind, ...] = (
    # A ModelCache with spec.finetune.gpuLease, while one of its finetune Jobs runs or waits (the seed's finetune
    # flow). Read first: the Jobs it owns are its own, not carriers of their own.
    CarrierKind("ModelCache", V1ALPHA1, LeaseSource.MODELCACHE, _read_modelcache, read_while_deleting=True),
    # A Job labelled ai.flexinfer/gpu-lease-group=<group>, until it reaches a terminal state.
    CarrierKind("Job", "batch/v1", LeaseSource.JOB, _read_job, read_while_deleting=False),
    # A legacy ConfigMap gpu-lease-<group> labelled ai.flexinfer/gpu-lease=<group>.
    CarrierKind("ConfigMap", "v1", LeaseSource.CONFIGMAP, _read_configmap, read_while_deleting=False),
)

CARRIER_SOURCES = frozenset(kind.source for kind in CARRIER_KINDS)


def carrier_wants(
    *, caches: Iterable[Object], jobs: Iterable[Object], configmaps: Iterable[Object], default_ttl: int
) -> tuple[list[Want], list[Note]]:
    """The GPULeases the carriers need now, and Warnings about carriers that cannot have one. Two carriers naming
    the same GPULease: the first read has it."""
    jobs = [j for j in jobs if not being_deleted(j)]
    objects: Mapping[str, Iterable[Object]] = {"ModelCache": caches, "Job": jobs, "ConfigMap": configmaps}
    reading = Reading(jobs=jobs, default_ttl=default_ttl)
    wants: dict[Key, Want] = {}
    for carrier_kind in CARRIER_KINDS:
        for obj in objects[carrier_kind.kind]:
            if being_deleted(obj) and not carrier_kind.read_while_deleting:
                continue
            wanted = carrier_kind.read(obj, reading)
            if wanted is None:
                continue
            namespace, name = key_of(obj)
            carrier = Carrier(carrier_kind.api_version, carrier_kind.kind, namespace, name, uid_of(obj))
            if (namespace, wanted.name) in wants:
                taken = wants[(namespace, wanted.name)].carrier
                message = f"no GPU lease: its GPULease name {wanted.name} is already {taken.kind} {taken.name}'s"
                reading.warn(obj, carrier_kind.kind, "GPULeaseNameTaken", message)
                continue
            wants[(namespace, wanted.name)] = Want(
                namespace,
                wanted.name,
                wanted.group,
                wanted.owner,
                wanted.node,
                wanted.ttl_seconds,
                carrier_kind.source,
                carrier,
                wanted.jobs,
            )
    return list(wants.values()), reading.notes
