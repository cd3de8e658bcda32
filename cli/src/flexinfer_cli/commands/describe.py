"""``flexinfer describe model NAME``: spec, status, the model's group, its recent swaps and events;
``flexinfer describe group NAME``: the group's election and why, each member's reasoning, its recent swaps.
The pages are written by :mod:`flexinfer_cli.descriptions`."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

import typer

from flexinfer_cli.cli import (
    ExitCode,
    Namespace,
    NatsUrl,
    SchedulerUrl,
    app,
    fail,
    model_argument,
    resolve_url,
    run,
)
from flexinfer_cli.client import AdminClient, ApiError
from flexinfer_cli.completion import complete_kind, complete_name
from flexinfer_cli.config import Service, admin_token, nats_url
from flexinfer_cli.descriptions import Events, describe_group, describe_model
from flexinfer_cli.tables import VIEWS, Kind, UnexpectedAnswer, item_of, items_of, parse_kind
from flexinfer_common.admin_api import Group
from flexinfer_common.durations import parse_duration
from flexinfer_common.manifests import Model


@app.command()
def describe(
    kind: Annotated[
        str,
        typer.Argument(metavar="KIND", help="model or group (also model/NAME)", autocompletion=complete_kind),
    ],
    name: Annotated[
        str | None,
        typer.Argument(metavar="NAME", help="NAME or NAMESPACE/NAME", show_default=False, autocompletion=complete_name),
    ] = None,
    namespace: Namespace = None,
    events_since: Annotated[
        str, typer.Option("--events-since", help="Show the events of this last stretch of time (the bus keeps 24h).")
    ] = "1h",
    no_events: Annotated[bool, typer.Option("--no-events", help="Do not read events from NATS.")] = False,
    scheduler_url: SchedulerUrl = None,
    nats: NatsUrl = None,
) -> None:
    """Show one model (its spec and status, its group, its recent swaps and events, read from NATS) or one group
    (its scheduling policy, the election's leader and reason, and why each member holds the GPU or waits)."""
    text, slash, rest = kind.partition("/")
    try:
        parsed = parse_kind(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="KIND") from None
    if parsed not in (Kind.MODELS, Kind.GROUPS):
        raise typer.BadParameter(
            f"describe shows models and groups (not {parsed.value}): try `flexinfer get {parsed.value}`"
        )
    given = rest if slash else name
    if parsed is Kind.GROUPS:
        if not given or (slash and name):
            raise typer.BadParameter("give the group as NAME or group/NAME", param_hint="NAME")
        try:
            typer.echo(run(_describe_group(given, resolve_url(Service.SCHEDULER, scheduler_url))))
        except UnexpectedAnswer as exc:
            fail(str(exc))
        return
    if not given or (slash and name):
        raise typer.BadParameter("give the model as NAME, NAMESPACE/NAME or model/NAME", param_hint="NAME")
    ref = model_argument(given, namespace)
    try:
        since = parse_duration(events_since)
    except ValueError as exc:
        fail(f"--events-since: {exc}", ExitCode.USAGE)
    url = resolve_url(Service.SCHEDULER, scheduler_url)
    get_path = VIEWS[Kind.MODELS].get_path

    async def go() -> str:
        now = datetime.now(UTC)
        async with AdminClient(Service.SCHEDULER, url, token=admin_token()) as client:
            try:
                model: Model = item_of(Kind.MODELS, await client.get(get_path(ref.namespace, ref.name)))
            except ApiError as exc:
                if exc.status == 404:
                    fail(f'model "{ref.name}" not found in namespace {ref.namespace}')
                raise
            group = None
            if model.spec.gpu.shared:
                try:
                    group = Group.model_validate(await client.get(f"/api/v1/groups/{model.spec.gpu.shared}"))
                except ApiError as exc:
                    if exc.status != 404:
                        raise
            swaps = items_of(Kind.SWAPS, await client.get("/api/v1/swaps?limit=200"))
        events = Events()
        if no_events:
            events = Events(unavailable="not read (--no-events)")
        elif model.spec.gpu.shared:
            from flexinfer_cli.events import recent_events

            events = await recent_events(
                nats_url(nats), group=model.spec.gpu.shared, model=str(ref), now=now, since=since
            )
        return describe_model(model, group=group, swaps=swaps, events=events, now=datetime.now(UTC))

    try:
        typer.echo(run(go()))
    except UnexpectedAnswer as exc:
        fail(str(exc))


async def _describe_group(name: str, url: str) -> str:
    async with AdminClient(Service.SCHEDULER, url, token=admin_token()) as client:
        try:
            group = Group.model_validate(await client.get(f"/api/v1/groups/{name}"))
        except ApiError as exc:
            if exc.status == 404:
                fail(f'group "{name}" not found')
            raise
        swaps = items_of(Kind.SWAPS, await client.get("/api/v1/swaps?limit=200"))
    return describe_group(group, swaps=swaps, now=datetime.now(UTC))
