"""``flexinfer demand MODEL``: signal demand on NATS, as any external producer may (the work is in
:mod:`flexinfer_cli.demand_signal`)."""

from __future__ import annotations

from typing import Annotated

import typer

from flexinfer_cli.cli import Namespace, NatsUrl, app, model_argument, run
from flexinfer_cli.completion import complete_model
from flexinfer_cli.config import nats_url


@app.command()
def demand(
    model: Annotated[
        str,
        typer.Argument(
            metavar="MODEL", help="NAME or NAMESPACE/NAME", show_default=False, autocompletion=complete_model
        ),
    ],
    queued: Annotated[int, typer.Option("--queued", min=0, help="Requests waiting (0: activity only).")] = 1,
    source: Annotated[str, typer.Option("--source", help="Who signals (demand is counted per source).")] = (
        "flexinfer-cli"
    ),
    namespace: Namespace = None,
    nats: NatsUrl = None,
) -> None:
    """Signal demand for MODEL on NATS, as any external producer may."""
    from flexinfer_cli.demand_signal import publish_demand

    ref = model_argument(model, namespace)
    subject = run(publish_demand(nats_url(nats), ref, queued=queued, source=source))
    typer.echo(f"demand for model/{ref} published on {subject} (queued={queued})")
