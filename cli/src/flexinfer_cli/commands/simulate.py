"""``flexinfer simulate TRACE``: replay a request trace through the real election on a virtual clock (the work is in
:mod:`flexinfer_cli.simulation`; see docs/simulate.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from flexinfer_cli.cli import ExitCode, Output, OutputFormat, app, fail, print_json


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
    quiet_yield: Annotated[
        str | None,
        typer.Option(
            "--quiet-yield",
            help="FLEXINFER_QUIET_YIELD for the flexinfer policy: a holder with nothing in flight or queued and no "
            "request for this long is idle and may yield to a waiting model (default: 10s, as the scheduler).",
        ),
    ] = None,
    one_at_a_time: Annotated[
        bool,
        typer.Option(
            "--one-at-a-time",
            help="Ignore the trace's capacity line: one model on the GPU at a time, as a group without "
            "spec.capacity (to compare with and without models side by side).",
        ),
    ] = False,
    output: Output = OutputFormat.TABLE,
) -> None:
    """Replay a request trace through the real election and swap code on a virtual clock, once per policy, and
    compare swaps, GPU time, queue waits, 429/504 answers and the longest wait (see docs/simulate.md)."""
    from flexinfer_cli.simulation import (
        ALL_POLICIES,
        Settings,
        TraceError,
        as_json,
        load_trace,
        render_svg,
        render_table,
    )
    from flexinfer_common.durations import parse_duration

    chosen = policy or list(ALL_POLICIES)
    unknown = [p for p in chosen if p not in ALL_POLICIES]
    if unknown:
        fail(f"unknown policy {', '.join(unknown)} (known: {', '.join(ALL_POLICIES)})", ExitCode.USAGE)
    try:
        timeout = parse_duration(queue_timeout).total_seconds()
        quiet = parse_duration(quiet_yield).total_seconds() if quiet_yield is not None else None
        data = load_trace(trace)
    except (TraceError, ValueError) as exc:
        fail(str(exc), ExitCode.USAGE)
    except OSError as exc:
        fail(f"cannot read {trace}: {exc.strerror or exc}", ExitCode.USAGE)
    from flexinfer_cli.simulation import simulate as run_simulation

    settings = Settings(queue_timeout=timeout, queue_max=queue_max, quiet_yield=quiet, one_at_a_time=one_at_a_time)
    comparison = run_simulation(data, chosen, settings)
    if output is OutputFormat.JSON:
        print_json(as_json(comparison))
    else:
        typer.echo(render_table(comparison))
    if svg is not None:
        svg.write_text(render_svg(comparison))
        if output is not OutputFormat.JSON:
            typer.echo(f"timeline written to {svg}")
