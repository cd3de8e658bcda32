"""``flexinfer get``: which API each kind comes from, its columns, and kubectl-style table rendering.

Everything here is pure: a decoded JSON answer in, read through the API's own body models
(``flexinfer_common.admin_api``), text out. A value the answer lacks prints as ``<none>``, as
``kubectl get -o custom-columns`` does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any
from urllib.parse import quote

from pydantic import ValidationError

from flexinfer_cli.config import DEFAULT_NAMESPACE, Service
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
from flexinfer_common.manifests import GPUGroup, GPULease, Model, Resource

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


def one_line(text: str, limit: int = 120) -> str:
    """A message on one line for a table (a log tail spans many): whitespace runs folded, cut at ``limit``
    characters with an ellipsis; ``describe`` and ``-o yaml`` keep the full text."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


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
    """The seed's columns: NAME SHARED PRIORITY PHASE STATE QUEUE LAST_ACTIVE."""
    status = item.status
    return [
        cell(item.metadata.name),
        cell(item.spec.gpu.shared),
        cell(item.spec.gpu.priority),
        cell(status.phase.value if status else None),
        cell(status.shared_group.state.value if status and status.shared_group.state else None),
        cell(status.shared_group.queue_position if status else None),
        _time(status.last_active_time if status else None),
    ]


def model_wide(item: Model) -> Row:
    status = item.status
    return [
        cell(status.preempted_by if status else None),
        cell(",".join(item.spec.service_labels)),
        cell(item.spec.backend),
        NONE,  # REQUESTS: the proxy's count of requests waiting, filled in by table_row when it was read
        cell(status.restarts if status else None),
        cell(one_line(status.message) if status else None),
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


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.1f}Gi"


def group_wide(item: Group) -> Row:
    """The members, the lease, and for a group with a capacity the models it holds and each device's memory used
    of its capacity (``0:11.0Gi/24.0Gi``)."""
    resident = ",".join(f"{m.namespace}/{m.name}" for m in item.resident_models) if item.resident_models else None
    memory = (
        " ".join(f"{d.index}:{_gib(d.used_bytes)}/{_gib(d.used_bytes + d.free_bytes)}" for d in item.devices)
        if item.devices
        else None
    )
    return [
        cell(",".join(f"{m.namespace}/{m.name}" for m in item.models)),
        cell(item.lease.owner if item.lease else None),
        _time(item.lease.expires_at if item.lease else None),
        cell(resident),
        cell(memory),
    ]


def lease_row(item: Lease) -> Row:
    return [cell(item.name), cell(item.group), cell(item.owner), cell(item.node), _time(item.expires_at)]


def lease_wide(item: Lease) -> Row:
    ttl = format_seconds(item.ttl_seconds) if item.ttl_seconds is not None else NONE
    phase = item.phase.value if item.phase is not None else None
    return [
        cell(phase),
        ttl,
        _time(item.acquired_at),
        _time(item.renew_time),
        cell(item.source),
        cell(one_line(item.message)),
    ]


def queue_row(item: QueueInfo) -> Row:
    return [
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
        cell(item.outcome or ("running" if item.finished_at is None else None)),
    ]


def swap_wide(item: Swap) -> Row:
    return [cell(item.id), cell(item.phase), _time(item.finished_at), cell(one_line(item.message or ""))]


Item = Model | Group | Lease | QueueInfo | Swap


def _seg(value: str) -> str:
    return quote(value, safe="")


