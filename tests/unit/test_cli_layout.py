"""The CLI package's layout rule (``flexinfer_cli/__init__.py``): Typer only in ``cli.py``, ``main.py`` and
``commands/``; the heavy work of a command loaded only when that command runs."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import flexinfer_cli
from flexinfer_cli.commands import COMMANDS

PACKAGE = Path(flexinfer_cli.__file__).parent
SURFACE = {"cli.py", "main.py"}


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda path: path.name)
def test_the_work_never_imports_typer(path: Path) -> None:
    if path.name in SURFACE:
        return
    assert not {name for name in imported(path) if name.split(".")[0] == "typer"}


def test_every_command_module_is_registered() -> None:
    modules = {path.stem for path in (PACKAGE / "commands").glob("*.py")} - {"__init__"}
    assert modules == set(COMMANDS)


def test_the_heavy_work_is_not_loaded_by_help() -> None:
    """``flexinfer --help`` and shell completion import every command; the planner, the supervisor, the embedded
    servers and NATS wait until the command that needs them runs."""
    heavy = ["flexinfer_cli.simulation", "flexinfer_cli.local_system", "flexinfer_cli.gpu_lease"]
    heavy += ["flexinfer_cli.demand_signal", "flexinfer_cli.embedded", "flexinfer_cli.supervisor"]
    code = f"import sys, flexinfer_cli.main; print([m for m in {heavy!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    assert out.strip() == "[]"
