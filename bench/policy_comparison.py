"""The scheduling policies side by side on every example trace, and on fresh variants of each kind.

    python bench/policy_comparison.py                  # the example traces
    python bench/policy_comparison.py --variants 3     # and 3 new random variants of each generated kind
    python bench/policy_comparison.py --only bursty    # the traces whose name contains 'bursty'
    python bench/policy_comparison.py --capacity       # with the traces' capacity lines (models side by side)
    python bench/policy_comparison.py --load-scale 3   # every model loading 3 times as long (0.3: faster)

For each trace: the seed's exact policy, the v1alpha1 defaults, FlexInfer's default and the offline lower bound
(`flexinfer simulate --one-at-a-time`, queue timeout 5 m: a trace's capacity line is ignored, so the figures compare
with the seed's one model per GPU; `--capacity` honours it), and whether the default meets the goals of issue 21:
- 504s <= the better of seed and v1alpha1, plus 1 % of the requests;
- the worst model's p95 wait <= the better of seed and v1alpha1;
- swaps <= 1.5 x the larger of the seed's swaps and the offline lower bound.
Exits 1 when a goal is missed on any trace.
"""

from __future__ import annotations

import argparse
import runpy
import sys
from dataclasses import replace
from pathlib import Path

from _common import print_rows_in_parallel

from flexinfer_cli.simulation import Comparison, Settings, Trace, load_trace, read_trace, simulate

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "examples" / "traces"


def variants(count: int, first_seed: int = 1000) -> dict[str, Trace]:
    """``count`` new traces of each kind drawn at random (other random seeds than the shipped files)."""
    generator = runpy.run_path(str(TRACES / "generate.py"))  # a script beside the traces, not a package's module
    return {
        f"{kind}@{seed}": read_trace(generator["trace_lines"](kind, seed), source=f"{kind}@{seed}")
        for kind, about in generator["KINDS"].items()
        if about.seed is not None
        for seed in range(first_seed, first_seed + count)
    }


def load_scaled(trace: Trace, factor: float) -> Trace:
    """``trace`` with every model's load time multiplied by ``factor``: the same day for models that load faster or
    slower (the kinds' models load in 20-40 s; real ones from seconds to minutes)."""
    models = {name: replace(m, load_seconds=m.load_seconds * factor) for name, m in trace.models.items()}
    return replace(trace, models=models)


def worst_p95(outcome) -> float:  # type: ignore[no-untyped-def]
    return max((p for m in outcome.waits if (p := outcome.percentile(m, 95)) is not None), default=0.0)


def goals(c: Comparison) -> tuple[float, float, float]:
    """Issue 21's limits for FlexInfer's default on one trace: the most 504s, the longest worst-model p95 wait and
    the most swaps (``c`` has the seed, v1alpha1 and the offline bound)."""
    seed, v1 = c.outcomes["seed"], c.outcomes["v1alpha1"]
    return (
        min(seed.timed_out, v1.timed_out) + 0.01 * len(c.trace.requests),
        min(worst_p95(seed), worst_p95(v1)),
        1.5 * max(seed.loads, c.offline or 0),
    )


def judge(name: str, trace: Trace, capacity: bool = False) -> tuple[str, bool]:
    # one model at a time, as these goals were set, unless ``capacity``: every policy but v1alpha1 (one model per
    # GPUGroup) then loads models side by side where the trace's capacity line lets them
    c = simulate(trace, ("seed", "v1alpha1", "flexinfer", "offline"), Settings(one_at_a_time=not capacity))
    seed, v1, ours = c.outcomes["seed"], c.outcomes["v1alpha1"], c.outcomes["flexinfer"]
    limit_504, limit_p95, limit_swaps = goals(c)
    ok = (ours.timed_out <= limit_504, worst_p95(ours) <= limit_p95 + 1e-9, ours.loads <= limit_swaps)
    marks = ["" if good else "!" for good in ok]

    def cell(o) -> str:  # type: ignore[no-untyped-def]
        return f"{o.timed_out} / {worst_p95(o):.0f} s / {o.loads}"

    row = (
        f"| {name} | {len(trace.requests)} | {cell(seed)} | {cell(v1)} | {ours.timed_out}{marks[0]} / "
        f"{worst_p95(ours):.0f} s{marks[1]} / {ours.loads}{marks[2]} | {c.offline} | "
        f"{limit_504:.0f} / {limit_p95:.0f} s / {limit_swaps:.0f} |"
    )
    return row, all(ok)


def _judge(item: tuple[str, Trace, bool]) -> tuple[str, bool]:
    return judge(*item)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", type=int, default=0, help="new random traces of each kind (default 0)")
    parser.add_argument("--first-seed", type=int, default=1000)
    parser.add_argument("--only", default="", help="only traces whose name contains this")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument(
        "--capacity", action="store_true", help="honour the traces' capacity lines (models side by side where they fit)"
    )
    parser.add_argument(
        "--load-scale", type=float, default=1.0, help="multiply every model's load time by this (default 1)"
    )
    parser.add_argument("--no-shipped", action="store_true", help="only the --variants, not the example traces")
    args = parser.parse_args()
    if not args.load_scale > 0:
        parser.error(f"--load-scale: {args.load_scale} is not a factor > 0")
    traces = {} if args.no_shipped else {p.stem: load_trace(p) for p in sorted(TRACES.glob("*.jsonl"))}
    traces.update(variants(args.variants, args.first_seed))
    if args.load_scale != 1.0:
        traces = {f"{name} x{args.load_scale:g}": load_scaled(t, args.load_scale) for name, t in traces.items()}
    items = [(n, t, args.capacity) for n, t in traces.items() if args.only in n]
    print("504 / worst model's p95 wait / swaps ('!': a goal missed)\n")
    print("| trace | requests | seed | v1alpha1 | flexinfer (default) | offline swaps | goal (at most) |")
    print("|---|---|---|---|---|---|---|")
    failed = print_rows_in_parallel(_judge, items, jobs=args.jobs)
    print(f"\n{len(items) - failed} of {len(items)} traces meet every goal")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
