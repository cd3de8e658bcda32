"""``flexinfer apply -f FILE``: create or update resources through the admin APIs (the work is in
:mod:`flexinfer_cli.apply_plan`)."""

from __future__ import annotations

import typer

from flexinfer_cli.cli import ExitCode, Files, LeaseManagerUrl, SchedulerUrl, admin_clients, app, fail, resolve_url, run
from flexinfer_cli.client import CliError
from flexinfer_cli.config import Service, default_namespace


@app.command()
def apply(file: Files, scheduler_url: SchedulerUrl = None, lease_manager_url: LeaseManagerUrl = None) -> None:
    """Create or update the resources in FILE (Model, GPUGroup, GPULease) through the admin APIs."""
    from flexinfer_cli.apply_plan import ApiCall, execute_plan, plan_apply, read_manifests

    if not file:
        fail("give the manifests with -f FILE", ExitCode.USAGE)
    try:
        resources = read_manifests(file)
    except CliError as exc:
        fail(str(exc), exc.exit_code)
    plan = plan_apply(resources, default_namespace=default_namespace())
    needed = {step.service for step in plan if isinstance(step, ApiCall)}
    urls = {
        Service.SCHEDULER: resolve_url(Service.SCHEDULER, scheduler_url),
        Service.LEASE_MANAGER: resolve_url(Service.LEASE_MANAGER, lease_manager_url),
    }

    async def go() -> None:
        async with admin_clients(urls, needed) as clients:
            await execute_plan(plan, clients, echo=typer.echo, warn=lambda line: typer.echo(line, err=True))

    run(go())
