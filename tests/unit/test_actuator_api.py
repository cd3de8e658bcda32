"""The actuator's HTTP surface and settings, without a bus: the process table, the admin token, ops routes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from flexinfer_actuator.adapters.local import LocalProcessScaler
from flexinfer_actuator.api import build_app
from flexinfer_actuator.domain.processes import ProcessInfo, ProcessPhase
from flexinfer_actuator.main import connect_kubernetes
from flexinfer_actuator.settings import ActuatorSettings
from flexinfer_common.settings import SettingsError, load_settings

ROW = ProcessInfo(
    namespace="default",
    name="qwen",
    pid=4242,
    port=9100,
    phase=ProcessPhase.READY,
    generation=3,
    started_at=datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC),
    endpoint="http://127.0.0.1:9100",
)


async def ready() -> dict[str, bool]:
    return {"bus": True, "consumer": True}


async def not_ready() -> dict[str, bool]:
    return {"bus": False, "consumer": True}


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    app = build_app(processes=lambda: [ROW], readiness=ready, admin_token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://actuator") as http:
        yield http


async def test_process_table_lists_rows_with_camel_case_fields(client: httpx.AsyncClient) -> None:
    response = await client.get("/api/v1/processes")
    assert response.status_code == 200
    assert response.json() == {
        "items": [
            {
                "namespace": "default",
                "name": "qwen",
                "pid": 4242,
                "pod": None,
                "port": 9100,
                "phase": "Ready",
                "generation": 3,
                "startedAt": "2026-01-02T03:04:05Z",
                "endpoint": "http://127.0.0.1:9100",
            }
        ]
    }


async def test_ops_routes_answer(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    assert (await client.get("/readyz")).status_code == 200
    metrics = await client.get("/metrics")
    assert "flexinfer_actuator_commands_total" in metrics.text


async def test_readyz_is_503_while_the_bus_is_down() -> None:
    app = build_app(processes=list, readiness=not_ready, admin_token=None)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://actuator") as http:
        response = await http.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"] == {"bus": False, "consumer": True}


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        pytest.param({}, 401, id="no-token-401"),
        pytest.param({"Authorization": "Bearer wrong"}, 401, id="wrong-token-401"),
        pytest.param({"Authorization": "Basic s3cret"}, 401, id="wrong-scheme-401"),
        pytest.param({"Authorization": "Bearer s3cret"}, 200, id="right-token-200"),
    ],
)
async def test_admin_token_guards_api_v1(headers: dict[str, str], status: int) -> None:
    app = build_app(processes=list, readiness=ready, admin_token="s3cret")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://actuator") as http:
        response = await http.get("/api/v1/processes", headers=headers)
        assert response.status_code == status
        if status == 401:
            assert response.json()["error"]["code"] == "unauthorized"
            assert response.headers["www-authenticate"] == "Bearer"
        assert (await http.get("/healthz")).status_code == 200  # ops routes stay open


def test_state_dir_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEXINFER_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("FLEXINFER_READINESS_PROBE_INTERVAL", "50ms")
    settings = load_settings(ActuatorSettings)
    assert settings.state_dir == tmp_path / "state"
    assert settings.readiness_probe_interval.total_seconds() == 0.05


def test_state_dir_defaults_to_dot_flexinfer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FLEXINFER_STATE_DIR", raising=False)
    assert load_settings(ActuatorSettings).state_dir == Path(".flexinfer")


def test_kubernetes_backend_without_a_configuration_is_refused_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEXINFER_ACTUATOR", "kubernetes")
    monkeypatch.setenv("FLEXINFER_KUBECONFIG", str(tmp_path / "missing-kubeconfig"))
    settings = load_settings(ActuatorSettings)
    with pytest.raises(SettingsError, match="FLEXINFER_KUBECONFIG") as refused:
        connect_kubernetes(settings)
    assert "missing-kubeconfig" in str(refused.value)


async def test_kubernetes_backend_uses_the_kubeconfig_and_context_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        """
apiVersion: v1
kind: Config
current-context: laptop
clusters:
  - name: laptop
    cluster: {server: "http://127.0.0.1:6443"}
  - name: lab
    cluster: {server: "http://127.0.0.1:7443"}
users:
  - name: me
    user: {token: not-a-secret}
contexts:
  - name: laptop
    context: {cluster: laptop, user: me}
  - name: lab
    context: {cluster: lab, user: me}
"""
    )
    monkeypatch.setenv("FLEXINFER_KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("FLEXINFER_KUBE_CONTEXT", "lab")
    client = connect_kubernetes(load_settings(ActuatorSettings))
    try:
        assert client.host == "http://127.0.0.1:7443"
    finally:
        await client.close()


async def test_local_backend_is_built_from_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FLEXINFER_STATE_DIR", str(tmp_path))

    async def sink(_: object) -> None:
        return None

    scaler = LocalProcessScaler.from_settings(load_settings(ActuatorSettings), on_status=sink)
    assert scaler.backend == "local"
    assert scaler.snapshot() == []
    await scaler.close()
