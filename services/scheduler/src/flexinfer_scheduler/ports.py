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

from flexinfer_common.messages import Route, RuntimeSpec
from flexinfer_scheduler.domain.model import GroupSnapshot, ModelKey
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
                    values[name] = getattr(value, "value", value)
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

    def may_delete(self, owner: str, stored: datetime | None) -> bool:
        """The admin API deletes anything; a watcher only what it owns, and not with a stale observation."""
        if self.source == API_ORIGIN.source:
            return True
        return owner == self.source and not self.is_older_than(stored)


API_ORIGIN = Origin("api")


class SchedulerStore(Protocol):
    """The scheduler's state: the only writer of groups, models and swaps."""

    async def load_world(
        self, now: datetime, demand_window: timedelta, groups_only: set[str] | None = None, *, in_flight_ttl: timedelta
    ) -> tuple[World, bool]:
        """Every group (or only ``groups_only``), and whether leases could be read (else: none, fail open)."""
        ...

    async def apply_plans(self, world: World, plans: Sequence[GroupPlan], now: datetime) -> None:
        """Write what the plans changed, and only that, in one transaction."""
        ...

    async def record_demand(
        self, *, namespace: str, name: str, source: str, queued: int, when: datetime, message_id: str
    ) -> str | None: ...

    async def record_runtime(
        self,
        *,
        namespace: str,
        name: str,
        phase: str,
        generation: int,
        endpoint: str | None,
        message: str,
        when: datetime,
    ) -> str | None: ...

    async def record_in_flight(self, *, source: str, counts: Mapping[ModelKey, int], when: datetime) -> set[str]:
        """A proxy's complete in-flight counts (a model it does not name has none); returns the groups of the
        models whose count fell to zero (a drain may be over)."""
        ...

    async def forget_runtime(self) -> int: ...

    async def group_names(self) -> list[str]: ...

    async def model_keys(self) -> set[ModelKey]: ...

    async def prune(self, now: datetime, keep: timedelta) -> None: ...


class Stoppable(Protocol):
    async def stop(self) -> None: ...


Decoder = Callable[[str, bytes], M]
Handler = Callable[[M, Any], Awaitable[None]]


class SchedulerBus(Protocol):
    """Messages in and out, and the routes the proxies read."""

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None: ...

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

    async def try_acquire(self) -> bool:
        """Take the lock if free (or keep it); True while this replica holds it."""
        ...

    async def still_held(self) -> bool:
        """False once the lock was lost (its holder's connection dropped)."""
        ...

    async def release(self) -> None: ...
