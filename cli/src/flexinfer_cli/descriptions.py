"""``flexinfer describe``: one resource as a readable page, as ``kubectl describe`` prints one: its spec and status
(camelCase field names as Title Case words), then what FlexInfer knows around it: the model's group, its recent
swaps and its events (from the ``flexinfer.events.*`` stream). A group's page shows its election and why, and each
member's reasoning: why it holds the GPU or what it waits for, until when.

Everything here is pure: typed API answers and ``now`` in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer_cli.tables import NONE, format_seconds, render_table, swap_row
from flexinfer_common.admin_api import Group, GroupMember, Swap
from flexinfer_common.clock import rfc3339
from flexinfer_common.manifests import Model

INDENT = "  "
RECENT_SWAPS = 5
RECENT_EVENTS = 10


def title(key: str) -> str:
    """``swapCooldown`` -> ``Swap Cooldown``, ``gpu`` -> ``GPU`` (what kubectl describe does to CRD fields)."""
    words = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", key).split()
    return " ".join(w.upper() if w.lower() in {"gpu", "id", "url", "ttl"} else w[:1].upper() + w[1:] for w in words)


def fields(value: Any, depth: int = 0) -> list[str]:
    """Nested mappings and lists as indented ``Key:  value`` lines."""
    pad = INDENT * depth
    lines: list[str] = []
    if isinstance(value, dict):
        width = max((len(title(k)) + 1 for k in value), default=0)
        for key, child in value.items():
            label = f"{title(key)}:"
            if isinstance(child, dict) and child:
                lines.append(f"{pad}{label}")
                lines.extend(fields(child, depth + 1))
            elif isinstance(child, list) and child and any(isinstance(x, dict | list) for x in child):
                lines.append(f"{pad}{label}")
                for entry in child:
                    sub = fields(entry, depth + 2)
                    if sub:
                        sub[0] = f"{pad}{INDENT}- {sub[0].lstrip()}"
                    lines.extend(sub)
            else:
                lines.append(f"{pad}{label.ljust(width)}  {scalar(child)}")
    else:
        lines.append(f"{pad}{scalar(value)}")
    return lines


def scalar(value: Any) -> str:
    if value is None or value == "" or value == [] or value == {}:
        return NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ", ".join(scalar(v) for v in value)
    return str(value)


def age(then: datetime | None, now: datetime) -> str:
    """``3m10s`` (kubectl's AGE); ``<unknown>`` without a time."""
    if then is None:
        return "<unknown>"
    return format_seconds(max(0.0, (now - then).total_seconds())) or "0s"


@dataclass(frozen=True)
class Event:
    """One line of the Events section."""

    time: datetime
    kind: str
    message: str


@dataclass(frozen=True)
class Events:
    """The events found, or why there are none to show (NATS not reachable, ...)."""

    items: tuple[Event, ...] = ()
    unavailable: str | None = None


def involves(swap: Swap, model: str) -> bool:
    return model in {swap.from_model, swap.to_model}


def describe_model(model: Model, *, group: Group | None, swaps: Sequence[Swap], events: Events, now: datetime) -> str:
    """The page of ``flexinfer describe model NAME``."""
    meta = model.metadata
    ref = f"{meta.namespace}/{meta.name}"
    manifest = model.model_dump(mode="json", by_alias=True, exclude_none=True)
    lines = [
        f"Name:         {meta.name}",
        f"Namespace:    {meta.namespace or NONE}",
        f"API Version:  {manifest.get('apiVersion', NONE)}",
        f"Kind:         {manifest.get('kind', 'Model')}",
    ]
    if meta.labels:
        lines.append("Labels:       " + ", ".join(f"{k}={v}" for k, v in sorted(meta.labels.items())))
    if meta.generation is not None:
        lines.append(f"Generation:   {meta.generation}")
    lines.append("Spec:")
    lines.extend(fields(manifest.get("spec", {}), 1))
    lines.append("Status:")
    status = manifest.get("status") or {}
    if status:
        lines.extend(fields(status, 1))
    else:
        lines.append(f"{INDENT}{NONE}")
    if model.status is not None and model.status.last_active_time is not None:
        lines.append(f"{INDENT}(last active {age(model.status.last_active_time, now)} ago)")

    lines.append(f"Group:          {group_line(group, model)}")

    mine = [s for s in swaps if involves(s, ref)][:RECENT_SWAPS]
    lines.append("Recent Swaps:" + ("" if mine else f"  {NONE}"))
    if mine:
        headers = ("GROUP", "FROM", "TO", "REASON", "STARTED", "DURATION", "PHASES", "OUTCOME")
        lines.extend(INDENT + line for line in render_table(headers, [swap_row(s) for s in mine]).splitlines())

    lines.extend(events_section(events, now))
    return "\n".join(lines)


def group_line(group: Group | None, model: Model) -> str:
    if group is None:
        return NONE if not model.spec.gpu.shared else f"{model.spec.gpu.shared} (not known to the scheduler yet)"
    active = f"{group.active_model.namespace}/{group.active_model.name}" if group.active_model else NONE
    parts = [f"{group.name} ({group.policy})", f"active {active}", f"state {group.state}"]
    if group.cooldown_remaining_seconds:
        parts.append(f"cooldown {format_seconds(group.cooldown_remaining_seconds)}")
    if group.lease is not None:
        parts.append(f"leased by {group.lease.owner} until {rfc3339(group.lease.expires_at) or NONE}")
    return ", ".join(parts)


# The election's reasons (the scheduler's ElectionReason values, as the group API gives them), in a user's words.
ELECTION_REASONS: dict[str, str] = {
    "gpu-lease": "a GPU lease holds the group: no model runs until it ends",
    "force-promotion": "promoted (forcePromotion or `flexinfer promote`)",
    "cooldown": "it keeps the GPU until its hold ends (the swap cooldown: its load pays for itself)",
    "demand": "requests wait for it and no rule keeps the GPU from it",
    "max-wait": "its requests waited past their bound (maxWait), so the busy holder drains for it",
    "quiet-yield": "the holder went quiet and yields to it (parked as idle, no preemption)",
    "hysteresis": "the challenger's demand has not lasted the hysteresis window yet",
    "ready": "it is loaded and no waiting model may take the GPU from it",
    "recent": "nobody asks for the GPU: the member active most recently",
    "fallback": "nobody asks for the GPU: the one member of the highest priority",
    "minimum-run": "the holder has not run its minimum run duration yet",
    "no-candidate": "no member runs: none asked for (peers of the highest priority wait for a request), or each "
    "parked idle or failed",
}


def ref_of(namespace: str, name: str) -> str:
    return f"{namespace}/{name}"


def election_line(group: Group) -> str:
    """``default/chat leads (ready: it is loaded and ...)``; ``<none>`` for an answer without the election."""
    if group.election is None:
        return NONE
    reason = group.election.reason
    explained = f"{reason}: {ELECTION_REASONS[reason]}" if reason in ELECTION_REASONS else reason
    leader = group.election.leader
    if leader is None:
        return f"no leader ({explained})"
    return f"{ref_of(leader.namespace, leader.name)} leads ({explained})"


def member_reason(member: GroupMember, group: Group) -> str:
    """Why a member holds the GPU or waits: its status message (what it waits for, until when) when it has one, else
    what the election and its state say."""
    if member.message:
        return member.message
    leader = group.election.leader if group.election else None
    active = group.active_model
    mine = ref_of(member.namespace, member.name)
    if leader is not None and ref_of(leader.namespace, leader.name) == mine:
        verb = "holds the GPU" if active is not None and ref_of(active.namespace, active.name) == mine else "is elected"
        reason = group.election.reason if group.election else ""
        return f"{verb}: {ELECTION_REASONS.get(reason, reason)}"
    if member.preempted_by:
        return f"preempted by {member.preempted_by}"
    return f"not asked for ({member.state or member.phase or NONE})"


def describe_group(group: Group, *, swaps: Sequence[Swap], now: datetime) -> str:
    """The page of ``flexinfer describe group NAME``: the group, its election and why, each member's reasoning."""
    active = ref_of(group.active_model.namespace, group.active_model.name) if group.active_model else NONE
    lines = [
        f"Name:         {group.name}",
        f"Policy:       {group.policy}",
        f"Scheduling:   {group.scheduling or NONE}",
        f"State:        {group.state}",
        f"Active Model: {active}",
    ]
    if group.cooldown_remaining_seconds:
        lines.append(f"Cooldown:     {format_seconds(group.cooldown_remaining_seconds)} left")
    if group.lease is not None:
        until = rfc3339(group.lease.expires_at) or NONE
        expires = group.lease.expires_at
        left = f" ({format_seconds(max(0.0, (expires - now).total_seconds()))} left)" if expires else ""
        lines.append(f"Lease:        {group.lease.name} held by {group.lease.owner} until {until}{left}")
    lines.append(f"Election:     {election_line(group)}")
    lines.append("Members:" + ("" if group.models else f"      {NONE}"))
    if group.models:
        member_headers = ("NAME", "PRIORITY", "PHASE", "STATE", "WAITING", "IN FLIGHT", "QUEUE")
        rows = [
            [
                ref_of(m.namespace, m.name),
                str(m.priority),
                m.phase or NONE,
                m.state or NONE,
                str(m.requests.waiting if m.requests else 0),
                str(m.requests.in_flight if m.requests else 0),
                str(m.queue_position) if m.queue_position is not None else NONE,
            ]
            for m in group.models
        ]
        lines.extend(INDENT + line for line in render_table(member_headers, rows).splitlines())
        lines.append("Why:")
        width = max(len(ref_of(m.namespace, m.name)) for m in group.models)
        for m in group.models:
            lines.append(f"{INDENT}{ref_of(m.namespace, m.name).ljust(width)}   {member_reason(m, group)}")
    mine = [s for s in swaps if s.group == group.name][:RECENT_SWAPS]
    lines.append("Recent Swaps:" + ("" if mine else f"  {NONE}"))
    if mine:
        headers = ("GROUP", "FROM", "TO", "REASON", "STARTED", "DURATION", "PHASES", "OUTCOME")
        lines.extend(INDENT + line for line in render_table(headers, [swap_row(s) for s in mine]).splitlines())
    return "\n".join(lines)


def events_section(events: Events, now: datetime) -> list[str]:
    if events.unavailable is not None:
        return [f"Events:         <unavailable: {events.unavailable}>"]
    recent = sorted(events.items, key=lambda e: e.time)[-RECENT_EVENTS:]
    if not recent:
        return [f"Events:         {NONE}"]
    rows = [[age(e.time, now), e.kind, e.message] for e in recent]
    return ["Events:", *(INDENT + line for line in render_table(("AGE", "KIND", "MESSAGE"), rows).splitlines())]
