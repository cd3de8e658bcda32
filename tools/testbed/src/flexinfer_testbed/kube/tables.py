"""Server-side printing: the `meta.k8s.io/v1` Table that `kubectl get` asks for.

Custom resources get the real apiextensions layout (NAME, then the CRD's additionalPrinterColumns, or NAME and
AGE when the CRD declares none); `date` columns are rendered as an age (`5m`, `<invalid>` for a future time)
exactly as the API server renders them. Built-in kinds get the columns `kubectl get` users know.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from flexinfer_testbed.kube.resources import PrinterColumn, ResourceType
from flexinfer_testbed.kube.store import jsonpath_get, parse_time

Obj = dict[str, Any]


def human_duration(seconds: float) -> str:
    """k8s.io/apimachinery/pkg/util/duration.HumanDuration."""
    if seconds < -1:
        return "<invalid>"
    if seconds < 0:
        return "0s"
    s = int(seconds)
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        return f"{minutes}m{s % 60}s" if s % 60 else f"{minutes}m"
    if minutes < 180:
        return f"{minutes}m"
    hours = minutes // 60
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if hours < 192:
        return f"{hours // 24}d{hours % 24}h" if hours % 24 else f"{hours // 24}d"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        years = hours // (24 * 365)
        days = (hours // 24) % 365
        return f"{years}y{days}d" if days else f"{years}y"
    return f"{hours // (24 * 365)}y"


def age(timestamp: str | None, now: datetime) -> str:
    if not timestamp:
        return "<unknown>"
    try:
        return human_duration((now - parse_time(timestamp)).total_seconds())
    except ValueError:
        return "<invalid>"


def _col(name: str, type_: str = "string", description: str = "", priority: int = 0, fmt: str = "") -> Obj:
    return {"name": name, "type": type_, "format": fmt, "description": description, "priority": priority}


NAME = _col("Name", fmt="name", description="Name must be unique within a namespace.")
AGE = _col(
    "Age", description="CreationTimestamp is a timestamp representing the server time when this object was created."
)


def pod_status_reason(pod: Obj) -> str:
    """The STATUS column of `kubectl get pods` (printPod in pkg/printers/internalversion)."""
    status = pod.get("status") or {}
    reason = status.get("reason") or status.get("phase") or "Unknown"
    initializing = False
    for container in status.get("initContainerStatuses") or []:
        state = container.get("state") or {}
        if (state.get("terminated") or {}).get("exitCode") == 0:
            continue
        initializing = True
        if state.get("waiting", {}).get("reason") not in (None, "PodInitializing"):
            reason = f"Init:{state['waiting']['reason']}"
        break
    if not initializing:
        has_running = False
        for container in reversed(status.get("containerStatuses") or []):
            state = container.get("state") or {}
            if (state.get("waiting") or {}).get("reason"):
                reason = state["waiting"]["reason"]
            elif (state.get("terminated") or {}).get("reason"):
                reason = state["terminated"]["reason"]
            elif state.get("terminated"):
                code = state["terminated"].get("exitCode", 0)
                reason = (
                    f"ExitCode:{code}"
                    if not state["terminated"].get("signal")
                    else f"Signal:{state['terminated']['signal']}"
                )
            elif state.get("running") and container.get("ready"):
                has_running = True
        if reason == "Completed" and has_running:
            reason = "Running"
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        reason = "Terminating"
    return reason


def _pod_cells(pod: Obj, now: datetime) -> list[Any]:
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    total = len((pod.get("spec") or {}).get("containers") or [])
    ready = sum(1 for c in statuses if c.get("ready"))
    restarts = sum(int(c.get("restartCount") or 0) for c in statuses)
    return [
        f"{ready}/{total}",
        pod_status_reason(pod),
        restarts,
        (pod.get("status") or {}).get("podIP") or "<none>",
        (pod.get("spec") or {}).get("nodeName") or "<none>",
        "<none>",
        "<none>",
    ]


def _deployment_cells(d: Obj, now: datetime) -> list[Any]:
    spec, status = d.get("spec") or {}, d.get("status") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    selector = (spec.get("selector") or {}).get("matchLabels") or {}
    return [
        f"{status.get('readyReplicas', 0)}/{spec.get('replicas', 0)}",
        int(status.get("updatedReplicas") or 0),
        int(status.get("availableReplicas") or 0),
        ",".join(c.get("name", "") for c in containers),
        ",".join(c.get("image", "") for c in containers),
        ",".join(f"{k}={v}" for k, v in sorted(selector.items())),
    ]


def _event_cells(e: Obj, now: datetime) -> list[Any]:
    involved = e.get("involvedObject") or {}
    last = e.get("lastTimestamp") or e.get("eventTime") or e["metadata"].get("creationTimestamp")
    return [
        age(last, now),
        e.get("type", ""),
        e.get("reason", ""),
        f"{str(involved.get('kind', '')).lower()}/{involved.get('name', '')}",
        e.get("message", ""),
    ]


def _service_cells(s: Obj, now: datetime) -> list[Any]:
    spec = s.get("spec") or {}
    ports = ",".join(f"{p.get('port')}/{p.get('protocol', 'TCP')}" for p in spec.get("ports") or [])
    return [spec.get("type", "ClusterIP"), spec.get("clusterIP") or "<none>", "<none>", ports or "<none>"]


def _job_cells(j: Obj, now: datetime) -> list[Any]:
    status = j.get("status") or {}
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
    state = (
        "Complete"
        if conditions.get("Complete") == "True"
        else ("Failed" if conditions.get("Failed") == "True" else "Running")
    )
    return [state, f"{status.get('succeeded', 0)}/{(j.get('spec') or {}).get('completions', 1)}", ""]


Row = Callable[[Obj, datetime], list[Any]]


def _table(columns: list[Obj], cells: Row) -> tuple[list[Obj], Row]:
    """A kind's columns and its row: the object's name and age where the columns put NAME and AGE, ``cells``
    (in order) in the others."""

    def row(obj: Obj, now: datetime) -> list[Any]:
        own = iter(cells(obj, now))
        meta = obj["metadata"]
        return [
            meta["name"] if c is NAME else age(meta.get("creationTimestamp"), now) if c is AGE else next(own)
            for c in columns
        ]

    return columns, row


BUILTIN: dict[tuple[str, str], tuple[list[Obj], Row]] = {
    ("", "pods"): _table(
        [
            NAME,
            _col("Ready"),
            _col("Status"),
            _col("Restarts", "integer"),
            AGE,
            _col("IP", priority=1),
            _col("Node", priority=1),
            _col("Nominated Node", priority=1),
            _col("Readiness Gates", priority=1),
        ],
        _pod_cells,
    ),
    ("apps", "deployments"): _table(
        [
            NAME,
            _col("Ready"),
            _col("Up-to-date", "integer"),
            _col("Available", "integer"),
            AGE,
            _col("Containers", priority=1),
            _col("Images", priority=1),
            _col("Selector", priority=1),
        ],
        _deployment_cells,
    ),
    ("", "events"): _table(
        [_col("Last Seen"), _col("Type"), _col("Reason"), _col("Object"), _col("Message")],
        _event_cells,
    ),
    ("", "services"): _table(
        [NAME, _col("Type"), _col("Cluster-IP"), _col("External-IP"), _col("Port(s)"), AGE],
        _service_cells,
    ),
    ("batch", "jobs"): _table([NAME, _col("Status"), _col("Completions"), _col("Duration"), AGE], _job_cells),
    ("", "namespaces"): _table(
        [NAME, _col("Status"), AGE],
        lambda o, _: [(o.get("status") or {}).get("phase", "")],
    ),
    ("", "configmaps"): _table(
        [NAME, _col("Data", "integer"), AGE],
        lambda o, _: [len(o.get("data") or {}) + len(o.get("binaryData") or {})],
    ),
    ("", "secrets"): _table(
        [NAME, _col("Type"), _col("Data", "integer"), AGE],
        lambda o, _: [o.get("type", "Opaque"), len(o.get("data") or {})],
    ),
    ("coordination.k8s.io", "leases"): _table(
        [NAME, _col("Holder"), AGE],
        lambda o, _: [(o.get("spec") or {}).get("holderIdentity", "")],
    ),
    ("apiextensions.k8s.io", "customresourcedefinitions"): _table(
        [NAME, _col("Created At", "date")],
        lambda o, _: [o["metadata"].get("creationTimestamp")],
    ),
}


def _cell(column: PrinterColumn, obj: Obj, now: datetime) -> Any:
    value = jsonpath_get(obj, column.json_path)
    if value is None:
        return None
    match column.type:
        case "date":
            return age(value, now) if isinstance(value, str) else None
        case "integer":
            return value if isinstance(value, int) and not isinstance(value, bool) else None
        case "number":
            return value if isinstance(value, int | float) and not isinstance(value, bool) else None
        case "boolean":
            return value if isinstance(value, bool) else None
        case _:
            return value if isinstance(value, str) else str(value)


def table_for(rt: ResourceType, objects: list[Obj], now: datetime, *, include: str, rv: str) -> Obj:
    """A Table of `objects`; `include` is the request's includeObject (None, Object, Metadata)."""
    if rt.printer_columns is not None or not rt.builtin:
        printer = rt.printer_columns or (PrinterColumn("Age", "date", ".metadata.creationTimestamp"),)
        columns, row = _table(
            [NAME, *(_col(c.name, c.type, c.description, c.priority, c.format) for c in printer)],
            lambda o, when: [_cell(c, o, when) for c in printer],
        )
    elif rt.key in BUILTIN:
        columns, row = BUILTIN[rt.key]
    else:
        columns, row = _table([NAME, AGE], lambda _o, _now: [])

    rows = []
    for obj in objects:
        entry: Obj = {"cells": row(obj, now)}
        if include == "Object":
            entry["object"] = obj
        elif include != "None":
            entry["object"] = {
                "kind": "PartialObjectMetadata",
                "apiVersion": "meta.k8s.io/v1",
                "metadata": obj["metadata"],
            }
        rows.append(entry)
    return {
        "kind": "Table",
        "apiVersion": "meta.k8s.io/v1",
        "metadata": {"resourceVersion": rv},
        "columnDefinitions": columns,
        "rows": rows,
    }
