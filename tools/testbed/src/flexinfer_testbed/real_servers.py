"""Real inference servers for the end-to-end suite and P9: llama-cpp-python's OpenAI server with SmolLM2-135M,
installed by scripts/install_real_servers.py into a cache outside the clone (see that script), and what a test needs
around them: the Model manifests that run it in local mode, and a sampler of the process table that proves two
engines of a group are never alive at once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[4]  # tools/testbed/src/flexinfer_testbed -> the repository
INSTALLER = ROOT / "scripts" / "install_real_servers.py"
#: llama-cpp-python's server has no /health; /v1/models answers once the model is loaded.
READINESS_PATH = "/v1/models"
#: A marker of the engine's command line (the launcher execs ``python -m llama_cpp.server``).
ENGINE_MARKER = b"llama_cpp.server"
#: SmolLM2-135M's hidden size: the length of its (mean-pooled) embeddings.
EMBEDDING_DIMENSIONS = 576


class InstallFailed(RuntimeError):
    """The installer failed: the message ends with the tail of its build log."""


@dataclass(frozen=True)
class RealServers:
    server: Path  # the llama-cpp-server launcher: the executable a Model's spec.local.command names
    model: Path  # the SmolLM2-135M-Instruct GGUF
    seconds: float  # how long finding (or building) them took
    timings: dict[str, float]


def install_real_servers(timeout: float = 3600) -> RealServers:
    """Install (or find in the cache) the engine and the weights; :class:`InstallFailed` with the log tail."""
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, str(INSTALLER)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        output = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        raise InstallFailed(f"{INSTALLER.name} did not finish within {timeout:g}s:\n{output[-6000:]}") from None
    if done.returncode != 0:
        raise InstallFailed(f"{INSTALLER.name} failed ({done.returncode}):\n{done.stderr[-6000:]}{done.stdout[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return RealServers(
        server=Path(report["server"]),
        model=Path(report["model"]),
        seconds=time.monotonic() - started,
        timings=report.get("timings", {}),
    )


def engine_command(servers: RealServers, name: str, *, model: Path | None = None, embedding: bool = False) -> list[str]:
    """The argv of one llama.cpp server for ``spec.local.command`` (``{port}`` filled in by the actuator)."""
    argv = [
        str(servers.server),
        "--model",
        str(model or servers.model),
        "--model_alias",
        name,
        "--host",
        "127.0.0.1",
        "--port",
        "{port}",
        "--n_ctx",
        "2048",
        "--n_threads",
        "2",
    ]
    if embedding:
        # SmolLM2's GGUF names no pooling (a chat model's): without one, llama.cpp returns a vector per token.
        # Mean pooling (1) gives one vector per input, as an embedding server does.
        argv += ["--embedding", "true", "--kv_overrides", "llama.pooling_type=int:1"]
    return argv


def llama_model(
    servers: RealServers,
    name: str,
    *,
    group: str,
    priority: int = 50,
    embedding: bool = False,
    model: Path | None = None,
    swap_cooldown: str = "0s",
) -> dict[str, Any]:
    """A Model manifest run by the real llama.cpp server in local mode.

    With the actuator's ``backend: llama-cpp`` preset for local mode, this becomes ``backend: llama-cpp`` and
    ``source: <the GGUF path>`` without ``spec.local.command`` and ``endpoint``; the executable then comes from the
    preset's setting instead of FLEXINFER_LOCAL_COMMANDS."""
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "backend": "llama-cpp",
            "source": str(model or servers.model),
            "gpu": {"shared": group, "priority": priority, "swapCooldown": swap_cooldown},
            "endpoint": {"readinessPath": READINESS_PATH},
            "local": {"command": engine_command(servers, name, model=model, embedding=embedding)},
        },
    }


def _parent_pids() -> dict[int, int]:
    """pid -> parent pid of every live (non-zombie) process."""
    out = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # exited meanwhile
        if fields[0] != b"Z":
            out[int(entry.name)] = int(fields[1])
    return out


def engine_processes(root_pid: int) -> dict[int, str]:
    """The live llama.cpp server processes descending from ``root_pid`` (e.g. a ``flexinfer up``): pid -> the
    model name it serves (its ``--model_alias``)."""
    parents = _parent_pids()
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found: dict[int, str] = {}
    todo = list(children.get(root_pid, []))
    while todo:
        pid = todo.pop()
        todo.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                argv = cmdline.read().split(b"\0")
        except OSError:
            continue
        if ENGINE_MARKER in argv and b"--model_alias" in argv[:-1]:
            found[pid] = argv[argv.index(b"--model_alias") + 1].decode()
    return found


@dataclass
class ProcessSampler:
    """Samples the process table in a thread: which engine processes of the models ``names`` (one group) under
    ``root_pid`` are alive at once."""

    root_pid: int
    names: frozenset[str]
    interval: float = 0.02
    samples: int = 0
    overlaps: list[dict[int, str]] = field(default_factory=list)  # every sample with two or more engines alive
    seen: dict[int, str] = field(default_factory=dict)  # every engine process ever seen
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> ProcessSampler:
        self._thread = threading.Thread(target=self._run, name="process-sampler", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            alive = {pid: name for pid, name in engine_processes(self.root_pid).items() if name in self.names}
            self.samples += 1
            self.seen.update(alive)
            if len(alive) > 1:
                self.overlaps.append(alive)
            self._stop.wait(self.interval)
