"""Metrics hygiene and the monitoring files, offline.

- Each service's process registers only its own metrics (and the shared bus counter): imported in a fresh
  interpreter, ``flexinfer_proxy.main`` exports no scheduler gauge, and so on.
- The scheduler's per-group gauges lose the series of groups and members that went away.
- charts/flexinfer/files/prometheus-rules.yaml and grafana-dashboard.json: the PromQL parses (promql-parser, the
  Rust parser of Prometheus' grammar), every metric they name is registered by some service, with the labels they
  match on, and the files have the structure Prometheus, the Prometheus Operator and Grafana read.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml
from prometheus_client import REGISTRY

from flexinfer_common.durations import parse_duration
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import Capacity, GroupSnapshot, Member
from flexinfer_scheduler.domain.plan import plan_group
from flexinfer_scheduler.metrics import GroupGauges, GroupView, group_view

ROOT = Path(__file__).resolve().parents[2]
FILES = ROOT / "charts" / "flexinfer" / "files"

SHARED = {
    "flexinfer_bad_messages": ("counter", ("subject",)),
    "flexinfer_unpublishable_messages": ("counter", ()),
}
# Family name -> (type, labels), per service: exactly what its process registers.
EXPECTED: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {
    "flexinfer_proxy": {
        **SHARED,
        "flexinfer_proxy_queue_depth": ("gauge", ("namespace", "model")),
        "flexinfer_proxy_open_connections": ("gauge", ()),
        "flexinfer_proxy_shed": ("counter", ("reason",)),
        "flexinfer_proxy_queue_wait_seconds": ("histogram", ()),
        "flexinfer_proxy_requests": ("counter", ("namespace", "model", "code")),
        "flexinfer_proxy_cold_starts": ("counter", ("namespace", "model")),
        "flexinfer_proxy_request_duration_seconds": ("histogram", ("namespace", "model")),
        "flexinfer_proxy_time_to_first_byte_seconds": ("histogram", ("namespace", "model")),
    },
    "flexinfer_scheduler": {
        **SHARED,
        "flexinfer_swaps": ("counter", ("group", "from_model", "to_model", "reason")),
        "flexinfer_model_restarts": ("counter", ("namespace", "model")),
        "flexinfer_swap_duration_seconds": ("histogram", ("group", "phase")),
        "flexinfer_election_duration_seconds": ("histogram", ()),
        "flexinfer_group_active_model": ("gauge", ("group", "model")),
        "flexinfer_group_memory_bytes": ("gauge", ("group", "device", "state")),
        "flexinfer_group_swap_started_timestamp_seconds": ("gauge", ("group",)),
        "flexinfer_lease_read_errors": ("counter", ()),
        "flexinfer_scheduler_leader": ("gauge", ()),
    },
    "flexinfer_actuator": {
        **SHARED,
        "flexinfer_actuator_commands": ("counter", ("action", "result")),
        "flexinfer_actuator_leader": ("gauge", ()),
    },
    "flexinfer_lease_manager": {
        **SHARED,
        "flexinfer_gpu_lease_active": ("gauge", ("group", "namespace", "owner")),
        "flexinfer_gpu_lease_acquired": ("counter", ("group", "namespace", "owner")),
        "flexinfer_gpu_lease_expires_timestamp_seconds": ("gauge", ("group", "namespace", "owner")),
        "flexinfer_lease_manager_leader": ("gauge", ()),
    },
}

_LIST_METRICS = """
import importlib, json, pkgutil, sys
package = importlib.import_module(sys.argv[1])
for info in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
    if not info.name.endswith("__main__"):
        importlib.import_module(info.name)
from prometheus_client import REGISTRY
found = {}
for collector in list(REGISTRY._collector_to_names):
    for family in collector.describe() if hasattr(collector, "describe") else collector.collect():
        if family.name.startswith("flexinfer_"):
            found[family.name] = [family.type, list(getattr(collector, "_labelnames", ()))]
