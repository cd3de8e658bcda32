"""The ``flexinfer`` command (CONTRACT section 7). Each command is a thin shell over a module that does the work:
``up`` -> :mod:`flexinfer_cli.up`, ``apply`` -> :mod:`flexinfer_cli.apply`, ``get`` -> :mod:`flexinfer_cli.tables`,
``demand`` -> :mod:`flexinfer_cli.demand`; HTTP goes through :mod:`flexinfer_cli.client`.

Exit codes: 0 done, 1 the operation failed (an API error, a service not reachable, ``up`` could not start),
2 bad input (a usage error, a bad manifest or setting).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
from collections.abc import Awaitable, Callable, Coroutine
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, NoReturn, TypeVar
from urllib.parse import quote

import typer

from flexinfer_cli.client import AdminClient, CliError
from flexinfer_cli.config import (
    ConfigError,
    ModelRef,
    Service,
    admin_token,
    default_namespace,
    nats_url,
    parse_model_ref,
    service_url,
)

T = TypeVar("T")

app = typer.Typer(
    name="flexinfer",
    help="FlexInfer: time-share a GPU across inference models.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)
lease_app = typer.Typer(help="Hold a shared GPU for other work (GPU leases).", no_args_is_help=True)
app.add_typer(lease_app, name="lease")


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"


SchedulerUrl = Annotated[
    str | None,
    typer.Option(
        "--scheduler-url",
        envvar=Service.SCHEDULER.url_variable,
        help="Scheduler admin API (default: http://127.0.0.1:$FLEXINFER_SCHEDULER_PORT or 8081)",
        show_default=False,
    ),
]
ProxyUrl = Annotated[
    str | None,
    typer.Option(
        "--proxy-url",
        envvar=Service.PROXY.url_variable,
        help="Proxy (default: http://127.0.0.1:$FLEXINFER_PROXY_PORT or 8080)",
        show_default=False,
    ),
]
LeaseManagerUrl = Annotated[
    str | None,
    typer.Option(
        "--lease-manager-url",
        envvar=Service.LEASE_MANAGER.url_variable,
        help="Lease manager API (default: http://127.0.0.1:$FLEXINFER_LEASE_MANAGER_PORT or 8082)",
        show_default=False,
    ),
]
Output = Annotated[OutputFormat, typer.Option("-o", "--output", help="Output format.")]
Files = Annotated[
    list[str],
    typer.Option(
        "-f", "--file", "--filename", metavar="FILE", help="YAML file of manifests (repeatable; '-' reads stdin)."
    ),
]


def fail(message: str, code: int = 1) -> NoReturn:
    typer.echo(f"error: {message}", err=True)
    raise typer.Exit(code)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run one command's coroutine; print a CliError readably and exit with its code."""
    try:
        return asyncio.run(coro)
    except CliError as exc:
        fail(str(exc), exc.exit_code)


def resolve_url(service: Service, flag: str | None) -> str:
    try:
        return service_url(service, flag)
    except ConfigError as exc:
        fail(str(exc), 2)


def model_argument(value: str) -> ModelRef:
    try:
        return parse_model_ref(value, default_namespace=default_namespace())
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


async def call(service: Service, url: str, action: Callable[[AdminClient], Awaitable[T]]) -> T:
    async with AdminClient(service, url, token=admin_token()) as client:
        return await action(client)


def print_json(payload: Any) -> None:
    typer.echo(json.dumps(payload, indent=2, sort_keys=False))


# -- up ----------------------------------------------------------------------------------------------------


@app.command()
def up(
    file: Files = [],  # noqa: B006 - typer reads the default, never mutates it
    state_dir: Annotated[
        Path,
        typer.Option("--state-dir", envvar="FLEXINFER_STATE_DIR", help="Where embedded NATS and Postgres keep data."),
    ] = Path(".flexinfer"),
    ready_timeout: Annotated[
        float, typer.Option("--ready-timeout", help="Seconds to wait for every service to be ready.")
    ] = 60.0,
    kubeconfig: Annotated[
        Path | None,
        typer.Option(
            "--kubeconfig",
            exists=True,
            dir_okay=False,
            help="Kubernetes mode: run the control plane here against the cluster of this kubeconfig "
            "(models are the cluster's Model resources and run as its Deployments).",
        ),
    ] = None,
    context: Annotated[
        str, typer.Option("--context", help="With --kubeconfig: a context other than the current.")
    ] = "",
) -> None:
    """Run the whole system on this machine: NATS, Postgres, the services and the models in FILE.

    Uses FLEXINFER_NATS_URL / FLEXINFER_DATABASE_URL when set, else embedded servers in --state-dir.
    With --kubeconfig the actuator drives that cluster instead of local processes.
    Ctrl-C stops everything it started (twice: kill at once).
    """
    from flexinfer_cli.up import UpOptions, run_up
    from flexinfer_common.logs import configure_logging

    level = os.environ.get("FLEXINFER_LOG_LEVEL", "INFO").upper()
    configure_logging("flexinfer-up", level if level in {"DEBUG", "INFO", "WARNING", "ERROR"} else "INFO")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line per plugin otherwise
    options = UpOptions(
        files=file, state_dir=state_dir, ready_timeout=ready_timeout, kubeconfig=kubeconfig, kube_context=context
    )
    code = run(run_up(options))
    raise typer.Exit(code)


