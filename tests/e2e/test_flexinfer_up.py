"""End to end, as a user would: `flexinfer up -f examples/homelab.yaml` (embedded NATS and Postgres, local
actuator, fake models), then curl-like HTTP requests and the `flexinfer` CLI, then Ctrl-C."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.up import exported_nats_url, start_up, stop_up, until_up, up_environment, wait_until

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


@pytest.fixture
def up(tmp_path: Path) -> Iterator[Up]:
    env = up_environment(
        tmp_path / "state",
        FLEXINFER_RECONCILE_INTERVAL="500ms",
        FLEXINFER_DEMAND_REFRESH_INTERVAL="500ms",
        FLEXINFER_SHARED_DEMAND_WINDOW="3s",
    )
    log = tmp_path / "up.log"
    process = start_up(ROOT / "examples" / "homelab.yaml", env, log, "--state-dir", str(tmp_path / "state"))
    handle = Up(process, env, log)
    try:
        # `up` prints its banner once every service is ready and the example is applied
        until_up(process, log)
        # `up` prints the NATS URL to export; the CLI's `demand` needs it
        if nats_url := exported_nats_url(log):
            env["FLEXINFER_NATS_URL"] = nats_url
        yield handle
    finally:
        stop_up(process)


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


async def _forge(url: str, user: str | None, password: str | None) -> tuple[str, list[str]]:
    """The issue's bus attacks, as ``user`` (None: without credentials): a route to the attacker's server, an
    activate with a huge generation for the parked model, a park of the serving one. Returns how the connection
    went and the server's errors (each refused publish is answered with a permissions violation)."""
    import asyncio
    import contextlib

    import nats

    from flexinfer_common.enums import ScaleAction
    from flexinfer_common.messages import RuntimeSpec, ScaleCommand
    from flexinfer_common.subjects import ROUTES_BUCKET, command_subject

    errors: list[str] = []
    three_refused = asyncio.Event()

    async def note(exc: Exception) -> None:
        errors.append(str(exc))
        if sum("permissions violation for publish" in e.lower() for e in errors) >= 3:
            three_refused.set()

    try:
        nc = await nats.connect(
            url, user=user, password=password, error_cb=note, allow_reconnect=False, connect_timeout=2
        )
    except Exception as exc:
        return f"refused: {exc}", errors
    route = {"namespace": "default", "name": "chat-large", "endpoint": "http://127.0.0.1:9/", "ready": True}
    await nc.publish(f"$KV.{ROUTES_BUCKET}.default.chat-large", json.dumps({**route, "generation": 10**6}).encode())
    for model, action in (("chat-small", ScaleAction.ACTIVATE), ("chat-large", ScaleAction.PARK)):
        forged = ScaleCommand(
            namespace="default",
            model=model,
            action=action,
            generation=10**6,
            leader_epoch=10**6,
            runtime=RuntimeSpec(namespace="default", name=model, command=["flexinfer-fake-model", "--port", "{port}"]),
            issued_at="2026-01-01T00:00:00Z",
        )
        await nc.publish(command_subject("default", model), forged.to_bytes())
    await nc.flush()
    with contextlib.suppress(TimeoutError):  # the server's refusals arrive shortly after
        await asyncio.wait_for(three_refused.wait(), 5)
    await nc.close()
    return "connected", errors


