"""``flexinfer up [-f FILE]``: the whole system on this machine (the work is in :mod:`flexinfer_cli.local_system`)."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from flexinfer_cli.cli import Files, app, run


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
    from flexinfer_cli.local_system import UpOptions, run_up
    from flexinfer_common.logs import configure_logging

    level = os.environ.get("FLEXINFER_LOG_LEVEL", "INFO").upper()
    configure_logging("flexinfer-up", level if level in {"DEBUG", "INFO", "WARNING", "ERROR"} else "INFO")
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)  # one line per plugin otherwise
    options = UpOptions(
        files=file, state_dir=state_dir, ready_timeout=ready_timeout, kubeconfig=kubeconfig, kube_context=context
    )
    code = run(run_up(options))
    raise typer.Exit(code)
