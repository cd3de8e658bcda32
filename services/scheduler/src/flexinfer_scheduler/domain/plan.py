"""Plan one group: elect, then turn the election into the swap's next step. Pure: a snapshot and ``now`` in,
a :class:`GroupPlan` out (what to write, which commands to send, which statuses to show, which events to emit).

The swap is a persisted state machine: ``draining -> parking -> loading -> ready``. The new leader is told to
activate only once every other member is confirmed parked, so two members of a group never run at once. A command
that got no answer for its generation within ``command_retry`` is sent again (same generation, so it is harmless).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from flexinfer_common.enums import ModelPhase, RuntimePhase, ScaleAction, SharedState, SwapPhase, SwapReason
from flexinfer_scheduler.domain.election import (
    Election,
    ElectionParams,
    ElectionReason,
    cooldown_remaining,
    elect,
    is_eligible,
    rank,
)
from flexinfer_scheduler.domain.model import GroupSnapshot, Lease, Member, ModelKey, Swap


@dataclass(frozen=True)
class Command:
    key: ModelKey
    action: ScaleAction
    generation: int
    swap_id: str | None
    reissue: bool = False


@dataclass(frozen=True)
class StatusView:
    """What users see of a member (the contract's Model status) and what the proxy routes by."""

    phase: ModelPhase
    state: SharedState
    queue_position: int | None
    preempted_at: datetime | None
    preempted_by: str | None
    message: str
    ready: bool
    failure: str | None


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
    member_updates: dict[ModelKey, dict[str, Any]]
    commands: list[Command]
    statuses: dict[ModelKey, StatusView]
    swap_updates: list[SwapUpdate] = field(default_factory=list)
    cooldown_remaining: timedelta = timedelta(0)
    drain_timeout: timedelta | None = None
    lease: Lease | None = None  # the GPU lease this election honoured (published so the lease manager knows)


_REASONS = {
    ElectionReason.DEMAND: SwapReason.DEMAND,
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


def _load_failed(m: Member) -> bool:
    """The member's current activate ended Failed before it was ever seen Ready, and that is recorded already."""
    return m.failed_at is not None and m.command_issued_at is not None and m.failed_at >= m.command_issued_at


def _runtime_lost(m: Member) -> bool:
    """The runtime of the member's current activate is gone (Failed): it was Ready and crashed, or it failed to load."""
    return m.desired_action == ScaleAction.ACTIVATE and m.runtime == RuntimePhase.FAILED and m.runtime_confirmed


def _needs_restart(m: Member) -> bool:
    """An elected member whose runtime is gone gets a fresh activate (as Kubernetes restarts a crashed pod) when it
    crashed after it was Ready, or when it failed to load but was asked for (or promoted) again since."""
    if not _runtime_lost(m):
        return False
    if not _load_failed(m):
        return True
    assert m.failed_at is not None
    return is_eligible(m) or (m.promoted_at is not None and m.promoted_at > m.failed_at)


def _note_failures(snapshot: GroupSnapshot, now: datetime) -> tuple[GroupSnapshot, dict[ModelKey, dict[str, Any]]]:
    """A member whose current activate command ended Failed before it was Ready is marked failed (left out until
    asked for again, so a model that cannot load is not restarted in a loop and its queue learns why); a promote
    call that led to it is over. A model that crashed after it was Ready is not: it stays electable and is
    restarted (the seed's rollout restart)."""
    updates: dict[ModelKey, dict[str, Any]] = {}
    members = []
    for m in snapshot.members:
        failed_now = (
            _runtime_lost(m)
            and m.ready_since is None
            and (m.failed_at is None or (m.command_issued_at is not None and m.failed_at < m.command_issued_at))
        )
        if failed_now:
            reason = m.runtime_message or "the model failed to load"
            updates[m.key] = {"failed_at": now, "last_failure": reason}
            if m.promoted_at is not None:  # else the promotion would pin the group on a model that cannot load
                updates[m.key]["promoted_at"] = None
            m = dataclasses.replace(m, failed_at=now, last_failure=reason, promoted_at=None)
        members.append(m)
    return dataclasses.replace(snapshot, members=tuple(members)), updates


def _advance(swap: Swap, phase: SwapPhase, now: datetime) -> Swap:
    spent = (now - swap.phase_started_at).total_seconds()
    phases = {**swap.phases, swap.phase.value: round(spent, 3)}
    return dataclasses.replace(swap, phase=phase, phase_started_at=now, phases=phases)


def plan_group(
    snapshot: GroupSnapshot,
    now: datetime,
    params: ElectionParams,
    *,
    command_retry: timedelta,
    new_swap_id: str,
    restart_backoff: timedelta = timedelta(0),
) -> GroupPlan:
    """``restart_backoff``: a model that crashed after it was Ready is restarted no sooner than this after its
    previous activate (a crash loop costs at most one load per back-off, as Kubernetes' CrashLoopBackOff)."""
    snapshot, updates = _note_failures(snapshot, now)
    election = elect(snapshot, now, params)
    leader = election.leader

    def update(key: ModelKey, **fields: Any) -> None:
        updates.setdefault(key, {}).update(fields)

    for key in election.idle_expired:
        if key != leader:
            update(key, idle_parked_at=now)

    swap_updates: list[SwapUpdate] = []
    swap = snapshot.swap
    active, leader_since = snapshot.active, snapshot.leader_since
    lease_holder = (
        f"gpu-lease/{snapshot.lease.owner}" if election.reason == ElectionReason.LEASE and snapshot.lease else None
    )

    if leader != active:
        if swap is not None:
            swap_updates.append(
                SwapUpdate(
                    _advance(swap, SwapPhase.ABORTED, now),
                    finished_at=now,
                    message=f"superseded: {leader or 'no leader'} elected",
                )
            )
        old = snapshot.member(active)
        # A preemption takes the GPU from a model that served or was asked for; cancelling a fallback load that
        # nobody asked for (as when manifests arrive one by one) starts no cooldown.
        was_wanted = old is not None and (old.ready_since is not None or old.last_active_time is not None)
        if old is not None and not old.parked and was_wanted and active not in election.idle_expired:
            update(old.key, preempted_at=now, preempted_by=lease_holder or (leader.name if leader else None))
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
        if fresh:
            generation = m.command_generation + 1
            commands.append(Command(m.key, want, generation, swap_id))
            update(m.key, desired_action=want, command_generation=generation, command_issued_at=now)
        elif not m.runtime_confirmed and (m.command_issued_at is None or now - m.command_issued_at >= command_retry):
            commands.append(Command(m.key, want, m.command_generation, swap_id, reissue=True))
            update(m.key, command_issued_at=now)
        else:
            continue
        if want == ScaleAction.ACTIVATE and m.ready_since is not None:
            update(m.key, ready_since=None)  # a runtime started afresh has not been Ready yet

    leader_member = snapshot.member(leader)
    leader_ready = (
        leader_member is not None and leader_member.ready and leader_member.desired_action == ScaleAction.ACTIVATE
    )
    if leader_member is not None:
        if leader_ready and leader_member.ready_since is None:
            update(leader_member.key, ready_since=now)
        if leader_member.promoted_at is not None and leader_ready:
            update(leader_member.key, promoted_at=None)
    for m in members:
        if m.key != leader and m.ready_since is not None:
            update(m.key, ready_since=None)

    # The swap's next phase.
    if swap is not None:
        if swap.phase == SwapPhase.DRAINING:
            swap = _advance(swap, SwapPhase.PARKING, now)
        if swap.phase == SwapPhase.PARKING and others_parked:
            swap = _advance(swap, SwapPhase.LOADING, now) if leader is not None else swap
            if leader is None:
                swap_updates.append(SwapUpdate(_advance(swap, SwapPhase.READY, now), finished_at=now))
                swap = None
        if swap is not None and swap.phase == SwapPhase.LOADING and leader_ready:
            swap_updates.append(SwapUpdate(_advance(swap, SwapPhase.READY, now), finished_at=now))
            swap = None
        if swap is not None and swap.phase != snapshot_phase(snapshot):
            swap_updates.append(SwapUpdate(swap))
        elif swap is not None and not any(u.swap.id == swap.id for u in swap_updates):
            pass

    statuses = _statuses(snapshot, election, leader, now, params, updates, lease_holder)
    return GroupPlan(
        group=snapshot.name,
        election=election,
        active=active,
        leader_since=leader_since,
        swap_id=swap.id if swap is not None else None,
        member_updates=updates,
        commands=commands,
        statuses=statuses,
        swap_updates=_dedupe(swap_updates),
        cooldown_remaining=cooldown_remaining(_with_updates(snapshot, updates), now, params),
        drain_timeout=snapshot.v1alpha1.drain_timeout if snapshot.v1alpha1 is not None else None,
        lease=snapshot.lease if lease_holder is not None else None,
    )


def snapshot_phase(snapshot: GroupSnapshot) -> SwapPhase | None:
    return snapshot.swap.phase if snapshot.swap is not None else None


def _dedupe(updates: list[SwapUpdate]) -> list[SwapUpdate]:
    """Keep the last update of each swap (a swap can be created and advanced in one pass)."""
    latest: dict[str, SwapUpdate] = {}
    created: set[str] = set()
    for u in updates:
        if u.created:
            created.add(u.swap.id)
        latest[u.swap.id] = u
    return [dataclasses.replace(u, created=u.swap.id in created) for u in latest.values()]


def _with_updates(snapshot: GroupSnapshot, updates: dict[ModelKey, dict[str, Any]]) -> GroupSnapshot:
    if not updates:
        return snapshot
    members = tuple(
        dataclasses.replace(m, **{k: v for k, v in updates[m.key].items() if hasattr(m, k)}) if m.key in updates else m
        for m in snapshot.members
    )
    return dataclasses.replace(snapshot, members=members)


def _statuses(
    snapshot: GroupSnapshot,
    election: Election,
    leader: ModelKey | None,
    now: datetime,
    params: ElectionParams,
    updates: dict[ModelKey, dict[str, Any]],
    lease_holder: str | None,
) -> dict[ModelKey, StatusView]:
    current = _with_updates(snapshot, updates)
    waiting = sorted(
        (
            m
            for m in current.members
            if m.key != leader
            and is_eligible(m)
            and (m.queued > 0 or (m.last_active_time is not None and now - m.last_active_time <= params.demand_window))
        ),
        key=rank,
    )
    positions = {m.key: index + 1 for index, m in enumerate(waiting)}
    others_parked = all(m.parked for m in current.members if m.key != leader)
    out: dict[ModelKey, StatusView] = {}
    for m in current.members:
        failure = None
        if m.key == leader:
            if m.ready:
                phase, message = ModelPhase.READY, ""
            elif _runtime_lost(m) and _load_failed(m):  # forced onto a model that failed to load
                phase, message = ModelPhase.FAILED, m.last_failure or "failed to load"
                failure = message
            elif not others_parked:
                blocking = ", ".join(o.key.name for o in current.members if o.key != leader and not o.parked)
                phase, message = ModelPhase.LOADING, f"waiting for {blocking} to park"
            else:
                phase, message = ModelPhase.LOADING, "loading"
            out[m.key] = StatusView(
                phase, SharedState.ACTIVE, 0, m.preempted_at, m.preempted_by, message, m.ready, failure
            )
            continue
        state = SharedState.QUEUED if m.key in positions else SharedState.PARKED
        preempted_by = m.preempted_by
        if lease_holder is not None:
            # Preempted only once it is off the GPU: the lease manager reports a lease Held (and admits a training
            # Job) when every member shows Preempted by the lease.
            preempted_by = lease_holder
            if m.parked:
                phase, message = ModelPhase.PREEMPTED, f"parked while {lease_holder} holds the GPU"
            else:
                phase, message = ModelPhase.DRAINING, f"parking for {lease_holder}"
        elif m.failed_at is not None and not is_eligible(m):
            phase, message = ModelPhase.FAILED, m.last_failure or "failed to load"
            failure = message
        elif m.idle_parked_at is not None and not is_eligible(m):
            phase, message = ModelPhase.IDLE, "parked after its idle timeout"
        elif not m.parked:
            phase, message = ModelPhase.DRAINING, f"parking for {leader.name if leader else 'no leader'}"
        elif m.preempted_at is not None:
            phase, message = ModelPhase.PREEMPTED, f"preempted by {m.preempted_by}" if m.preempted_by else "preempted"
        else:
            phase, message = ModelPhase.PENDING, ""
        if m.parked and m.runtime == RuntimePhase.PARKED and m.runtime_message and m.runtime_message != "sleeping":
            # how the actuator parked it, when that is news (a Sleep park that had to scale to zero)
            message = f"{message}; {m.runtime_message}" if message else m.runtime_message
        if (
            state == SharedState.QUEUED
            and leader is not None
            and election.reason
            in (
                ElectionReason.COOLDOWN,
                ElectionReason.READY,
                ElectionReason.MINIMUM_RUN,
            )
        ):
            message = (message + "; " if message else "") + f"waiting: {leader.name} holds the GPU ({election.reason})"
        out[m.key] = StatusView(
            phase, state, positions.get(m.key), m.preempted_at, preempted_by, message, False, failure
        )
    return out
