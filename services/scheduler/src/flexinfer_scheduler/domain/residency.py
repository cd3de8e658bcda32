"""Which models hold a group's card(s) when a demanded model wants to load (issue 23). Pure: time is an argument.

A group with a :class:`~flexinfer_scheduler.domain.model.Capacity` may hold several models at once. A demanded model
that fits on a device beside the loaded ones loads with no eviction; one that does not fit evicts the cheapest set
of loaded models that frees enough, never a pinned one for a model of lower or equal priority, never a model of
higher priority that is serving or has requests waiting. ``plan.plan_resident_set`` plans a group with a capacity
with it (the scheduler and the simulator alike).

A GPU lease with memory (GPULease ``spec.memory``) in such a group is a reservation of that many bytes on one
device (``plan_reservation``): the device where freeing it costs least is chosen, only the models that must go to
free it are evicted, and the reserved bytes count as held on that device while the lease holds (``reserved``), so
nothing loads into them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.model import Capacity, Member

# a model never measured is assumed to take this long to reload (the eviction cost's first term)
DEFAULT_RELOAD = timedelta(seconds=30)


class ResidencyReason(StrEnum):
    ALREADY_LOADED = "already-loaded"
    FITS = "fits"  # loads beside the others, nothing evicted
    EVICTS = "evicts"  # the cheapest set that frees enough is evicted
    NO_ROOM = "no-room"  # what could free enough is pinned, busy at a higher priority, or the card is too small


@dataclass(frozen=True)
class Residency:
    """The resident set after the decision: every model's devices, what to park first, and why."""

    placements: dict[ModelKey, tuple[int, ...]]
    evict: tuple[ModelKey, ...]
    reason: ResidencyReason


def memory_of(member: Member, capacity: Capacity) -> int:
    """What the model holds on each of its devices: its declaration, else a whole device."""
    return capacity.memory_per_device if member.memory is None else member.memory


def placement_of(member: Member, capacity: Capacity) -> tuple[int, ...]:
    """Where a model that holds memory is: where it was placed, else (loaded before the group had a capacity) its
    first devices."""
    if member.placement is not None:
        return member.placement
    return tuple(range(min(member.devices, capacity.devices)))


def reload_time(member: Member) -> timedelta:
    """The measured load time (``ready_since - command_issued_at``) when known, else :data:`DEFAULT_RELOAD`."""
    if member.ready_since is not None and member.command_issued_at is not None:
        measured = member.ready_since - member.command_issued_at
        if measured >= timedelta(0):
            return measured
    return DEFAULT_RELOAD


#: how fast the chance that an idle model is asked again fades, for the eviction cost (half after this long)
RECALL_HALF_LIFE = timedelta(seconds=30)
#: reloads shorter than this count as this long in the eviction cost: below it, a reload's length is noise next
#: to how recently the model was asked (a small model loads in a second or less)
RELOAD_FLOOR = timedelta(seconds=10)


def eviction_cost(member: Member, now: datetime) -> tuple[int, int, float, float]:
    """Cheapest first: no requests in flight or waiting, then lower priority, then the least expected reload: its
    reload time (at least ``RELOAD_FLOOR``) weighed by how likely it is to be asked again soon
    (``half_life / (half_life + idle)``: a model idle for minutes is cheap whatever its load time, one asked a second
    ago is not), then the longest idle."""
    busy = member.in_flight + member.queued
    idle = (now - member.last_active_time).total_seconds() if member.last_active_time is not None else float("inf")
    half = RECALL_HALF_LIFE.total_seconds()
    recall = half / (half + idle) if idle != float("inf") else 0.0
    reload = max(reload_time(member), RELOAD_FLOOR).total_seconds()
    return (busy, member.priority, reload * recall, -idle)


def may_evict(resident: Member, candidate: Member) -> bool:
    if resident.pinned and resident.priority >= candidate.priority:
        return False
    return not (resident.priority > candidate.priority and (resident.in_flight > 0 or resident.queued > 0))


def free_memory(
    capacity: Capacity,
    members: dict[ModelKey, Member],
    placements: dict[ModelKey, tuple[int, ...]],
    reserved: dict[int, int] | None = None,
) -> list[int]:
    """Per device, what is left once the placed models (and ``reserved``: bytes held per device for a lease) hold
    theirs."""
    free = [capacity.memory_per_device] * capacity.devices
    for device, size in (reserved or {}).items():
        if 0 <= device < capacity.devices:
            free[device] -= size
    for key, devices in placements.items():
        for device in devices:
            free[device] -= memory_of(members[key], capacity)
    return free


def place(need: int, count: int, free: list[int]) -> tuple[int, ...] | None:
    """Best fit: the ``count`` devices with room that would be left with the least free."""
    fitting = sorted((f - need, d) for d, f in enumerate(free) if f >= need)
    if len(fitting) < count:
        return None
    return tuple(sorted(d for _, d in fitting[:count]))


