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

from flexinfer_common.enums import ScaleAction, SharedState, SwapPhase, SwapReason
from flexinfer_scheduler.domain import swap as swaps
from flexinfer_scheduler.domain.election import (
    Election,
    ElectionParams,
    ElectionReason,
    cooldown_remaining,
    elect,
    is_eligible,
    wants_gpu,
)
from flexinfer_scheduler.domain.model import NO_CHANGE, GroupSnapshot, Lease, Member, MemberPatch, ModelKey, Swap
from flexinfer_scheduler.domain.status import StatusView, load_failed, runtime_lost, status_views

__all__ = ["Command", "GroupPlan", "StatusView", "SwapUpdate", "apply_plan", "plan_group"]


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
}


def _swap_reason(election: Election, previous: ModelKey | None) -> SwapReason:
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
    drain_timeout: timedelta = timedelta(seconds=60),
    drain_settle: timedelta = timedelta(seconds=1),
) -> GroupPlan:
    """``restart_backoff``: a model that crashed after it was Ready is restarted no sooner than this after its
    previous activate (a crash loop costs at most one load per back-off, as Kubernetes' CrashLoopBackOff).
    ``drain_timeout``: how long a swap waits for the outgoing model's requests in flight (a v1alpha1 group's
    ``drainTimeoutSeconds`` wins); ``drain_settle``: how long a drain waits for the proxies' counts when the outgoing
    model served a request lately (their report interval)."""
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
            aborted = swaps.fire(swap, swaps.SwapEvent.SUPERSEDED, now)
            swap_updates.append(SwapUpdate(aborted, finished_at=now, message=f"superseded: {leader or 'no leader'}"))
        old = snapshot.member(active)
        # A preemption takes the GPU from a model that served or was asked for; cancelling a fallback load that
        # nobody asked for (as when manifests arrive one by one) starts no cooldown.
        was_wanted = old is not None and (old.ready_since is not None or old.last_active_time is not None)
        if old is not None and not old.parked and was_wanted and active not in election.idle_expired:
            patches.add(
                old.key, MemberPatch(preempted_at=now, preempted_by=lease_holder or (leader.name if leader else None))
            )
        swap = Swap(
            id=new_swap_id,
            from_model=active,
            to_model=leader,
            reason=_swap_reason(election, active),
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
        restart = (
            want == ScaleAction.ACTIVATE
            and _needs_restart(m)
            and (m.command_issued_at is None or now - m.command_issued_at >= restart_backoff)
        )
        fresh = m.desired_action != want or restart
        if want == ScaleAction.ACTIVATE and fresh and not others_parked:
            continue  # never two on one GPU: activate only once every other member is confirmed parked
        if want == ScaleAction.PARK and m.desired_action is None and m.runtime is None:
            continue  # never started: nothing to park
        if fresh and not swaps.may_command(phase, want, m):
            continue  # the swap's phase holds this command back (a draining model finishes first)
        if fresh:
            generation = m.command_generation + 1
            commands.append(Command(m.key, want, generation, swap_id))
            patches.add(m.key, MemberPatch(desired_action=want, command_generation=generation, command_issued_at=now))
        elif not m.runtime_confirmed and (m.command_issued_at is None or now - m.command_issued_at >= command_retry):
            commands.append(Command(m.key, want, m.command_generation, swap_id, reissue=True))
            patches.add(m.key, MemberPatch(command_issued_at=now))
        else:
            continue
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