def test_the_bus_refuses_a_local_attacker_and_a_demand_producer_forgeries(up: Up) -> None:
    import asyncio

    state = Path(up.env["FLEXINFER_STATE_DIR"])
    wait_until(lambda: models(up)["chat-large"]["status"]["phase"] == "Ready", 30, "chat-large to be Ready")
    creds = state / "nats-credentials.json"
    assert state.stat().st_mode & 0o066 == 0  # others cannot list it (a search bit stays for PostgreSQL as root)
    assert creds.stat().st_mode & 0o777 == 0o600
    assert (state / "nats" / "nats.conf").stat().st_mode & 0o777 == 0o600
    passwords = json.loads(creds.read_text())
    url = up.env.get("FLEXINFER_NATS_URL", "nats://127.0.0.1:4222")

    # A local user without the credentials cannot even connect (on main: connected, and every forgery landed).
    outcome, _ = asyncio.run(_forge(url, None, None))
    assert outcome.startswith("refused") and "Authorization Violation" in outcome
    # The demand identity (what an external producer holds) connects, but each forgery is refused and dropped.
    outcome, errors = asyncio.run(_forge(url, "demand", passwords["demand"]))
    assert outcome == "connected"
    refused = [e for e in errors if "permissions violation for publish" in e.lower()]
    assert len(refused) == 3, errors
    # `flexinfer demand` still works as that identity (from the state folder, as a user runs it).
    assert "flexinfer.demand.default.chat-small" in up.cli("demand", "chat-small")

    # Nothing changed: the requests still reach the real model, which still runs alone.
    response = up.chat("chat-large", "still me")
    assert response.status_code == 200
    assert response.json()["choices"][0]["message"]["content"] == "[chat-large] still me"
    processes = httpx.get(up.url("actuator") + "/api/v1/processes", headers=up.auth(), timeout=5).json()["items"]
    assert [p["name"] for p in processes] == ["chat-large"]
    assert models(up)["chat-large"]["status"]["phase"] == "Ready"

    # No bus password in any log line.
    up.process.send_signal(signal.SIGINT)
    assert up.process.wait(timeout=30) == 0
    text = up.log.read_text(errors="replace")
    for identity, password in passwords.items():
        assert password not in text, identity


PEERS = """
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: peer-a}
spec:
  gpu: {shared: peers, priority: 10, swapCooldown: 1s}
  local: {command: ["flexinfer-fake-model", "--port", "{port}", "--model", "peer-a", "--token-delay", "0.05"]}
---
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: peer-b}
spec:
  gpu: {shared: peers, priority: 10, swapCooldown: 1s, maxWait: 5s}
  local: {command: ["flexinfer-fake-model", "--port", "{port}", "--model", "peer-b"]}
"""


def test_a_request_behind_a_busy_peer_is_served_within_its_bound_with_a_3s_window(up: Up, tmp_path: Path) -> None:
    """The scheduling issue's starvation case, live: a 3 s demand window, two clients looping on peer-a (answers of
    a few tenths of a second), one request for peer-b of equal priority. peer-b's demand must not lapse between the
    proxy's refreshes: it stays Queued (never Parked) until its bound (maxWait 5 s) hands it the card."""
    import threading

    manifest = tmp_path / "peers.yaml"
    manifest.write_text(PEERS)
    up.cli("apply", "-f", str(manifest))
    assert up.chat("peer-a", "warm up", timeout=60).status_code == 200
    stop = threading.Event()
    answered: list[int] = []

    def client() -> None:
        while not stop.is_set():
            answered.append(up.chat("peer-a", "busy " * 4, timeout=120).status_code)

    clients = [threading.Thread(target=client) for _ in range(2)]
    for thread in clients:
        thread.start()
    try:
        wait_until(lambda: len(answered) >= 4, 30, "peer-a to be answering in a loop")
        result: list[httpx.Response] = []
        waiting = threading.Thread(target=lambda: result.append(up.chat("peer-b", "my turn", timeout=120)))
        started = time.monotonic()
        waiting.start()
        states = []
        while waiting.is_alive():
            state = models(up)["peer-b"]["status"].get("sharedGroup", {}).get("state")
            if not result:
                states.append(state)
            waiting.join(timeout=0.3)
        took = time.monotonic() - started
    finally:
        stop.set()
        for thread in clients:
            thread.join(timeout=120)
    assert result and result[0].status_code == 200, result[0].text if result else "no answer"
    assert result[0].json()["choices"][0]["message"]["content"] == "[peer-b] my turn"
    # the bound (5 s) + the busy holder's hold (its load paid, at least 10 s) + a load and a reconcile or two
    assert took < 40, f"peer-b waited {took:.1f}s"
    assert "Parked" not in states[2:], f"peer-b's demand lapsed while it waited: {states}"
    assert set(answered) == {200}, "peer-a's clients were all answered too (they waited for the swap back)"


