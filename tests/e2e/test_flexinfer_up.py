"""End to end, as a user would: `flexinfer up -f examples/homelab.yaml` (embedded NATS and Postgres, local
actuator, fake models), then curl-like HTTP requests and the `flexinfer` CLI, then Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.up import up_environment

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


class Up:
    def __init__(self, process: subprocess.Popen[bytes], env: dict[str, str], log: Path) -> None:
        self.process = process
        self.env = env
        self.log = log

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.env[f'FLEXINFER_{service.upper()}_PORT']}"

    def cli(self, *args: str) -> str:
        done = subprocess.run(
            [str(BIN / "flexinfer"), *args], env=self.env, capture_output=True, timeout=30, check=False
        )
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode()

    @property
    def token_file(self) -> Path:
        return Path(self.env["FLEXINFER_STATE_DIR"]) / "admin-token"

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token_file.read_text().strip()}"}

    def chat(self, model: str, text: str, timeout: float = 60) -> httpx.Response:
        body = {"model": model, "messages": [{"role": "user", "content": text}]}
        return httpx.post(self.url("proxy") + "/v1/chat/completions", json=body, timeout=timeout)


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    env = up_environment(
        tmp_path / "state",
        FLEXINFER_RECONCILE_INTERVAL="500ms",
        FLEXINFER_DEMAND_REFRESH_INTERVAL="500ms",
        FLEXINFER_SHARED_DEMAND_WINDOW="3s",
    )
    log = tmp_path / "up.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [
                str(BIN / "flexinfer"),
                "up",
                "-f",
                str(ROOT / "examples" / "homelab.yaml"),
                "--state-dir",
                str(tmp_path / "state"),
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    handle = Up(process, env, log)
    try:
        # `up` prints its banner once every service is ready and the example is applied
        wait_until(lambda: "Watch the models" in log.read_text() or process.poll() is not None, 120, "the banner")
        assert process.poll() is None, log.read_text()[-3000:]
        # `up` prints the NATS URL to export; the CLI's `demand` needs it
        text = log.read_text()
        for line in text.splitlines():
            if "export FLEXINFER_NATS_URL=" in line:
                env["FLEXINFER_NATS_URL"] = line.split("=", 1)[1].strip()
        yield handle
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def models(up: Up) -> dict[str, dict[str, Any]]:
    return {m["metadata"]["name"]: m for m in json.loads(up.cli("get", "models", "-o", "json"))["items"]}


def test_the_readme_demo_swaps_models_and_ctrl_c_stops_everything(up: Up) -> None:
    # At start the group's fallback leader (highest priority) is loaded: chat-large.
    wait_until(lambda: models(up)["chat-large"]["status"]["phase"] == "Ready", 30, "chat-large to be Ready")
    response = up.chat("chat-large", "hello")
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "[chat-large] hello"

    # chat-small has the lower priority: an operator promotes it (the README's `flexinfer promote`).
    up.cli("promote", "chat-small")
    response = up.chat("chat-small", "hi small")
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["message"]["content"] == "[chat-small] hi small"
    assert response.headers["X-FlexInfer-Cold-Start"] == "true"

    state = models(up)
    assert state["chat-small"]["status"]["phase"] == "Ready"
    assert state["chat-small"]["status"]["sharedGroup"]["state"] == "Active"
    assert state["chat-large"]["status"]["phase"] == "Preempted"
    assert state["chat-large"]["status"]["preemptedBy"] == "chat-small"
    swaps = up.cli("get", "swaps")
    assert "force-promotion" in swaps and "default/chat-small" in swaps
    assert "homelab-gpu" in up.cli("get", "groups")

    # The service label "chat" goes to the active model that carries it.
    response = up.chat("chat", "via label")
    assert response.json()["choices"][0]["message"]["content"] == "[chat-small] via label"

    processes = httpx.get(up.url("actuator") + "/api/v1/processes", headers=up.auth(), timeout=5).json()["items"]
    pids = [p["pid"] for p in processes]
    assert [p["name"] for p in processes] == ["chat-small"]

    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(timeout=30) == 0
    for pid in pids:
        wait_until(lambda pid=pid: not Path(f"/proc/{pid}").exists(), 10, f"model process {pid} to exit")
    log = up.log.read_text()
    assert "embedded servers stopped" in log


def test_unknown_model_and_bad_manifest_are_reported_clearly(up: Up, tmp_path: Path) -> None:
    response = up.chat("no-such-model", "hi", timeout=10)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "model_not_found"

    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nmetadata: {name: x}\nspec: {gpu: {priority: high}}\n"
    )
    done = subprocess.run(
        [str(BIN / "flexinfer"), "apply", "-f", str(bad)], env=up.env, capture_output=True, timeout=30, check=False
    )
    assert done.returncode == 2
    assert "spec.gpu.priority" in done.stderr.decode()


def listening_addresses(port: int) -> set[str]:
    """The local addresses on which something listens on TCP ``port`` (from /proc/net/tcp and tcp6)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.partition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_the_defaults_expose_nothing_and_refuse_what_is_not_allowed(up: Up, tmp_path: Path) -> None:
    # Every service listens on loopback only.
    for service in ("proxy", "scheduler", "lease_manager", "actuator"):
        port = int(up.env[f"FLEXINFER_{service.upper()}_PORT"])
        assert listening_addresses(port) == {"0100007F"}, service  # 127.0.0.1, little-endian hex
    # `up` generated a token only its user can read, and the services require it.
    assert up.token_file.stat().st_mode & 0o777 == 0o600
    token = up.token_file.read_text().strip()
    assert len(token) >= 32
    for service, path in (
        ("scheduler", "/api/v1/models"),
        ("actuator", "/api/v1/processes"),
        ("proxy", "/api/v1/queues"),
    ):
        for headers in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": f"Basic {token}"}):
            response = httpx.get(up.url(service) + path, headers=headers, timeout=5)
            assert response.status_code == 401, (service, headers)
            assert response.headers["WWW-Authenticate"] == "Bearer"
            assert response.json()["error"]["code"] == "unauthorized"
    # The CLI finds the token by itself (the demo stays two commands).
    assert "chat-large" in up.cli("get", "models")

    # The attack: a manifest that asks the box to run a shell. Refused with 422 naming the rule.
    marker = tmp_path / "pwned"
    evil = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "evil", "namespace": "default"},
        "spec": {
            "gpu": {"shared": "homelab-gpu", "priority": 1000},
            "local": {"command": ["sh", "-c", f"touch {marker}"]},
        },
    }
    url = up.url("scheduler") + "/api/v1/models/default/evil"
    assert httpx.put(url, json=evil, timeout=5).status_code == 401
    response = httpx.put(url, json=evil, headers=up.auth(), timeout=5)
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "command_not_allowed"
    assert "FLEXINFER_LOCAL_COMMANDS" in error["message"] and "'sh'" in error["message"]
    assert httpx.get(url, headers=up.auth(), timeout=5).status_code == 404
    time.sleep(1)
    assert not marker.exists()

    # No token in any log: `up`'s own output (every service's log lines) and the model processes' logs.
    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(timeout=30) == 0
    logs = [up.log, *Path(up.env["FLEXINFER_STATE_DIR"]).glob("logs/*.log")]
    assert len(logs) > 1
    for log in logs:
        assert token not in log.read_text(errors="replace"), log
