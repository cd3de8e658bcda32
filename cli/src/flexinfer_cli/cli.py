"""The ``flexinfer`` Typer application and what its commands share: options with kubectl's names, output formats,
exit codes, running a command's coroutine.

Each command lives in its own module under :mod:`flexinfer_cli.commands` and registers itself on :data:`app`;
:mod:`flexinfer_cli.main` imports them all. The package's docstring (:mod:`flexinfer_cli`) says where a command's
work goes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable, Mapping
from enum import IntEnum, StrEnum
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Any, NoReturn, TypeVar

import typer

from flexinfer_cli.client import AdminClient, CliError
from flexinfer_cli.config import ConfigError, ModelRef, Service, admin_token, default_namespace, parse_model_ref
from flexinfer_cli.config import service_url as _service_url

T = TypeVar("T")


class ExitCode(IntEnum):
    """The exit codes of every ``flexinfer`` command."""

    OK = 0
    FAILED = 1  # the operation failed: an API error, a resource not found, a service or NATS not reachable
    USAGE = 2  # bad input: an unknown command, kind or option, a bad manifest, setting or argument


EXIT_CODES_HELP = (
    "Exit codes: 0 done; 1 the operation failed (an API error, a resource not found, a service not reachable, "
    "`up` could not start); 2 bad input (usage, a bad manifest, setting or argument)."
)


def cli_version() -> str:
    try:
        return version("flexinfer")
    except PackageNotFoundError:  # pragma: no cover - run from a source tree without installing
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"flexinfer {cli_version()}")
        raise typer.Exit(ExitCode.OK)


app = typer.Typer(
    name="flexinfer",
    help=f"FlexInfer: time-share a GPU across inference models.\n\n{EXIT_CODES_HELP}",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print the CLI's version and exit.",
            show_default=False,
        ),
    ] = False,
) -> None:
    """FlexInfer: time-share a GPU across inference models."""


class OutputFormat(StrEnum):
    TABLE = "table"
    WIDE = "wide"
    JSON = "json"
    YAML = "yaml"
    NAME = "name"


def _url_option(service: Service, what: str) -> Any:
    return typer.Option(
        service.url_flag,
        envvar=service.url_variable,
        help=f"{what} (default: http://127.0.0.1:${service.port_variable} or {service.default_port})",
        show_default=False,
    )


SchedulerUrl = Annotated[str | None, _url_option(Service.SCHEDULER, "Scheduler admin API")]
ProxyUrl = Annotated[str | None, _url_option(Service.PROXY, "Proxy")]
LeaseManagerUrl = Annotated[str | None, _url_option(Service.LEASE_MANAGER, "Lease manager API")]
NatsUrl = Annotated[
    str | None,
    typer.Option(
        "--nats-url",
        envvar="FLEXINFER_NATS_URL",
        help="NATS server (default: nats://127.0.0.1:4222)",
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
Namespace = Annotated[
    str | None,
    typer.Option(
        "-n",
        "--namespace",
        help="The namespace (default: $FLEXINFER_NAMESPACE, else default).",
        show_default=False,
    ),
]
AllNamespaces = Annotated[
    bool, typer.Option("-A", "--all-namespaces", help="Every namespace (a NAMESPACE column leads the table).")
]


def fail(message: str, code: int = ExitCode.FAILED) -> NoReturn:
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
        return _service_url(service, flag)
    except ConfigError as exc:
        fail(str(exc), ExitCode.USAGE)


def namespace_or_default(namespace: str | None) -> str:
    return namespace.strip() if namespace and namespace.strip() else default_namespace()


def model_argument(value: str, namespace: str | None = None) -> ModelRef:
    """MODEL as ``NAME`` (in ``namespace``, else the default one) or ``NAMESPACE/NAME``."""
    try:
        return parse_model_ref(value, default_namespace=namespace_or_default(namespace))
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


@contextlib.asynccontextmanager
async def admin_clients(
    urls: Mapping[Service, str], needed: Iterable[Service]
) -> AsyncIterator[dict[Service, AdminClient]]:
    """One open AdminClient per service in ``needed`` (at the URL ``urls`` gives it), closed on the way out."""
    async with contextlib.AsyncExitStack() as stack:
        yield {
            service: await stack.enter_async_context(AdminClient(service, urls[service], token=admin_token()))
            for service in set(needed)
        }


async def call(service: Service, url: str, action: Callable[[AdminClient], Awaitable[T]]) -> T:
    async with AdminClient(service, url, token=admin_token()) as client:
        return await action(client)


def print_json(payload: Any) -> None:
    typer.echo(json.dumps(payload, indent=2, sort_keys=False))


def print_yaml(payload: Any) -> None:
    import yaml

    typer.echo(yaml.safe_dump(payload, sort_keys=False, allow_unicode=True).rstrip("\n"))
