"""What users see of each member after a pass (the contract's Model status) and what the proxies route by. Pure."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import NamedTuple

from flexinfer_common.enums import ModelPhase, RuntimePhase, ScaleAction, SchedulingPolicy, SharedState, SwapPhase
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import (
    Election,
    ElectionParams,
    ElectionReason,
    asked_for,
    cooldown_remaining,
    is_eligible,
    policy_of,
    rank,
)
from flexinfer_scheduler.domain.manifests import group_phrase
from flexinfer_scheduler.domain.model import GroupSnapshot, Member, Swap


class StatusView(NamedTuple):
    """A member's view after a pass (a tuple: a pass over 10,000 models builds 10,000 of them)."""

    phase: ModelPhase
    state: SharedState
    queue_position: int | None
    preempted_at: datetime | None
    preempted_by: str | None
    message: str
    ready: bool
    failure: str | None


def load_failed(m: Member) -> bool:
    """The member's current activate ended Failed before it was ever seen Ready, and that is recorded already."""
    return m.failed_at is not None and m.command_issued_at is not None and m.failed_at >= m.command_issued_at


def runtime_lost(m: Member) -> bool:
    """The runtime of the member's current activate is gone (Failed): it was Ready and crashed, or it failed to load."""
    return m.desired_action == ScaleAction.ACTIVATE and m.runtime == RuntimePhase.FAILED and m.runtime_confirmed


_WAITING_REASONS = (
    ElectionReason.COOLDOWN,
    ElectionReason.READY,
    ElectionReason.MINIMUM_RUN,
    ElectionReason.HYSTERESIS,
)


@functools.lru_cache(maxsize=4096)
def _clock(when: datetime) -> str:
    return when.strftime("%H:%M:%S")


def explain_wait(
    m: Member,
    holder: Member,
    election: Election,
    current: GroupSnapshot,
    now: datetime,
    params: ElectionParams,
    held: timedelta | None = None,
) -> str:
    """What a waiting member waits for, and until when: "a holds the GPU; swap cooldown ends at 19:05:12; bounded
    wait ends at 19:06:00" (times UTC). ``held``: the group's cooldown left, when the caller worked it out already
    (it is the same for every member)."""
    parts = [f"{holder.key.name} holds the GPU"]
    if held is None:
        held = cooldown_remaining(current, now, params)
    if election.reason is ElectionReason.COOLDOWN and held > timedelta(0):
        parts.append(f"swap cooldown ends at {_clock(now + held)}")
    elif election.reason is ElectionReason.COOLDOWN and not holder.ready:
        parts.append("it is loading")
    elif election.reason in (ElectionReason.MINIMUM_RUN, ElectionReason.HYSTERESIS):
        parts.append(str(election.reason))
    if m.priority < holder.priority:
        parts.append(f"priority {m.priority} < {holder.priority}: waits until {holder.key.name} is idle")
    else:
        bound = params.max_wait(m)
        if bound is not None and m.demand_since is not None and current.v1alpha1 is None:
            parts.append(f"bounded wait ends at {_clock(max(m.demand_since + bound, now + held))}")
        elif current.v1alpha1 is None and policy_of(current, params) is SchedulingPolicy.SEED:
            parts.append(f"waits until {holder.key.name} is idle for {params.demand_window.total_seconds():.0f}s")
    return "waiting: " + "; ".join(parts)


def _waiting(m: Member, current: GroupSnapshot, now: datetime, params: ElectionParams) -> bool:
    if current.v1alpha1 is None and policy_of(current, params) is SchedulingPolicy.FLEXINFER:
        return asked_for(m, now, params)
    return m.queued > 0 or (m.last_active_time is not None and now - m.last_active_time <= params.demand_window)


