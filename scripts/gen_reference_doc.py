"""Generate the tables of docs/reference.md from the code (``--check`` fails if they are stale).

The reference is written by hand except between ``<!-- BEGIN GENERATED: <name> -->`` and
``<!-- END GENERATED: <name> -->``, which this script rewrites:

- ``settings``: every ``FLEXINFER_*`` setting, from the pydantic settings classes (the shared ones in
  ``flexinfer_common.settings`` and each service's ``settings.py``): its variable, default and description. A
  setting's description is its ``Field(description=...)``, else the docstring under it, else the comment above it;
  a setting with none of these stops the script, so every new setting is documented where it is defined.
- ``metrics``: every Prometheus metric, from the metrics module of each service and the shared one: its name as
  scraped, type, labels, help text and the process that exports it.
- ``cli``: every ``flexinfer`` command with its arguments and options, from the Typer app.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Iterator
from datetime import timedelta
from enum import Enum
from pathlib import Path
from types import ModuleType
from typing import Any

import typer
from generated_file import write_or_check
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

import flexinfer_actuator.metrics
import flexinfer_common.metrics
import flexinfer_lease_manager.metrics
import flexinfer_proxy.metrics
import flexinfer_scheduler.metrics
from flexinfer_actuator.settings import ActuatorSettings
from flexinfer_cli.main import app
from flexinfer_cli.settings import UpSettings
from flexinfer_common.durations import format_duration
from flexinfer_common.settings import ENV_PREFIX, CommonSettings, KubernetesSettings
from flexinfer_lease_manager.settings import LeaseManagerSettings
from flexinfer_proxy.settings import ProxySettings
from flexinfer_scheduler.settings import SchedulerSettings

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "reference.md"

# Each settings class and who reads it; a class lists only the settings it defines itself.
SETTINGS: tuple[tuple[type[BaseSettings], str], ...] = (
    (CommonSettings, "every service and `flexinfer up`"),
    (KubernetesSettings, "the actuator and the lease manager (their Kubernetes mode)"),
    (ProxySettings, "the proxy"),
    (SchedulerSettings, "the scheduler"),
    (ActuatorSettings, "the actuator"),
    (LeaseManagerSettings, "the lease manager"),
    (UpSettings, "`flexinfer up`"),
)

# Each metrics module and the process that exports its metrics.
METRICS: tuple[tuple[ModuleType, str], ...] = (
    (flexinfer_common.metrics, "every service"),
    (flexinfer_proxy.metrics, "proxy"),
    (flexinfer_scheduler.metrics, "scheduler"),
    (flexinfer_actuator.metrics, "actuator"),
    (flexinfer_lease_manager.metrics, "lease manager"),
)


# ---- settings


def _field_docs(cls: type) -> dict[str, str]:
    """For each field the class itself defines: the docstring under it, else the comment lines just above it."""
    source = textwrap.dedent(inspect.getsource(cls))
    lines = source.splitlines()
    body = ast.parse(source).body[0]
    assert isinstance(body, ast.ClassDef)
    docs: dict[str, str] = {}
    statements = body.body
    for index, node in enumerate(statements):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        following = statements[index + 1] if index + 1 < len(statements) else None
        if (
            isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = following.value.value
            continue
        comments: list[str] = []
        row = node.lineno - 2  # the line above, 0-based
        while row >= 0 and lines[row].strip().startswith("#"):
            comments.insert(0, lines[row].strip().lstrip("#").strip())
            row -= 1
        if comments:
            docs[node.target.id] = " ".join(comments)
    return docs


_NAME_PREFIX = re.compile(r"^``FLEXINFER_\w+``\s*(?:\((?P<note>[^)]*)\))?\s*:?\s*")
_NAME_ONLY = re.compile(r"^FLEXINFER_\w+\s*:\s*")


def _clean(text: str) -> str:
    """One table cell: the leading ``FLEXINFER_X``: dropped (the table names it), RST literals as Markdown."""
    text = " ".join(text.split())
    match = _NAME_PREFIX.match(text)
    if match:
        note = match.group("note")
        text = (f"({note}) " if note else "") + text[match.end() :]
    text = _NAME_ONLY.sub("", text)
    text = text.replace("``", "`").replace("|", "\\|")
    return text[:1].upper() + text[1:]


def _default(field: FieldInfo) -> str:
    value: Any = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, Enum):
        value = value.value
    if isinstance(value, timedelta):
        return f"`{format_duration(value)}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list):
        return f"`{','.join(str(v) for v in value)}`" if value else "empty"
    if isinstance(value, dict):
        return f"`{value}`".replace("'", '"').replace("|", "\\|") if value else "empty"
    if value == "":
        return "empty"
    return f"`{value}`"


def settings_table() -> str:
    parts: list[str] = []
    missing: list[str] = []
    for cls, readers in SETTINGS:
        docs = _field_docs(cls)
        own = [name for name in cls.__annotations__ if name in cls.model_fields]
        parts.append(f"\n**`{cls.__name__}`** (`{cls.__module__}`), read by {readers}:\n\n")
        parts.append("| variable | default | meaning |\n|---|---|---|\n")
        for name in own:
            field = cls.model_fields[name]
            text = field.description or docs.get(name, "")
            if not text:
                missing.append(f"{cls.__module__}.{cls.__name__}.{name}")
                continue
            parts.append(f"| `{ENV_PREFIX}{name.upper()}` | {_default(field)} | {_clean(text)} |\n")
    if missing:
        raise SystemExit(
            "settings without a description (give each a docstring under it, or Field(description=...)): "
            + ", ".join(missing)
        )
    return "".join(parts)


# ---- metrics


def _metrics_of(module: ModuleType) -> Iterator[tuple[str, str, tuple[str, ...], str]]:
    """(name as scraped, type, labels, help) of each metric the module defines (a prometheus_client metric, or one
    of the scheduler's own series kinds)."""
    for value in vars(module).values():
        if inspect.isclass(value) or not hasattr(value, "describe") or not hasattr(value, "_labelnames"):
            continue
        for family in value.describe():
            name = family.name + ("_total" if family.type == "counter" else "")
            yield name, family.type, tuple(value._labelnames), family.documentation


def metrics_table() -> str:
    rows = []
    for module, exporter in METRICS:
        for name, kind, labels, help_text in sorted(_metrics_of(module)):
            shown = ", ".join(f"`{label}`" for label in labels) or "—"
            rows.append(f"| `{name}` | {kind} | {shown} | {exporter} | {help_text.replace('|', chr(92) + '|')} |\n")
    return "\n| metric | type | labels | exported by | meaning |\n|---|---|---|---|---|\n" + "".join(rows)


# ---- command line


def _commands(group: Any, prefix: str) -> Iterator[tuple[str, Any]]:
    """(``flexinfer get``, command) for each command under the group, sub-groups expanded. (Typer bundles its own
    click, so the commands are read by their attributes, not their classes.)"""
    context = type(group).context_class(group)
    for name in group.list_commands(context):
        command = group.get_command(context, name)
        if command is None or command.hidden:
            continue
        path = f"{prefix} {name}"
        if hasattr(command, "list_commands"):
            yield from _commands(command, path)
        else:
            yield path, command


def _param(param: Any) -> str:
    if param.param_type_name == "argument":
        if param.metavar:  # Typer's, brackets and all: ``[NAME]...``
            return f"`{param.metavar}`"
        shown = param.name.upper()
        return f"`{shown}`" if param.required else f"`[{shown}]`"
    return "/".join(f"`{opt}`" for opt in (*param.opts, *param.secondary_opts))


def cli_table() -> str:
    rows = []
    for path, command in _commands(typer.main.get_command(app), "flexinfer"):
        params = [p for p in command.params if p.name != "help" and not getattr(p, "hidden", False)]
        summary = (command.help or "").strip().split("\n\n")[0]
        summary = " ".join(summary.split()).replace("|", "\\|")
        shown = ", ".join(_param(p) for p in params) or "—"
        rows.append(f"| `{path}` | {shown} | {summary} |\n")
    return "\n| command | arguments and options | what it does |\n|---|---|---|\n" + "".join(rows)


# ---- the document

GENERATORS = {"settings": settings_table, "metrics": metrics_table, "cli": cli_table}


def render(text: str) -> str:
    for name, generate in GENERATORS.items():
        begin = f"<!-- BEGIN GENERATED: {name} (scripts/gen_reference_doc.py; do not edit by hand) -->"
        end = f"<!-- END GENERATED: {name} -->"
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise SystemExit(f"docs/reference.md has no region {begin!r} ... {end!r}")
        text = text[: start + len(begin)] + "\n" + generate() + "\n" + text[stop:]
    return text


def main() -> int:
    return write_or_check(OUT, render(OUT.read_text()))


if __name__ == "__main__":
    raise SystemExit(main())
