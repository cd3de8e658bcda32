"""The scheduler's pure view of a group: members, leases and the group's own state, as of one snapshot."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import Enum
from typing import Any

from flexinfer_common.enums import GroupPolicy, RuntimePhase, ScaleAction, SchedulingPolicy, SwapPhase, SwapReason
from flexinfer_common.keys import ModelKey

# The actuator has not confirmed this model's state since it (re)started: not safe to assume it is parked.
RUNTIME_UNKNOWN = "Unknown"

# An activated model whose runtime is unknown (the actuator restarted) still holds the GPU slot: it is re-activated,
# not replaced, so an actuator restart never hands the GPU to a model the priority gate would have kept waiting.
LOADED_RUNTIME = {RuntimePhase.LOADING.value, RuntimePhase.READY.value, RUNTIME_UNKNOWN}
PARKED_RUNTIME = {None, RuntimePhase.PARKED.value, RuntimePhase.FAILED.value}


@dataclass(frozen=True)
class Member:
    """One model of a group, with everything the election and the swap planner read."""

    key: ModelKey
    priority: int = 0
    last_active_time: datetime | None = None
    preempted_at: datetime | None = None
    preempted_by: str | None = None
    swap_cooldown: timedelta | None = None
    idle_timeout: timedelta | None = None
    force_promotion: bool = False
    promoted_at: datetime | None = None
    # what the actuator last reported, for the command generation it answers
    runtime: str | None = None
    runtime_generation: int = 0
    runtime_message: str = ""
    endpoint: str | None = None
    # what the scheduler last asked for
    desired_action: ScaleAction | None = None
    command_generation: int = 0
    command_issued_at: datetime | None = None
    ready_since: datetime | None = None
    idle_parked_at: datetime | None = None
    failed_at: datetime | None = None
    last_failure: str | None = None
    # since when the member has wanted the GPU without interruption (v1alpha2: requests or demand; v1alpha1: the
    # queue threshold reached): the hysteresis delay and the bounded wait count from here
    demand_since: datetime | None = None
    queued: int = 0  # requests waiting at the proxies (summed over sources)
    in_flight: int = 0  # requests being answered by the model at the proxies (summed over fresh reports)
    max_wait: timedelta | None = None  # spec.gpu.maxWait (None: the group's default)
    # several models on one card: what the model holds when loaded (bytes; None: a whole device in a group with a
    # capacity), how many devices it needs at once, and whether it stays loaded
    memory: int | None = None
    memory_estimated: bool = False  # ``memory`` estimated from the weights' size, not declared
    # what its processes held when last measured (local mode with a GPU); ``memory`` is this where it is larger
    memory_measured: int | None = None
    devices: int = 1
    pinned: bool = False
    # in a group with a capacity: the devices the model was placed on when it was activated (None: not placed), and
    # since when it is being evicted (drained, then parked) to make room for another
    placement: tuple[int, ...] | None = None
    evicting_since: datetime | None = None
    # carried through to what is published
    service_labels: tuple[str, ...] = ()
    observed_generation: int | None = None
    # deleted, waiting to be confirmed parked before its row goes: no leader any more (api-invariants)
    deleting: bool = False
    # moved to another group by a membership change from Kubernetes while it may hold this group's GPU: no leader
    # here any more, and it joins ``moving_to`` once confirmed parked (never scheduled by two groups at once)
    moving_to: str | None = None

    @classmethod
    def of(cls, fields: dict[str, Any]) -> Member:
        """A member from every one of its fields, by name: what a store builds for each model it loads, without
        the frozen dataclass's ``__init__`` (a set per field: a fifth of building a first pass's 10,000 members)."""
        if fields.keys() != _MEMBER_FIELDS:
            raise TypeError(f"Member.of needs every field: {sorted(_MEMBER_FIELDS ^ fields.keys())} differ")
        member = object.__new__(cls)
        member.__dict__.update(fields)
        return member

    @property
    def leaving(self) -> bool:
        """Deleted, or moving to another group: parked here as for a swap, and never this group's leader again."""
        return self.deleting or self.moving_to is not None

    @property
    def runtime_confirmed(self) -> bool:
        """The last report answers the last command (a stale report says nothing about the present, and after an
        actuator restart nothing is known until it reports again, so the command is re-issued)."""
        if self.desired_action is None:
            return True
        return self.runtime != RUNTIME_UNKNOWN and self.runtime_generation >= self.command_generation

    @property
    def loaded(self) -> bool:
        """Holding the GPU or about to: loading or serving for the current command."""
        return self.desired_action == ScaleAction.ACTIVATE and self.runtime in LOADED_RUNTIME

    @property
    def ready(self) -> bool:
        return (
            self.desired_action == ScaleAction.ACTIVATE
            and self.runtime == RuntimePhase.READY
            and self.runtime_confirmed
        )

    @property
    def parked(self) -> bool:
        """Confirmed off the GPU (never started, parked, or failed)."""
        if self.desired_action is None:
            return self.runtime in PARKED_RUNTIME
        return self.runtime_confirmed and self.runtime in PARKED_RUNTIME


def fitting_memory(reference: int | None, measured: int | None) -> int | None:
    """The memory fitting counts for a model: its declared or estimated figure (``reference``), or what it was
    measured to hold where that is more (a smaller measurement never lowers it: the model may grow into it). A model
    with neither takes a whole device, whatever it measured."""
    if reference is None or measured is None:
        return reference
    return max(reference, measured)


