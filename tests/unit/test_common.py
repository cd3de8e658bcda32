"""libs/common: durations, settings errors that name the variable, manifests with field-naming errors,
and demand decoding (the contract's subject-fills-body rule)."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from flexinfer_common.bus import BadMessage, decode_demand
from flexinfer_common.durations import format_duration, parse_duration
from flexinfer_common.manifests import GPUGroup, ManifestError, Model, load_manifests
from flexinfer_common.settings import CommonSettings, SettingsError, load_settings


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("90s", 90, id="seconds"),
        pytest.param("2m", 120, id="minutes"),
        pytest.param("1h30m", 5400, id="compound"),
        pytest.param("250ms", 0.25, id="milliseconds"),
        pytest.param("3", 3, id="plain-seconds"),
        pytest.param("0.5", 0.5, id="fractional-seconds"),
    ],
)
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["", "abc", "5x", "m5", "-3s", "5s junk"])
def test_parse_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)


def test_format_duration_round_trips() -> None:
    assert [format_duration(timedelta(seconds=s)) for s in (300, 90, 0.25, 3600)] == ["5m", "1m30s", "250ms", "1h"]


def test_bad_setting_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXINFER_QUEUE_TIMEOUT", "soon")
    with pytest.raises(SettingsError, match="FLEXINFER_QUEUE_TIMEOUT"):
        load_settings(CommonSettings)


def test_settings_accept_go_durations_and_libpq_urls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXINFER_RECONCILE_INTERVAL", "500ms")
    monkeypatch.setenv("FLEXINFER_DATABASE_URL", "postgresql://u@127.0.0.1:5/db")
    settings = load_settings(CommonSettings)
    assert settings.reconcile_interval == timedelta(milliseconds=500)
    assert settings.database_url == "postgresql+asyncpg://u@127.0.0.1:5/db"


SEED_MODEL = """
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata:
  name: qwen3-8b
spec:
  backend: mlc-llm
  source: HF://mlc-ai/Qwen3-8B-q4f16_1-MLC
  gpu:
    shared: homelab-gpu
    priority: 100
    swapCooldown: "3m"
---
apiVersion: ai.flexinfer/v1alpha1
kind: GPUGroup
metadata: {name: g1}
spec:
  models: [{name: a, priority: 5}]
"""


def test_seed_manifests_parse() -> None:
    model, group = load_manifests(SEED_MODEL)
    assert isinstance(model, Model) and isinstance(group, GPUGroup)
    assert model.spec.gpu.shared == "homelab-gpu" and model.spec.gpu.priority == 100
    assert model.spec.gpu.swap_cooldown == timedelta(minutes=3)
    assert model.namespace == "default"
    assert group.spec.policy.request_queue_threshold == 3  # the seed's v1alpha1 default


@pytest.mark.parametrize(
    ("text", "names"),
    [
        pytest.param(
            "apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nmetadata: {name: a}\nspec: {gpu: {priority: high}}",
            "spec.gpu.priority",
            id="bad-priority",
        ),
        pytest.param(
            "apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nmetadata: {name: a}\nspec: {gpu: {swapCooldown: soon}}",
            "spec.gpu.swapCooldown",
            id="bad-duration",
        ),
        pytest.param("apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nspec: {}", "metadata", id="missing-metadata"),
        pytest.param(
            "apiVersion: v9\nkind: Model\nmetadata: {name: a}", "unsupported apiVersion/kind", id="unknown-kind"
        ),
        pytest.param("a: [", "not valid YAML", id="bad-yaml"),
        pytest.param(
            "apiVersion: ai.flexinfer/v1alpha1\nkind: GPULease\nmetadata: {name: l}\n"
            "spec: {group: g, owner: o, ttlSeconds: 5}",
            "spec.ttlSeconds",
            id="lease-ttl-min-60",
        ),
    ],
)
def test_bad_manifest_names_the_field(text: str, names: str) -> None:
    with pytest.raises(ManifestError, match=names.replace(".", r"\.")):
        load_manifests(text)


@pytest.mark.parametrize(
    ("subject", "body", "expected"),
    [
        pytest.param("flexinfer.demand.default.m", {"model": "m", "queued": 2}, ("default", "m", 2), id="full-body"),
        pytest.param("flexinfer.demand.team.m", {"model": "m"}, ("team", "m", 0), id="namespace-from-subject"),
        pytest.param("flexinfer.demand.default.qwen3-1_7b", {}, ("default", "qwen3-1.7b", 0), id="dots-in-names"),
        pytest.param("flexinfer.demand.x.y", {"model": "ns2/m"}, ("ns2", "m", 0), id="namespace-slash-name"),
    ],
)
def test_decode_demand(subject: str, body: dict[str, object], expected: tuple[str, str, int]) -> None:
    demand = decode_demand(subject, json.dumps(body).encode())
    assert (demand.namespace, demand.model, demand.queued) == expected


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        pytest.param(b"{nope", "not JSON", id="not-json"),
        pytest.param(b"[1]", "expected a JSON object", id="not-object"),
        pytest.param(b'{"model": "m", "queued": -1}', "queued", id="negative-queued"),
        pytest.param(b'{"model": ""}', "model", id="empty-model"),
    ],
)
def test_decode_demand_rejects_with_reason(data: bytes, reason: str) -> None:
    with pytest.raises(BadMessage, match=reason):
        decode_demand("flexinfer.demand.default.m", data)


def test_message_times_are_utc_at_every_depth() -> None:
    """A consumer compares times across services: every time in a message reads as UTC, a naive one taken as UTC
    and an offset one converted, also inside nested parts (a model's status in its update)."""
    from datetime import UTC, datetime, timezone

    from flexinfer_common.messages import ModelStatus, ModelStatusUpdate, SharedGroupStatus

    plus_two = timezone(timedelta(hours=2))
    update = ModelStatusUpdate(
        namespace="default",
        model="a",
        status=ModelStatus(
            last_active_time=datetime(2026, 1, 1, 14, 0, tzinfo=plus_two),
            shared_group=SharedGroupStatus(preempted_at=datetime(2026, 1, 1, 12, 0)),
        ),
        time=datetime(2026, 1, 1, 12, 0),
    )
    assert update.time == datetime(2026, 1, 1, 12, 0, tzinfo=UTC) and update.time.tzinfo is UTC
    assert update.status.last_active_time is not None and update.status.last_active_time.tzinfo is UTC
    assert update.status.last_active_time.hour == 12
    assert update.status.shared_group.preempted_at == datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
    body = json.loads(update.to_bytes())
    assert body["status"]["lastActiveTime"].startswith("2026-01-01T12:00:00")
    assert body["status"]["lastActiveTime"].endswith("Z")
