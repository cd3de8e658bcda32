"""The environment of a `flexinfer up` a test runs as a user would: free loopback ports, its own state folder (where
the CLI also finds the admin token), this venv's commands on PATH, and no FLEXINFER_* setting of the caller."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from flexinfer_cli.embedded import free_port
from tests.support.run_as import suite_run_as

BIN = Path(sys.executable).parent


def up_environment(state_dir: Path, **settings: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXINFER_")}
    for service in ("PROXY", "SCHEDULER", "LEASE_MANAGER", "ACTUATOR"):
        env[f"FLEXINFER_{service}_PORT"] = str(free_port())
    env["FLEXINFER_STATE_DIR"] = str(state_dir)
    env["PATH"] = f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"
    env.update(suite_run_as())
    env.update(settings)
    return env


def wait_until(
    predicate: Any, timeout: float, what: str, *, ignoring: tuple[type[Exception], ...] = (httpx.HTTPError,)
) -> Any:
    """Poll ``predicate`` every 0.1 s until it returns something truthy, and return that; an exception of
    ``ignoring`` (a service not answering yet) counts as not yet."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except ignoring:
            pass
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def start_up(manifest: Path, env: dict[str, str], log: Path, *options: str) -> subprocess.Popen[bytes]:
    """``flexinfer up -f manifest *options`` with its output in ``log``, in a session of its own (so that
    ``stop_up`` can kill what it started if it does not stop)."""
    with log.open("wb") as out:
        return subprocess.Popen(
            [str(BIN / "flexinfer"), "up", "-f", str(manifest), *options],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def until_up(process: subprocess.Popen[bytes], log: Path, *, within: float = 120.0) -> None:
    """Until ``up`` printed its banner (every service ready, the manifest applied); fails when it exits instead."""
    deadline = time.monotonic() + within
    while "Watch the models" not in log.read_text(errors="replace"):
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, f"flexinfer up printed no banner within {within} s"
        time.sleep(0.1)
    assert process.poll() is None, log.read_text(errors="replace")[-3000:]


def exported_nats_url(log: Path) -> str | None:
    """The NATS URL the banner says to export (none when ``up`` uses the default one)."""
    for line in log.read_text(errors="replace").splitlines():
        if "export FLEXINFER_NATS_URL=" in line:
            return line.split("=", 1)[1].strip()
    return None


def stop_up(process: subprocess.Popen[bytes], *, within: float = 30.0) -> None:
    """Ctrl-C, as a user stops ``up``; when it has not ended within ``within`` seconds, its whole session killed."""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=within)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