# -- apply -------------------------------------------------------------------------------------------------


@app.command()
def apply(file: Files, scheduler_url: SchedulerUrl = None, lease_manager_url: LeaseManagerUrl = None) -> None:
    """Create or update the resources in FILE (Model, GPUGroup, GPULease) through the admin APIs."""
    from flexinfer_cli.apply import ApiCall, execute_plan, plan_apply, read_manifests

    if not file:
        fail("give the manifests with -f FILE", 2)
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
        async with contextlib.AsyncExitStack() as stack:
            clients = {
                service: await stack.enter_async_context(AdminClient(service, urls[service], token=admin_token()))
                for service in needed
            }
            await execute_plan(plan, clients, echo=typer.echo, warn=lambda line: typer.echo(line, err=True))

    run(go())


# -- get ---------------------------------------------------------------------------------------------------


@app.command()
def get(
    kind: Annotated[
        str, typer.Argument(metavar="KIND", help="models | groups | leases | queues | swaps", show_default=False)
    ],
    output: Output = OutputFormat.TABLE,
    scheduler_url: SchedulerUrl = None,
    proxy_url: ProxyUrl = None,
    lease_manager_url: LeaseManagerUrl = None,
) -> None:
    """List models, groups, leases, queues or swaps."""
    from flexinfer_cli.tables import VIEWS, UnexpectedAnswer, parse_kind, render_kind

    try:
        parsed = parse_kind(kind)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="KIND") from None
    view = VIEWS[parsed]
    flags = {Service.SCHEDULER: scheduler_url, Service.PROXY: proxy_url, Service.LEASE_MANAGER: lease_manager_url}
    url = resolve_url(view.service, flags[view.service])
    payload = run(call(view.service, url, lambda client: client.get(view.path)))
    if output is OutputFormat.JSON:
        print_json(payload)
        return
    try:
        table = render_kind(parsed, payload)
    except UnexpectedAnswer as exc:
        fail(str(exc))
    if table is None:
        typer.echo(f"No {parsed.value} found.", err=True)
    else:
        typer.echo(table)


# -- promote -----------------------------------------------------------------------------------------------


@app.command()
def promote(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="NAME or NAMESPACE/NAME", show_default=False)],
    scheduler_url: SchedulerUrl = None,
) -> None:
    """Make MODEL the active model of its group now (a GPU lease still beats it)."""
    ref = model_argument(model)
    url = resolve_url(Service.SCHEDULER, scheduler_url)
    path = f"/api/v1/models/{quote(ref.namespace, safe='')}/{quote(ref.name, safe='')}/promote"
    run(call(Service.SCHEDULER, url, lambda client: client.post(path)))
    typer.echo(f"model/{ref} promoted")


# -- demand ------------------------------------------------------------------------------------------------


