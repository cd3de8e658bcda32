"""The GPULease plan: leases in Kubernetes, decided as one plan per reconcile. Pure: the watched objects, the lease
rows and ``now`` in; a :class:`KubePlan` out (GPULeases to create, patch or delete; rows to acquire, renew or
release; statuses to write; Jobs to admit; Events to record). No I/O.

Every lease is a ``GPULease`` resource in Kubernetes mode, and every ``GPULease`` is a lease:

- **Carriers** want one (:mod:`flexinfer_lease_manager.domain.carriers` says which objects are carriers and what
  each wants). Their GPULease is owner-referenced to the carrier, so deleting the carrier garbage-collects it (the
  seed's first backstop); it is deleted when the Job reaches a terminal state.
- A GPULease without ``status.acquiredAt`` is a **request**: it is acquired when its group is free (else it stays
  ``Pending``, and is acquired in creation order when the group frees up).
- A GPULease with a lease row is **held**: its status mirrors the row; a carrier's is renewed every refresh while
  the carrier still wants it (the seed's "refreshes the TTL every reconcile while the Job is Active").
- A lease taken through the REST API gets a **mirror** GPULease; deleting any GPULease releases its lease.
- A suspended Job waiting for its lease is **admitted** (``spec.suspend: false``) once the lease is Held: every
  serving member of the group parked (Kueue's suspend-based admission; the seed's "acquire before launching").
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from flexinfer_common.enums import LeasePhase
from flexinfer_common.manifests import V1ALPHA1, GPULeaseSpec, describe_validation_error
from flexinfer_common.notes import EventType, Note
from flexinfer_lease_manager.domain.carriers import (
    ADMITTED_ANNOTATION,
    CARRIER_SOURCES,
    Carrier,
    Want,
    carrier_wants,
    lease_spec,
)
from flexinfer_lease_manager.domain.leases import (
    Lease,
    LeaseSource,
    group_leased_message,
    new_lease,
    oversized_memory,
    renewal_due,
    renewed,
    unknown_group_message,
)
from flexinfer_lease_manager.domain.objects import (
    Key,
    Object,
    being_deleted,
    key_of,
    kube_time,
    labels_of,
    meta,
    owned_by,
    uid_of,
)

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGER = "flexinfer-lease-manager"
SOURCE_LABEL = "ai.flexinfer/lease-source"


def _gpulease_body(namespace: str, name: str, source: LeaseSource, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": V1ALPHA1,
        "kind": "GPULease",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {MANAGED_BY_LABEL: MANAGER, SOURCE_LABEL: source.value},
        },
        "spec": spec,
    }


def carrier_body(want: Want) -> dict[str, Any]:
    """The GPULease a carrier wants, owner-referenced to it (deleting the carrier garbage-collects it)."""
    body = _gpulease_body(want.namespace, want.name, want.source, want.spec())
    body["metadata"]["ownerReferences"] = [want.carrier.owner_reference()]
    return body


def mirror_body(lease: Lease) -> dict[str, Any]:
    """The GPULease that shows a lease taken through the REST API (its row is the truth)."""
    return _gpulease_body(lease.namespace, lease.name, lease.source, _lease_spec(lease))


def _lease_spec(lease: Lease) -> dict[str, Any]:
    return lease_spec(lease.group, lease.owner, lease.node, lease.ttl_seconds, lease.memory)


# ------------------------------------------------------------------------------------------ the plan


@dataclass(frozen=True)
class Acquire:
    lease: Lease
    carrier: Carrier | None = None


@dataclass(frozen=True)
class Release:
    lease: Lease
    reason: str


@dataclass(frozen=True)
class RowUpdate:
    lease: Lease
    renewed: bool = False


@dataclass
class KubePlan:
    create: list[dict[str, Any]] = field(default_factory=list)
    patch_spec: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)
    delete: list[tuple[str, str, str]] = field(default_factory=list)  # namespace, name, uid (a precondition)
    acquire: list[Acquire] = field(default_factory=list)
    release: list[Release] = field(default_factory=list)
    update: list[RowUpdate] = field(default_factory=list)
    statuses: list[tuple[str, str, dict[str, Any]]] = field(default_factory=list)  # namespace, name, status
    admit: list[tuple[str, str, str]] = field(default_factory=list)  # namespace, Job, the lease admitting it
    notes: list[Note] = field(default_factory=list)


@dataclass(frozen=True)
class KubeWorld:
    gpuleases: Sequence[Object]
    caches: Sequence[Object]
    jobs: Sequence[Object]
    configmaps: Sequence[Object]
    rows: dict[str, Lease]
    known_groups: frozenset[str]
    now: datetime
    default_ttl: int
    refresh: timedelta
    #: the declared spec.capacity.memoryPerDevice (bytes) of the groups GPULeases with memory name, where declared
    memory_per_device: Mapping[str, int] = field(default_factory=dict)


def lease_status(lease: Lease) -> dict[str, Any]:
    status: dict[str, Any] = {
        "acquiredAt": kube_time(lease.acquired_at),
        "expiresAt": kube_time(lease.expires_at),
        "renewTime": kube_time(lease.renew_time),
        "phase": lease.phase.value,
        "message": lease.message,
    }
    if lease.memory is not None:  # the device reserved for it (null: not yet, or the whole group is leased)
        status["device"] = lease.device
    return status


def pending_status(message: str) -> dict[str, Any]:
    # null removes a field in a merge patch: a Pending GPULease has no lease times
    return {
        "acquiredAt": None,
        "expiresAt": None,
        "renewTime": None,
        "phase": LeasePhase.PENDING.value,
        "message": message,
    }


def _status_differs(obj: Object, desired: Mapping[str, Any]) -> bool:
    current = obj.get("status") or {}
    return any(current.get(name) != value for name, value in desired.items())


def _source(obj: Object) -> LeaseSource:
    value = labels_of(obj).get(SOURCE_LABEL)
    if labels_of(obj).get(MANAGED_BY_LABEL) == MANAGER and value in {s.value for s in LeaseSource}:
        return LeaseSource(value)
    return LeaseSource.GPULEASE  # written by someone else (kubectl apply)


def _carrier_made(obj: Object) -> bool:
    return _source(obj) in CARRIER_SOURCES


def _acquired(obj: Object) -> bool:
    return bool((obj.get("status") or {}).get("acquiredAt"))


def _creation(obj: Object) -> tuple[str, str]:
    return (str(meta(obj).get("creationTimestamp") or ""), key_of(obj)[1])


class _Planner:
    def __init__(self, world: KubeWorld) -> None:
        self.world = world
        self.plan = KubePlan()
        self.by_group = {lease.group: lease for lease in world.rows.values()}
        self.claimed: set[str] = set()
        self.pending: dict[Key, str] = {}

    def pend(self, obj: Object, message: str, *, warn: str | None = None) -> None:
        namespace, name = key_of(obj)
        self.pending[(namespace, name)] = message
        status = pending_status(message)
        if _status_differs(obj, status):
            self.plan.statuses.append((namespace, name, status))
        if warn:
            self.plan.notes.append(Note(namespace, name, EventType.WARNING, warn, message, kind="GPULease"))

    def held(self, obj: Object, lease: Lease, spec: GPULeaseSpec, want: Want | None) -> None:
        """A GPULease whose lease holds: follow its spec (or, for the REST API's mirror, the row), renew it while
        its carrier wants it, and show the row in its status."""
        world, namespace, name = self.world, *key_of(obj)
        if lease.source is LeaseSource.API:
            new = lease if lease.resource_uid else dataclasses.replace(lease, resource_uid=uid_of(obj))
            if (obj.get("spec") or {}) != _lease_spec(lease):
                self.plan.patch_spec.append((namespace, name, _lease_spec(lease)))
            self._row(lease, new, renewed=False)
            self._status(obj, new)
            return
        if spec.group != lease.group:
            self.plan.release.append(Release(lease, f"its GPULease now names group {spec.group}"))
            self.pend(obj, f"released from group {lease.group}; acquiring group {spec.group}")
            return
        new = dataclasses.replace(lease, resource_uid=uid_of(obj), owner=spec.owner, node=spec.node, memory=spec.memory)
        ttl = spec.ttl_seconds or world.default_ttl
        renew = ttl != lease.ttl_seconds or (want is not None and renewal_due(lease, world.now, world.refresh))
        if renew:
            new = renewed(new, world.now, ttl)
        self._row(lease, new, renewed=renew)
        self._status(obj, new)

    def _row(self, old: Lease, new: Lease, *, renewed: bool) -> None:
        if new != old:
            self.plan.update.append(RowUpdate(new, renewed=renewed))

    def _status(self, obj: Object, lease: Lease) -> None:
        status = lease_status(lease)
        if _status_differs(obj, status):
            namespace, name = key_of(obj)
            self.plan.statuses.append((namespace, name, status))

    def request(self, obj: Object, spec: GPULeaseSpec, want: Want | None) -> None:
        world, namespace, name = self.world, *key_of(obj)
        if spec.group not in world.known_groups:
            self.pend(obj, unknown_group_message(spec.group, world.known_groups), warn="UnknownGroup")
            return
        too_large = oversized_memory(spec.memory, spec.group, world.memory_per_device.get(spec.group))
        if too_large is not None:  # what the REST API refuses with 422: never acquired, said in the status
            self.pend(obj, "invalid spec: spec." + too_large, warn="InvalidSpec")
            return
        holder = self.by_group.get(spec.group)
        if holder is not None:
            self.pend(obj, "waiting: " + group_leased_message(holder))
            return
        if spec.group in self.claimed:
            self.pend(obj, f"waiting: group {spec.group} is being acquired by an older GPULease")
            return
        self.claimed.add(spec.group)
        lease = new_lease(
            name=name,
            namespace=namespace,
            group=spec.group,
            owner=spec.owner,
            node=spec.node,
            ttl_seconds=spec.ttl_seconds or world.default_ttl,
            source=want.source if want is not None else LeaseSource.GPULEASE,
            now=world.now,
            resource_uid=uid_of(obj),
            memory=spec.memory,
        )
        self.plan.acquire.append(Acquire(lease, want.carrier if want is not None else None))


def plan_kubernetes(world: KubeWorld) -> KubePlan:
    """One reconcile's worth of changes. Level-triggered: whatever this plan leaves undone (a creation the watch
    has not shown yet, an acquisition that lost a race) the next one does."""
    planner = _Planner(world)
    plan = planner.plan
    wants, notes = carrier_wants(
        caches=world.caches, jobs=world.jobs, configmaps=world.configmaps, default_ttl=world.default_ttl
    )
    plan.notes.extend(notes)
    wanted = {(w.namespace, w.name): w for w in wants}
    objects = {key_of(obj): obj for obj in world.gpuleases}
    gone: set[Key] = {key for key, obj in objects.items() if being_deleted(obj)}

    # 1. The carriers' GPULeases: create what is wanted, keep its spec, delete what is no longer wanted.
    for key, want in wanted.items():
        obj = objects.get(key)
        if obj is None:
            plan.create.append(carrier_body(want))
        elif not _carrier_made(obj) or not owned_by(obj, want.carrier.uid):
            if _carrier_made(obj) and key not in gone:  # made for an earlier carrier of that name
                plan.delete.append((*key, uid_of(obj)))
                gone.add(key)
            elif not _carrier_made(obj):
                plan.notes.append(
                    Note(
                        want.carrier.namespace,
                        want.carrier.name,
                        EventType.WARNING,
                        "GPULeaseNameTaken",
                        f"no GPU lease: a GPULease named {want.name} exists and is not FlexInfer's",
                        kind=want.carrier.kind,
                    )
                )
        elif (obj.get("spec") or {}) != want.spec():
            plan.patch_spec.append((*key, want.spec()))
    for key, obj in objects.items():
        if key not in wanted and key not in gone and _carrier_made(obj):
            plan.delete.append((*key, uid_of(obj)))  # its Job ended, or its carrier lost the opt-in
            gone.add(key)

    # 2. Each GPULease against the lease rows.
    rows = world.rows
    matched: set[str] = set()
    for obj in sorted(objects.values(), key=_creation):
        key = key_of(obj)
        if key in gone:
            continue
        namespace, name = key
        wanting = wanted.get(key)
        try:
            spec = GPULeaseSpec.model_validate(obj.get("spec") or {})
        except ValidationError as exc:
            planner.pend(obj, "invalid spec: " + describe_validation_error(exc, "spec."), warn="InvalidSpec")
            continue
        lease = rows.get(name)
        if lease is not None and lease.namespace != namespace:
            planner.pend(obj, f"waiting: the lease name {name} is taken by namespace {lease.namespace}")
            continue
        if lease is not None:
            matched.add(name)
            if lease.resource_uid in (None, uid_of(obj)):
                planner.held(obj, lease, spec, wanting)
            else:  # the GPULease it was acquired for was deleted, and this one made since
                plan.release.append(Release(lease, "its GPULease was deleted"))
            continue
        if _source(obj) is LeaseSource.API or (_acquired(obj) and wanting is None):
            plan.delete.append((*key, uid_of(obj)))  # its lease was released or expired
            continue
        planner.request(obj, spec, wanting)

    # 3. Rows without their GPULease: deleted in Kubernetes (released), or taken through the API (mirrored).
    for name, lease in rows.items():
        if name in matched:
            continue
        if lease.resource_uid is not None:
            plan.release.append(Release(lease, "its GPULease was deleted"))
        elif (lease.namespace, lease.name) not in gone:
            plan.create.append(mirror_body(lease))

    # 4. Admission: a suspended Job starts once every serving member of its group is parked.
    for want in wants:
        if not want.jobs:
            continue
        lease = rows.get(want.name)
        held = lease is not None and lease.namespace == want.namespace and lease.held_at is not None
        for job in want.jobs:
            if held:
                assert lease is not None
                plan.admit.append((want.namespace, job, lease.name))
                message = f"started: group {lease.group} is parked for {lease.holder} (lease {lease.name})"
                plan.notes.append(Note(want.namespace, job, EventType.NORMAL, "GPULeaseHeld", message, kind="Job"))
            else:
                why = lease.message if lease is not None else planner.pending.get((want.namespace, want.name))
                message = f"suspended until group {want.group} is parked for lease {want.name}: " + (
                    why or "acquiring the lease"
                )
                plan.notes.append(
                    Note(want.namespace, job, EventType.NORMAL, "WaitingForGPULease", message, kind="Job")
                )
    return plan


def admission_patch(lease_name: str) -> dict[str, Any]:
    """Start a suspended Job, recording which lease admitted it."""
    return {"metadata": {"annotations": {ADMITTED_ANNOTATION: lease_name}}, "spec": {"suspend": False}}
