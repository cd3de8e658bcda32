"""``flexinfer delete -f FILE`` / ``flexinfer delete KIND NAME...`` (the work is in
:mod:`flexinfer_cli.delete_plan`)."""

from __future__ import annotations

from typing import Annotated

import typer

from flexinfer_cli.apply_plan import read_manifests
from flexinfer_cli.cli import (
    ExitCode,
    Files,
    LeaseManagerUrl,
    Namespace,
    SchedulerUrl,
    admin_clients,
    app,
    fail,
    namespace_or_default,
    resolve_url,
    run,
)
from flexinfer_cli.client import CliError
from flexinfer_cli.completion import complete_kind, complete_name
from flexinfer_cli.config import Service, default_namespace
from flexinfer_cli.delete_plan import DeleteResult, NotDeletable, execute_deletes, plan_delete, plan_delete_resources
from flexinfer_cli.tables import parse_kind


@app.command()
def delete(
    kind: Annotated[
        str | None,
        typer.Argument(
            metavar="[KIND]", help="model | gpugroup | gpulease (also KIND/NAME)", autocompletion=complete_kind
        ),
    ] = None,
    names: Annotated[
        list[str] | None, typer.Argument(metavar="[NAME]...", show_default=False, autocompletion=complete_name)
    ] = None,
    file: Files = [],  # noqa: B006 - typer reads the default, never mutates it
    namespace: Namespace = None,
    ignore_not_found: Annotated[
        bool, typer.Option("--ignore-not-found", help="A resource that does not exist is not an error.")
    ] = False,
    scheduler_url: SchedulerUrl = None,
    lease_manager_url: LeaseManagerUrl = None,
) -> None:
    """Delete the resources of FILE, or KIND NAME...: models, GPUGroups, GPU leases (a released lease)."""
    if file and kind:
        fail("give -f FILE or KIND NAME, not both", ExitCode.USAGE)
    if file:
        try:
            resources = read_manifests(file)
        except CliError as exc:
            fail(str(exc), exc.exit_code)
        ns = namespace.strip() if namespace and namespace.strip() else default_namespace()
        steps = plan_delete_resources(resources, default_namespace=ns)
    elif kind:
        text, slash, name = kind.partition("/")
        wanted = [name] if slash and name else list(names or [])
        if not wanted or (slash and names):
            fail("give the NAME to delete (KIND NAME... or KIND/NAME)", ExitCode.USAGE)
        try:
            steps = plan_delete(parse_kind(text), wanted, namespace=namespace_or_default(namespace))
        except (ValueError, NotDeletable) as exc:
            fail(str(exc), ExitCode.USAGE)
    else:
        fail("give -f FILE or KIND NAME", ExitCode.USAGE)
    urls = {
        Service.SCHEDULER: resolve_url(Service.SCHEDULER, scheduler_url),
        Service.LEASE_MANAGER: resolve_url(Service.LEASE_MANAGER, lease_manager_url),
    }

    async def go() -> DeleteResult:
        async with admin_clients(urls, (step.service for step in steps)) as clients:
            return await execute_deletes(steps, clients, echo=typer.echo)

    result = run(go())
    if result.missing and not ignore_not_found:
        fail("; ".join(f"{resource} not found" for resource in result.missing))
