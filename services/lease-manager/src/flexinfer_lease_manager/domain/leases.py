"""GPU leases as pure decisions (the seed's "Training on a shared card"): what a lease is, when it lapses, how it is
renewed, what makes a request for one invalid, and when it is held. No I/O and no clock: ``now`` is an argument.

A lease holds its group from the moment it is acquired (the scheduler then elects no leader for the group, so every
serving member parks); it is ``Held`` once every serving member is seen parked, and it lapses at ``expires_at``
unless renewed (the seed's TTL backstop: a dead lease manager, or a killed ``flexinfer lease run``, strands nothing).

A lease with ``memory`` (GPULease ``spec.memory``) in a group with a capacity holds only that many bytes on one
device: the scheduler parks only what must go to free them, and names the device in its group status; the lease is
``Held`` once the scheduler says that much is confirmed free there. In a group without a capacity it holds the whole
group, as any other lease.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from flexinfer_common.clock import rfc3339
from flexinfer_common.enums import LeasePhase, ModelPhase
from flexinfer_common.manifests import MIN_LEASE_TTL_SECONDS, OWNER_PATTERN
from flexinfer_common.messages import LeaseRef

MAX_NAME = 253
_OWNER = re.compile(OWNER_PATTERN)
_DNS_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_NOT_DNS = re.compile(r"[^a-z0-9.-]+")
NAME_SUFFIX = "-gpu-lease"


class LeaseSource(StrEnum):
    """Who asked for a lease."""

    API = "api"  # POST /api/v1/leases (flexinfer lease acquire|run, flexinfer apply of a GPULease)
    GPULEASE = "gpulease"  # a GPULease written in Kubernetes (kubectl apply)
    MODELCACHE = "modelcache"  # a finetune Job of a ModelCache with spec.finetune.gpuLease
    JOB = "job"  # a Job labelled ai.flexinfer/gpu-lease-group
    CONFIGMAP = "configmap"  # a legacy ConfigMap gpu-lease-<group>


@dataclass(frozen=True)
class Lease:
    name: str
    namespace: str
    group: str
    owner: str
    node: str | None
    ttl_seconds: int
    acquired_at: datetime
    expires_at: datetime
    renew_time: datetime
    source: LeaseSource = LeaseSource.API
    phase: LeasePhase = LeasePhase.PARKING
    message: str = ""
    held_at: datetime | None = None
    resource_uid: str | None = None
    memory: int | None = None  # bytes to free on one device (None: the whole group)
    device: int | None = None  # the device the scheduler reserved them on (None: not yet, or the whole group)

    @property
    def holder(self) -> str:
        """What the group's members show as ``preemptedBy``."""
        return f"gpu-lease/{self.owner}"

    @property
    def ref(self) -> LeaseRef:
        return LeaseRef(name=self.name, owner=self.owner, acquired_at=self.acquired_at)


def new_lease(
    *,
    name: str,
    namespace: str,
    group: str,
    owner: str,
    node: str | None,
    ttl_seconds: int,
    source: LeaseSource,
    now: datetime,
    resource_uid: str | None = None,
    memory: int | None = None,
) -> Lease:
    return Lease(
        name=name,
        namespace=namespace,
        group=group,
        owner=owner,
        node=node,
        ttl_seconds=ttl_seconds,
        acquired_at=now,
        expires_at=now + timedelta(seconds=ttl_seconds),
        renew_time=now,
        source=source,
        message=f"freeing {memory} bytes on one device of group {group}"
        if memory is not None
        else f"parking the serving models of group {group}",
        resource_uid=resource_uid,
        memory=memory,
    )


def lease_is_expired(lease: Lease, now: datetime) -> bool:
    """The election ignores a lease once ``now >= expiresAt`` (the seed's words); so does the lease manager."""
    return now >= lease.expires_at


def renewed(lease: Lease, now: datetime, ttl_seconds: int | None = None) -> Lease:
    """``expiresAt`` moves to ``now + TTL`` (a new TTL, when given, from now on)."""
    ttl = ttl_seconds if ttl_seconds is not None else lease.ttl_seconds
    return dataclasses.replace(lease, ttl_seconds=ttl, renew_time=now, expires_at=now + timedelta(seconds=ttl))


def renewal_due(lease: Lease, now: datetime, interval: timedelta) -> bool:
    """A lease the lease manager keeps alive (a running Job's) is renewed once per refresh interval; half of it, so
    a reconcile that comes a little early does not skip a renewal and a quick series of them writes once."""
    return now - lease.renew_time >= interval / 2


def default_lease_name(owner: str) -> str:
    """``<owner>-gpu-lease``, the owner made a Kubernetes name (the seed's ``qwen3-1p7b-lora-gpu-lease``)."""
    base = _NOT_DNS.sub("-", owner.lower()).strip("-.")[: MAX_NAME - len(NAME_SUFFIX)].rstrip("-.")
    return f"{base or 'lease'}{NAME_SUFFIX}"


# ------------------------------------------------------------------------------------------ requests


@dataclass(frozen=True)
class LeaseRequest:
    group: str
    owner: str
    node: str | None = None
    ttl_seconds: int | None = None
    name: str | None = None
    namespace: str | None = None
    memory: int | None = None  # bytes (the API parses the quantity)


class Refusal(StrEnum):
    """Why a lease call changed nothing."""

    INVALID = "invalid_lease"
    UNKNOWN_GROUP = "unknown_group"
    GROUP_LEASED = "group_leased"
    NAME_TAKEN = "lease_name_taken"
    NOT_FOUND = "lease_not_found"
    OWNER_MISMATCH = "owner_mismatch"
    MANAGED_IN_KUBERNETES = "managed_in_kubernetes"


