"""End to end in front of real inference servers: `flexinfer up` with two llama.cpp servers (llama-cpp-python's
OpenAI server on SmolLM2-135M-Instruct: one chat model, and the same weights in embedding mode under another name)
time-sharing one group, plus a Model whose weights do not exist, checked through the proxy with the `openai` SDK.

The engine and the weights are installed by scripts/install_real_servers.py into ~/.cache/flexinfer (built once per
machine, minutes on 2 cores; found in seconds afterwards). A failed build fails this module with the build log's tail:
the suite never skips the real servers. A process sampler watches the process table the whole time: two engines of
the group are never alive at once."""

from __future__ import annotations

import concurrent.futures
import getpass
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from flexinfer_testbed.real_servers import (
    EMBEDDING_DIMENSIONS,
    InstallFailed,
    ProcessSampler,
    RealServers,
    install_real_servers,
    llama_model,
)
from tests.support import up as up_support
from tests.support.figures import figures as figures_of
from tests.support.up import start_up, stop_up, until_up, up_environment

# The first test of the module pays for the installer: on a fresh machine, a build of minutes. Every wait inside a
# test has its own, much shorter, deadline.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(3600)]

BIN = Path(sys.executable).parent
GROUP = "real-cpu"
CHAT, EMBED, BROKEN = "smollm", "smollm-embed", "smollm-broken"
MISSING_WEIGHTS = "/nonexistent/flexinfer-test/missing.gguf"
DEMAND_WINDOW = 1.0  # seconds: a model idle this long may be swapped out
FIGURES = "real inference servers"  # the section of the run's summary with what these tests measured


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    env: dict[str, str]
    log: Path
    sampler: ProcessSampler
    figures: list[str]

    def url(self, service: str) -> str:
        return f"http://127.0.0.1:{self.env[f'FLEXINFER_{service.upper()}_PORT']}"

    def client(self, timeout: float = 60) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url("proxy") + "/v1", api_key="unused", max_retries=0, timeout=timeout)

    def auth(self) -> dict[str, str]:
        token = (Path(self.env["FLEXINFER_STATE_DIR"]) / "admin-token").read_text().strip()
        return {"Authorization": f"Bearer {token}"}

    def models(self) -> dict[str, dict[str, Any]]:
        done = subprocess.run(
            [str(BIN / "flexinfer"), "get", "models", "-o", "json"],
            env=self.env,
            capture_output=True,
            timeout=30,
            check=True,
        )
        return {m["metadata"]["name"]: m for m in json.loads(done.stdout)["items"]}

    def pid_of(self, name: str) -> int:
        items = httpx.get(self.url("actuator") + "/api/v1/processes", headers=self.auth(), timeout=5).json()["items"]
        (pid,) = [p["pid"] for p in items if p["name"] == name]
        return int(pid)

    def note(self, line: str) -> None:
        print(line)
        self.figures.append(line)


def wait_until(predicate: Any, timeout: float, what: str) -> Any:
    """``up.wait_until``, counting a CLI that failed or printed no model yet as not yet too."""
    not_yet = (httpx.HTTPError, subprocess.CalledProcessError, KeyError, ValueError)
    return up_support.wait_until(predicate, timeout, what, ignoring=not_yet)


@pytest.fixture(scope="module")
def real(request: pytest.FixtureRequest) -> RealServers:
    try:
        servers = install_real_servers()
    except InstallFailed as exc:
        pytest.fail(f"the real inference servers could not be installed:\n{exc}", pytrace=False)
    figures = figures_of(request.config, FIGURES)
    figures.append(f"real servers installed or found in {servers.seconds:.1f} s {servers.timings or ''}".rstrip())
    return servers