@dataclass(frozen=True)
class KindView:
    """How one kind is listed, shown and named.

    ``namespaced`` kinds are listed in one namespace (``-n``, default the CLI's) unless ``-A`` is given, which adds
    a leading NAMESPACE column, as kubectl does. ``manifests``, when set, is the collection on ``service`` where
    one of the kind's manifests is written (``apply``) and deleted by name (kinds without it cannot be deleted).
    """

    kind: Kind
    singular: str
    service: Service
    path: str
    headers: tuple[str, ...]
    row: Callable[[Any], Row]
    wide_headers: tuple[str, ...]
    wide: Callable[[Any], Row]
    answer: type[ModelList | GroupList | LeaseList | QueueList | SwapList]  # the API's list body
    item: type[Item]  # one object of it
    namespaced: bool
    name_of: Callable[[Any], str]
    namespace_of: Callable[[Any], str] = lambda _: ""
    manifests: str | None = None

    def object_path(self, collection: str, namespace: str, name: str) -> str:
        """``collection/{namespace}/{name}`` for a namespaced kind, ``collection/{name}`` otherwise (URL-quoted)."""
        return "/".join((collection, *map(_seg, (namespace, name) if self.namespaced else (name,))))

    def get_path(self, namespace: str, name: str) -> str:
        """Where one object is read by name (models, groups and leases: the queues and swaps APIs only list)."""
        return self.object_path(self.path, namespace, name)

    def manifest_path(self, namespace: str, name: str) -> str:
        """Where one manifest is written and deleted by name (a kind with ``manifests``)."""
        if self.manifests is None:
            raise ValueError(f"{self.kind.value} have no manifests")
        return self.object_path(self.manifests, namespace, name)

    def label(self, namespace: str, name: str) -> str:
        """How an object is named when printed: ``model/default/chat``, ``gpugroup/homelab-gpu``."""
        return f"{self.singular}/{namespace}/{name}" if self.namespaced else f"{self.singular}/{name}"

    def key(self, item: Any) -> tuple[str, str]:
        """The identity of an item (namespace, name): a watch tells a changed row from a new one by it."""
        return (self.namespace_of(item) if self.namespaced else "", self.name_of(item))


VIEWS: dict[Kind, KindView] = {
    Kind.MODELS: KindView(
        kind=Kind.MODELS,
        singular="model",
        service=Service.SCHEDULER,
        path="/api/v1/models",
        headers=("NAME", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "LAST_ACTIVE"),
        row=model_row,
        wide_headers=("PREEMPTED_BY", "SERVICE_LABELS", "BACKEND", "REQUESTS", "RESTARTS", "MESSAGE"),
        wide=model_wide,
        answer=ModelList,
        item=Model,
        namespaced=True,
        name_of=lambda item: item.metadata.name,
        namespace_of=lambda item: item.metadata.namespace or DEFAULT_NAMESPACE,
        manifests="/api/v1/models",
    ),
    Kind.GROUPS: KindView(
        kind=Kind.GROUPS,
        singular="gpugroup",
        service=Service.SCHEDULER,
        path="/api/v1/groups",
        headers=("NAME", "POLICY", "ACTIVE", "STATE", "COOLDOWN", "LEASE"),
        row=group_row,
        wide_headers=("MODELS", "LEASE_OWNER", "LEASE_EXPIRES", "RESIDENT", "MEMORY"),
        wide=group_wide,
        answer=GroupList,
        item=Group,
        namespaced=False,
        name_of=lambda item: item.name,
        manifests="/api/v1/gpugroups",
    ),
    Kind.LEASES: KindView(
        kind=Kind.LEASES,
        singular="gpulease",
        service=Service.LEASE_MANAGER,
        path="/api/v1/leases",
        headers=("NAME", "GROUP", "OWNER", "NODE", "EXPIRES"),
        row=lease_row,
        wide_headers=("PHASE", "TTL", "ACQUIRED", "RENEWED", "SOURCE", "MESSAGE"),
        wide=lease_wide,
        answer=LeaseList,
        item=Lease,
        namespaced=False,
        name_of=lambda item: item.name,
        manifests="/api/v1/leases",
    ),
    Kind.QUEUES: KindView(
        kind=Kind.QUEUES,
        singular="queue",
        service=Service.PROXY,
        path="/api/v1/queues",
        headers=("MODEL", "QUEUED", "OLDEST_WAIT"),
        row=queue_row,
        wide_headers=(),
        wide=lambda _: [],
        answer=QueueList,
        item=QueueInfo,
        namespaced=True,
        name_of=lambda item: item.model,
        namespace_of=lambda item: item.namespace,
    ),
    Kind.SWAPS: KindView(
        kind=Kind.SWAPS,
        singular="swap",
        service=Service.SCHEDULER,
        path="/api/v1/swaps",
        headers=("GROUP", "FROM", "TO", "REASON", "STARTED", "DURATION", "PHASES", "OUTCOME"),
        row=swap_row,
        wide_headers=("ID", "PHASE", "FINISHED", "MESSAGE"),
        wide=swap_wide,
        answer=SwapList,
        item=Swap,
        namespaced=False,
        name_of=lambda item: item.id or "",
    ),
}

# The kind each manifest of a FILE is written to and deleted from (ModelCaches are the Kubernetes controller's).
MANIFEST_KINDS: dict[type[Resource], Kind] = {
    Model: Kind.MODELS,
    GPUGroup: Kind.GROUPS,
    GPULease: Kind.LEASES,
}


