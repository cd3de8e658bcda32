"""The swap as an explicit state machine: what moves a swap from one phase to the next, and what each phase lets
the planner command. Pure: facts about a snapshot in, the swap's new phase out.

A swap starts (in ``draining``) when the election picks a leader other than the group's active model, and ends in
``ready`` (the new leader serves, or the GPU is empty when there is no new leader) or ``aborted`` (the election
changed its mind; the next swap starts from where things stand).

| phase      | event            | next     | what the planner may command meanwhile                                  |
|------------|------------------|----------|-------------------------------------------------------------------------|
| draining   | drained          | parking  | nothing for a model that still serves: its route takes no new requests  |
|            |                  |          | (they queue at the proxies) while those in flight finish                |
| parking    | parked           | loading  | park every member but the new leader                                    |
| parking    | nothing-to-load  | ready    | (no new leader: a GPU lease, an idle timeout) park every member         |
| loading    | leader-ready     | ready    | park the others, activate the new leader                                |
| loading    | load-failed      | failed   | (the new leader failed to load; the next swap starts from there)        |
| any active | superseded       | aborted  | the next swap's                                                         |

``drained``: no request is in flight at any proxy for the models being parked (at least ``settle`` after the
drain started when one of them served a request lately, so the proxies' counts are in), or nothing served, or
the drain timeout ran out. ``parked``: every member but the new leader is confirmed parked by the actuator for its
latest command. Several events can follow each other in one pass (an idle incumbent with nothing in flight goes
from draining to loading at once).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from flexinfer_common.enums import ScaleAction, SwapPhase
from flexinfer_scheduler.domain.model import Member, Swap


class SwapEvent(StrEnum):
    DRAINED = "drained"
    PARKED = "parked"
    NOTHING_TO_LOAD = "nothing-to-load"
    LEADER_READY = "leader-ready"
    SUPERSEDED = "superseded"
    LOAD_FAILED = "load-failed"


TRANSITIONS: dict[tuple[SwapPhase, SwapEvent], SwapPhase] = {
    (SwapPhase.DRAINING, SwapEvent.DRAINED): SwapPhase.PARKING,
    (SwapPhase.PARKING, SwapEvent.PARKED): SwapPhase.LOADING,
    (SwapPhase.PARKING, SwapEvent.NOTHING_TO_LOAD): SwapPhase.READY,
    (SwapPhase.LOADING, SwapEvent.LEADER_READY): SwapPhase.READY,
    (SwapPhase.DRAINING, SwapEvent.SUPERSEDED): SwapPhase.ABORTED,
    (SwapPhase.PARKING, SwapEvent.SUPERSEDED): SwapPhase.ABORTED,
    (SwapPhase.LOADING, SwapEvent.SUPERSEDED): SwapPhase.ABORTED,
    (SwapPhase.LOADING, SwapEvent.LOAD_FAILED): SwapPhase.FAILED,
}

FINAL = frozenset({SwapPhase.READY, SwapPhase.ABORTED, SwapPhase.FAILED})

#: What the planner may command while a swap is in a phase (None: no swap runs). During ``draining`` a member that
#: is serving is not parked; one that serves nothing (still loading, say) may be.
ALLOWED: dict[SwapPhase | None, frozenset[ScaleAction]] = {
    SwapPhase.DRAINING: frozenset({ScaleAction.PARK}),
    SwapPhase.PARKING: frozenset({ScaleAction.PARK}),
    SwapPhase.LOADING: frozenset({ScaleAction.PARK, ScaleAction.ACTIVATE}),
    None: frozenset({ScaleAction.PARK, ScaleAction.ACTIVATE}),
}


def may_command(phase: SwapPhase | None, action: ScaleAction, member: Member) -> bool:
    """Whether a swap in ``phase`` lets the planner send ``action`` to ``member`` now."""
    if action not in ALLOWED[phase]:
        return False
    return not (phase is SwapPhase.DRAINING and action is ScaleAction.PARK and member.ready)


@dataclass(frozen=True)
class SwapFacts:
    """What the planner observed in this pass, for the swap's events."""

    drained: bool
    others_parked: bool
    has_leader: bool
    leader_ready: bool


def event_for(phase: SwapPhase, facts: SwapFacts) -> SwapEvent | None:
    """The event the facts raise in ``phase`` (None: the swap stays where it is)."""
    if phase is SwapPhase.DRAINING and facts.drained:
        return SwapEvent.DRAINED
    if phase is SwapPhase.PARKING and facts.others_parked:
        return SwapEvent.PARKED if facts.has_leader else SwapEvent.NOTHING_TO_LOAD
    if phase is SwapPhase.LOADING and facts.leader_ready:
        return SwapEvent.LEADER_READY
    return None


def enter(swap: Swap, phase: SwapPhase, now: datetime) -> Swap:
    """``swap`` in ``phase`` from ``now``, with the seconds spent in the phase it leaves."""
    spent = (now - swap.phase_started_at).total_seconds()
    phases = {**swap.phases, swap.phase.value: round(spent, 3)}
    return dataclasses.replace(swap, phase=phase, phase_started_at=now, phases=phases)


def fire(swap: Swap, event: SwapEvent, now: datetime) -> Swap:
    """Apply one event through the transition table (an event the phase does not take is an error of the caller)."""
    return enter(swap, TRANSITIONS[(swap.phase, event)], now)


def advance(swap: Swap, facts: SwapFacts, now: datetime) -> Swap:
    """Fire every event the facts raise, one after the other, until the swap rests or ends."""
    while swap.phase not in FINAL and (event := event_for(swap.phase, facts)) is not None:
        swap = fire(swap, event, now)
    return swap


def drained(outgoing: list[Member], swap: Swap, now: datetime, *, drain_timeout: timedelta, settle: timedelta) -> bool:
    """Whether the models a swap takes the GPU from have finished what they were answering (see the module
    docstring). ``outgoing``: the members being parked that still serve (Ready)."""
    if not outgoing:
        return True
    spent = now - swap.phase_started_at
    if spent >= drain_timeout:
        return True
    if any(m.in_flight > 0 for m in outgoing):
        return False
    if spent >= settle:
        return True
    # Nothing in flight as far as the proxies told. A request forwarded just before the route changed is counted
    # within ``settle``; a model that answered nothing lately has none.
    since = swap.phase_started_at - settle
    return not any(m.last_active_time is not None and m.last_active_time > since for m in outgoing)