@pytest.fixture(scope="module")
def up(real: RealServers, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[Up]:
    work = tmp_path_factory.mktemp("real-servers")
    manifests = work / "models.yaml"
    manifests.write_text(
        yaml.safe_dump_all(
            [
                llama_model(real, CHAT, group=GROUP),
                llama_model(real, EMBED, group=GROUP, embedding=True),
                # Its own group, so its failure does not stand in the way of the two others.
                llama_model(real, BROKEN, group="real-broken", model=Path(MISSING_WEIGHTS)),
            ]
        )
    )
    state = work / "state"
    env = up_environment(
        state,
        FLEXINFER_LOCAL_COMMANDS=str(real.server),
        # The engine and the weights live in this user's cache: the model processes run as this user.
        FLEXINFER_LOCAL_RUN_AS=getpass.getuser(),
        FLEXINFER_RECONCILE_INTERVAL="300ms",
        FLEXINFER_READINESS_PROBE_INTERVAL="50ms",
        FLEXINFER_DEMAND_REFRESH_INTERVAL="500ms",
        FLEXINFER_SHARED_DEMAND_WINDOW=f"{DEMAND_WINDOW:g}s",
        FLEXINFER_RESTART_BACKOFF="1s",
        FLEXINFER_LOAD_TIMEOUT="60s",
    )
    log = work / "up.log"
    process = start_up(manifests, env, log, "--state-dir", str(state))
    sampler = ProcessSampler(process.pid, frozenset({CHAT, EMBED})).start()
    handle = Up(process, env, log, sampler, figures_of(request.config, FIGURES))
    try:
        until_up(process, log)
        yield handle
    finally:
        stop_up(process)
        sampler.stop()


def ask(up: Up, model: str, text: str = "What is the capital of France?", max_tokens: int = 24) -> tuple[str, float]:
    """A chat completion through the proxy: its text and how long the client waited."""
    started = time.monotonic()
    answer = up.client().chat.completions.create(
        model=model, messages=[{"role": "user", "content": text}], max_tokens=max_tokens, temperature=0
    )
    return answer.choices[0].message.content or "", time.monotonic() - started


def embed(up: Up, texts: list[str]) -> tuple[list[list[float]], float]:
    started = time.monotonic()
    response = up.client().embeddings.create(model=EMBED, input=texts)
    return [item.embedding for item in response.data], time.monotonic() - started


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / (math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b)))


def idle_for_the_demand_window() -> None:
    """The active model may be swapped out once it has had no request for the demand window (a duration of the
    policy, not a guess at how long something takes)."""
    time.sleep(DEMAND_WINDOW + 0.2)


def active(up: Up) -> str:
    state = up.models()
    (name,) = [n for n in (CHAT, EMBED) if state[n]["status"].get("sharedGroup", {}).get("state") == "Active"]
    return name


def test_the_chat_model_answers_a_real_question(up: Up) -> None:
    text, took = ask(up, CHAT)
    up.note(f"chat answer in {took:.2f} s (a swap included if {CHAT} was not loaded): {text!r}")
    assert "paris" in text.lower(), text


def test_the_embedding_model_embeds_by_meaning(up: Up) -> None:
    vectors, took = embed(up, ["The capital of France is Paris.", "Paris is France's capital city.", "I like trains."])
    up.note(f"3 embeddings in {took:.2f} s (a swap included if {EMBED} was not loaded)")
    assert [len(v) for v in vectors] == [EMBEDDING_DIMENSIONS] * 3
    assert cosine(vectors[0], vectors[1]) > cosine(vectors[0], vectors[2])


def test_a_swap_each_way_answers_the_waiting_client(up: Up) -> None:
    ask(up, CHAT)  # the chat model holds the group
    assert active(up) == CHAT
    idle_for_the_demand_window()
    vectors, to_embed = embed(up, ["hello"])
    assert len(vectors[0]) == EMBEDDING_DIMENSIONS
    state = up.models()
    assert state[EMBED]["status"]["sharedGroup"]["state"] == "Active"
    assert state[CHAT]["status"]["phase"] in {"Preempted", "Parked", "Idle"}, state[CHAT]["status"]
    idle_for_the_demand_window()
    text, to_chat = ask(up, CHAT, "Say hello.", max_tokens=1)
    assert text.strip()
    assert active(up) == CHAT
    swaps = httpx.get(up.url("scheduler") + "/api/v1/swaps", headers=up.auth(), timeout=5).json()["items"]
    phases = {s["toModel"].split("/")[-1]: s["phases"] for s in swaps[:2]}
    up.note(
        f"client-seen swap wait: {CHAT} -> {EMBED} {to_embed:.2f} s, {EMBED} -> {CHAT} {to_chat:.2f} s "
        f"(the scheduler's phases: {json.dumps(phases)})"
    )
    assert to_embed < 30 and to_chat < 30


