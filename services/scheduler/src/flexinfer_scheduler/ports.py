"""What the scheduler's loop needs from the world, as narrow ports. Each has a real implementation (PostgreSQL,
NATS: ``adapters/store.py``, ``adapters/bus.py``) and an in-memory one (``adapters/memory.py``); the same contract
tests run against both (``tests/integration/test_scheduler_ports.py``), so the loop is tested without servers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, NamedTuple, Protocol, TypeVar

from pydantic import BaseModel

from flexinfer_common.db import GroupRow, ModelRow, SwapRow
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GPUGroup, Model
from flexinfer_common.messages import Route, RuntimeSpec
from flexinfer_common.ports import Publisher
from flexinfer_scheduler.domain.manifests import GroupMove, SpecFacts
from flexinfer_scheduler.domain.model import GroupSnapshot
from flexinfer_scheduler.domain.plan import GroupPlan
from flexinfer_scheduler.domain.status import StatusView

M = TypeVar("M", bound=BaseModel)


class StoredStatus(NamedTuple):
    """A member's status columns as stored (a pass writes only what changed; a tuple, built for every model
    loaded)."""

    phase: str
    shared_state: str | None
    queue_position: int | None
    preempted_by: str | None
    message: str

    @classmethod
    def of(cls, view: StatusView) -> StoredStatus:
        return cls(view.phase.value, view.state.value, view.queue_position, view.preempted_by, view.message)


def _no_runtime(key: ModelKey) -> RuntimeSpec | None:
    return None


@dataclass(frozen=True)
class World:
    """Everything one election pass reads: the groups, and each member's status as stored; ``runtime`` gives what
    the actuator needs to run a model, for the commands a pass sends (looked up only for those: the election does
    not read it; None for a model not loaded, a pydantic ValidationError when its stored manifest no longer parses)."""

    groups: list[GroupSnapshot]
    statuses: dict[ModelKey, StoredStatus]
    runtime: Callable[[ModelKey], RuntimeSpec | None] = _no_runtime
    by_name: dict[str, GroupSnapshot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.by_name.update((g.name, g) for g in self.groups)

    def group(self, name: str) -> GroupSnapshot | None:
        return self.by_name.get(name)


def encode_placement(devices: tuple[int, ...] | None) -> str | None:
    """A placement as the ``models.placement`` column holds it: ``"0,1"``."""
    return ",".join(str(d) for d in devices) if devices is not None else None


def decode_placement(text: str | None) -> tuple[int, ...] | None:
    return tuple(int(d) for d in text.split(",")) if text else None


def changes_of(plan: GroupPlan, world: World) -> dict[ModelKey, dict[str, Any]]:
    """The columns a plan changes per member (patched fields and status), compared with what ``world`` read: a
    store writes these and nothing else."""
    snapshot = world.group(plan.group)
    if snapshot is None:
        return {}
    before = {m.key: m for m in snapshot.members}
    out: dict[ModelKey, dict[str, Any]] = {}
    for key in set(plan.patches) | set(plan.statuses):
        member = before.get(key)
        if member is None:
            continue
        values: dict[str, Any] = {}
        patch = plan.patches.get(key)
        if patch is not None:
            for name, value in patch.changes().items():
                if getattr(member, name) != value:
                    values[name] = encode_placement(value) if name == "placement" else getattr(value, "value", value)
        view = plan.statuses.get(key)
        if view is not None:
            new, stored = StoredStatus.of(view), world.statuses.get(key)
            if new != stored:
                values.update(
                    (name, value) for name, value in new._asdict().items() if getattr(stored, name, None) != value
                )
        if values:
            out[key] = values
    return out


@dataclass(frozen=True)
class Origin:
    """Who wrote a manifest: the admin API (``api``), or a watcher of Kubernetes resources handing on what it saw
    at ``observed_at`` (``metadata.generation`` = ``generation``)."""

    source: str
    observed_at: datetime | None = None
    generation: int | None = None

    def is_older_than(self, stored: datetime | None) -> bool:
        """A change observed before the one stored is stale (redelivered or overtaken)."""
        return self.observed_at is not None and stored is not None and self.observed_at < stored

    @property
    def answers_refusals(self) -> bool:
        """The admin API answers a change it cannot make safely with a 409; a watcher of Kubernetes cannot refuse
        what is already in the cluster, so such a change is applied and made safe as it goes (a loaded model's
        move waits until it is parked)."""
        return self.source == API_ORIGIN.source

    def may_delete(self, owner: str, stored: datetime | None) -> bool:
        """The admin API deletes anything; a watcher only what it owns, and not with a stale observation."""
        if self.source == API_ORIGIN.source:
            return True
        return owner == self.source and not self.is_older_than(stored)


API_ORIGIN = Origin("api")


class GroupChangeRefused(Exception):
    """A model that may hold its group's GPU cannot move to another group: the new group's election would load a
    model beside it on the card it still holds. Park it first (delete it, or wait until it is parked)."""

    def __init__(self, key: ModelKey, old: str | None, new: str) -> None:
        super().__init__(
            f"model {key} may still hold the GPU of group {old!r}: it cannot move to {new!r} until it is parked "
            "(delete it and apply it again, or wait until it is parked)"
        )


class MembershipChangeRefused(GroupChangeRefused):
    """A GPUGroup created, changed or deleted through the admin API would move models that may hold their group's
    GPU, for the reason a Model's own move is refused: nothing is changed. (From Kubernetes the change is applied
    and such a model moves once parked: ``Placement``.)"""

    def __init__(self, gpugroup: str, action: str, moves: Sequence[GroupMove]) -> None:
        self.moves = tuple(moves)
        Exception.__init__(
            self,
            f"GPUGroup {gpugroup!r} cannot be {action}: it would move {'; '.join(m.describe() for m in self.moves)}. "
            f"Park {'it' if len(self.moves) == 1 else 'them'} first (or wait until parked), then try again",
        )


#: The actuator back-end whose GPUs are discovered (NVML, amdsmi on its machine): a v1alpha2 shared group that declares
#: no ``spec.capacity`` gets their capacity. A Kubernetes actuator runs beside, not on, the GPU nodes.
LOCAL_BACKEND = "local"


@dataclass(frozen=True, slots=True)
class DemandReport:
    """A demand signal as the store records it: ``source`` has ``queued`` requests for the model at ``when``, a count
    that stands for ``valid_for`` (None: the TTL load_world is given); ``message_id`` makes a repeat count once."""

    namespace: str
    name: str
    source: str
    queued: int
    when: datetime
    message_id: str
    valid_for: timedelta | None = None

    @property
    def valid_until(self) -> datetime | None:
        return self.when + self.valid_for if self.valid_for is not None else None


@dataclass(frozen=True, slots=True)
class RuntimeReport:
    """An actuator's report on a model's runtime (``phase``, a RuntimePhase value) for command ``generation``."""

    namespace: str
    name: str
    phase: str
    generation: int
    endpoint: str | None
    message: str
    when: datetime


@dataclass(frozen=True)
class MeasuredMemory:
    """What ``record_measured_memory`` found: the model's group, the figure it replaced, and the declared or
    estimated one (``reference``; None: neither, the model takes a whole device)."""

    group: str | None
    previous: int | None
    reference: int | None
    estimated: bool

    @property
    def source(self) -> str:
        return "estimated" if self.estimated else "declared"


class SchedulerStore(Protocol):
    """The scheduler's state: the only writer of groups, models and swaps."""

    async def load_world(
        self, now: datetime, queued_ttl: timedelta, groups_only: set[str] | None = None, *, in_flight_ttl: timedelta
    ) -> tuple[World, bool]:
        """Every group (or only ``groups_only``), and whether leases could be read (else: none, fail open)."""
        ...

    async def apply_plans(self, world: World, plans: Sequence[GroupPlan], now: datetime) -> set[ModelKey]:
        """Write what the plans changed, and only that, in one transaction. A model is written only while it is
        in the group its plan is for: returns the models that left it (moved or deleted) after ``world`` was read,
        whose changes were not written (nothing is published for them)."""
        ...

    async def record_demand(self, report: DemandReport) -> str | None:
        """Refresh lastActiveTime (never backwards) and the source's queued count. Returns the model's group, or
        None when the model is unknown or the message was seen already."""
        ...

    async def record_runtime(self, report: RuntimeReport) -> str | None:
        """Store an actuator report unless it answers an older command than the last one seen. Returns the
        model's group when stored."""
        ...

    async def record_measured_memory(self, *, namespace: str, name: str, measured: int) -> MeasuredMemory | None:
        """Store what a model was measured to hold on the GPU (written only when it changed); None: no such
        model."""
        ...

    async def record_gpu_inventory(
        self, *, backend: str, actuator: str, device_memory: Sequence[int], when: datetime
    ) -> bool:
        """Store the GPUs an actuator of ``backend`` found (each device's total memory; none: forget them).
        True when the discovered capacity changed."""
        ...

    async def note_crash(self, *, namespace: str, name: str, generation: int) -> tuple[int, str | None] | None:
        """A Failed report for ``generation``: when it ends a runtime that was Ready for the current activate, count
        a restart and return (restarts so far, the model's group); None otherwise (a failed load, a repeat)."""
        ...

    async def record_in_flight(self, *, source: str, counts: Mapping[ModelKey, int], when: datetime) -> set[str]:
        """A proxy's complete in-flight counts (a model it does not name has none); returns the groups of the
        models whose count fell to zero (a drain may be over)."""
        ...

    async def forget_runtime(self) -> int: ...

    async def finish_deletions(self, keys: Sequence[ModelKey]) -> list[Any]:
        """Delete the rows of these models that are being deleted and confirmed parked; the rows deleted."""
        ...

    async def finish_moves(self, keys: Sequence[ModelKey]) -> list[GroupMove]:
        """Move these models that are moving to another group and are confirmed parked into it; the moves made."""
        ...

    async def group_names(self) -> list[str]: ...

    async def model_keys(self) -> set[ModelKey]: ...

    async def model(self, namespace: str, name: str) -> ModelRow | None:
        """One model's row, its manifest loaded (None: there is none)."""
        ...

    async def prune(self, now: datetime, keep: timedelta) -> None: ...