@app.command()
def demand(
    model: Annotated[str, typer.Argument(metavar="MODEL", help="NAME or NAMESPACE/NAME", show_default=False)],
    queued: Annotated[int, typer.Option("--queued", min=0, help="Requests waiting (0: activity only).")] = 1,
    source: Annotated[str, typer.Option("--source", help="Who signals (demand is counted per source).")] = (
        "flexinfer-cli"
    ),
    nats: Annotated[
        str | None,
        typer.Option(
            "--nats-url",
            envvar="FLEXINFER_NATS_URL",
            help="NATS server (default: nats://127.0.0.1:4222)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Signal demand for MODEL on NATS, as any external producer may."""
    from flexinfer_cli.demand import publish_demand

    ref = model_argument(model)
    subject = run(publish_demand(nats_url(nats), ref, queued=queued, source=source))
    typer.echo(f"demand for model/{ref} published on {subject} (queued={queued})")


# -- lease -------------------------------------------------------------------------------------------------

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


def _lease_run(coro: Coroutine[Any, Any, T]) -> T:
    from flexinfer_cli.lease import LeaseUsageError

    try:
        return asyncio.run(coro)
    except LeaseUsageError as exc:
        raise typer.BadParameter(str(exc).split(": ", 1)[-1], param_hint=str(exc).split(":", 1)[0]) from None
    except CliError as exc:
        fail(str(exc), exc.exit_code)


@lease_app.command("acquire")
def lease_acquire(
    group: Annotated[str, typer.Option("--group", help="The shared-GPU group to hold.", show_default=False)],
    owner: LeaseOwner = None,
    node: LeaseNode = None,
    ttl: LeaseTtl = None,
    name: LeaseName = None,
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
    from flexinfer_cli.lease import acquire, default_owner, lease_body, lease_line, parse_interval, parse_ttl

    def options() -> tuple[dict[str, Any], float | None]:
        ttl_seconds = parse_ttl(ttl) if ttl is not None else None
        body = lease_body(group=group, owner=owner or default_owner(), node=node, ttl_seconds=ttl_seconds, name=name)
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
    from flexinfer_cli.lease import lease_line, lease_path, parse_ttl

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
    from flexinfer_cli.lease import lease_path

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
    renew_every: Annotated[
        str | None, typer.Option("--renew-every", help="How often to renew (default: a quarter of the TTL).")
    ] = None,
    lease_manager_url: LeaseManagerUrl = None,
) -> None:
    """Hold a lease on GROUP for the life of COMMAND: wait until the group's models are parked, run COMMAND, renew
    the lease while it runs, release it however COMMAND ends. Exits with COMMAND's exit code."""
    from flexinfer_cli.lease import default_owner, lease_body, parse_interval, parse_ttl, run_with_lease

    async def go() -> int:
        ttl_seconds = parse_ttl(ttl)
        every = parse_interval(renew_every, "--renew-every") if renew_every is not None else ttl_seconds / 4
        body = lease_body(group=group, owner=owner or default_owner(), node=node, ttl_seconds=ttl_seconds, name=name)
        async with AdminClient(Service.LEASE_MANAGER, url, token=admin_token()) as client:
            return await run_with_lease(
                client, body, command, renew_every=every, echo=lambda line: typer.echo(f"flexinfer: {line}", err=True)
            )

    url = resolve_url(Service.LEASE_MANAGER, lease_manager_url)
    raise typer.Exit(_lease_run(go()))


@app.command()
def simulate(
    trace: Annotated[Path, typer.Argument(metavar="TRACE", help="A JSONL request trace.", show_default=False)],
    policy: Annotated[
        list[str] | None,
        typer.Option("--policy", "-p", help="seed | flexinfer | v1alpha1 | offline (repeat it; default: all)."),
    ] = None,
    svg: Annotated[
        Path | None, typer.Option("--svg", help="Write the timeline picture (which model holds the GPU, queues).")
    ] = None,
    queue_timeout: Annotated[str, typer.Option("--queue-timeout", help="FLEXINFER_QUEUE_TIMEOUT.")] = "5m",
    queue_max: Annotated[int, typer.Option("--queue-max", min=1, help="FLEXINFER_QUEUE_MAX.")] = 256,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Replay a request trace through the real election and swap code on a virtual clock, once per policy, and
    compare swaps, GPU time, queue waits, 429/504 answers and the longest wait (see docs/simulate.md)."""
    from flexinfer_cli.simulate import ALL_POLICIES, Settings, TraceError, as_json, load_trace, render_svg, render_table
    from flexinfer_common.durations import parse_duration

    chosen = policy or list(ALL_POLICIES)
    unknown = [p for p in chosen if p not in ALL_POLICIES]
    if unknown:
        fail(f"unknown policy {', '.join(unknown)} (known: {', '.join(ALL_POLICIES)})", 2)
    try:
        timeout = parse_duration(queue_timeout).total_seconds()
        data = load_trace(trace)
    except (TraceError, ValueError) as exc:
        fail(str(exc), 2)
    except OSError as exc:
        fail(f"cannot read {trace}: {exc.strerror or exc}", 2)
    from flexinfer_cli.simulate import simulate as run_simulation

    comparison = run_simulation(data, chosen, Settings(queue_timeout=timeout, queue_max=queue_max))
    if output is OutputFormat.JSON:
        print_json(as_json(comparison))
    else:
        typer.echo(render_table(comparison))
    if svg is not None:
        svg.write_text(render_svg(comparison))
        if output is not OutputFormat.JSON:
            typer.echo(f"timeline written to {svg}")


def main() -> None:
    app()