class LeaseRefused(Exception):
    def __init__(self, refusal: Refusal, message: str, holder: Lease | None = None) -> None:
        super().__init__(message)
        self.refusal = refusal
        self.message = message
        self.holder = holder


def oversized_memory(memory: int | None, group: str, memory_per_device: int | None) -> str | None:
    """Why a lease with ``memory`` can never be reserved on one device of ``group`` (None: it can, or the group
    declares no capacity, in which case the whole group is leased)."""
    if memory is None or memory_per_device is None or memory <= memory_per_device:
        return None
    return (
        f"memory: {memory} bytes is more than one device of group {group} holds "
        f"(spec.capacity.memoryPerDevice {memory_per_device} bytes); omit memory to lease the whole group"
    )


def request_problems(
    request: LeaseRequest, *, namespaces: Iterable[str] | None = None, memory_per_device: int | None = None
) -> list[str]:
    """Every problem of a request, each naming its field (empty: valid). ``namespaces``: those a lease may live in
    (Kubernetes mode, watching some namespaces only); None: any. ``memory_per_device``: the group's declared
    capacity per device, when known (a lease with more memory could never be reserved on one device)."""
    problems = []
    if request.memory is not None and request.memory < 1:
        problems.append(f"memory: must be a positive amount of memory (got {request.memory})")
    elif (too_large := oversized_memory(request.memory, request.group, memory_per_device)) is not None:
        problems.append(too_large)
    if not request.group.strip():
        problems.append("group: must not be empty")
    if not _OWNER.match(request.owner) or len(request.owner) > MAX_NAME:
        problems.append(
            f"owner: {request.owner!r} is not a valid owner (letters, digits, '.', '_' and '-', starting and ending "
            "with a letter or digit; it shows as preemptedBy gpu-lease/<owner>)"
        )
    if request.ttl_seconds is not None and request.ttl_seconds < MIN_LEASE_TTL_SECONDS:
        problems.append(f"ttlSeconds: must be at least {MIN_LEASE_TTL_SECONDS} (got {request.ttl_seconds})")
    for field, value in (("name", request.name), ("namespace", request.namespace)):
        if value is not None and (len(value) > MAX_NAME or not _DNS_NAME.match(value)):
            problems.append(f"{field}: {value!r} is not a valid name (lowercase letters, digits, '-' and '.')")
    if namespaces is not None and request.namespace is not None and request.namespace not in set(namespaces):
        problems.append(
            f"namespace: {request.namespace!r} is not watched by the lease manager (FLEXINFER_WATCH_NAMESPACES)"
        )
    return problems


def unknown_group_message(group: str, known: Iterable[str]) -> str:
    names = sorted(known)
    listed = ", ".join(names[:20]) + (", ..." if len(names) > 20 else "") if names else "none yet"
    return (
        f"group {group!r} is not a GPU group: no Model has spec.gpu.shared {group!r} and no GPUGroup is named "
        f"{group!r} (known groups: {listed})"
    )


def group_leased_message(holder: Lease) -> str:
    return (
        f"group {holder.group} is leased by {holder.name} (owner {holder.owner}, {holder.phase.value.lower()}, "
        f"expires {rfc3339(holder.expires_at)})"
    )


# ------------------------------------------------------------------------------------------ parking


@dataclass(frozen=True)
class MemberState:
    """One serving member of the leased group, as the scheduler last wrote its status."""

    namespace: str
    name: str
    phase: str
    preempted_by: str | None


@dataclass(frozen=True)
class ParkVerdict:
    held: bool
    message: str
    device: int | None = None  # a lease with memory: the device the scheduler reserved for it


def park_verdict(lease: Lease, members: Iterable[MemberState], honoured: LeaseRef | None) -> ParkVerdict:
    """Is the group parked for this lease? Held when the scheduler's group status names this very lease (so no
    election that did not see it can still activate a member) and every member shows ``phase: Preempted`` with
    ``preemptedBy: gpu-lease/<owner>`` (the scheduler shows Preempted only once the member is off the GPU)."""
    seen = honoured is not None and honoured.name == lease.name and honoured.acquired_at == lease.acquired_at
    if lease.memory is not None and seen and honoured is not None and honoured.device is not None:
        # a reservation on one device: the scheduler says when that much is confirmed free there
        where = f"device {honoured.device} of group {lease.group}"
        if honoured.free:
            return ParkVerdict(
                True, f"{lease.memory} bytes free on {where}; they are {lease.holder}'s", honoured.device
            )
        return ParkVerdict(False, f"freeing {lease.memory} bytes on {where}", honoured.device)
    members = list(members)
    if not members:
        return ParkVerdict(True, f"group {lease.group} has no serving model to park")
    waiting = [m for m in members if not (m.phase == ModelPhase.PREEMPTED.value and m.preempted_by == lease.holder)]
    if waiting:
        names = ", ".join(f"{m.name} ({m.phase})" for m in sorted(waiting, key=lambda m: (m.name, m.namespace)))
        return ParkVerdict(False, f"waiting for {names} to park")
    if not seen:
        return ParkVerdict(False, f"waiting for the scheduler to honour the lease on group {lease.group}")
    count = f"{len(members)} serving model{'s' if len(members) != 1 else ''}"
    return ParkVerdict(True, f"{count} of group {lease.group} parked; the GPU is {lease.holder}'s")


def with_verdict(lease: Lease, verdict: ParkVerdict, now: datetime) -> Lease:
    """The lease after a park check: Held (``held_at`` the first time) or Parking again, with the message (and, for a
    lease with memory, the device reserved for it)."""
    phase = LeasePhase.HELD if verdict.held else LeasePhase.PARKING
    held_at = lease.held_at if lease.held_at is not None or not verdict.held else now
    return dataclasses.replace(lease, phase=phase, message=verdict.message, held_at=held_at, device=verdict.device)
