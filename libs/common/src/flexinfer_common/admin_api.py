"""The bodies of the admin APIs (docs/reference.md section 4), as pydantic models shared by the services (their
``response_model``, so ``/openapi.json`` documents every body) and the CLI (which reads answers through them)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from flexinfer_common.enums import LeasePhase
from flexinfer_common.manifests import MAX_DURATION_SECONDS, KubeName, Memory, Model


class _Body(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class ModelList(_Body):
    """``GET /api/v1/models``: each Model is its manifest with ``status``, as Kubernetes returns it."""

    items: list[Model]


class ModelRef(_Body):
    namespace: str
    name: str


class GroupLease(_Body):
    name: str
    owner: str
    expires_at: datetime | None = Field(None, alias="expiresAt")
    memory: int | None = Field(None, description="A lease with memory: the bytes it frees on one device")
    device: int | None = Field(
        None, description="A lease with memory in a group with a capacity: the device reserved for it"
    )


class MemberRequests(_Body):
    """One member's requests as the scheduler counts them (summed over the proxies)."""

    waiting: int = 0
    in_flight: int = Field(0, alias="inFlight")


class GroupMember(_Body):
    namespace: str
    name: str
    priority: int = 0
    phase: str | None = None
    state: str | None = None
    queue_position: int | None = Field(None, alias="queuePosition")
    last_active_time: datetime | None = Field(None, alias="lastActiveTime")
    preempted_at: datetime | None = Field(None, alias="preemptedAt")
    preempted_by: str | None = Field(None, alias="preemptedBy")
    message: str | None = Field(None, description="The member's status.message: what it waits for, until when")
    requests: MemberRequests | None = None
    memory: MemberMemory | None = Field(None, description="A group with a capacity: what the model holds when loaded")
    placement: Placement | None = Field(None, description="A group with a capacity: the devices it holds now")


class MemberMemory(_Body):
    bytes: int
    source: Literal["declared", "estimated", "measured", "whole-device"] = Field(
        description="declared (spec.gpu.memory), estimated (from the size of local weights at spec.source: 1.2 x "
        "the weights + 512 MiB), measured (local mode with a GPU: it was measured to hold more than either), or "
        "whole-device (neither: the model takes a device)"
    )


class Placement(_Body):
    devices: list[int]


class GroupCapacity(_Body):
    devices: int
    memory_per_device: int = Field(alias="memoryPerDevice")


class DeviceUse(_Body):
    index: int
    used_bytes: int = Field(alias="usedBytes", description="Memory of its models not confirmed parked")
    free_bytes: int = Field(alias="freeBytes")
    models: list[ModelRef] = Field(default_factory=list)


class GroupElection(_Body):
    """Why the leader leads, as the election decides at the time of the answer."""

    leader: ModelRef | None = None
    reason: str = Field(examples=["cooldown"])


class Group(_Body):
    """A shared-GPU group: who is active, in which state, and its members."""

    name: str
    policy: Literal["v1alpha2", "v1alpha1"]
    scheduling: Literal["flexinfer", "seed"] | None = Field(
        None,
        description="A v1alpha2 group's election: its GPUGroup's spec.scheduling, else FLEXINFER_SCHEDULING_POLICY; "
        "none for a v1alpha1 group",
    )
    election: GroupElection | None = None
    active_model: ModelRef | None = Field(None, alias="activeModel")
    state: str = Field(examples=["Serving"], description="Idle, Loading, Serving, Swapping or Leased")
    cooldown_remaining_seconds: float = Field(0.0, alias="cooldownRemainingSeconds")
    lease: GroupLease | None = None
    models: list[GroupMember] = Field(default_factory=list)
    capacity: GroupCapacity | None = Field(None, description="Its GPUGroup's spec.capacity (none: one model at a time)")
    devices: list[DeviceUse] | None = None
    resident_models: list[ModelRef] | None = Field(None, alias="residentModels", description="The models it holds")


class GroupList(_Body):
    items: list[Group]


