"""``flexinfer get``: which API each kind comes from, its columns, and kubectl-style table rendering.

Everything here is pure: a decoded JSON answer in, text out. A value the answer lacks prints as ``<none>``,
as ``kubectl get -o custom-columns`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from flexinfer_cli.config import Service

NONE = "<none>"
COLUMN_GAP = 3

Row = list[str]


class Kind(StrEnum):
    MODELS = "models"
    GROUPS = "groups"
    LEASES = "leases"
    QUEUES = "queues"
    SWAPS = "swaps"


KIND_ALIASES: dict[str, Kind] = {
    "model": Kind.MODELS,
    "models": Kind.MODELS,
    "mo": Kind.MODELS,
    "group": Kind.GROUPS,
    "groups": Kind.GROUPS,
    "gpugroup": Kind.GROUPS,
    "gpugroups": Kind.GROUPS,
    "lease": Kind.LEASES,
    "leases": Kind.LEASES,
    "gpulease": Kind.LEASES,
    "gpuleases": Kind.LEASES,
    "queue": Kind.QUEUES,
    "queues": Kind.QUEUES,
    "swap": Kind.SWAPS,
    "swaps": Kind.SWAPS,
}


def parse_kind(value: str) -> Kind:
    kind = KIND_ALIASES.get(value.strip().lower())
    if kind is None:
        raise ValueError(f"unknown kind {value!r}: use one of {', '.join(k.value for k in Kind)}")
    return kind


def _get(item: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(item, Mapping):
            return None
        item = item.get(key)
    return item


def _first(item: Any, *keys: str) -> Any:
    for key in keys:
        value = _get(item, *key.split("."))
        if value is not None:
            return value
    return None


def cell(value: Any) -> str:
    if value is None or value == "":
        return NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def format_seconds(value: Any) -> str:
    """``0.25`` -> ``250ms``, ``2.5`` -> ``2.5s``, ``90`` -> ``1m30s``; not a number -> ``<none>``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return NONE
    seconds = float(value)
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    if seconds < 60:
        return f"{seconds:.1f}".removesuffix(".0") + "s"
    minutes, rest = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    out = f"{hours}h" if hours else ""
    if minutes or hours:
        out += f"{minutes}m"
    return out + (f"{rest}s" if rest else "")


def _model_name(value: Any) -> str:
    """A model reference in the API: ``"name"``, ``"ns/name"`` or ``{"namespace", "name"}``."""
    if isinstance(value, Mapping):
        name, namespace = value.get("name"), value.get("namespace")
        if not name:
            return NONE
        return f"{namespace}/{name}" if namespace else str(name)
    return cell(value)


def _parse_time(value: Any) -> float | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def model_row(item: Any) -> Row:
    return [
        cell(_get(item, "metadata", "name")),
        cell(_get(item, "metadata", "namespace")),
        cell(_get(item, "spec", "gpu", "shared")),
        cell(_get(item, "spec", "gpu", "priority")),
        cell(_get(item, "status", "phase")),
        cell(_get(item, "status", "sharedGroup", "state")),
        cell(_get(item, "status", "sharedGroup", "queuePosition")),
        cell(_get(item, "status", "lastActiveTime")),
    ]


def group_row(item: Any) -> Row:
    cooldown = _get(item, "cooldownRemainingSeconds")
    return [
        cell(_get(item, "name")),
        cell(_get(item, "policy")),
        _model_name(_get(item, "activeModel")),
        cell(_get(item, "state")),
        "0s" if cooldown == 0 else format_seconds(cooldown),
        cell(_get(item, "lease", "name")),
    ]


def lease_row(item: Any) -> Row:
    return [
        cell(_get(item, "name")),
        cell(_get(item, "group")),
        cell(_get(item, "owner")),
        cell(_get(item, "node")),
        cell(_get(item, "expiresAt")),
    ]


def queue_row(item: Any) -> Row:
    wait = _first(item, "oldestWaitSeconds", "oldest_wait_seconds", "oldestWait")
    if wait is None and isinstance(ms := _first(item, "oldestWaitMs", "oldest_wait_ms"), int | float):
        wait = ms / 1000
    queued = _first(item, "queued", "depth", "length")
    return [
        cell(_get(item, "namespace")),
        cell(_first(item, "model", "name")),
        cell(queued),
        "-" if not queued and not wait else format_seconds(wait),
    ]


def swap_row(item: Any) -> Row:
    started, finished = _get(item, "startedAt"), _get(item, "finishedAt")
    start_ts, finish_ts = _parse_time(started), _parse_time(finished)
    if finished is None:
        duration = "running"
    elif start_ts is not None and finish_ts is not None:
        duration = format_seconds(max(0.0, finish_ts - start_ts))
    else:
        duration = NONE
    phases = _get(item, "phases")
    if isinstance(phases, Mapping) and phases:
        phase_text = ",".join(f"{phase}={format_seconds(seconds)}" for phase, seconds in phases.items())
    else:
        phase_text = NONE
    return [
        cell(_get(item, "group")),
        _model_name(_get(item, "fromModel")),
        _model_name(_get(item, "toModel")),
        cell(_get(item, "reason")),
        cell(started),
        duration,
        phase_text,
    ]


@dataclass(frozen=True)
class KindView:
    service: Service
    path: str
    headers: tuple[str, ...]
    row: Callable[[Any], Row]


VIEWS: dict[Kind, KindView] = {
    Kind.MODELS: KindView(
        Service.SCHEDULER,
        "/api/v1/models",
        ("NAME", "NAMESPACE", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "LAST_ACTIVE"),
        model_row,
    ),
    Kind.GROUPS: KindView(
        Service.SCHEDULER, "/api/v1/groups", ("NAME", "POLICY", "ACTIVE", "STATE", "COOLDOWN", "LEASE"), group_row
    ),
    Kind.LEASES: KindView(
        Service.LEASE_MANAGER, "/api/v1/leases", ("NAME", "GROUP", "OWNER", "NODE", "EXPIRES"), lease_row
    ),
    Kind.QUEUES: KindView(Service.PROXY, "/api/v1/queues", ("NAMESPACE", "MODEL", "QUEUED", "OLDEST_WAIT"), queue_row),
    Kind.SWAPS: KindView(
        Service.SCHEDULER,
        "/api/v1/swaps",
        ("GROUP", "FROM", "TO", "REASON", "STARTED", "DURATION", "PHASES"),
        swap_row,
    ),
}


def items_of(payload: Any) -> list[Any]:
    """The list in an answer: ``{"items": [...]}`` (the contract's shape) or a bare list."""
    if isinstance(payload, Mapping):
        items = payload.get("items")
        return list(items) if isinstance(items, list) else []
    if isinstance(payload, list):
        return payload
    return []


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, three spaces apart, like ``kubectl get`` (no trailing spaces)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for index, value in enumerate(row):
            widths[index] = max(widths[index], len(value))
    lines = []
    for row in [list(headers), *rows]:
        padded = [value.ljust(widths[index]) for index, value in enumerate(row)]
        lines.append((" " * COLUMN_GAP).join(padded).rstrip())
    return "\n".join(lines)


def render_kind(kind: Kind, payload: Any) -> str | None:
    """The table for an API answer; None when it lists nothing."""
    view = VIEWS[kind]
    rows = [view.row(item) for item in items_of(payload)]
    if not rows:
        return None
    return render_table(view.headers, rows)
