"""``flexinfer get KIND [NAME]...``: tables (the seed's columns), ``-o wide|json|yaml|name``, ``-n``/``-A``,
``--watch``."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Annotated, Any

import typer
from pydantic import ValidationError

from flexinfer_cli.cli import (
    AllNamespaces,
    ExitCode,
    LeaseManagerUrl,
    Namespace,
    Output,
    OutputFormat,
    ProxyUrl,
    SchedulerUrl,
    app,
    call,
    fail,
    namespace_or_default,
    print_json,
    print_yaml,
    resolve_url,
    run,
)
from flexinfer_cli.client import CliError
from flexinfer_cli.completion import complete_kind, complete_name
from flexinfer_cli.config import Service
from flexinfer_cli.tables import (
    VIEWS,
    Kind,
    KindView,
    Selection,
    UnexpectedAnswer,
    column_widths,
    dump,
    format_line,
    items_of,
    object_name,
    parse_kind,
    select,
    table_headers,
    table_row,
)
from flexinfer_cli.watching import Snapshot, watch_until_interrupted
from flexinfer_common.admin_api import QueueList


def kind_and_names(kind: str, names: Sequence[str]) -> tuple[Kind, list[str]]:
    """``KIND [NAME]...`` or ``KIND/NAME`` (kubectl's two spellings); a usage error names the choices."""
    text, slash, name = kind.partition("/")
    try:
        parsed = parse_kind(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="KIND") from None
    if slash and (not name or names):
        raise typer.BadParameter("give KIND/NAME or KIND NAME..., not both", param_hint="KIND")
    return parsed, [name] if slash else list(names)


def where(view: KindView, selection: Selection) -> str:
    if not view.namespaced:
        return ""
    return " in any namespace" if selection.namespace is None else f" in namespace {selection.namespace}"


async def requests_waiting(proxy: str) -> dict[tuple[str, str], int] | None:
    """Requests waiting per model at the proxy (``GET /api/v1/queues``); None when it cannot be read (the
    REQUESTS column then says ``<none>``, and the rest of the table is printed)."""
    try:
        payload = await call(Service.PROXY, proxy, lambda client: client.get("/api/v1/queues"))
        queues = QueueList.model_validate(payload)
    except (CliError, ValidationError):
        return None
    return {(q.namespace, q.model): q.queued for q in queues.items}


class Printer:
    """Prints a ``get``'s objects in the chosen format; with ``--watch``, one poll's changes at a time."""

    def __init__(self, kind: Kind, output: OutputFormat, *, all_namespaces: bool, headers: bool) -> None:
        self.kind = kind
        self.output = output
        self.all_namespaces = all_namespaces
        self.headers = headers
        self.widths: list[int] | None = None
        self.waiting: dict[tuple[str, str], int] | None = None  # get models -o wide: the proxy's queues

    @property
    def wide(self) -> bool:
        return self.output is OutputFormat.WIDE

    def rows(self, items: Sequence[Any]) -> list[list[str]]:
        return [
            table_row(self.kind, i, wide=self.wide, all_namespaces=self.all_namespaces, waiting=self.waiting)
            for i in items
        ]

    def table(self, items: Sequence[Any], *, first: bool) -> None:
        rows = self.rows(items)
        header = list(table_headers(self.kind, wide=self.wide, all_namespaces=self.all_namespaces))
        if self.widths is None:  # column widths are fixed by the first print, as kubectl -w does
            self.widths = column_widths(header, rows)
        if first and self.headers:
            typer.echo(format_line(header, self.widths))
        for row in rows:
            typer.echo(format_line(row, self.widths))

    def objects(self, items: Sequence[Any], *, single: bool, first: bool = True) -> None:
        if self.output is OutputFormat.NAME:
            for item in items:
                typer.echo(object_name(self.kind, item))
            return
        dumped = [dump(item) for item in items]
        payload: Any = dumped[0] if single and len(dumped) == 1 else {"items": dumped}
        if self.output is OutputFormat.JSON:
            print_json(payload)
        else:
            if not first:
                typer.echo("---")
            print_yaml(payload)

    def watched(self, items: Sequence[Any], first: bool) -> None:
        """One poll's changes: tables keep their columns; json/yaml print each changed object on its own."""
        if self.output in {OutputFormat.TABLE, OutputFormat.WIDE}:
            self.table(items, first=first)
        else:
            for index, item in enumerate(items):
                self.objects([item], single=True, first=first and index == 0)


@app.command()
def get(
    kind: Annotated[
        str,
        typer.Argument(
            metavar="KIND",
            help="models | groups | leases | queues | swaps (also KIND/NAME)",
            show_default=False,
            autocompletion=complete_kind,
        ),
    ],
    names: Annotated[
        list[str] | None,
        typer.Argument(metavar="[NAME]...", help="Only these.", show_default=False, autocompletion=complete_name),
    ] = None,
    namespace: Namespace = None,
    all_namespaces: AllNamespaces = False,
    output: Output = OutputFormat.TABLE,
    watch_flag: Annotated[
        bool, typer.Option("-w", "--watch", help="After the list, print each object that appears or changes.")
    ] = False,
    watch_interval: Annotated[
        float, typer.Option("--watch-interval", min=0.1, help="With --watch: seconds between two polls of the API.")
    ] = 1.0,
    no_headers: Annotated[bool, typer.Option("--no-headers", help="Tables without their header line.")] = False,
    scheduler_url: SchedulerUrl = None,
    proxy_url: ProxyUrl = None,
    lease_manager_url: LeaseManagerUrl = None,
) -> None:
    """List models, groups, leases, queues or swaps (one namespace, or every one with -A), or only NAMEs."""
    parsed, wanted = kind_and_names(kind, names or [])
    view = VIEWS[parsed]
    selection = Selection(None if all_namespaces else namespace_or_default(namespace), tuple(wanted))
    flags = {Service.SCHEDULER: scheduler_url, Service.PROXY: proxy_url, Service.LEASE_MANAGER: lease_manager_url}
    url = resolve_url(view.service, flags[view.service])
    printer = Printer(parsed, output, all_namespaces=all_namespaces and view.namespaced, headers=not no_headers)

    async def fetch() -> list[Any]:
        if parsed is Kind.MODELS and output is OutputFormat.WIDE:
            printer.waiting = await requests_waiting(resolve_url(Service.PROXY, proxy_url))
        payload = await call(view.service, url, lambda client: client.get(view.path))
        try:
            return select(parsed, items_of(parsed, payload), selection)
        except UnexpectedAnswer as exc:
            fail(str(exc))

    if watch_flag:

        async def poll() -> Snapshot[tuple[str, str], Any]:
            items = await fetch()
            return Snapshot(tuple((view.key(item), item) for item in items))

        with contextlib.suppress(KeyboardInterrupt):
            run(watch_until_interrupted(poll, printer.watched, interval=watch_interval))
        raise typer.Exit(ExitCode.OK)

    items = run(fetch())
    missing = [name for name in wanted if name not in {view.name_of(item) for item in items}]
    if output in {OutputFormat.TABLE, OutputFormat.WIDE}:
        if items:
            printer.table(items, first=True)
        elif not wanted:
            typer.echo(f"No {parsed.value} found{where(view, selection)}.", err=True)
    elif items or not wanted:
        printer.objects(items, single=len(wanted) == 1)
    if missing:
        fail("; ".join(f'{view.singular} "{name}" not found{where(view, selection)}' for name in missing))