def plan_residency(
    capacity: Capacity,
    members: tuple[Member, ...],
    placements: dict[ModelKey, tuple[int, ...]],
    candidate: ModelKey,
    now: datetime,
    allowed: set[ModelKey] | None = None,
    reserved: dict[int, int] | None = None,
) -> Residency:
    """The resident set once ``candidate`` is loaded (``placements``: the models loaded now and their devices;
    ``allowed``: the only ones that may go, when the caller's policy narrows them; ``reserved``: bytes a lease holds
    per device, never given to a model)."""
    by_key = {m.key: m for m in members}
    current = {k: v for k, v in placements.items() if k in by_key}
    if candidate in current:
        return Residency(current, (), ResidencyReason.ALREADY_LOADED)
    wanted = by_key[candidate]
    need = memory_of(wanted, capacity)
    if need > capacity.memory_per_device or wanted.devices > capacity.devices:
        return Residency(current, (), ResidencyReason.NO_ROOM)
    placed = place(need, wanted.devices, free_memory(capacity, by_key, current, reserved))
    if placed is not None:
        return Residency({**current, candidate: placed}, (), ResidencyReason.FITS)
    evictable = [k for k in current if may_evict(by_key[k], wanted) and (allowed is None or k in allowed)]

    def fits(evict: list[ModelKey]) -> bool:
        left = {k: v for k, v in current.items() if k not in evict}
        return place(need, wanted.devices, free_memory(capacity, by_key, left, reserved)) is not None

    evict = _cheapest_set(evictable, fits, lambda k: eviction_cost(by_key[k], now))
    if evict is None:
        return Residency(current, (), ResidencyReason.NO_ROOM)
    left = {k: v for k, v in current.items() if k not in evict}
    placed = place(need, wanted.devices, free_memory(capacity, by_key, left, reserved))
    assert placed is not None  # the loop above stopped on a set that fits
    return Residency({**left, candidate: placed}, tuple(evict), ResidencyReason.EVICTS)


class ReservationReason(StrEnum):
    FREE = "free"  # the device has that much free already: nothing goes
    EVICTS = "evicts"  # the cheapest set of the device's models that frees enough goes


@dataclass(frozen=True)
class Reservation:
    """Where a lease with memory is reserved, what must go to free it, and why."""

    device: int
    evict: tuple[ModelKey, ...]
    reason: ReservationReason


def _freeing(
    capacity: Capacity,
    by_key: dict[ModelKey, Member],
    placements: dict[ModelKey, tuple[int, ...]],
    device: int,
    need: int,
    now: datetime,
) -> tuple[ModelKey, ...]:
    """The cheapest models of ``device`` whose eviction leaves ``need`` free there: cheapest first until enough is
    free, then every one that need not go is kept (most expensive first)."""
    here = [k for k, devices in placements.items() if device in devices]

    def fits(evict: list[ModelKey]) -> bool:
        return free_memory(capacity, by_key, {k: v for k, v in placements.items() if k not in evict})[device] >= need

    if fits([]):
        return ()
    evict = _cheapest_set(here, fits, lambda k: eviction_cost(by_key[k], now))
    return tuple(here if evict is None else evict)


def _cheapest_set(
    evictable: list[ModelKey],
    fits: Callable[[list[ModelKey]], bool],
    cost: Callable[[ModelKey], tuple[int, int, float, float]],
) -> list[ModelKey] | None:
    """The models to evict so that what is wanted ``fits`` (it does not with none evicted): the cheapest first until
    it does, then every one that need not go is kept, the dearest first (None: not even evicting them all will do)."""
    evict: list[ModelKey] = []
    for key in sorted(evictable, key=cost):
        evict.append(key)
        if fits(evict):
            break
    else:
        return None
    for key in sorted(evict, key=cost, reverse=True):
        trial = [k for k in evict if k != key]
        if fits(trial):
            evict = trial
    return evict


def plan_reservation(
    capacity: Capacity,
    members: tuple[Member, ...],
    placements: dict[ModelKey, tuple[int, ...]],
    need: int,
    now: datetime,
    device: int | None = None,
) -> Reservation:
    """Where a lease of ``need`` bytes (at most ``memory_per_device``) is reserved (``placements``: the models that
    hold memory and are not leaving already): ``device`` when the lease has one already (the reservation stays
    where it is), else the device where freeing it costs least (nothing to evict first; then the set whose dearest
    model is cheapest, then fewer models; then the lowest index). A lease beats every model, pinned ones too, as a
    whole-group lease does; it never evicts more than it needs."""
    assert need <= capacity.memory_per_device
    by_key = {m.key: m for m in members}
    current = {k: v for k, v in placements.items() if k in by_key}
    devices = [device] if device is not None and 0 <= device < capacity.devices else range(capacity.devices)
    options = []
    for d in devices:
        evict = _freeing(capacity, by_key, current, d, need, now)
        cost = tuple(sorted((eviction_cost(by_key[k], now) for k in evict), reverse=True))
        options.append(((bool(evict), cost, len(evict), d), d, evict))
    _, chosen, evict = min(options)
    return Reservation(chosen, evict, ReservationReason.EVICTS if evict else ReservationReason.FREE)


@dataclass(frozen=True)
class DeviceUsage:
    """One device of a group with a capacity: what the models not confirmed parked hold on it."""

    index: int
    capacity: int
    used: int
    models: tuple[ModelKey, ...]

    @property
    def free(self) -> int:
        return self.capacity - self.used


def device_usage(capacity: Capacity, members: Iterable[Member]) -> list[DeviceUsage]:
    """Per device, the memory of the models placed there that are not confirmed parked (what the invariant bounds)."""
    used = [0] * capacity.devices
    holders: list[list[ModelKey]] = [[] for _ in range(capacity.devices)]
    for m in members:
        if m.placement is None or (m.parked and m.evicting_since is None):
            continue
        for device in m.placement:
            if 0 <= device < capacity.devices:
                used[device] += memory_of(m, capacity)
                holders[device].append(m.key)
    return [
        DeviceUsage(i, capacity.memory_per_device, used[i], tuple(sorted(holders[i]))) for i in range(capacity.devices)
    ]
