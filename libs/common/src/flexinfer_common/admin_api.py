"""The bodies of the admin APIs (CONTRACT section 4), as pydantic models shared by the services (their
``response_model``, so ``/openapi.json`` documents every body) and the CLI (which reads answers through them)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from flexinfer_common.enums import LeasePhase
from flexinfer_common.manifests import Model


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


class Group(_Body):
    """A shared-GPU group: who is active, in which state, and its members."""

    name: str
    policy: Literal["v1alpha2", "v1alpha1"]
    active_model: ModelRef | None = Field(None, alias="activeModel")
    state: str = Field(examples=["Serving"], description="Idle, Loading, Serving, Swapping or Leased")
    cooldown_remaining_seconds: float = Field(0.0, alias="cooldownRemainingSeconds")
    lease: GroupLease | None = None
    models: list[GroupMember] = Field(default_factory=list)


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
    message: str | None = None


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


class _Request(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class LeaseAcquire(_Request):
    """``POST /api/v1/leases``: take a group's GPU."""

    group: str = Field(description="The shared GPU group to hold (a Model's spec.gpu.shared, or a GPUGroup)")
    owner: str = Field(description="Who holds it; the group's models show preemptedBy gpu-lease/<owner>")
    node: str | None = Field(None, description="The node the work runs on (shown, not enforced)")
    ttl_seconds: int | None = Field(
        None, alias="ttlSeconds", description="Seconds it holds without a renewal (min 60); default 1h"
    )
    name: str | None = Field(None, description="The lease's name; default <owner>-gpu-lease")
    namespace: str | None = Field(None, description="Where its GPULease lives in Kubernetes mode")


class LeaseRenewal(_Request):
    """``POST /api/v1/leases/{name}/renew``: ``expiresAt`` = now + the TTL (a new one when given)."""

    owner: str | None = Field(None, description="When given, the lease must be this owner's")
    ttl_seconds: int | None = Field(None, alias="ttlSeconds", description="A new TTL (min 60), from now on")


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