class Stoppable(Protocol):
    async def stop(self) -> None: ...


Decoder = Callable[[str, bytes], M]
Handler = Callable[[M, Any], Awaitable[None]]


class SchedulerBus(Publisher, Protocol):
    """Messages in and out, and the routes the proxies read."""

    async def publish_many(self, items: list[tuple[str, BaseModel, str | None]]) -> list[bool]:
        """Publish (subject, message, message id) items together; True for each one published."""
        ...

    async def consume(
        self, *, stream: str, durable: str | None, filter_subject: str, decode: Decoder[M], handler: Handler[M]
    ) -> Stoppable: ...

    async def put_routes(self, routes: list[Route]) -> list[bool]:
        """Write these routes; True for each one written."""
        ...

    async def create_route(self, route: Route) -> bool:
        """Write a route only if the model has none yet; False when it had one."""
        ...

    async def delete_route(self, key: ModelKey) -> None: ...


class LeaderLock(Protocol):
    """One scheduler replica leads at a time."""

    #: The fencing token of this replica's leadership: a number taken when it acquired the lock, higher than any
    #: earlier leader's (0 while not leading). Every command carries it; the actuator refuses a lower one.
    epoch: int

    async def try_acquire(self) -> bool:
        """Take the lock if free (or keep it); True while this replica holds it. Acquiring takes a new epoch."""
        ...

    async def still_held(self) -> bool:
        """False once the lock was lost (its holder's connection dropped)."""
        ...

    async def release(self) -> None: ...


