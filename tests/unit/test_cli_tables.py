"""``flexinfer get`` tables: columns from the admin API's JSON (docs/reference.md section 4), kubectl-style layout."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_cli.tables import (
    VIEWS,
    Kind,
    Selection,
    UnexpectedAnswer,
    format_seconds,
    group_wide,
    items_of,
    parse_kind,
    render_kind,
    render_table,
    select,
    swap_row,
    table_headers,
    table_row,
)
from flexinfer_common.admin_api import Group, Swap
from flexinfer_common.manifests import Model


def model(name: str = "chat", **status: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"gpu": {"shared": "homelab-gpu", "priority": 100}},
        "status": status,
    }


def group(name: str, policy: str, state: str, **fields: Any) -> dict[str, Any]:
    """A GPU group of the groups API: no active model, no cooldown left and no lease unless ``fields`` say so."""
    return {
        "name": name,
        "policy": policy,
        "activeModel": None,
        "state": state,
        "cooldownRemainingSeconds": 0,
        "lease": None,
        **fields,
    }


def queue(model: str, queued: int, oldest_wait: float) -> dict[str, Any]:
    return {"namespace": "default", "model": model, "queued": queued, "oldestWaitSeconds": oldest_wait}


def test_render_table_aligns_columns_three_spaces_apart() -> None:
    text = render_table(("NAME", "PHASE"), [["chat-small", "Ready"], ["big", "Preempted"]])
    assert text.splitlines() == [
        "NAME         PHASE",
        "chat-small   Ready",
        "big          Preempted",
    ]


def test_render_table_has_no_trailing_spaces() -> None:
    text = render_table(("A", "LONGER"), [["aaaaaa", ""]])
    assert all(line == line.rstrip() for line in text.splitlines())


@pytest.mark.parametrize(
    ("kind", "item", "expected"),
    [
        pytest.param(
            Kind.MODELS,
            model(
                phase="Ready",
                lastActiveTime="2026-01-02T03:04:05Z",
                sharedGroup={"state": "Active", "queuePosition": 0},
            ),
            ["chat", "homelab-gpu", "100", "Ready", "Active", "0", "2026-01-02T03:04:05Z"],
            id="models-active-model",
        ),
        pytest.param(
            Kind.MODELS,
            model(phase="Pending"),
            ["chat", "homelab-gpu", "100", "Pending", "<none>", "<none>", "<none>"],
            id="models-missing-values-print-none",
        ),
        pytest.param(
            Kind.MODELS,
            {"metadata": {"name": "solo", "namespace": "x"}, "spec": {}},
            ["solo", "<none>", "0", "<none>", "<none>", "<none>", "<none>"],
            id="models-no-status-no-gpu",
        ),
        pytest.param(
            Kind.GROUPS,
            group(
                "homelab-gpu",
                "v1alpha2",
                "Stable",
                activeModel={"namespace": "default", "name": "chat-large"},
                cooldownRemainingSeconds=95,
                models=[],
            ),
            ["homelab-gpu", "v1alpha2", "default/chat-large", "Stable", "1m35s", "<none>"],
            id="groups-active-in-cooldown",
        ),
        pytest.param(
            Kind.GROUPS,
            group(
                "g",
                "v1alpha1",
                "Leased",
                lease={"name": "lora-lease", "owner": "lora", "expiresAt": "2026-01-01T00:00:00Z"},
            ),
            ["g", "v1alpha1", "<none>", "Leased", "0s", "lora-lease"],
            id="groups-leased-no-active",
        ),
        pytest.param(
            Kind.LEASES,
            {
                "name": "qwen3-1p7b-lora-gpu-lease",
                "group": "5930k-textgen",
                "owner": "qwen3-1p7b-lora",
                "node": None,
                "ttlSeconds": 3600,
                "expiresAt": "2026-06-20T12:00:00Z",
            },
            [
                "qwen3-1p7b-lora-gpu-lease",
                "5930k-textgen",
                "qwen3-1p7b-lora",
                "<none>",
                "2026-06-20T12:00:00Z",
            ],
            id="leases",
        ),
        pytest.param(Kind.QUEUES, queue("chat", 3, 12.34), ["chat", "3", "12.3s"], id="queues-seconds"),
        pytest.param(Kind.QUEUES, queue("chat", 1, 0.25), ["chat", "1", "250ms"], id="queues-milliseconds"),
        pytest.param(Kind.QUEUES, queue("idle", 0, 0), ["idle", "0", "-"], id="queues-empty-queue"),
        pytest.param(
            Kind.SWAPS,
            {
                "group": "homelab-gpu",
                "fromModel": "default/chat-small",
                "toModel": "default/chat-large",
                "reason": "demand",
                "startedAt": "2026-01-01T00:00:00Z",
                "finishedAt": "2026-01-01T00:00:04.500Z",
                "phases": {"draining": 0.2, "parking": 1.3, "loading": 3.0},
                "phase": "ready",
                "outcome": "ready",
            },
            [
                "homelab-gpu",
                "default/chat-small",
                "default/chat-large",
                "demand",
                "2026-01-01T00:00:00Z",
                "4.5s",
                "draining=200ms,parking=1.3s,loading=3s",
                "ready",
            ],
            id="swaps-finished-swap",
        ),
        pytest.param(
            Kind.SWAPS,
            {
                "group": "g",
                "fromModel": None,
                "toModel": "default/a",
                "reason": "initial",
                "startedAt": "2026-01-01T00:00:00+00:00",
                "finishedAt": None,
                "phases": {},
            },
            ["g", "<none>", "default/a", "initial", "2026-01-01T00:00:00Z", "running", "<none>", "running"],
            id="swaps-running-initial-swap",
        ),
    ],
)
def test_row(kind: Kind, item: dict[str, Any], expected: list[str]) -> None:
    """Each kind's default columns, from one item of its API answer."""
    view = VIEWS[kind]
    assert view.row(view.item.model_validate(item)) == expected


