"""String enums shared by services and the bus (a reason or phase is never a bare string)."""

from enum import StrEnum


class ModelPhase(StrEnum):
    PENDING = "Pending"
    LOADING = "Loading"
    READY = "Ready"
    DRAINING = "Draining"
    PREEMPTED = "Preempted"
    IDLE = "Idle"
    FAILED = "Failed"


class SharedState(StrEnum):
    ACTIVE = "Active"
    QUEUED = "Queued"
    PARKED = "Parked"


class ParkStrategy(StrEnum):
    SCALE_TO_ZERO = "ScaleToZero"
    SLEEP = "Sleep"


class GroupPolicy(StrEnum):
    V1ALPHA2 = "v1alpha2"
    V1ALPHA1 = "v1alpha1"


class SchedulingPolicy(StrEnum):
    """How a v1alpha2 group picks its holder: FlexInfer's own policy (the default) or the seed's exact election."""

    FLEXINFER = "flexinfer"
    SEED = "seed"


class ScaleAction(StrEnum):
    ACTIVATE = "activate"
    PARK = "park"


class RuntimePhase(StrEnum):
    """What the actuator observes about a model's process or Deployment."""

    LOADING = "Loading"
    READY = "Ready"
    STOPPING = "Stopping"
    PARKED = "Parked"
    FAILED = "Failed"


class SwapPhase(StrEnum):
    DRAINING = "draining"
    PARKING = "parking"
    LOADING = "loading"
    READY = "ready"
    FAILED = "failed"
    ABORTED = "aborted"


class SwapReason(StrEnum):
    DEMAND = "demand"
    MAX_WAIT = "max-wait"  # a demanded model waited its spec.gpu.maxWait behind a busy one
    FALLBACK = "fallback"
    FORCE_PROMOTION = "force-promotion"
    IDLE_TIMEOUT = "idle-timeout"
    IDLE = "idle"  # FlexInfer's policy: the holder was quiet and another model's wait was worth a load
    LEASE = "gpu-lease"
    INITIAL = "initial"
    RECOVERY = "recovery"
    GROUP_CHANGE = "group-change"  # the holder was moved to another group (from Kubernetes): parked here first


class LeasePhase(StrEnum):
    """Where a GPU lease stands. ``Pending``: asked for (a GPULease, a Job, a ModelCache) but its group is held by
    another lease or unknown; ``Parking``: it holds the group and the serving members are being parked; ``Held``:
    every serving member is parked, the GPU is the lease holder's."""

    PENDING = "Pending"
    PARKING = "Parking"
    HELD = "Held"
