"""The status page's view model: what the page shows, built from plain records and ``now``. Pure (no I/O, no clock):
the routes (``ui/routes.py``) read the store and the bus into these records and push the result to every open
page; the browser only draws it.

What it answers, per group: who holds the card (and the memory in use once a capacity is declared), every member's
phase, state, requests waiting and in flight, last activity and why it waits; over the last hour: a swap timeline
(who held the card, loading and draining shaded, failures marked, as ``flexinfer simulate``'s picture) and the
queue depths; the recent events; the leases with their expiry.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from flexinfer_common.clock import rfc3339

WINDOW = timedelta(hours=1)
MAX_EVENTS = 100
#: the phases of a swap in the order they run, and how the timeline shades each (the model it concerns)
_SWAP_STEPS = (("draining", "from"), ("parking", "from"), ("loading", "to"))
_LOADED_PHASES = {"Ready", "Loading", "Draining"}


@dataclass(frozen=True)
class MemberInfo:
    """One model as the page shows it (the store's row, its demand and in-flight counts)."""

    namespace: str
    name: str
    group: str
    priority: int = 0
    phase: str = "Pending"
    state: str | None = None
    queue_position: int | None = None
    waiting: int = 0
    in_flight: int = 0
    last_active_time: datetime | None = None
    message: str = ""
    preempted_by: str | None = None
    restarts: int = 0
    memory: str | None = None  # spec.gpu.memory as declared (a Kubernetes quantity), when it is


@dataclass(frozen=True)
class DeviceInfo:
    """One card of a group with a capacity, as the planner sees it: what the models on it hold (loading, serving or
    not yet confirmed parked; estimated sizes included) and what is free."""

    index: int
    used_bytes: int
    free_bytes: int
    models: tuple[str, ...] = ()  # "namespace/name"


@dataclass(frozen=True)
class GroupInfo:
    name: str
    state: str
    active: str | None  # "namespace/name"
    cooldown_remaining_seconds: float = 0.0
    capacity_memory: str | None = None  # a GPUGroup's spec.capacity.memoryPerDevice, when declared
    capacity_devices: int | None = None
    devices: tuple[DeviceInfo, ...] = ()  # with a capacity: every card's use (the group API's ``devices``)


@dataclass(frozen=True)
class SwapInfo:
    id: str
    group: str
    from_model: str | None
    to_model: str | None
    reason: str
    phase: str
    started_at: datetime
    finished_at: datetime | None
    phases: Mapping[str, float] = field(default_factory=dict)
    message: str = ""


@dataclass(frozen=True)
class LeaseInfo:
    name: str
    group: str
    owner: str
    expires_at: datetime
    acquired_at: datetime | None = None


@dataclass(frozen=True)
class EventInfo:
    """One line of the recent events: ``kind`` as on the bus (``swap.failed``, ``model.restarted``, ...)."""

    time: datetime
    kind: str
    group: str | None
    text: str
    severity: str = "info"  # info | warning | error


def swap_outcome(phase: str) -> str | None:
    """How a swap ended (``ready``, ``failed``, ``aborted``); None while it runs."""
    return phase if phase in {"ready", "failed", "aborted"} else None


_QUANTITY = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([KMGTPE]i?)?\s*$")
_UNITS = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_UNITS.update({f"{u}i": 1024 ** (i + 1) for i, u in enumerate("KMGTPE")})


def quantity_bytes(value: str | None) -> int | None:
    """A Kubernetes quantity (``6Gi``, ``500M``, ``1024``) in bytes; None when absent or not one."""
    if not value:
        return None
    match = _QUANTITY.match(str(value))
    if match is None:
        return None
    return int(float(match.group(1)) * _UNITS[match.group(2) or ""])


def _key(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def _member_json(m: MemberInfo, *, holds: bool) -> dict[str, Any]:
    return {
        "key": _key(m.namespace, m.name),
        "namespace": m.namespace,
        "name": m.name,
        "priority": m.priority,
        "phase": m.phase,
        "state": m.state,
        "queuePosition": m.queue_position,
        "waiting": m.waiting,
        "inFlight": m.in_flight,
        "lastActiveTime": rfc3339(m.last_active_time),
        "message": m.message,
        "preemptedBy": m.preempted_by,
        "restarts": m.restarts,
        "holdsCard": holds,
        "memoryBytes": quantity_bytes(m.memory),
    }


def timeline(swaps: Iterable[SwapInfo], now: datetime, *, window: timedelta = WINDOW) -> dict[str, Any]:
    """The swap timeline of the last ``window``: per group, segments ``{model, start, end, kind}`` (``held``,
    ``draining``, ``parking``, ``loading``) and marks ``{time, model, kind, text}`` for swaps that failed or were
    aborted. A model holds the card from the end of the swap that loaded it to the start of the next swap."""
    start = now - window
    by_group: dict[str, list[SwapInfo]] = {}
    for swap in sorted(swaps, key=lambda s: s.started_at):
        by_group.setdefault(swap.group, []).append(swap)
    segments: list[dict[str, Any]] = []
    marks: list[dict[str, Any]] = []

    def add(group: str, model: str | None, a: datetime, b: datetime, kind: str) -> None:
        a, b = max(a, start), min(b, now)
        if model and b > a:
            segments.append({"group": group, "model": model, "start": rfc3339(a), "end": rfc3339(b), "kind": kind})

    for group, items in by_group.items():
        for index, swap in enumerate(items):
            following = items[index + 1] if index + 1 < len(items) else None
            if index == 0 and swap.from_model:
                add(group, swap.from_model, start, swap.started_at, "held")
            t = swap.started_at
            for phase, who in _SWAP_STEPS:
                model = swap.from_model if who == "from" else swap.to_model
                if phase in swap.phases:
                    end = t + timedelta(seconds=float(swap.phases[phase]))
                elif phase == swap.phase and swap.finished_at is None:
                    end = following.started_at if following else now
                else:
                    continue
                add(group, model, t, end, phase)
                t = end
            outcome = swap_outcome(swap.phase)
            if outcome == "ready" and swap.to_model:
                add(group, swap.to_model, swap.finished_at or t, following.started_at if following else now, "held")
            elif outcome in {"failed", "aborted"}:
                when = swap.finished_at or t
                if when >= start:
                    marks.append(
                        {
                            "group": group,
                            "model": swap.to_model,
                            "time": rfc3339(when),
                            "kind": outcome,
                            "text": swap.message or outcome,
                        }
                    )
    return {"start": rfc3339(start), "end": rfc3339(now), "segments": segments, "marks": marks}


def swap_events(swaps: Iterable[SwapInfo], now: datetime, *, window: timedelta = WINDOW) -> list[EventInfo]:
    """The swaps of the last ``window`` as event lines (kept in the database, so a restarted scheduler shows them
    too): a start each, and how each ended."""
    out: list[EventInfo] = []
    for s in swaps:
        moved = f"{s.from_model or 'nothing'} → {s.to_model or 'nothing'}"
        if s.started_at >= now - window:
            preempts = s.from_model is not None and s.reason in {"demand", "max-wait", "force-promotion", "lease"}
            kind = "preemption" if preempts else "swap.started"
            out.append(EventInfo(s.started_at, kind, s.group, f"{moved} ({s.reason})"))
        outcome = swap_outcome(s.phase)
        if outcome is not None and s.finished_at is not None and s.finished_at >= now - window:
            took = (s.finished_at - s.started_at).total_seconds()
            if outcome == "ready":
                out.append(EventInfo(s.finished_at, "swap.finished", s.group, f"{moved}: ready after {took:.1f} s"))
            else:
                severity = "error" if outcome == "failed" else "warning"
                why = f": {s.message}" if s.message else ""
                out.append(EventInfo(s.finished_at, f"swap.{outcome}", s.group, f"{moved} {outcome}{why}", severity))
    return out


def queue_series(
    history: Mapping[str, Sequence[tuple[datetime, int]]], now: datetime, *, window: timedelta = WINDOW
) -> dict[str, Any]:
    """Requests waiting per model over the last ``window``, as ``[time, count]`` points (a model that never had
    any waiting is left out)."""
    start = now - window
    series: list[dict[str, Any]] = []
    peak = 0
    for model in sorted(history):
        points = [(t, n) for t, n in history[model] if t >= start]
        if any(n for _, n in points):
            series.append({"model": model, "points": [[rfc3339(t), n] for t, n in points]})
            peak = max(peak, *(n for _, n in points))
    return {"start": rfc3339(start), "end": rfc3339(now), "peak": peak, "series": series}


def build_view(
    *,
    groups: Sequence[GroupInfo],
    members: Sequence[MemberInfo],
    swaps: Sequence[SwapInfo],
    leases: Sequence[LeaseInfo],
    events: Sequence[EventInfo],
    queue_history: Mapping[str, Sequence[tuple[datetime, int]]],
    now: datetime,
) -> dict[str, Any]:
    """The whole page's data (JSON-ready)."""
    by_group: dict[str, list[MemberInfo]] = {}
    for m in members:
        by_group.setdefault(m.group, []).append(m)
    leases_by_group = {lease.group: lease for lease in leases if lease.expires_at > now}
    out_groups = []
    for g in sorted(groups, key=lambda g: g.name):
        group_members = sorted(by_group.get(g.name, []), key=lambda m: (-m.priority, m.name))
        holders = [
            _key(m.namespace, m.name)
            for m in group_members
            if _key(m.namespace, m.name) == g.active or m.phase in {"Ready", "Draining"}
        ]
        memory = None
        capacity = quantity_bytes(g.capacity_memory)
        declared = [
            b for m in group_members if m.phase in _LOADED_PHASES and (b := quantity_bytes(m.memory)) is not None
        ]
        if g.devices:  # the planner's view: per card, estimates included
            memory = {
                "usedBytes": sum(d.used_bytes for d in g.devices),
                "capacityBytes": sum(d.used_bytes + d.free_bytes for d in g.devices),
                "devices": [
                    {"index": d.index, "usedBytes": d.used_bytes, "freeBytes": d.free_bytes, "models": list(d.models)}
                    for d in g.devices
                ],
            }
        elif capacity is not None or declared:
            memory = {
                "usedBytes": sum(declared),
                "capacityBytes": capacity * (g.capacity_devices or 1) if capacity is not None else None,
            }
        lease = leases_by_group.get(g.name)
        out_groups.append(
            {
                "name": g.name,
                "state": g.state,
                "active": g.active,
                "holders": holders,
                "cooldownRemainingSeconds": g.cooldown_remaining_seconds,
                "memory": memory,
                "lease": _lease_json(lease, now) if lease else None,
                "members": [_member_json(m, holds=_key(m.namespace, m.name) in holders) for m in group_members],
            }
        )
    every_event = sorted([*events, *swap_events(swaps, now)], key=lambda e: e.time, reverse=True)[:MAX_EVENTS]
    return {
        "now": rfc3339(now),
        "groups": out_groups,
        "timeline": timeline(swaps, now),
        "queues": queue_series(queue_history, now),
        "events": [
            {"time": rfc3339(e.time), "kind": e.kind, "group": e.group, "text": e.text, "severity": e.severity}
            for e in every_event
        ],
        "leases": [_lease_json(lease, now) for lease in sorted(leases, key=lambda x: x.expires_at)],
        "swaps": [
            {
                "id": s.id,
                "group": s.group,
                "fromModel": s.from_model,
                "toModel": s.to_model,
                "reason": s.reason,
                "phase": s.phase,
                "outcome": swap_outcome(s.phase),
                "startedAt": rfc3339(s.started_at),
                "finishedAt": rfc3339(s.finished_at),
                "message": s.message,
            }
            for s in sorted(swaps, key=lambda s: s.started_at, reverse=True)[:20]
        ],
    }


def _lease_json(lease: LeaseInfo, now: datetime) -> dict[str, Any]:
    return {
        "name": lease.name,
        "group": lease.group,
        "owner": lease.owner,
        "acquiredAt": rfc3339(lease.acquired_at),
        "expiresAt": rfc3339(lease.expires_at),
        "remainingSeconds": max(0.0, round((lease.expires_at - now).total_seconds(), 1)),
    }