CARD = """
apiVersion: ai.flexinfer/v1alpha1
kind: GPUGroup
metadata: {name: card}
spec:
  capacity: {devices: 1, memoryPerDevice: 24Gi}
"""


def card_model(name: str, memory: str) -> str:
    return f"""---
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {{name: {name}}}
spec:
  gpu: {{shared: card, priority: 10, memory: {memory}}}
  local: {{command: ["flexinfer-fake-model", "--port", "{{port}}", "--model", "{name}"]}}
"""


def test_models_that_fit_on_the_card_serve_side_by_side_and_a_third_evicts_only_what_it_must(
    up: Up, tmp_path: Path
) -> None:
    """A GPUGroup with a capacity (24 GiB) and models with declared sizes: chat (6 GiB) and code (5 GiB) fit and
    stay loaded together (no swap, both processes alive); big (16 GiB) does not fit beside both, so the one idle
    longest goes and the other keeps serving."""
    manifest = tmp_path / "card.yaml"
    manifest.write_text(CARD + card_model("chat", "6Gi") + card_model("code", "5Gi") + card_model("big", "16Gi"))
    up.cli("apply", "-f", str(manifest))

    def processes() -> list[str]:
        items = httpx.get(up.url("actuator") + "/api/v1/processes", headers=up.auth(), timeout=5).json()["items"]
        return sorted(p["name"] for p in items if p["name"] in ("chat", "code", "big"))

    def group() -> dict[str, Any]:
        answer = httpx.get(up.url("scheduler") + "/api/v1/groups/card", headers=up.auth(), timeout=5)
        return answer.json()  # type: ignore[no-any-return]

    for name in ("chat", "code", "chat", "code"):
        response = up.chat(name, "hi")
        assert response.status_code == 200, response.text
    assert processes() == ["chat", "code"]
    view = group()
    assert {m["name"] for m in view["residentModels"]} == {"chat", "code"}
    assert view["devices"][0]["usedBytes"] == 11 << 30 and view["devices"][0]["freeBytes"] == 13 << 30

    def code_asked_last() -> bool:
        """Ask code again until the scheduler has heard that it was asked after chat: a proxy reports a model's
        activity at most once a second (FLEXINFER_ACTIVITY_REPORT_INTERVAL), and these requests take milliseconds."""
        assert up.chat("code", "keep me").status_code == 200
        last = {name: m["status"].get("lastActiveTime") for name, m in models(up).items()}
        return datetime.fromisoformat(last["code"]) > datetime.fromisoformat(last["chat"])

    wait_until(code_asked_last, 30, "the scheduler to see code asked after chat")  # chat is the one idle longest
    response = up.chat("big", "room please", timeout=90)
    assert response.status_code == 200, response.text
    wait_until(lambda: processes() == ["big", "code"], 30, "chat evicted, code kept")
    assert up.chat("code", "still here").headers.get("X-FlexInfer-Cold-Start") != "true"
    state = models(up)
    assert state["chat"]["status"]["phase"] == "Preempted" and state["chat"]["status"]["preemptedBy"] == "big"
    assert state["code"]["status"]["memory"] == {"bytes": 5 << 30, "source": "declared"}
    assert state["code"]["status"]["placement"] == {"devices": [0]} and "placement" not in state["chat"]["status"]
    view = group()
    assert view["devices"][0]["usedBytes"] == 21 << 30
    swaps = [line for line in up.cli("get", "swaps").splitlines() if "default/big" in line]
    assert len(swaps) == 1 and "default/chat" in swaps[0], "the eviction is in the swap history"
