"""Every message on the bus, as a frozen pydantic model. ``docs/events.md`` is generated from these.

Each class names its subject pattern in ``SUBJECT``. Times are timezone-aware UTC and serialize as RFC 3339.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from flexinfer_common.enums import (
    ModelPhase,
    ParkStrategy,
    RuntimePhase,
    ScaleAction,
    SharedState,
    SwapPhase,
    SwapReason,
)

# Names that become NATS subject tokens and database keys: Kubernetes names (lowercase letters, digits, '-' and '.',
# at most 253 characters). A message naming anything else is rejected as malformed, so no producer can make a
# service publish to a wildcard or an oversized subject.
Name = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")]
# Who sent a message (a proxy or actuator instance id, a producer's name): any printable token, bounded.
Origin = Annotated[str, StringConstraints(max_length=253, pattern=r"^[A-Za-z0-9_.:@/-]*$")]


def _utc(value: datetime) -> datetime:
    if value.tzinfo is UTC:
        return value
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


# Every time in a message: timezone-aware UTC (a naive time is taken as UTC). A validator on these fields only: one
# on every field ("*") ran a Python call per field of every message, 190,000 calls in a scheduler's first pass
# over 10,000 models.
UtcDateTime = Annotated[datetime, AfterValidator(_utc)]


def new_id() -> str:
    return uuid.uuid4().hex


def message_id(origin: str) -> str:
    """The one message-id scheme (JetStream's ``Nats-Msg-Id``, the scheduler's processed-message table):
    ``<origin>:<128 random bits>``. Unique for every message, also across restarts of the same ``origin`` (an
    instance id that survives a restart, such as a pod name, must not make new messages look like old ones).
    Make one per message and pass the same id again only when retrying that same publish."""
    return f"{origin}:{uuid.uuid4().hex}"


def encode(message: BaseModel) -> bytes:
    """A message's body on the bus: its JSON by alias, as bytes. Straight from pydantic's serializer, without
    ``model_dump_json``'s keyword handling and the str round trip (2.1 -> 1.5 us a route; a first pass over 10,000
    models sends 23,000 messages)."""
    return message.__pydantic_serializer__.to_json(message, by_alias=True)


#: The longest a demand message's queued count may stand unrenewed (``validFor``): a day.
MAX_DEMAND_VALID_FOR_SECONDS = 86_400


class Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)

    SUBJECT: ClassVar[str] = ""

    def to_bytes(self) -> bytes:
        return encode(self)


class Demand(Message):
    """Someone wants this model: a proxy with queued or forwarded requests, or an external producer.

    Every demand message refreshes the model's ``lastActiveTime``. ``queued`` is the number of requests waiting
    at this ``source`` (the v1alpha1 queue threshold sums it over sources); ``0`` reports activity only.
    """

    SUBJECT: ClassVar[str] = "flexinfer.demand.<namespace>.<model>"

    model: Name = Field(description="Model name (or namespace/name)", examples=["qwen3-8b"])
    namespace: Name | Literal[""] = Field("", description="Filled from the subject when omitted", examples=["default"])
    queued: int = Field(0, ge=0, description="Requests waiting at this source", examples=[3])
    source: Origin = Field("external", description="Who signals: a proxy instance id, or any producer name")
    time: UtcDateTime | None = Field(None, description="When the demand was seen; the receiver's clock if omitted")
    valid_for: float | None = Field(
        None,
        alias="validFor",
        gt=0,
        le=MAX_DEMAND_VALID_FOR_SECONDS,
        description="Seconds this source's queued count stands without a newer message from it (the scheduler's "
        "queued-count TTL if omitted). A proxy sends three of its demand refresh intervals plus a margin, so its "
        "waiting requests keep their demand whatever the scheduler's own settings are.",
        examples=[35],
    )


class InFlightCount(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    namespace: str
    model: str
    in_flight: int = Field(ge=1, alias="inFlight", description="Requests being forwarded to the model right now")


class InFlightReport(Message):
    """A proxy's requests in flight, per model: every model it is forwarding to now (a model not listed has none).

    Sent when the counts change (at most once per activity report interval) and every interval while any is not
    zero, so the scheduler knows when a draining model has finished what it was answering.
    """

    SUBJECT: ClassVar[str] = "flexinfer.proxy.inflight.<source>"

    source: str = Field(description="The proxy instance (its demand ``source``)")
    models: list[InFlightCount] = Field(default_factory=list)
    time: UtcDateTime


class RuntimeSpec(Message):
    """What the actuator needs to run one model (from the Model manifest)."""

    namespace: Name
    name: Name
    deployment: str | None = None
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)
    port: int | None = None
    readiness_path: str | None = Field(
        None, description="spec.endpoint.readinessPath; unset: the backend preset's (local mode), else /health"
    )
    backend: str | None = Field(None, description="spec.backend: local mode starts its preset without a command")
    source: str | None = Field(None, description="spec.source: the weights a local backend preset loads")
    park_strategy: ParkStrategy = ParkStrategy.SCALE_TO_ZERO
    rendered: bool = Field(
        False, description="Kubernetes mode: the Deployment is rendered by the actuator (it may not exist yet)"
    )
    drain_seconds: float | None = Field(
        None,
        description="How long a parked model may finish in-flight requests before it is killed "
        "(a v1alpha1 group's drainTimeoutSeconds); the actuator's own grace period when unset",
    )
    devices: list[int] | None = Field(
        None,
        description="The devices of its group the model was placed on (a group with a spec.capacity); the actuator "
        "exposes only these to it (CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES). None: the "
        "group holds one model at a time and it sees the whole card",
        examples=[[0]],
    )


WOKEN = "woken from sleep"
"""The message of a ``Ready`` report whose server was woken (parkStrategy Sleep), not started: not a cold start."""


class ScaleCommand(Message):
    """The scheduler tells the actuator to activate or park a model.

    ``generation`` grows with every command for a model; the actuator ignores a command older than one it applied.
    ``leader_epoch`` is the fencing token of the scheduler leader that sent it: the actuator refuses a command with
    an epoch lower than the highest it has seen (a deposed leader's), and judges generations within one epoch.
    """

    SUBJECT: ClassVar[str] = "flexinfer.actuator.command.<namespace>.<model>"

    command_id: str = Field(default_factory=new_id)
    group: str | None = None
    namespace: Name
    model: Name
    action: ScaleAction
    generation: int = Field(ge=0)
    swap_id: str | None = None
    runtime: RuntimeSpec
    issued_at: UtcDateTime
    leader_epoch: int = Field(
        0,
        ge=0,
        description="The sending scheduler leader's epoch (taken from PostgreSQL when it acquired the leader lock); "
        "0 from a scheduler without fencing",
    )


class RuntimeStatus(Message):
    """The actuator reports what it observes about a model (process or Deployment)."""

    SUBJECT: ClassVar[str] = "flexinfer.actuator.status.<namespace>.<model>"

    namespace: Name
    model: Name
    phase: RuntimePhase
    generation: int = Field(ge=0, description="The command generation this observation answers")
    endpoint: str | None = Field(
        None, description="Base URL to forward to once Ready", examples=["http://127.0.0.1:9001"]
    )
    message: str = ""
    time: UtcDateTime
    actuator: Origin = ""
    pid: int | None = None
    gpu_memory: int | None = Field(
        None,
        ge=0,
        description="Local mode on a machine with a GPU (NVML or amdsmi): the GPU memory the model's process and its "
        "children hold, in bytes, on the device where they hold most; measured when it becomes Ready and again while "
        "it runs. None: not measured",
        examples=[6_442_450_944],
    )


class ActuatorHello(Message):
    """An actuator (re)started and runs nothing yet: the scheduler re-issues the commands it wants applied."""

    SUBJECT: ClassVar[str] = "flexinfer.actuator.hello.<instance>"

    actuator: Origin
    backend: str
    time: UtcDateTime
    gpu_devices: list[int] = Field(
        default_factory=list,
        description="Local mode: the total memory of each GPU device of this machine in bytes, by index, as NVML or "
        "amdsmi reports it (empty: no GPU). A v1alpha2 shared group without a declared spec.capacity gets this "
        "capacity: as many devices, each of the smallest one's memory",
        examples=[[25_769_803_776]],
    )


class SharedGroupStatus(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    state: SharedState | None = None
    queue_position: int | None = Field(None, alias="queuePosition")
    preempted_at: UtcDateTime | None = Field(None, alias="preemptedAt")


class MemoryStatus(BaseModel):
    """What a model holds on each of its devices when loaded, and where the figure comes from."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    bytes: int = Field(ge=0)
    source: Literal["declared", "estimated", "measured"] = Field(
        description="declared (spec.gpu.memory), estimated (from the size of local weights at spec.source) or "
        "measured (local mode with a GPU: what its processes held when last measured)"
    )


class PlacementStatus(BaseModel):
    """The devices of its group a loaded model holds (a group with a capacity)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    devices: list[int]


class ModelStatus(BaseModel):
    """A Model's ``status``, as Kubernetes and the admin API show it (Kubernetes adds ``conditions``)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    phase: ModelPhase = ModelPhase.PENDING
    last_active_time: UtcDateTime | None = Field(None, alias="lastActiveTime")
    shared_group: SharedGroupStatus = Field(default_factory=SharedGroupStatus, alias="sharedGroup")
    preempted_by: str | None = Field(None, alias="preemptedBy")
    message: str = ""
    restarts: int = Field(
        0, ge=0, description="How many times the model's server was restarted after it crashed (kubectl's RESTARTS)"
    )
    observed_generation: int | None = Field(
        None,
        alias="observedGeneration",
        description="The Kubernetes metadata.generation of the spec this status reflects (Kubernetes mode)",
    )
    memory: MemoryStatus | None = Field(None, description="Its GPU memory when it declares or has an estimate of it")
    placement: PlacementStatus | None = Field(None, description="The devices it holds while loaded in a capacity group")


class ModelStatusUpdate(Message):
    """The scheduler publishes a Model's new status (the Kubernetes actuator writes it back to the resource)."""

    SUBJECT: ClassVar[str] = "flexinfer.status.model.<namespace>.<model>"

    namespace: Name
    model: Name
    status: ModelStatus
    time: UtcDateTime


class ModelRef(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


class LeaseRef(BaseModel):
    """One GPU lease, as the election that honoured it saw it (``acquired_at`` tells two leases of one name apart)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True, extra="ignore")

    name: str
    owner: str
    acquired_at: UtcDateTime | None = None
    device: int | None = Field(
        None,
        description="A lease with memory in a group with a capacity: the device whose memory is reserved for it "
        "(None: the lease holds the whole group)",
    )
    free: bool = Field(
        False,
        description="A lease with memory: the reserved memory is confirmed free on ``device`` (every model that had "
        "to go is parked) and nothing loads into it while the lease holds",
    )


class GroupStatusUpdate(Message):
    """The scheduler publishes a group's new state (the Kubernetes actuator writes it to the GPUGroup's status)."""

    SUBJECT: ClassVar[str] = "flexinfer.status.group.<group>"

    group: str
    active_model: ModelRef | None = Field(None, description="The member that holds the GPU (or is loading onto it)")
    queue: list[ModelRef] = Field(
        default_factory=list, description="Members waiting for the GPU, in queue order (queuePosition 1, 2, ...)"
    )
    lease: LeaseRef | None = Field(
        None,
        description="The GPU lease the election honoured: no member may run while it holds. The lease manager "
        "reports a lease Held only once the group status names it and every member is parked.",
    )
    time: UtcDateTime


class SpecChange(Message):
    """A Model or GPUGroup was created, changed or deleted where its users write it: in Kubernetes mode the actuator
    watches the resources and hands each change to the scheduler, so nobody calls the admin API.

    ``manifest`` is the resource as the admin API's PUT takes it (no status); ``generation`` its
    ``metadata.generation``, echoed back as ``status.observedGeneration``.
    """

    SUBJECT: ClassVar[str] = "flexinfer.spec.<kind>.<namespace>.<name>"

    kind: Literal["Model", "GPUGroup"]
    action: Literal["apply", "delete"]
    namespace: str
    name: str
    manifest: dict[str, Any] | None = None
    generation: int | None = None
    source: str = Field("kubernetes", description="Who owns the resource; a resync removes only its own")
    observed_at: UtcDateTime = Field(description="When the source saw this state (orders it against resyncs)")


class SpecResync(Message):
    """Every resource of ``kind`` that exists at ``source`` in ``namespaces`` (all when null), as listed at
    ``observed_at``: the scheduler deletes those it got from this source that are not named and were last changed
    before then (deletions a restarted watcher never saw)."""

    SUBJECT: ClassVar[str] = "flexinfer.spec.resync.<kind>"

    kind: Literal["Model", "GPUGroup"]
    source: str = "kubernetes"
    namespaces: list[str] | None = None
    names: list[str] = Field(default_factory=list, description="namespace/name of every resource listed")
    observed_at: UtcDateTime


class Route(Message):
    """Where a model is served and whether it is Ready: the proxy's view, kept in the ``flexinfer_routes`` KV bucket.

    Every managed model has an entry, so the proxy can tell an unknown model (404) from a parked one (queue).
    """

    SUBJECT: ClassVar[str] = "KV flexinfer_routes, key <namespace>.<model>"

    namespace: Name
    name: Name
    group: str | None = None
    priority: int = 0
    service_labels: list[str] = Field(default_factory=list)
    phase: ModelPhase = ModelPhase.PENDING
    state: SharedState | None = None
    ready: bool = False
    endpoint: str | None = None
    failure: str | None = Field(None, description="Why the model cannot load; the proxy fails its queue with 503")
    woken: bool = Field(
        False, description="Ready because its sleeping server was woken: a request that waited is not a cold start"
    )
    generation: int = 0
    updated_at: UtcDateTime


class SwapEvent(Message):
    """A swap changed phase (observers only)."""

    SUBJECT: ClassVar[str] = "flexinfer.events.swap.<group>"

    kind: Literal["swap.started", "swap.phase", "swap.finished", "swap.failed"]
    swap_id: str
    group: str
    from_model: str | None = None
    to_model: str | None = None
    reason: SwapReason
    phase: SwapPhase
    phases: dict[str, float] = Field(default_factory=dict, description="Seconds spent in each finished phase")
    message: str = ""
    time: UtcDateTime


class LeaseEvent(Message):
    """A GPU lease was acquired, became held (every serving member of its group parked), was renewed, released or
    expired. The lease manager publishes these; observers (and a training script) may wait on them."""

    SUBJECT: ClassVar[str] = "flexinfer.events.lease.<group>"

    kind: Literal["lease.acquired", "lease.held", "lease.renewed", "lease.released", "lease.expired"]
    name: Name
    group: str
    owner: str
    namespace: Name = "default"
    node: str | None = None
    source: str = Field("api", description="Who asked for it: api, gpulease, modelcache, job or configmap")
    acquired_at: UtcDateTime | None = None
    expires_at: UtcDateTime | None = None
    reason: str = Field("", description="Why it was released or expired, in words")
    time: UtcDateTime


class ModelEvent(Message):
    """A model's phase or shared-group state changed, or (``model.crashed``) its server died after it was Ready
    and is started again after the back-off: ``status.message`` says why (the exit reason the actuator reported),
    ``restarts`` how many times so far, or (``model.memory``, a warning) it was measured to hold more GPU memory than
    it declares (or than its estimate): ``status.memory`` is the measured figure, which fitting uses from then on,
    and ``status.message`` names both (observers only)."""

    SUBJECT: ClassVar[str] = "flexinfer.events.model.<group>"

    kind: Literal["model.status", "model.crashed", "model.memory"] = "model.status"
    namespace: Name
    model: Name
    group: str | None = None
    status: ModelStatus
    restarts: int = Field(0, ge=0, description="How many times the model was restarted after a crash")
    time: UtcDateTime


ALL_MESSAGES: tuple[type[Message], ...] = (
    Demand,
    InFlightReport,
    ScaleCommand,
    RuntimeStatus,
    ActuatorHello,
    ModelStatusUpdate,
    GroupStatusUpdate,
    SpecChange,
    SpecResync,
    Route,
    SwapEvent,
    LeaseEvent,
    ModelEvent,
)