class UnexpectedAnswer(ValueError):
    """An API answer that is not the body the contract describes."""


def _problems(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()[:3])


def items_of(kind: Kind, payload: Any) -> list[Any]:
    """The typed items of an API list answer (``{"items": [...]}``); UnexpectedAnswer names what is wrong."""
    try:
        return list(VIEWS[kind].answer.model_validate(payload).items)
    except ValidationError as exc:
        raise UnexpectedAnswer(f"the {kind.value} answer is not what this CLI expects ({_problems(exc)})") from None


def item_of(kind: Kind, payload: Any) -> Any:
    """One typed object of an API answer (``GET .../{name}``)."""
    view = VIEWS[kind]
    try:
        return view.item.model_validate(payload)
    except ValidationError as exc:
        raise UnexpectedAnswer(f"the {view.singular} answer is not what this CLI expects ({_problems(exc)})") from None


@dataclass(frozen=True)
class Selection:
    """Which items a ``get`` shows: one namespace (None: every namespace) and, when given, only these names."""

    namespace: str | None
    names: tuple[str, ...] = ()

    def keeps(self, view: KindView, item: Any) -> bool:
        if view.namespaced and self.namespace is not None and view.namespace_of(item) != self.namespace:
            return False
        return not self.names or view.name_of(item) in self.names


def select(kind: Kind, items: Sequence[Any], selection: Selection) -> list[Any]:
    view = VIEWS[kind]
    return [item for item in items if selection.keeps(view, item)]


def table_headers(kind: Kind, *, wide: bool, all_namespaces: bool) -> tuple[str, ...]:
    view = VIEWS[kind]
    namespace = ("NAMESPACE",) if view.namespaced and all_namespaces else ()
    return (*namespace, *view.headers, *(view.wide_headers if wide else ()))


def table_row(
    kind: Kind,
    item: Any,
    *,
    wide: bool,
    all_namespaces: bool,
    waiting: Mapping[tuple[str, str], int] | None = None,
) -> Row:
    """``waiting``: requests waiting per (namespace, model) at the proxy, for the REQUESTS column of
    ``get models -o wide`` (``<none>`` when the proxy could not be read)."""
    view = VIEWS[kind]
    namespace = [cell(view.namespace_of(item))] if view.namespaced and all_namespaces else []
    row = [*namespace, *view.row(item), *(view.wide(item) if wide else [])]
    if wide and kind is Kind.MODELS and waiting is not None:
        at = len(namespace) + len(view.headers) + view.wide_headers.index("REQUESTS")
        row[at] = str(waiting.get((view.namespace_of(item), view.name_of(item)), 0))
    return row


def column_widths(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[int]:
    widths = [len(h) for h in headers]
    for row in rows:
        for index, value in enumerate(row):
            widths[index] = max(widths[index], len(value))
    return widths


def format_line(row: Sequence[str], widths: Sequence[int]) -> str:
    """One table line: left-aligned cells, three spaces apart, no trailing spaces."""
    padded = [value.ljust(widths[index]) if index < len(widths) else value for index, value in enumerate(row)]
    return (" " * COLUMN_GAP).join(padded).rstrip()


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns, three spaces apart, like ``kubectl get`` (no trailing spaces)."""
    widths = column_widths(headers, rows)
    return "\n".join(format_line(row, widths) for row in [list(headers), *rows])


def render_kind(kind: Kind, payload: Any, *, wide: bool = False, all_namespaces: bool = True) -> str | None:
    """The table for an API list answer; None when it lists nothing."""
    rows = [table_row(kind, item, wide=wide, all_namespaces=all_namespaces) for item in items_of(kind, payload)]
    if not rows:
        return None
    return render_table(table_headers(kind, wide=wide, all_namespaces=all_namespaces), rows)


def object_name(kind: Kind, item: Any) -> str:
    """``-o name``: ``model/default/chat``, ``gpugroup/homelab-gpu``, as ``flexinfer apply`` prints resources."""
    view = VIEWS[kind]
    return view.label(view.namespace_of(item), view.name_of(item))


def dump(item: Any) -> dict[str, Any]:
    """An item as the API wrote it (camelCase, no nulls): what ``-o json|yaml`` prints."""
    dumped: dict[str, Any] = item.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped
