"""``flexinfer lease acquire|renew|release|run``: GPU leases through the lease manager's API (the work is in
:mod:`flexinfer_cli.gpu_lease`)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Annotated, Any, TypeVar
from urllib.parse import quote

import typer

from flexinfer_cli.cli import LeaseManagerUrl, Output, OutputFormat, app, call, fail, print_json, resolve_url, run
from flexinfer_cli.client import AdminClient, CliError
from flexinfer_cli.config import Service, admin_token

T = TypeVar("T")

lease_app = typer.Typer(help="Hold a shared GPU for other work (GPU leases).", no_args_is_help=True)
app.add_typer(lease_app, name="lease")

LeaseTtl = Annotated[
    str | None,
    typer.Option("--ttl", help="How long the lease holds without a renewal: 90s, 1h, or seconds (min 60)."),
]
LeaseOwner = Annotated[
    str | None,
    typer.Option(
        "--owner", help="Who holds it (shown as gpu-lease/<owner>); default: your user name.", show_default=False
    ),
]
LeaseName = Annotated[
    str | None, typer.Option("--name", help="The lease's name (default <owner>-gpu-lease).", show_default=False)
]
LeaseNode = Annotated[str | None, typer.Option("--node", help="The node the work runs on.", show_default=False)]
LeaseMemory = Annotated[
    str | None,
    typer.Option(
        "--memory",
        help="Free only this much on one device (4Gi, or bytes) in a group with a capacity; default: the whole group.",
        show_default=False,
    ),
]


def _lease_run(coro: Coroutine[Any, Any, T]) -> T:
    from flexinfer_cli.gpu_lease import LeaseUsageError

    try:
        return asyncio.run(coro)
    except LeaseUsageError as exc:
        raise typer.BadParameter(str(exc).split(": ", 1)[-1], param_hint=str(exc).split(":", 1)[0]) from None
    except CliError as exc:
        fail(str(exc), exc.exit_code)


def _lease_body(
    *, group: str, owner: str | None, node: str | None, ttl_seconds: int | None, name: str | None, memory: str | None
) -> dict[str, Any]:
    """The acquire body of the options: the login name when no --owner is given, --memory parsed."""
    from flexinfer_cli.gpu_lease import default_owner, lease_body, parse_memory_option

    return lease_body(
        group=group,
        owner=owner or default_owner(),
        node=node,
        ttl_seconds=ttl_seconds,
        name=name,
        memory=parse_memory_option(memory) if memory is not None else None,
    )


@lease_app.command("acquire")
def lease_acquire(
    group: Annotated[str, typer.Option("--group", help="The shared-GPU group to hold.", show_default=False)],
    owner: LeaseOwner = None,
    node: LeaseNode = None,
    ttl: LeaseTtl = None,
    name: LeaseName = None,
    memory: LeaseMemory = None,
    wait: Annotated[
        bool, typer.Option("--wait", help="Wait for the group to be free, then until its models are parked.")
    ] = False,
    timeout: Annotated[
        str | None, typer.Option("--timeout", help="With --wait: give up after this long (e.g. 10m).")
    ] = None,
    output: Output = OutputFormat.TABLE,
    lease_manager_url: LeaseManagerUrl = None,
) -> None:
    """Park the group's serving models until the lease is released or expires."""
    from flexinfer_cli.gpu_lease import (
        acquire,
        lease_line,
        parse_interval,
        parse_ttl,
    )

    def options() -> tuple[dict[str, Any], float | None]:
        ttl_seconds = parse_ttl(ttl) if ttl is not None else None
        body = _lease_body(group=group, owner=owner, node=node, ttl_seconds=ttl_seconds, name=name, memory=memory)
        return body, parse_interval(timeout, "--timeout") if timeout is not None else None

    async def go() -> Any:
        body, limit = options()
        async with AdminClient(Service.LEASE_MANAGER, url, token=admin_token()) as client:
            return await acquire(
                client, body, wait=wait, give_up_after=limit, echo=lambda line: typer.echo(line, err=True)
            )

    url = resolve_url(Service.LEASE_MANAGER, lease_manager_url)
    lease = _lease_run(go())
    if output is OutputFormat.JSON:
        print_json(lease)
    elif not wait:
        typer.echo(lease_line("acquired", lease))


@lease_app.command("renew")
def lease_renew(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The lease's name.", show_default=False)],
    ttl: LeaseTtl = None,
    owner: Annotated[str | None, typer.Option("--owner", help="Renew only if this owner holds it.")] = None,
    output: Output = OutputFormat.TABLE,
    lease_manager_url: LeaseManagerUrl = None,
) -> None:
    """Move the lease's expiry to now + its TTL (or a new --ttl)."""
    from flexinfer_cli.gpu_lease import lease_line, lease_path, parse_ttl

    async def go() -> Any:
        body: dict[str, Any] = {}
        if ttl is not None:
            body["ttlSeconds"] = parse_ttl(ttl)
        if owner is not None:
            body["owner"] = owner
        async with AdminClient(Service.LEASE_MANAGER, url, token=admin_token()) as client:
            return await client.post(lease_path(name, "/renew"), body)

    url = resolve_url(Service.LEASE_MANAGER, lease_manager_url)
    lease = _lease_run(go())
    if output is OutputFormat.JSON:
        print_json(lease)
    else:
        typer.echo(lease_line("renewed", lease) if lease is not None else f"gpulease/{name} renewed")


@lease_app.command("release")
def lease_release(
    name: Annotated[str, typer.Argument(metavar="NAME", help="The lease's name.", show_default=False)],
    owner: Annotated[str | None, typer.Option("--owner", help="Release only if this owner holds it.")] = None,
    lease_manager_url: LeaseManagerUrl = None,
) -> None:
    """Release a lease: the group's serving models may run again."""
    from flexinfer_cli.gpu_lease import lease_path

    url = resolve_url(Service.LEASE_MANAGER, lease_manager_url)
    path = lease_path(name) + (f"?owner={quote(owner, safe='')}" if owner is not None else "")
    run(call(Service.LEASE_MANAGER, url, lambda client: client.delete(path)))
    typer.echo(f"gpulease/{name} released")


@lease_app.command("run", context_settings={"allow_interspersed_args": False}, no_args_is_help=True)
def lease_run(
    command: Annotated[
        list[str], typer.Argument(metavar="-- COMMAND [ARGS]...", help="What to run while the lease holds.")
    ],
    group: Annotated[str, typer.Option("--group", help="The shared-GPU group to hold.", show_default=False)],
    owner: LeaseOwner = None,
    node: LeaseNode = None,
    ttl: Annotated[
        str,
        typer.Option("--ttl", help="The lease's TTL: if this wrapper is killed, serving is back this long after."),
    ] = "2m",
    name: LeaseName = None,
    memory: LeaseMemory = None,
    renew_every: Annotated[
        str | None, typer.Option("--renew-every", help="How often to renew (default: a quarter of the TTL).")
    ] = None,
    lease_manager_url: LeaseManagerUrl = None,
) -> None:
    """Hold a lease on GROUP for the life of COMMAND: wait until the group's models are parked, run COMMAND, renew
    the lease while it runs, release it however COMMAND ends. Exits with COMMAND's exit code. With --memory in a
    group with a capacity, only what must go to free that much on one device parks, and COMMAND runs with
    CUDA_VISIBLE_DEVICES set to that device."""
    from flexinfer_cli.gpu_lease import (
        parse_interval,
        parse_ttl,
        run_with_lease,
    )

    async def go() -> int:
        ttl_seconds = parse_ttl(ttl)
        every = parse_interval(renew_every, "--renew-every") if renew_every is not None else ttl_seconds / 4
        body = _lease_body(group=group, owner=owner, node=node, ttl_seconds=ttl_seconds, name=name, memory=memory)
        async with AdminClient(Service.LEASE_MANAGER, url, token=admin_token()) as client:
            return await run_with_lease(
                client, body, command, renew_every=every, echo=lambda line: typer.echo(f"flexinfer: {line}", err=True)
            )

    url = resolve_url(Service.LEASE_MANAGER, lease_manager_url)
    raise typer.Exit(_lease_run(go()))