class AdminStore(Protocol):
    """What the admin API reads and writes (``api.py``): manifests in and out, the views it serves. The PostgreSQL
    store fits; the API depends on this port, not on it."""

    async def models(self) -> list[ModelRow]: ...

    async def model(self, namespace: str, name: str) -> ModelRow | None: ...

    def facts(self, row: ModelRow) -> SpecFacts:
        """What the row's manifest says the election reads (its memory, estimated from the weights where undeclared),
        worked out once per spec generation: a listing of every model does not stat every weights file."""
        ...

    async def put_model(self, model: Model, now: datetime, origin: Origin = ...) -> tuple[ModelRow, bool]: ...

    async def request_deletion(
        self, namespace: str, name: str, now: datetime, origin: Origin = ...
    ) -> tuple[ModelRow, bool] | None: ...

    async def set_promoted(self, namespace: str, name: str, now: datetime) -> ModelRow | None: ...

    async def group(self, name: str) -> GroupRow | None: ...

    async def groups(self) -> list[GroupRow]: ...

    async def put_gpugroup(self, group: GPUGroup, now: datetime, origin: Origin = ...) -> bool: ...

    async def delete_group(self, name: str, origin: Origin = ...) -> bool: ...

    async def swaps(self, limit: int = 200) -> list[SwapRow]: ...

    async def load_world(
        self, now: datetime, queued_ttl: timedelta, groups_only: set[str] | None = None, *, in_flight_ttl: timedelta
    ) -> tuple[World, bool]: ...