def test_group_wide_shows_the_resident_models_and_each_devices_memory() -> None:
    gib = 1 << 30
    item = {
        "name": "card",
        "policy": "v1alpha2",
        "state": "Serving",
        "models": [{"namespace": "default", "name": "chat"}, {"namespace": "default", "name": "code"}],
        "capacity": {"devices": 1, "memoryPerDevice": 24 * gib},
        "devices": [{"index": 0, "usedBytes": 11 * gib, "freeBytes": 13 * gib, "models": []}],
        "residentModels": [{"namespace": "default", "name": "chat"}, {"namespace": "default", "name": "code"}],
    }
    row = group_wide(Group.model_validate(item))
    assert row[-2:] == ["default/chat,default/code", "0:11.0Gi/24.0Gi"]
    assert group_wide(Group.model_validate({**item, "devices": None, "residentModels": None}))[-2:] == [
        "<none>",
        "<none>",
    ]


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        pytest.param(0.0451, "45ms", id="ms"),
        pytest.param(2, "2s", id="whole-seconds"),
        pytest.param(2.25, "2.2s", id="tenths"),
        pytest.param(60, "1m", id="minute"),
        pytest.param(3725, "1h2m5s", id="hours"),
        pytest.param(None, "<none>", id="none"),
        pytest.param("x", "<none>", id="not-a-number"),
    ],
)
def test_format_seconds(seconds: Any, text: str) -> None:
    assert format_seconds(seconds) == text


def test_render_kind_models_header_and_empty() -> None:
    text = render_kind(Kind.MODELS, {"items": [model(phase="Ready")]}, all_namespaces=False)
    assert text is not None
    # The seed's custom columns, in its order.
    assert text.splitlines()[0].split() == ["NAME", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "LAST_ACTIVE"]
    everywhere = render_kind(Kind.MODELS, {"items": [model(phase="Ready")]}, all_namespaces=True, wide=True)
    assert everywhere is not None
    assert everywhere.splitlines()[0].split() == [
        "NAMESPACE",
        "NAME",
        "SHARED",
        "PRIORITY",
        "PHASE",
        "STATE",
        "QUEUE",
        "LAST_ACTIVE",
        "PREEMPTED_BY",
        "SERVICE_LABELS",
        "BACKEND",
        "REQUESTS",
        "RESTARTS",
        "MESSAGE",
    ]
    assert render_kind(Kind.MODELS, {"items": []}) is None
    with pytest.raises(UnexpectedAnswer, match="swaps answer is not what this CLI expects"):
        render_kind(Kind.SWAPS, {"items": [{"group": 3}]})