def memory_exceeded(reference: int | None, measured: int, previous: int | None) -> bool:
    """A measurement newly above the declared or estimated figure: say so once (a warning event), not at every
    measurement that stays above it."""
    return reference is not None and measured > reference and (previous is None or previous <= reference)


class _Unset(Enum):
    UNSET = "unset"


UNSET = _Unset.UNSET


@dataclass(frozen=True, slots=True)
class MemberPatch:
    """What one pass changes in a member's persisted state; a field left ``UNSET`` is not changed."""

    preempted_at: datetime | _Unset | None = UNSET
    preempted_by: str | _Unset | None = UNSET
    desired_action: ScaleAction | _Unset | None = UNSET
    command_generation: int | _Unset = UNSET
    command_issued_at: datetime | _Unset | None = UNSET
    ready_since: datetime | _Unset | None = UNSET
    idle_parked_at: datetime | _Unset | None = UNSET
    failed_at: datetime | _Unset | None = UNSET
    last_failure: str | _Unset | None = UNSET
    promoted_at: datetime | _Unset | None = UNSET
    demand_since: datetime | _Unset | None = UNSET
    placement: tuple[int, ...] | _Unset | None = UNSET
    evicting_since: datetime | _Unset | None = UNSET
    _changes: dict[str, Any] = field(init=False, repr=False, compare=False)

    # (written for speed: a pass over 10,000 models patches thousands of members, and ``dataclasses.replace`` made
    # patching the largest cost of planning; the fields set are worked out once, when the patch is made)

    def __post_init__(self) -> None:
        changes = {name: v for name in _PATCH_FIELDS if (v := getattr(self, name)) is not UNSET}
        object.__setattr__(self, "_changes", changes)

    def changes(self) -> dict[str, Any]:
        """The fields set, by name (not to be changed by the caller)."""
        return self._changes

    def merge(self, later: MemberPatch) -> MemberPatch:
        """This patch with ``later``'s set fields on top."""
        if not self._changes:
            return later
        return MemberPatch(**{**self._changes, **later._changes})

    def apply(self, member: Member) -> Member:
        """``member`` with this patch's fields (the same object when the patch changes nothing)."""
        changes = self._changes
        if not changes:
            return member
        patched = object.__new__(Member)
        patched.__dict__.update(member.__dict__, **changes)
        return patched


_MEMBER_FIELDS = frozenset(f.name for f in dataclasses.fields(Member))
_PATCH_FIELDS = tuple(f.name for f in dataclasses.fields(MemberPatch) if f.init)
NO_CHANGE = MemberPatch()


@dataclass(frozen=True)
class Lease:
    name: str
    group: str
    owner: str
    expires_at: datetime
    acquired_at: datetime | None = None
    # GPULease spec.memory: bytes to free on one device of a group with a capacity (None: the whole group)
    memory: int | None = None
    # the device its memory was reserved on, as the lease manager recorded it from the group status (None: not yet)
    device: int | None = None

    def is_active(self, now: datetime) -> bool:
        return now < self.expires_at

    @property
    def holder(self) -> str:
        """What the models it parks show as ``preemptedBy``."""
        return f"gpu-lease/{self.owner}"


def lease_is_active(lease: Lease | None, now: datetime) -> bool:
    """The election ignores a lease once ``now >= expiresAt`` (the seed's TTL backstop)."""
    return lease is not None and lease.is_active(now)


def reserves_memory(lease: Lease | None, capacity: Capacity | None, now: datetime) -> bool:
    """An active lease with memory that fits on one device of a group with a capacity is a reservation there
    (``residency.plan_reservation``); any other active lease holds the whole group (no leader at all)."""
    return (
        lease is not None
        and lease.is_active(now)
        and lease.memory is not None
        and capacity is not None
        and lease.memory <= capacity.memory_per_device
    )


@dataclass(frozen=True)
class V1Alpha1Policy:
    """The seed's GPUGroup knobs, in seconds."""

    hysteresis_window: timedelta = timedelta(seconds=10)
    request_queue_threshold: int = 3
    minimum_run_duration: timedelta = timedelta(seconds=30)
    cooldown_after_preemption: timedelta = timedelta(seconds=60)
    drain_timeout: timedelta = timedelta(seconds=60)
    idle_timeout: timedelta = timedelta(seconds=300)


@dataclass(frozen=True)
class Swap:
    id: str
    from_model: ModelKey | None
    to_model: ModelKey | None
    reason: SwapReason
    phase: SwapPhase
    started_at: datetime
    phase_started_at: datetime
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Capacity:
    """A group's card(s) (``spec.capacity``): without one, a group holds one model at a time."""

    devices: int
    memory_per_device: int


@dataclass(frozen=True)
class GroupSnapshot:
    name: str
    members: tuple[Member, ...]
    policy: GroupPolicy = GroupPolicy.V1ALPHA2
    v1alpha1: V1Alpha1Policy | None = None
    active: ModelKey | None = None
    leader_since: datetime | None = None
    swap: Swap | None = None
    lease: Lease | None = None
    scheduling: SchedulingPolicy | None = None  # the group's own spec.scheduling (None: the setting)
    capacity: Capacity | None = None  # spec.capacity (None: one model at a time, as the seed)

    def member(self, key: ModelKey | None) -> Member | None:
        if key is None:
            return None
        for member in self.members:
            if member.key == key:
                return member
        return None