print(json.dumps(found))
"""


@functools.cache
def _all_registered() -> dict[str, dict[str, tuple[str, tuple[str, ...]]]]:
    """Per service: the flexinfer_* metric families a fresh interpreter registers after importing every module of it
    (the four interpreters run side by side)."""
    running = {
        service: subprocess.Popen(
            [sys.executable, "-c", _LIST_METRICS, service], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for service in EXPECTED
    }
    found = {}
    for service, process in running.items():
        out, err = process.communicate(timeout=120)
        assert process.returncode == 0, err
        found[service] = {name: (kind, tuple(labels)) for name, (kind, labels) in json.loads(out).items()}
    return found


def registered(service: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    return _all_registered()[service]


@pytest.mark.parametrize("service", list(EXPECTED))
def test_each_service_registers_only_its_own_metrics(service: str) -> None:
    assert registered(service) == EXPECTED[service]


def test_the_contract_metrics_are_each_registered_by_one_service() -> None:
    owners: dict[str, list[str]] = {}
    for service, metrics in EXPECTED.items():
        for name in metrics:
            owners.setdefault(name, []).append(service)
    contract = [
        "flexinfer_swaps",
        "flexinfer_swap_duration_seconds",
        "flexinfer_proxy_queue_depth",
        "flexinfer_proxy_queue_wait_seconds",
        "flexinfer_proxy_requests",
        "flexinfer_election_duration_seconds",
        "flexinfer_group_active_model",
    ]
    assert {name: owners[name] for name in contract} == {
        name: ["flexinfer_proxy" if name.startswith("flexinfer_proxy") else "flexinfer_scheduler"] for name in contract
    }


# ------------------------------------------------------------------------------------------- scheduler gauges


def active(group: str, model: str) -> float | None:
    return REGISTRY.get_sample_value("flexinfer_group_active_model", {"group": group, "model": model})


def swap_started(group: str) -> float | None:
    return REGISTRY.get_sample_value("flexinfer_group_swap_started_timestamp_seconds", {"group": group})


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def view(members: str, active_model: str | None, started: datetime | None = None) -> GroupView:
    return GroupView(members=frozenset(members.split()), active=active_model, swap_started=started)


def test_group_gauges_show_every_member_and_drop_those_that_go() -> None:
    gauges = GroupGauges()
    gauges.show("g-members", view("a b c", "a"))
    assert (active("g-members", "a"), active("g-members", "b"), active("g-members", "c")) == (1, 0, 0)
    gauges.show("g-members", view("a b", "b", T0))
    assert (active("g-members", "a"), active("g-members", "b"), active("g-members", "c")) == (0, 1, None)
    assert swap_started("g-members") == T0.timestamp()
    gauges.show("g-members", view("a b", "b"))  # the swap finished
    assert swap_started("g-members") is None


def test_group_gauges_forget_deleted_groups_and_everything_when_stepping_down() -> None:
    gauges = GroupGauges()
    gauges.show("g-kept", view("x", "x"))
    gauges.show("g-gone", view("y z", None, T0 - timedelta(minutes=20)))
    assert active("g-gone", "y") == 0 and swap_started("g-gone") is not None
    gauges.retain(["g-kept"])
    assert active("g-gone", "y") is None and active("g-gone", "z") is None and swap_started("g-gone") is None
    assert active("g-kept", "x") == 1
    gauges.clear()
    assert active("g-kept", "x") is None


# ------------------------------------------------------------------------------------------- monitoring files


def sample_names() -> dict[str, tuple[str, ...]]:
    """Every series name the services export (a counter's ``_total``, a histogram's ``_bucket``/``_sum``/``_count``)
    with its labels."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
    names: dict[str, tuple[str, ...]] = {}
    for service in EXPECTED:
        for family, (kind, labels) in registered(service).items():
            for suffix in suffixes[kind]:
                names[family + suffix] = labels + (("le",) if suffix == "_bucket" else ())
    return names


def _nodes(node: Any) -> Iterator[Any]:
    yield node
    for attribute in dir(node):
        if attribute.startswith("_") or attribute in {"parse", "prettify"}:
            continue
        value = getattr(node, attribute)
        children = value if isinstance(value, list) else [value]
        for child in children:
            if type(child).__module__ == "promql_parser" and type(child).__name__.endswith(
                ("Expr", "Selector", "Call")
            ):
                yield from _nodes(child)


def check_promql(expr: str, where: str) -> list[str]:
    """Problems of one expression: a syntax error, a metric no service exports, a label that metric lacks."""
    try:
        parsed = promql_parser.parse(expr)
    except ValueError as exc:
        return [f"{where}: {exc}"]
    known = sample_names()
    problems = []
    for node in _nodes(parsed):
        if type(node).__name__ != "VectorSelector" or not node.name:
            continue
        if node.name not in known:
            problems.append(f"{where}: no service exports {node.name}")
            continue
        for matcher in node.matchers.matchers:
            if matcher.name not in known[node.name]:
                problems.append(f"{where}: {node.name} has no label {matcher.name}")
    return problems