@pytest.mark.parametrize(
    ("kind", "namespace", "names", "expected"),
    [
        pytest.param(Kind.MODELS, "default", (), ["default/a", "default/b"], id="one-namespace"),
        pytest.param(Kind.MODELS, None, (), ["default/a", "default/b", "lab/a"], id="all-namespaces"),
        pytest.param(Kind.MODELS, None, ("a",), ["default/a", "lab/a"], id="a-name-everywhere"),
        pytest.param(Kind.MODELS, "lab", ("b",), [], id="name-not-in-namespace"),
    ],
)
def test_select(kind: Kind, namespace: str | None, names: tuple[str, ...], expected: list[str]) -> None:
    items = items_of(
        kind, {"items": [model("a"), model("b"), {**model("a"), "metadata": {"name": "a", "namespace": "lab"}}]}
    )
    chosen = select(kind, items, Selection(namespace, names))
    assert [f"{m.metadata.namespace}/{m.metadata.name}" for m in chosen] == expected


def test_groups_and_leases_ignore_the_namespace() -> None:
    groups = items_of(Kind.GROUPS, {"items": [{"name": "g", "policy": "v1alpha2", "state": "Idle"}]})
    assert select(Kind.GROUPS, groups, Selection("lab")) == groups
    assert table_headers(Kind.GROUPS, wide=False, all_namespaces=True)[0] == "NAME"


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        pytest.param("models", Kind.MODELS, id="plural"),
        pytest.param("Model", Kind.MODELS, id="singular-any-case"),
        pytest.param("gpugroups", Kind.GROUPS, id="crd-plural"),
        pytest.param("gpulease", Kind.LEASES, id="crd-singular"),
        pytest.param("queue", Kind.QUEUES, id="queue"),
        pytest.param("swaps", Kind.SWAPS, id="swaps"),
    ],
)
def test_parse_kind(text: str, kind: Kind) -> None:
    assert parse_kind(text) is kind


def test_parse_kind_unknown_lists_the_choices() -> None:
    with pytest.raises(ValueError, match="models, groups, leases, queues, swaps"):
        parse_kind("pods")


def test_a_failed_swap_says_failed_and_why_on_one_line() -> None:
    """Issue 24: `get swaps` showed a swap whose model never loaded like one that served."""
    item = Swap.model_validate(
        {
            "group": "g",
            "fromModel": "default/a",
            "toModel": "default/b",
            "reason": "demand",
            "startedAt": "2026-01-01T00:00:00Z",
            "finishedAt": "2026-01-01T00:00:09Z",
            "phase": "failed",
            "outcome": "failed",
            "message": "default/b failed to load: killed by signal 4\nlast log lines:\n  Illegal instruction",
        }
    )
    assert swap_row(item)[-1] == "failed"
    assert render_kind(Kind.SWAPS, {"items": [item.model_dump(by_alias=True, mode="json")]}, wide=True).count("\n") == 1
    assert "killed by signal 4 last log lines: Illegal instruction" in render_kind(
        Kind.SWAPS, {"items": [item.model_dump(by_alias=True, mode="json")]}, wide=True
    )


def test_a_multi_line_message_stays_on_one_line_in_get_models_wide_with_restarts() -> None:
    model = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "chat", "namespace": "default"},
        "spec": {"gpu": {"shared": "g"}},
        "status": {"phase": "Loading", "restarts": 3, "message": "crashed: killed by signal 9\nline 2\nline 3"},
    }
    table = render_kind(Kind.MODELS, {"items": [model]}, wide=True)
    assert table is not None
    header, row = table.splitlines()
    assert header.split()[-3:] == ["REQUESTS", "RESTARTS", "MESSAGE"]
    assert "3" in row.split() and row.endswith("crashed: killed by signal 9 line 2 line 3")


def test_get_models_wide_shows_the_requests_waiting_beside_each_model() -> None:
    """Issue 24: QUEUE is the election's queue position; REQUESTS is how many requests wait at the proxy."""
    model = Model.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": "chat", "namespace": "default"},
            "spec": {"gpu": {"shared": "g"}},
            "status": {"phase": "Loading", "sharedGroup": {"state": "Active", "queuePosition": 0}},
        }
    )
    headers = table_headers(Kind.MODELS, wide=True, all_namespaces=False)
    row = table_row(Kind.MODELS, model, wide=True, all_namespaces=False, waiting={("default", "chat"): 7})
    assert row[headers.index("REQUESTS")] == "7" and row[headers.index("QUEUE")] == "0"
    unread = table_row(Kind.MODELS, model, wide=True, all_namespaces=False, waiting=None)
    assert unread[headers.index("REQUESTS")] == "<none>"