def test_a_stream_arrives_token_by_token(up: Up) -> None:
    ask(up, CHAT, "hi", max_tokens=1)  # loaded: what follows times the stream alone
    started = time.monotonic()
    arrivals, pieces = [], []
    stream = up.client().chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Tell me a short story about a cat."}],
        max_tokens=48,
        temperature=0,
        stream=True,
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - started)
            pieces.append(chunk.choices[0].delta.content)
    up.note(f"stream: {len(pieces)} chunks, first after {arrivals[0]:.2f} s, last after {arrivals[-1]:.2f} s")
    assert len(pieces) >= 10 and "".join(pieces).strip()
    # Incremental: the first chunk came well before the last, not all of them at once at the end.
    assert arrivals[-1] - arrivals[0] > 0.2 and arrivals[0] < arrivals[-1] / 2


def test_a_server_killed_mid_stream_ends_the_stream_and_comes_back(up: Up) -> None:
    ask(up, CHAT, "hi", max_tokens=1)
    pid = up.pid_of(CHAT)
    stream = up.client(timeout=30).chat.completions.create(
        model=CHAT,
        messages=[{"role": "user", "content": "Count from 1 to 1000, one number per line."}],
        max_tokens=1500,
        temperature=0,
        stream=True,
    )
    chunks = iter(stream)
    for _ in range(5):  # the stream is flowing
        next(chunks)
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)

    def drain() -> str:
        try:
            for _ in chunks:
                pass
        except (openai.APIError, httpx.HTTPError) as exc:
            return f"error: {type(exc).__name__}: {exc}"
        return "clean end"

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        try:
            outcome = pool.submit(drain).result(timeout=20)
        except concurrent.futures.TimeoutError:
            stream.close()
            pytest.fail("the stream hung for 20 s after its model server was SIGKILLed")
    up.note(f"killed mid-stream: the client saw '{outcome}' {time.monotonic() - killed_at:.2f} s after the SIGKILL")

    # The crash is logged with its reason; the scheduler restarts the model at once (its demand is recent), so the
    # Failed status lasts only until the new process starts: the log is where it stays.
    def crash_logged() -> dict[str, Any] | None:
        for line in up.log.read_text().splitlines():
            if '"model process exited unexpectedly"' in line and f'"pid": {pid},' in line:
                return dict(json.loads(line))
        return None

    crash = wait_until(crash_logged, 10, "the crash in the log of flexinfer up")
    assert "killed by signal 9 (SIGKILL) after it was Ready" in crash["reason"], crash
    text, took = ask(up, CHAT)
    up.note(f"after the crash, the next request was answered in {took:.2f} s (restart included)")
    assert text.strip()
    assert up.pid_of(CHAT) != pid


def test_a_server_that_cannot_start_is_reported_with_its_reason(up: Up) -> None:
    with pytest.raises(openai.APIStatusError) as raised:
        ask(up, BROKEN)
    error = raised.value
    assert error.status_code == 503
    body = error.response.json()["error"]
    assert body["code"] == "model_failed"
    assert "Model path does not exist" in body["message"] and MISSING_WEIGHTS in body["message"], body
    # The 503 may come from the failure of an earlier load (the group's fallback at start) while this request's
    # demand has the scheduler try once more: that try ends Failed with the same reason.
    status = wait_until(
        lambda: (s := up.models()[BROKEN]["status"])["phase"] == "Failed" and s, 60, "the broken model to be Failed"
    )
    assert MISSING_WEIGHTS in status["message"], status


def test_two_engines_of_the_group_are_never_alive_at_once(up: Up) -> None:
    for _ in range(2):  # a swap each way, even when this test runs alone
        idle_for_the_demand_window()
        embed(up, ["one more"])
        idle_for_the_demand_window()
        ask(up, CHAT, "hi", max_tokens=1)
    sampler = up.sampler
    names = sorted(set(sampler.seen.values()))
    up.note(f"process samples: {sampler.samples}, engine processes seen: {len(sampler.seen)} ({', '.join(names)})")
    assert names == sorted([CHAT, EMBED])
    assert sampler.samples > 100
    assert sampler.overlaps == [], sampler.overlaps[:5]