def status_views(
    current: GroupSnapshot,
    election: Election,
    swap: Swap | None,
    now: datetime,
    params: ElectionParams,
    lease_holder: str | None,
) -> dict[ModelKey, StatusView]:
    """Every member's view, from the snapshot as this pass leaves it (patches applied) and the swap it runs."""
    leader = election.leader
    waiting = sorted(
        (m for m in current.members if m.key != leader and is_eligible(m) and _waiting(m, current, now, params)),
        key=rank,
    )
    positions = {m.key: index + 1 for index, m in enumerate(waiting)}
    not_parked = [o.key.name for o in current.members if o.key != leader and not o.parked]
    draining = swap is not None and swap.phase is SwapPhase.DRAINING
    holder = current.member(leader)
    held: timedelta | None = None
    out: dict[ModelKey, StatusView] = {}
    for m in current.members:
        failure = None
        if m.key == leader:
            if m.ready:
                phase, message = ModelPhase.READY, ""
            elif runtime_lost(m) and load_failed(m):  # forced onto a model that failed to load
                phase, message = ModelPhase.FAILED, m.last_failure or "failed to load"
                failure = message
            elif runtime_lost(m):  # it was Ready and its server died: restarted after the back-off
                phase, message = ModelPhase.LOADING, f"crashed: {m.runtime_message or 'exited'}; restarting"
            elif not_parked:
                verb = "drain" if draining else "park"
                phase, message = ModelPhase.LOADING, f"waiting for {', '.join(not_parked)} to {verb}"
            elif m.runtime == RuntimePhase.LOADING and m.runtime_confirmed and m.runtime_message:
                phase, message = ModelPhase.LOADING, f"loading: {m.runtime_message}"  # e.g. the probe's answers
            else:
                phase, message = ModelPhase.LOADING, "loading"
            # preemptedBy is history once the model holds the GPU again (preemptedAt stays: the cooldown's)
            out[m.key] = StatusView(phase, SharedState.ACTIVE, 0, m.preempted_at, None, message, m.ready, failure)
            continue
        state = SharedState.QUEUED if m.key in positions else SharedState.PARKED
        preempted_by = m.preempted_by
        target = leader.name if leader else "no leader"
        idle = m.idle_parked_at is not None and not is_eligible(m)  # parked as idle, not asked for since
        if lease_holder is not None:
            # Preempted only once it is off the GPU: the lease manager reports a lease Held (and admits a training
            # Job) when every member shows Preempted by the lease.
            preempted_by = lease_holder
            if m.parked:
                phase, message = ModelPhase.PREEMPTED, f"parked while {lease_holder} holds the GPU"
            elif draining and m.ready:
                phase, message = ModelPhase.DRAINING, f"draining for {lease_holder} ({m.in_flight} in flight)"
            else:
                phase, message = ModelPhase.DRAINING, f"parking for {lease_holder}"
        elif m.failed_at is not None and not is_eligible(m):
            phase, message = ModelPhase.FAILED, m.last_failure or "failed to load"
            failure = message
        elif idle and m.parked:
            # Idle once the actuator confirmed it off the GPU (Draining until then, as in a group with a capacity):
            # a change refused while the model may hold the GPU ("park it first, or wait until parked") goes
            # through once it shows Idle
            phase, message = (
                ModelPhase.IDLE,
                "parked while idle (its idle timeout, or quiet while another model waited)",
            )
        elif not m.parked and draining and m.ready:
            phase, message = ModelPhase.DRAINING, f"draining for {target} ({m.in_flight} in flight)"
        elif not m.parked:
            phase, message = (
                ModelPhase.DRAINING,
                "parking while idle" if idle and leader is None else f"parking for {target}",
            )
        elif m.preempted_at is not None:
            phase, message = ModelPhase.PREEMPTED, f"preempted by {m.preempted_by}" if m.preempted_by else "preempted"
        else:
            phase, message = ModelPhase.PENDING, ""
        if m.parked and m.runtime == RuntimePhase.PARKED and m.runtime_message and m.runtime_message != "sleeping":
            # how the actuator parked it, when that is news (a Sleep park that had to scale to zero)
            message = f"{message}; {m.runtime_message}" if message else m.runtime_message
        if m.moving_to is not None:
            # (moved by a membership change from Kubernetes while it may hold this group's card)
            moving = f"moving to {group_phrase(m.moving_to)} once parked in {group_phrase(current.name)}"
            message = f"{moving}; {message}" if message else moving
        if state == SharedState.QUEUED and holder is not None and election.reason in _WAITING_REASONS:
            if held is None:
                held = cooldown_remaining(current, now, params)  # once per group: every member waits for the same
            message = (message + "; " if message else "") + explain_wait(
                m, holder, election, current, now, params, held
            )
        out[m.key] = StatusView(
            phase, state, positions.get(m.key), m.preempted_at, preempted_by, message, False, failure
        )
    return out
