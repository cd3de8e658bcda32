"""``flexinfer get``: which API each kind comes from, its columns, and kubectl-style table rendering.

Everything here is pure: a decoded JSON answer in, read through the API's own body models
(``flexinfer_common.admin_api``), text out. A value the answer lacks prints as ``<none>``, as
``kubectl get -o custom-columns`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import ValidationError

from flexinfer_cli.config import Service
from flexinfer_common.admin_api import (
    Group,
    GroupList,
    Lease,
    LeaseList,
    ModelList,
    QueueInfo,
    QueueList,
    Swap,
    SwapList,
)
from flexinfer_common.clock import rfc3339
from flexinfer_common.manifests import Model

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


def _time(value: datetime | None) -> str:
    return rfc3339(value) or NONE


def model_row(item: Model) -> Row:
    status = item.status
    return [
        cell(item.metadata.name),
        cell(item.metadata.namespace),
        cell(item.spec.gpu.shared),
        cell(item.spec.gpu.priority),
        cell(status.phase.value if status else None),
        cell(status.shared_group.state.value if status and status.shared_group.state else None),
        cell(status.shared_group.queue_position if status else None),
        _time(status.last_active_time if status else None),
    ]


def group_row(item: Group) -> Row:
    cooldown = item.cooldown_remaining_seconds
    active = item.active_model
    return [
        cell(item.name),
        cell(item.policy),
        f"{active.namespace}/{active.name}" if active else NONE,
        cell(item.state),
        "0s" if cooldown == 0 else format_seconds(cooldown),
        cell(item.lease.name if item.lease else None),
    ]


def lease_row(item: Lease) -> Row:
    return [cell(item.name), cell(item.group), cell(item.owner), cell(item.node), _time(item.expires_at)]


def queue_row(item: QueueInfo) -> Row:
    return [
        cell(item.namespace),
        cell(item.model),
        cell(item.queued),
        "-" if not item.queued and not item.oldest_wait_seconds else format_seconds(item.oldest_wait_seconds),
    ]


def swap_row(item: Swap) -> Row:
    if item.finished_at is None:
        duration = "running"
    elif item.started_at is not None:
        duration = format_seconds(max(0.0, (item.finished_at - item.started_at).total_seconds()))
    else:
        duration = NONE
    phase_text = ",".join(f"{phase}={format_seconds(seconds)}" for phase, seconds in item.phases.items()) or NONE
    return [
        cell(item.group),
        cell(item.from_model),
        cell(item.to_model),
        cell(item.reason),
        _time(item.started_at),
        duration,
        phase_text,
    ]


@dataclass(frozen=True)
class KindView:
    service: Service
    path: str
    headers: tuple[str, ...]
    row: Callable[[Any], Row]
    answer: type[ModelList | GroupList | LeaseList | QueueList | SwapList]  # the API's list body


VIEWS: dict[Kind, KindView] = {
    Kind.MODELS: KindView(
        Service.SCHEDULER,
        "/api/v1/models",
        ("NAME", "NAMESPACE", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "LAST_ACTIVE"),
        model_row,
        ModelList,
    ),
    Kind.GROUPS: KindView(
        Service.SCHEDULER,
        "/api/v1/groups",
        ("NAME", "POLICY", "ACTIVE", "STATE", "COOLDOWN", "LEASE"),
        group_row,
        GroupList,
    ),
    Kind.LEASES: KindView(
        Service.LEASE_MANAGER, "/api/v1/leases", ("NAME", "GROUP", "OWNER", "NODE", "EXPIRES"), lease_row, LeaseList
    ),
    Kind.QUEUES: KindView(
        Service.PROXY, "/api/v1/queues", ("NAMESPACE", "MODEL", "QUEUED", "OLDEST_WAIT"), queue_row, QueueList
    ),
    Kind.SWAPS: KindView(
        Service.SCHEDULER,
        "/api/v1/swaps",
        ("GROUP", "FROM", "TO", "REASON", "STARTED", "DURATION", "PHASES"),
        swap_row,
        SwapList,
    ),
}


class UnexpectedAnswer(ValueError):
    """An API answer that is not the body the contract describes."""


def items_of(kind: Kind, payload: Any) -> list[Any]:
    """The typed items of an API list answer (``{"items": [...]}``); UnexpectedAnswer names what is wrong."""
    try:
        return list(VIEWS[kind].answer.model_validate(payload).items)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])
        raise UnexpectedAnswer(f"the {kind.value} answer is not what this CLI expects ({problems})") from None


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
    rows = [view.row(item) for item in items_of(kind, payload)]
    if not rows:
        return None
    return render_table(view.headers, rows)
