"""``flexinfer promote MODEL``: make a model its group's active one now."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer

from flexinfer_cli.cli import Namespace, SchedulerUrl, app, call, model_argument, resolve_url, run
from flexinfer_cli.completion import complete_model
from flexinfer_cli.config import Service


@app.command()
def promote(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL", help="NAME or NAMESPACE/NAME", show_default=False, autocompletion=complete_model
        ),
    ],
    namespace: Namespace = None,
    scheduler_url: SchedulerUrl = None,
) -> None:
    """Make MODEL the active model of its group now (a GPU lease still beats it)."""
    ref = model_argument(model, namespace)
    url = resolve_url(Service.SCHEDULER, scheduler_url)
    path = f"/api/v1/models/{quote(ref.namespace, safe='')}/{quote(ref.name, safe='')}/promote"
    run(call(Service.SCHEDULER, url, lambda client: client.post(path)))
    typer.echo(f"model/{ref} promoted")
