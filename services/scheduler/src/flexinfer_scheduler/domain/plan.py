"""Plan one group. Pure: a snapshot and ``now`` in, a :class:`GroupPlan` out — what to write (typed member
patches, the swap), which commands to send, and what to publish (statuses, routes, the group's holder and queue).

A pass reads like this (``plan_group``):

1. bookkeeping: failed loads are noted, and each member's ``demand_since`` follows its demand (``note_demand``);
2. the election (``election.elect``);
3. the swap step (``domain.swap``): a new swap when the leader changed, then the transition table;
4. the members' commands, as far as the swap's phase allows (never two models on one GPU: the leader is activated
   only once every other member is confirmed parked); a command that got no answer for its generation within
   ``command_retry`` is sent again (same generation, so it is harmless);
5. the status view (``domain.status``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from flexinfer_common.enums import ModelPhase, ScaleAction, SharedState, SwapPhase, SwapReason
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain import swap as swaps
from flexinfer_scheduler.domain.election import (
    DRAIN_TIMEOUT,
    Election,
    ElectionParams,
    ElectionReason,
    acts_on_time,
    asked_for,
    cooldown_remaining,
    elect,
    first_after,
    first_in_line,
    idle_timeout_expired,
    is_eligible,
    next_change,
    params_for,
    parked_by_hand,
    rank,
    wants_gpu,
)
from flexinfer_scheduler.domain.model import (
    NO_CHANGE,
    Capacity,
    GroupSnapshot,
    Lease,
    Member,
    MemberPatch,
    Swap,
    reserves_memory,
)
from flexinfer_scheduler.domain.residency import (
    Reservation,
    ResidencyReason,
    free_memory,
    may_evict,
    memory_of,
    place,
    placement_of,
    plan_reservation,
    plan_residency,
)
from flexinfer_scheduler.domain.status import StatusView, load_failed, runtime_lost, status_views

__all__ = ["Command", "GroupPlan", "LeaseReservation", "StatusView", "SwapUpdate", "apply_plan", "plan_group"]


@dataclass(frozen=True)
class Command:
    key: ModelKey
    action: ScaleAction
    generation: int
    swap_id: str | None
    reissue: bool = False


@dataclass(frozen=True)
class SwapUpdate:
    swap: Swap
    created: bool = False
    finished_at: datetime | None = None
    message: str = ""


@dataclass(frozen=True)
class LeaseReservation:
    """A lease with memory in a group with a capacity: the device whose memory is reserved for it, and whether that
    much is confirmed free there (every model that had to go is confirmed parked: the holder may use it)."""

    device: int
    memory: int
    free: bool


@dataclass(frozen=True)
class GroupPlan:
    group: str
    election: Election
    active: ModelKey | None
    leader_since: datetime | None
    swap_id: str | None
    patches: dict[ModelKey, MemberPatch]
    commands: list[Command]
    statuses: dict[ModelKey, StatusView]
    swap_updates: list[SwapUpdate] = field(default_factory=list)
    cooldown_remaining: timedelta = timedelta(0)
    drain_timeout: timedelta | None = None
    #: every member as this pass leaves it (patches applied): what routes and statuses are published from
    members: dict[ModelKey, Member] = field(default_factory=dict)
    lease: Lease | None = None  # the GPU lease this election honoured (published so the lease manager knows)
    reservation: LeaseReservation | None = None  # ``lease`` reserves memory on one device (else: the whole group)
    #: when to plan the group again though nothing is reported (a rule of time ends: ``next_change``); None: at the
    #: next reconcile
    recheck_at: datetime | None = None

    @property
    def queue(self) -> list[ModelKey]:
        """The members waiting for the GPU, in queue order (queuePosition 1, 2, ...)."""
        queued = sorted(
            (view.queue_position, key)
            for key, view in self.statuses.items()
            if view.state is SharedState.QUEUED and view.queue_position is not None
        )
        return [key for _, key in queued]


_REASONS = {
    ElectionReason.DEMAND: SwapReason.DEMAND,
    ElectionReason.MAX_WAIT: SwapReason.MAX_WAIT,
    ElectionReason.FORCE_PROMOTION: SwapReason.FORCE_PROMOTION,
    ElectionReason.LEASE: SwapReason.LEASE,
    ElectionReason.QUIET_YIELD: SwapReason.IDLE,
}


def _swap_reason(election: Election, previous: ModelKey | None, holder: Member | None) -> SwapReason:
    if holder is not None and holder.moving_to is not None:
        return SwapReason.GROUP_CHANGE  # it leaves for another group: whoever leads here now, that is why
    if election.reason in _REASONS:
        return _REASONS[election.reason]
    if previous is None:
        return SwapReason.INITIAL
    if previous in election.idle_expired:
        return SwapReason.IDLE_TIMEOUT
    return SwapReason.FALLBACK


class _Patches:
    """The patches of one pass, with the snapshot they make."""

    def __init__(self, snapshot: GroupSnapshot) -> None:
        self.snapshot = snapshot
        self.by_key: dict[ModelKey, MemberPatch] = {}

    def add(self, key: ModelKey, patch: MemberPatch) -> None:
        self.by_key[key] = self.by_key.get(key, NO_CHANGE).merge(patch)

    def current(self) -> GroupSnapshot:
        """The snapshot with every patch so far applied."""
        if not self.by_key:
            return self.snapshot
        members = tuple(self.by_key[m.key].apply(m) if m.key in self.by_key else m for m in self.snapshot.members)
        return dataclasses.replace(self.snapshot, members=members)


def _needs_restart(m: Member) -> bool:
    """An elected member whose runtime is gone gets a fresh activate (as Kubernetes restarts a crashed pod) when it
    crashed after it was Ready, or when it failed to load but was asked for (or promoted) again since."""
    if not runtime_lost(m):
        return False
    if not load_failed(m):
        return True
    assert m.failed_at is not None
    return is_eligible(m) or (m.promoted_at is not None and m.promoted_at > m.failed_at)


def member_command(
    m: Member,
    want: ScaleAction,
    now: datetime,
    *,
    swap_id: str | None,
    command_retry: timedelta,
    restart_backoff: timedelta,
    held: bool = False,
    reset_ready_since: bool = False,
) -> tuple[Command, MemberPatch] | None:
    """The command to send ``m`` so that it comes to ``want``, and how the member changes, or None: a fresh command
    (a new generation) when it wants something else or must restart (a crash, after ``restart_backoff``) unless ``held``
    (the group's state holds a fresh one back); else the same command again while the actuator has not confirmed it,
    every ``command_retry``. A model never started is not parked. ``reset_ready_since``: a fresh activate starts the
    model's Ready clock over (the resident-set planner's holds count from it)."""
    restart = (
        want == ScaleAction.ACTIVATE
        and _needs_restart(m)
        and (m.command_issued_at is None or now - m.command_issued_at >= restart_backoff)
    )
    fresh = m.desired_action != want or restart
    if want == ScaleAction.PARK and m.desired_action is None and m.runtime is None:
        return None  # never started: nothing to park
    if fresh:
        if held:
            return None
        generation = m.command_generation + 1
        patch = MemberPatch(desired_action=want, command_generation=generation, command_issued_at=now)
        if reset_ready_since and want == ScaleAction.ACTIVATE and m.ready_since is not None:
            patch = patch.merge(MemberPatch(ready_since=None))
        return Command(m.key, want, generation, swap_id), patch
    if not m.runtime_confirmed and (m.command_issued_at is None or now - m.command_issued_at >= command_retry):
        return Command(m.key, want, m.command_generation, swap_id, reissue=True), MemberPatch(command_issued_at=now)
    return None


def note_failures(snapshot: GroupSnapshot, now: datetime) -> dict[ModelKey, MemberPatch]:
    """A member whose current activate command ended Failed before it was Ready is marked failed (left out until
    asked for again, so a model that cannot load is not restarted in a loop and its queue learns why); a promote
    call that led to it is over. A model that crashed after it was Ready is not: it stays electable and is
    restarted (the seed's rollout restart)."""
    patches = {}
    for m in snapshot.members:
        failed_now = (
            runtime_lost(m)
            and m.ready_since is None
            and (m.failed_at is None or (m.command_issued_at is not None and m.failed_at < m.command_issued_at))
        )
        if failed_now:
            reason = m.runtime_message or "the model failed to load"
            # a promotion must end, else it would pin the group on a model that cannot load
            patches[m.key] = MemberPatch(failed_at=now, last_failure=reason, promoted_at=None)
    return patches


def _end_swap(swap: Swap, target: Member | None, leader: ModelKey | None, now: datetime) -> SwapUpdate:
    """A running swap the election gave up: failed when the model it was loading failed to load (and why), else
    aborted (superseded)."""
    if swap.phase is SwapPhase.LOADING and target is not None and load_failed(target):
        failed = swaps.fire(swap, swaps.SwapEvent.LOAD_FAILED, now)
        return SwapUpdate(failed, finished_at=now, message=f"{target.key} failed to load: {target.last_failure}")
    aborted = swaps.fire(swap, swaps.SwapEvent.SUPERSEDED, now)
    return SwapUpdate(aborted, finished_at=now, message=f"superseded: {leader or 'no leader'}")


def note_demand(snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> dict[ModelKey, MemberPatch]:
    """``demand_since`` starts when a member begins to want the GPU and is cleared when it stops (demand that falls
    below the threshold restarts the v1alpha1 hysteresis clock; being served ends a v1alpha2 wait)."""
    patches = {}
    for m in snapshot.members:
        wants = wants_gpu(m, snapshot, now, params)
        if wants and m.demand_since is None:
            patches[m.key] = MemberPatch(demand_since=now)
        elif not wants and m.demand_since is not None:
            patches[m.key] = MemberPatch(demand_since=None)
    return patches


def plan_group(
    snapshot: GroupSnapshot,
    now: datetime,
    params: ElectionParams,
    *,
    command_retry: timedelta,
    new_swap_id: str,
    restart_backoff: timedelta = timedelta(0),
    drain_timeout: timedelta = DRAIN_TIMEOUT,
    drain_settle: timedelta = timedelta(seconds=1),
) -> GroupPlan:
    """``restart_backoff``: a model that crashed after it was Ready is restarted no sooner than this after its
    previous activate (a crash loop costs at most one load per back-off, as Kubernetes' CrashLoopBackOff).
    ``drain_timeout``: how long a swap waits for the outgoing model's requests in flight (a v1alpha1 group's
    ``drainTimeoutSeconds`` wins); ``drain_settle``: how long a drain waits for the proxies' counts when the outgoing
    model served a request lately (their report interval). A group with a capacity: ``plan_resident_set``."""
    params = params_for(snapshot, params)
    if snapshot.capacity is not None and snapshot.v1alpha1 is None:
        return plan_resident_set(
            snapshot,
            now,
            params,
            new_swap_id=new_swap_id,
            command_retry=command_retry,
            restart_backoff=restart_backoff,
            drain_timeout=drain_timeout,
        )
    patches = _Patches(snapshot)
    for source in (note_failures(snapshot, now), note_demand(snapshot, now, params)):
        for key, patch in source.items():
            patches.add(key, patch)
    snapshot = patches.current()

    # 2. the election
    election = elect(snapshot, now, params)
    leader = election.leader
    for key in election.idle_expired:
        if key != leader:
            patches.add(key, MemberPatch(idle_parked_at=now))

    # 3. the swap step
    swap_updates: list[SwapUpdate] = []
    swap = snapshot.swap
    active, leader_since = snapshot.active, snapshot.leader_since
    lease_holder = (
        f"gpu-lease/{snapshot.lease.owner}" if election.reason == ElectionReason.LEASE and snapshot.lease else None
    )
    if leader != active:
        if swap is not None:
            swap_updates.append(_end_swap(swap, snapshot.member(swap.to_model), leader, now))
        old = snapshot.member(active)
        # A preemption takes the GPU from a model that served or was asked for; cancelling a fallback load that
        # nobody asked for (as when manifests arrive one by one) starts no cooldown.
        was_wanted = old is not None and (old.ready_since is not None or old.last_active_time is not None)
        # (not a model that leaves for another group: a preemption here would start a cooldown for it there)
        moving = old is not None and old.moving_to is not None
        if old is not None and not old.parked and was_wanted and active not in election.idle_expired and not moving:
            patches.add(
                old.key, MemberPatch(preempted_at=now, preempted_by=lease_holder or (leader.name if leader else None))
            )
        swap = Swap(
            id=new_swap_id,
            from_model=active,
            to_model=leader,
            reason=_swap_reason(election, active, old),
            phase=SwapPhase.DRAINING,
            started_at=now,
            phase_started_at=now,
        )
        swap_updates.append(SwapUpdate(swap, created=True))
        active, leader_since = leader, now

    members = snapshot.members
    leader_member = snapshot.member(leader)
    leader_ready = (
        leader_member is not None and leader_member.ready and leader_member.desired_action == ScaleAction.ACTIVATE
    )
    if snapshot.v1alpha1 is not None:
        drain_timeout = snapshot.v1alpha1.drain_timeout
    if swap is not None:
        serving = [m for m in members if m.key != leader and m.ready]
        facts = swaps.SwapFacts(
            drained=swaps.drained(serving, swap, now, drain_timeout=drain_timeout, settle=drain_settle),
            others_parked=all(m.parked for m in members if m.key != leader),
            has_leader=leader is not None,
            leader_ready=leader_ready,
        )
        swap = swaps.advance(swap, facts, now)

    # 4. the members' commands
    phase = swap.phase if swap is not None and swap.phase not in swaps.FINAL else None
    others_parked = all(m.parked for m in members if m.key != leader)
    swap_id = swap.id if swap is not None else None
    commands: list[Command] = []
    for m in members:
        want = ScaleAction.ACTIVATE if m.key == leader else ScaleAction.PARK
        # never two on one GPU: activate only once every other member is confirmed parked; and the swap's phase
        # holds a command back (a draining model finishes first)
        held = (want == ScaleAction.ACTIVATE and not others_parked) or not swaps.may_command(phase, want, m)
        sent = member_command(
            m,
            want,
            now,
            swap_id=swap_id,
            command_retry=command_retry,
            restart_backoff=restart_backoff,
            held=held,
        )
        if sent is None:
            continue
        commands.append(sent[0])
        patches.add(m.key, sent[1])
        if want == ScaleAction.ACTIVATE and m.ready_since is not None:
            patches.add(m.key, MemberPatch(ready_since=None))  # a runtime started afresh has not been Ready yet

    if leader_member is not None:
        if leader_ready and leader_member.ready_since is None:
            patches.add(leader_member.key, MemberPatch(ready_since=now))
        if leader_member.promoted_at is not None and leader_ready:
            patches.add(leader_member.key, MemberPatch(promoted_at=None))
    for m in members:
        if m.key != leader and m.ready_since is not None:
            patches.add(m.key, MemberPatch(ready_since=None))

    if swap is not None:
        finished = swap.phase in swaps.FINAL
        changed = snapshot.swap is None or snapshot.swap.id != swap.id or snapshot.swap.phase != swap.phase
        if changed:
            swap_updates.append(SwapUpdate(swap, finished_at=now if finished else None))
        if finished:
            swap = None

    # 5. the status view
    current = patches.current()
    statuses = status_views(current, election, swap, now, params, lease_holder)
    settled = current if current.active == active else dataclasses.replace(current, active=active)
    recheck = [next_change(settled, now, params)]
    if swap is not None and swap.phase is SwapPhase.DRAINING and acts_on_time(snapshot, params):
        recheck += (swap.phase_started_at + drain_settle, swap.phase_started_at + drain_timeout)
    return GroupPlan(
        group=snapshot.name,
        election=election,
        active=active,
        leader_since=leader_since,
        swap_id=swap.id if swap is not None else None,
        patches=patches.by_key,
        commands=commands,
        statuses=statuses,
        swap_updates=_dedupe(swap_updates),
        cooldown_remaining=cooldown_remaining(current, now, params),
        drain_timeout=snapshot.v1alpha1.drain_timeout if snapshot.v1alpha1 is not None else None,
        members={m.key: m for m in current.members},
        lease=snapshot.lease if lease_holder is not None else None,
        recheck_at=first_after(recheck, now),
    )


def _dedupe(updates: list[SwapUpdate]) -> list[SwapUpdate]:
    """Keep the last update of each swap (a swap can be created and advanced in one pass)."""
    latest: dict[str, SwapUpdate] = {}
    created: set[str] = set()
    for u in updates:
        if u.created:
            created.add(u.swap.id)
        latest[u.swap.id] = u
    return [dataclasses.replace(u, created=u.swap.id in created) for u in latest.values()]


def apply_plan(snapshot: GroupSnapshot, plan: GroupPlan) -> GroupSnapshot:
    """What a store does with a plan, on a snapshot: the members' patches, the group's leader and its swap."""
    members = tuple(plan.patches[m.key].apply(m) if m.key in plan.patches else m for m in snapshot.members)
    swap = next((u.swap for u in reversed(plan.swap_updates) if u.finished_at is None), None)
    if swap is None and snapshot.swap is not None and snapshot.swap.id == plan.swap_id:
        swap = snapshot.swap
    return dataclasses.replace(snapshot, members=members, active=plan.active, leader_since=plan.leader_since, swap=swap)


# ---- a group with a capacity: several models on its card(s) -----------------------------------------------------


def _holds(m: Member) -> bool:
    """A resident: activated and not being evicted."""
    return m.desired_action == ScaleAction.ACTIVATE and m.evicting_since is None


def _occupies(m: Member) -> bool:
    """Holds memory now or may: not confirmed parked, a resident (a crashed one keeps its room for its restart), or
    an evicted one until its park is confirmed (a crashed one too: the park it is sent makes it unconfirmed again)."""
    return not m.parked or m.desired_action == ScaleAction.ACTIVATE or m.evicting_since is not None


def may_take_room(
    resident: Member, wanted: Member, snapshot: GroupSnapshot, now: datetime, params: ElectionParams
) -> bool:
    """Whether ``wanted`` may evict ``resident``: what the group's policy would decide were the two alone on one
    card with ``resident`` holding it (priorities, the hold that pays for a load, the quiet period, the bounded
    wait), so every guarantee holds member by member; a pinned model goes only for a higher priority."""
    if not may_evict(resident, wanted):
        return False
    pair = dataclasses.replace(snapshot, members=(resident, wanted), active=resident.key, swap=None, lease=None)
    return elect(pair, now, params).leader == wanted.key


def plan_resident_set(
    snapshot: GroupSnapshot,
    now: datetime,
    params: ElectionParams,
    *,
    command_retry: timedelta,
    new_swap_id: str = "",
    restart_backoff: timedelta = timedelta(0),
    drain_timeout: timedelta = DRAIN_TIMEOUT,
) -> GroupPlan:
    """``plan_group`` for a group with a capacity (``residency``): every member asked for that fits on a device
    beside the loaded ones is activated there; one that does not fit evicts the cheapest set that frees enough
    (``plan_residency``), each evicted model only where the group's policy would let the newcomer take the card
    from it (``may_take_room``); an evicted model drains (no new requests; those in flight finish, up to
    ``drain_timeout``) and is parked, and the newcomer is activated only once it fits beside every model that is
    not confirmed parked. Invariant: on every device, the memory of the models not confirmed parked never exceeds
    the capacity. A lease parks the whole group, unless it has memory that fits on one device: then only the
    cheapest models that must go to free that much on one device are evicted (``plan_reservation``) and those bytes
    stay reserved while it holds, so nothing loads into them (counted with the models not confirmed parked, they
    never exceed the capacity once the lease is ``free``). forcePromotion evicts whatever it must. Waiting is in
    queue order: a model that must wait for room holds back those after it (no starvation by smaller ones). A load
    that evicts is recorded as a swap (from the first model evicted to the newcomer, through the swap's phases), one
    at a time; a load that fits is none."""
    capacity = snapshot.capacity
    assert capacity is not None
    patches = _Patches(snapshot)
    for source in (note_failures(snapshot, now), note_demand(snapshot, now, params)):
        for key, patch in source.items():
            patches.add(key, patch)
    snapshot = patches.current()
    reserving = reserves_memory(snapshot.lease, capacity, now)
    # a reservation is not a lease on the whole group: the election runs as if unleased, around the reserved bytes
    election = elect(dataclasses.replace(snapshot, lease=None) if reserving else snapshot, now, params)
    lease_holder = (
        f"gpu-lease/{snapshot.lease.owner}" if election.reason == ElectionReason.LEASE and snapshot.lease else None
    )
    forced = election.leader if election.reason is ElectionReason.FORCE_PROMOTION else None
    members = {m.key: m for m in snapshot.members}
    for m in snapshot.members:  # an evicted model confirmed parked frees its room in this pass, not the next
        if m.desired_action == ScaleAction.PARK and m.parked and (m.evicting_since or m.placement):
            patch = MemberPatch(evicting_since=None, placement=None, ready_since=None)
            patches.add(m.key, patch)
            members[m.key] = patch.apply(m)

    def leaving(m: Member, by: str | None, *, idle: bool = False) -> None:
        """Evict ``m`` (drain, then park) for ``by``."""
        if m.evicting_since is not None or m.desired_action != ScaleAction.ACTIVATE:
            return
        patch = MemberPatch(evicting_since=now)
        if idle:
            patch = patch.merge(MemberPatch(idle_parked_at=now))
        elif m.ready_since is not None or m.last_active_time is not None:
            patch = patch.merge(MemberPatch(preempted_at=now, preempted_by=by))
        patches.add(m.key, patch)
        members[m.key] = patch.apply(m)

    # 1. who goes whatever else happens: everyone for a lease; members idle past their timeout, failed or deleted
    for m in snapshot.members:
        if m.desired_action != ScaleAction.ACTIVATE or m.evicting_since is not None:
            continue
        if lease_holder is not None:
            leaving(m, lease_holder)
        elif (idle_timeout_expired(m, now, m.idle_timeout) or parked_by_hand(m)) and m.key != forced:
            leaving(m, None, idle=True)
        elif m.leaving or (load_failed(m) and not _needs_restart(m)):
            leaving(m, None)

    # 1b. a lease with memory: the cheapest models that must go to free it on one device go (none once enough is
    # free or leaving already); its bytes are held there from now on
    reservation: Reservation | None = None
    reserved: dict[int, int] = {}
    if reserving:
        lease = snapshot.lease
        assert lease is not None and lease.memory is not None
        staying_now = {
            k: placement_of(m, capacity)
            for k, m in members.items()
            if _occupies(m) and m.desired_action == ScaleAction.ACTIVATE and m.evicting_since is None
        }
        reservation = plan_reservation(
            capacity, tuple(members.values()), staying_now, lease.memory, now, device=lease.device
        )
        for key in reservation.evict:
            leaving(members[key], lease.holder)
        reserved = {reservation.device: lease.memory}

    swap_updates: list[SwapUpdate] = []
    swap = snapshot.swap
    if swap is not None and swap.to_model not in members:
        swap_updates.append(_end_swap(swap, None, None, now))
        swap = None  # (a model deleted)

    # 2. who comes: the members asked for, in queue order (a forced one first); else, on an empty card, the
    # election's pick (the seed's stage 4: ready > recent > fallback)
    waiting_room: dict[ModelKey, str] = {}
    admitted: list[ModelKey] = []
    if lease_holder is None:
        resident = [
            m for m in members.values() if m.desired_action == ScaleAction.ACTIVATE and m.evicting_since is None
        ]
        eligible = [
            m
            for m in members.values()
            if m.desired_action != ScaleAction.ACTIVATE
            and is_eligible(m)
            and not m.leaving
            and not idle_timeout_expired(m, now, m.idle_timeout, loaded=False)
        ]
        asked = [m for m in eligible if asked_for(m, now, params)]
        queue = [m.key for m in asked]
        ordered = []
        if forced is not None and members[forced].desired_action != ScaleAction.ACTIVATE:
            ordered.append(members[forced])
        while asked:
            first = first_in_line(asked, now)
            assert first is not None
            asked.remove(first)
            if first.key != forced:
                ordered.append(first)
        if not ordered and not resident and election.leader is not None and election.leader not in queue:
            candidate = members.get(election.leader)
            if candidate is not None and candidate.desired_action != ScaleAction.ACTIVATE:
                ordered.append(candidate)
        for wanted in ordered:
            occupied = {k: placement_of(m, capacity) for k, m in members.items() if _occupies(m) or k in admitted}
            going = {k for k, m in members.items() if m.evicting_since is not None}
            need = memory_of(wanted, capacity)
            if need > capacity.memory_per_device or wanted.devices > capacity.devices:
                waiting_room[wanted.key] = (
                    f"needs {wanted.devices} x {need} bytes: more than the group's "
                    f"{capacity.devices} x {capacity.memory_per_device}"
                )
                break
            placed = place(need, wanted.devices, free_memory(capacity, members, occupied, reserved))
            if placed is not None:
                patch = MemberPatch(placement=placed, evicting_since=None)
                patches.add(wanted.key, patch)
                members[wanted.key] = patch.apply(wanted)
                admitted.append(wanted.key)
                continue
            staying = {k: v for k, v in occupied.items() if k not in going}
            if place(need, wanted.devices, free_memory(capacity, members, staying, reserved)) is not None:
                names = ", ".join(sorted(members[k].key.name for k in going))
                waiting_room[wanted.key] = f"waiting for {names} to park to make room"
                break
            allowed = {
                k: members[k]
                for k in staying
                if members[k].desired_action == ScaleAction.ACTIVATE
                and (wanted.key == forced or may_take_room(members[k], wanted, snapshot, now, params))
            }
            fixed = {k: v for k, v in staying.items() if k not in allowed}
            choice = plan_residency(
                Capacity(capacity.devices, capacity.memory_per_device),
                tuple(members.values()),
                staying,
                wanted.key,
                now,
                allowed=set(allowed),
                reserved=reserved,
            )
            if choice.reason is ResidencyReason.EVICTS and not (set(choice.evict) & set(fixed)):
                for key in choice.evict:
                    leaving(members[key], wanted.key.name)
                if swap is None:
                    reason = (
                        _swap_reason(election, choice.evict[0], members[choice.evict[0]])
                        if wanted.key == election.leader
                        else None
                    )
                    swap = Swap(
                        id=new_swap_id,
                        from_model=choice.evict[0],
                        to_model=wanted.key,
                        reason=reason or (SwapReason.FORCE_PROMOTION if wanted.key == forced else SwapReason.DEMAND),
                        phase=SwapPhase.DRAINING,
                        started_at=now,
                        phase_started_at=now,
                    )
                    swap_updates.append(SwapUpdate(swap, created=True))
                names = ", ".join(sorted(k.name for k in choice.evict))
                waiting_room[wanted.key] = f"evicting {names} to make room"
            else:
                kept = ", ".join(sorted(k.name for k in staying))
                if reservation is not None and snapshot.lease is not None:
                    kept = ", ".join(filter(None, (kept, f"{snapshot.lease.holder} (device {reservation.device})")))
                waiting_room[wanted.key] = f"no room: {kept} hold the card and keep it"
            break

    # 3. the commands: residents and the admitted are activated, the rest parked; an evicted model drains first
    commands: list[Command] = []
    for m in list(members.values()):
        if m.evicting_since is not None:
            want = ScaleAction.PARK
            drained = m.in_flight == 0 or now - m.evicting_since >= drain_timeout
            if m.desired_action == ScaleAction.ACTIVATE and not drained:
                continue  # its route is withdrawn (not ready below): what is in flight finishes first
        else:
            want = (
                ScaleAction.ACTIVATE
                if m.desired_action == ScaleAction.ACTIVATE or m.key in admitted
                else ScaleAction.PARK
            )
        sent = member_command(
            m,
            want,
            now,
            swap_id=None,
            command_retry=command_retry,
            restart_backoff=restart_backoff,
            reset_ready_since=True,
        )
        if sent is not None:
            command, patch = sent
            commands.append(command)
            patches.add(m.key, patch)
            if not command.reissue:
                members[m.key] = patch.apply(m)
    for m in list(members.values()):
        if m.ready and m.ready_since is None and m.evicting_since is None:
            patches.add(m.key, MemberPatch(ready_since=now))
        elif m.desired_action == ScaleAction.PARK and m.parked and (m.evicting_since or m.placement or m.ready_since):
            patches.add(m.key, MemberPatch(evicting_since=None, placement=None, ready_since=None))

    # 4. the status view
    current = patches.current()
    statuses = _resident_statuses(current, election, now, params, lease_holder, waiting_room)
    latest = max(
        (m for m in current.members if _holds(m)), key=lambda m: (m.command_issued_at or now, m.key), default=None
    )
    active = latest.key if latest is not None else None
    held = None
    if reservation is not None and snapshot.lease is not None and snapshot.lease.memory is not None:
        held = LeaseReservation(
            reservation.device,
            snapshot.lease.memory,
            free=_free_on(capacity, current.members, reservation.device) >= snapshot.lease.memory,
        )
    if swap is not None:
        swap, update = _advance_eviction(swap, current, now, lease_holder is not None)
        if update is not None:
            swap_updates.append(update)
    # each resident's rules of time, as if it were the one holder, and the evictions' drains
    recheck = [
        next_change(dataclasses.replace(current, active=m.key), now, params) for m in current.members if _holds(m)
    ]
    if acts_on_time(snapshot, params):
        recheck += (m.evicting_since + drain_timeout for m in current.members if m.evicting_since is not None)
    return GroupPlan(
        group=snapshot.name,
        election=election,
        active=active,
        leader_since=snapshot.leader_since if active == snapshot.active else now,
        swap_id=swap.id if swap is not None and swap.phase not in swaps.FINAL else None,
        patches=patches.by_key,
        commands=commands,
        statuses=statuses,
        swap_updates=_dedupe(swap_updates),
        members={m.key: m for m in current.members},
        lease=snapshot.lease if lease_holder is not None or held is not None else None,
        reservation=held,
        recheck_at=first_after(recheck, now),
    )


def _free_on(capacity: Capacity, members: tuple[Member, ...], device: int) -> int:
    """What the models that hold memory or may (``_occupies``: not confirmed parked, residents, evicted ones until
    confirmed parked) leave free on ``device``."""
    by_key = {m.key: m for m in members}
    holding = {m.key: placement_of(m, capacity) for m in members if _occupies(m)}
    return free_memory(capacity, by_key, holding)[device]


def _advance_eviction(
    swap: Swap, current: GroupSnapshot, now: datetime, leased: bool
) -> tuple[Swap, SwapUpdate | None]:
    """The eviction swap's next phase: drained once every evicted model was sent its park, parked once they are
    confirmed parked, ready once the newcomer is; aborted when a lease comes or the newcomer is no longer wanted
    (neither resident nor waiting), failed when its load failed."""
    target = current.member(swap.to_model)
    wanted = target is not None and (_holds(target) or target.queued > 0 or target.demand_since is not None)
    if leased or not wanted or (target is not None and swap.phase is SwapPhase.LOADING and load_failed(target)):
        ended = _end_swap(swap, target, None, now)
        return ended.swap, ended
    assert target is not None
    evicted = [m for m in current.members if m.evicting_since is not None]
    facts = swaps.SwapFacts(
        drained=all(m.desired_action != ScaleAction.ACTIVATE for m in evicted),
        others_parked=not evicted,
        has_leader=True,
        leader_ready=target.ready,
    )
    moved = swaps.advance(swap, facts, now)
    if moved.phase == swap.phase:
        return swap, None
    return moved, SwapUpdate(moved, finished_at=now if moved.phase in swaps.FINAL else None)


def _resident_statuses(
    current: GroupSnapshot,
    election: Election,
    now: datetime,
    params: ElectionParams,
    lease_holder: str | None,
    waiting_room: dict[ModelKey, str],
) -> dict[ModelKey, StatusView]:
    """Every member's view in a group with a capacity: residents are Active (Ready once loaded: routed), an evicted
    one drains (not routed), the models asked for wait in queue order with what they wait for."""
    asked = sorted(
        (
            m
            for m in current.members
            if m.desired_action != ScaleAction.ACTIVATE and is_eligible(m) and asked_for(m, now, params)
        ),
        key=lambda m: (m.key not in waiting_room, -m.priority, m.demand_since or now, rank(m)),
    )
    positions = {m.key: i + 1 for i, m in enumerate(asked)}
    out: dict[ModelKey, StatusView] = {}
    for m in current.members:
        failure = None
        if _holds(m):
            if m.ready:
                phase, message = ModelPhase.READY, ""
            elif runtime_lost(m) and load_failed(m):
                phase, message = ModelPhase.FAILED, m.last_failure or "failed to load"
                failure = message
            elif runtime_lost(m):
                phase, message = ModelPhase.LOADING, f"crashed: {m.runtime_message or 'exited'}; restarting"
            else:
                phase, message = ModelPhase.LOADING, "loading"
            where = ", ".join(str(d) for d in m.placement or ())
            message = (message + "; " if message else "") + f"on device {where}" if where else message
            out[m.key] = StatusView(phase, SharedState.ACTIVE, 0, m.preempted_at, None, message, m.ready, failure)
            continue
        if not m.parked:
            by = lease_holder or m.preempted_by or "another model"
            verb = f"draining ({m.in_flight} in flight)" if m.desired_action == ScaleAction.ACTIVATE else "parking"
            out[m.key] = StatusView(
                ModelPhase.DRAINING,
                SharedState.PARKED,
                None,
                m.preempted_at,
                m.preempted_by,
                f"evicted for {by}: {verb}",
                False,
                None,
            )
            continue
        state = SharedState.QUEUED if m.key in positions else SharedState.PARKED
        if lease_holder is not None:
            phase, message = ModelPhase.PREEMPTED, f"parked while {lease_holder} holds the GPU"
        elif m.failed_at is not None and not is_eligible(m):
            phase, message = ModelPhase.FAILED, m.last_failure or "failed to load"
            failure = message
        elif m.idle_parked_at is not None and not is_eligible(m):
            phase, message = ModelPhase.IDLE, "parked while idle (its idle timeout)"
        elif m.preempted_at is not None:
            phase, message = ModelPhase.PREEMPTED, f"evicted for {m.preempted_by}" if m.preempted_by else "evicted"
        else:
            phase, message = ModelPhase.PENDING, ""
        if m.key in waiting_room:
            message = (message + "; " if message else "") + "waiting: " + waiting_room[m.key]
        out[m.key] = StatusView(
            phase, state, positions.get(m.key), m.preempted_at, lease_holder or m.preempted_by, message, False, failure
        )
    return out