@pytest.fixture(scope="module")
def rules() -> list[dict[str, Any]]:
    document = yaml.safe_load((FILES / "prometheus-rules.yaml").read_text())
    assert set(document) == {"groups"}
    return [rule for group in document["groups"] for rule in group["rules"]]


def test_the_alerts_an_operator_needs_are_there(rules: list[dict[str, Any]]) -> None:
    names = {rule["alert"] for rule in rules}
    assert {
        "FlexInferNoSchedulerLeader",
        "FlexInferNoActuatorLeader",
        "FlexInferGroupStuckSwapping",
        "FlexInferQueueWaitHigh",
        "FlexInferLeaseHeldPastTTL",
        "FlexInferNoLeaseManagerLeader",
    } <= names


def test_every_rule_parses_and_names_only_exported_metrics(rules: list[dict[str, Any]]) -> None:
    problems = []
    for rule in rules:
        where = rule.get("alert", rule.get("record", "?"))
        assert set(rule) <= {"alert", "record", "expr", "for", "labels", "annotations", "keep_firing_for"}, where
        assert ("alert" in rule) != ("record" in rule), where
        problems += check_promql(rule["expr"], where)
        if "for" in rule:
            parse_duration(rule["for"])
        if "alert" in rule:
            assert rule["labels"]["severity"] in {"critical", "warning", "info"}, where
            assert {"summary", "description"} <= set(rule["annotations"]), where
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("expr", "problem"),
    [
        pytest.param("sum(flexinfer_scheduler_leader", "unclosed", id="syntax"),
        pytest.param("flexinfer_scheduler_leaders > 0", "no service exports", id="unknown-metric"),
        pytest.param('flexinfer_proxy_queue_depth{group="g"}', "has no label group", id="unknown-label"),
        pytest.param("rate(flexinfer_swaps[5m])", "no service exports", id="counter-without-total"),
    ],
)
def test_the_check_catches_a_bad_expression(expr: str, problem: str) -> None:
    assert problem in "\n".join(check_promql(expr, "test"))


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((FILES / "grafana-dashboard.json").read_text())
    return loaded


def test_dashboard_structure(dashboard: dict[str, Any]) -> None:
    assert dashboard["uid"] and dashboard["title"] and isinstance(dashboard["schemaVersion"], int)
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    cells: set[tuple[int, int]] = set()
    for panel in dashboard["panels"]:
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, panel["title"]
        covered = {
            (x, y) for x in range(grid["x"], grid["x"] + grid["w"]) for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"panel {panel['title']!r} overlaps another"
        cells |= covered
        if panel["type"] == "row":
            continue
        assert panel["type"] in {"stat", "timeseries", "state-timeline", "table", "gauge", "bargauge"}
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])


def test_dashboard_queries_parse_and_name_only_exported_metrics(dashboard: dict[str, Any]) -> None:
    problems = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            # Grafana's variables, as Prometheus would see them once substituted.
            expr = target["expr"].replace("$__rate_interval", "5m").replace("$group", ".*")
            problems += check_promql(expr, f"panel {panel['title']!r}")
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            metric = variable["definition"].removeprefix("label_values(").split(",")[0]
            label = variable["definition"].split(",")[1].strip(" )")
            assert label in sample_names()[metric], variable["name"]
    assert not problems, "\n".join(problems)


def test_group_memory_gauges_follow_the_resident_set_and_go_with_the_group() -> None:
    def memory(device: str, state: str) -> float | None:
        labels = {"group": "g-mem", "device": device, "state": state}
        return REGISTRY.get_sample_value("flexinfer_group_memory_bytes", labels)

    gib = 1 << 30
    members = tuple(
        Member(ModelKey("default", n), memory=size * gib, queued=1, last_active_time=T0)
        for n, size in (("a", 6), ("b", 5))
    )
    snapshot = GroupSnapshot("g-mem", members, capacity=Capacity(devices=1, memory_per_device=24 * gib))
    plan = plan_group(snapshot, T0, ElectionParams(), command_retry=timedelta(seconds=10), new_swap_id="s")
    gauges = GroupGauges()
    gauges.show("g-mem", group_view(snapshot, plan))
    assert (memory("0", "used"), memory("0", "free")) == (11 * gib, 13 * gib)
    assert (active("g-mem", "a"), active("g-mem", "b")) == (1, 1)  # both resident
    gauges.retain(())
    assert memory("0", "used") is None
