"""``flexinfer describe``: one resource as a readable page, as ``kubectl describe`` prints one: its spec and status
(camelCase field names as Title Case words), then what FlexInfer knows around it: the model's group, its recent
swaps and its events (from the ``flexinfer.events.*`` stream).

Everything here is pure: typed API answers and ``now`` in, text out.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from flexinfer_cli.tables import NONE, format_seconds, render_table, swap_row
from flexinfer_common.admin_api import Group, Swap
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
        headers = ("GROUP", "FROM", "TO", "REASON", "STARTED", "DURATION", "PHASES")
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


def events_section(events: Events, now: datetime) -> list[str]:
    if events.unavailable is not None:
        return [f"Events:         <unavailable: {events.unavailable}>"]
    recent = sorted(events.items, key=lambda e: e.time)[-RECENT_EVENTS:]
    if not recent:
        return [f"Events:         {NONE}"]
    rows = [[age(e.time, now), e.kind, e.message] for e in recent]
    return ["Events:", *(INDENT + line for line in render_table(("AGE", "KIND", "MESSAGE"), rows).splitlines())]
