"""The environment of a `flexinfer up` a test runs as a user would: free loopback ports, its own state folder (where
the CLI also finds the admin token), this venv's commands on PATH, and no FLEXINFER_* setting of the caller."""

from __future__ import annotations

import os
import sys
from pathlib import Path

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
