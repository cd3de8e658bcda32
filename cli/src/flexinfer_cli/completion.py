"""Shell completion of kinds and names (``flexinfer --install-completion`` sets it up for bash, zsh, fish or
PowerShell). Names come from the admin APIs with a short timeout; completion never prints an error, it offers
nothing instead."""

from __future__ import annotations

import asyncio
import contextlib

import click

from flexinfer_cli.client import AdminClient
from flexinfer_cli.config import admin_token, default_namespace, service_url
from flexinfer_cli.tables import VIEWS, Kind, items_of, parse_kind

COMPLETION_TIMEOUT = 2.0
KIND_WORDS = sorted({kind.value for kind in Kind} | {"model", "gpugroup", "gpulease"})
# What `flexinfer describe` and `flexinfer delete` take.
DESCRIBABLE = ("model", "group")
DELETABLE = ("model", "gpugroup", "gpulease")


def _words_for(ctx: click.Context) -> tuple[str, ...] | None:
    command = ctx.command.name
    return DESCRIBABLE if command == "describe" else DELETABLE if command == "delete" else None


def complete_kind(ctx: click.Context, incomplete: str) -> list[str]:
    words = _words_for(ctx)
    return [w for w in (words or KIND_WORDS) if w.startswith(incomplete.lower())]


async def _names(kind: Kind, namespace: str | None) -> list[str]:
    view = VIEWS[kind]
    url = service_url(view.service)
    async with AdminClient(view.service, url, token=admin_token(), timeout=COMPLETION_TIMEOUT) as client:
        items = items_of(kind, await client.get(view.path))
    return sorted(
        {
            view.name_of(item)
            for item in items
            if not view.namespaced or namespace is None or view.namespace_of(item) == namespace
        }
    )


def complete_name(ctx: click.Context, incomplete: str) -> list[str]:
    """The names of the KIND given before (in ``-n``'s namespace, or every one with ``-A``)."""
    raw = ctx.params.get("kind") or ""
    try:
        kind = parse_kind(str(raw).split("/", 1)[0])
    except ValueError:
        return []
    namespace = None if ctx.params.get("all_namespaces") else (ctx.params.get("namespace") or default_namespace())
    names: list[str] = []
    with contextlib.suppress(Exception):
        names = asyncio.run(asyncio.wait_for(_names(kind, namespace), COMPLETION_TIMEOUT + 0.5))
    return [name for name in names if name.startswith(incomplete)]


def complete_model(ctx: click.Context, incomplete: str) -> list[str]:
    """MODEL arguments (promote, demand): model names in ``-n``'s namespace."""
    namespace = ctx.params.get("namespace") or default_namespace()
    names: list[str] = []
    with contextlib.suppress(Exception):
        names = asyncio.run(asyncio.wait_for(_names(Kind.MODELS, namespace), COMPLETION_TIMEOUT + 0.5))
    return [name for name in names if name.startswith(incomplete)]