class Swap(_Body):
    """One swap of a group's active model; ``phases`` holds the seconds spent in each finished phase."""

    id: str | None = None
    group: str
    from_model: str | None = Field(None, alias="fromModel", examples=["default/qwen3-8b"])
    to_model: str | None = Field(None, alias="toModel", examples=["default/llama-3-8b"])
    reason: str
    phase: str | None = None
    started_at: datetime | None = Field(None, alias="startedAt")
    finished_at: datetime | None = Field(None, alias="finishedAt")
    phases: dict[str, float] = Field(default_factory=dict)
    outcome: Literal["ready", "failed", "aborted"] | None = Field(
        None, description="How the swap ended (null while it runs): ready, failed (its model did not load), aborted"
    )
    message: str | None = Field(None, description="Why it failed or was aborted")


class SwapList(_Body):
    items: list[Swap]


class Lease(_Body):
    """A GPU lease (the lease manager's API): it holds its group until ``expiresAt`` unless renewed; ``phase`` is
    ``Parking`` until every serving member of the group is parked, then ``Held``."""

    name: str
    namespace: str | None = Field(None, description="Where its GPULease lives (Kubernetes mode)")
    group: str
    owner: str
    node: str | None = None
    ttl_seconds: int | None = Field(None, alias="ttlSeconds")
    acquired_at: datetime | None = Field(None, alias="acquiredAt")
    expires_at: datetime | None = Field(None, alias="expiresAt")
    renew_time: datetime | None = Field(None, alias="renewTime")
    phase: LeasePhase | None = Field(None, examples=["Held"])
    message: str = Field("", description="What it waits for, or that the group is parked")
    held_at: datetime | None = Field(None, alias="heldAt", description="When every member was first seen parked")
    source: str | None = Field(None, description="Who asked for it: api, gpulease, modelcache, job or configmap")
    memory: int | None = Field(
        None, description="Bytes to free on one device of a group with a capacity (None: the whole group)"
    )
    device: int | None = Field(
        None,
        description="A lease with memory: the device of the group reserved for it (its index in the group's "
        "capacity; None: not chosen yet, or the lease holds the whole group)",
    )


class _Request(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


def _ttl_field(description: str) -> Any:
    """A request's optional ``ttlSeconds``, at most 30 days."""
    return Field(None, alias="ttlSeconds", le=MAX_DURATION_SECONDS, description=description)


class LeaseAcquire(_Request):
    """``POST /api/v1/leases``: take a group's GPU."""

    group: KubeName = Field(description="The shared GPU group to hold (a Model's spec.gpu.shared, or a GPUGroup)")
    owner: str = Field(description="Who holds it; the group's models show preemptedBy gpu-lease/<owner>")
    node: KubeName | None = Field(None, description="The node the work runs on (shown, not enforced)")
    ttl_seconds: int | None = _ttl_field("Seconds it holds without a renewal (min 60, at most 30 days); default 1h")
    # (the lease's own name and namespace are checked by the lease manager, code invalid_lease)
    name: str | None = Field(None, description="The lease's name; default <owner>-gpu-lease")
    namespace: str | None = Field(None, description="Where its GPULease lives in Kubernetes mode")
    memory: Memory | None = Field(
        None,
        description="A Kubernetes quantity (4Gi) or bytes: in a group with a capacity, free only this much on one "
        "device (the cheapest models to evict go); without it, or in a group without a capacity, the whole group "
        "parks",
        examples=["4Gi"],
    )


class LeaseRenewal(_Request):
    """``POST /api/v1/leases/{name}/renew``: ``expiresAt`` = now + the TTL (a new one when given)."""

    owner: str | None = Field(None, description="When given, the lease must be this owner's")
    ttl_seconds: int | None = _ttl_field("A new TTL (min 60, at most 30 days), from now on")


class LeaseList(_Body):
    items: list[Lease]


class QueueInfo(_Body):
    """Requests waiting at a proxy for one model (``GET /api/v1/queues`` of the proxy)."""

    namespace: str
    model: str
    queued: int = 0
    oldest_wait_seconds: float = Field(0.0, alias="oldestWaitSeconds")


class QueueList(_Body):
    items: list[QueueInfo]
