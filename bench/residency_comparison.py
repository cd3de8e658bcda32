"""Models side by side against one at a time: every example trace, with and without its capacity line.

    python bench/residency_comparison.py                 # FlexInfer's default policy
    python bench/residency_comparison.py -p seed         # another policy of `flexinfer simulate`

For each trace: swaps (model loads), 504s and the worst model's p95 queue wait, one model at a time
(`flexinfer simulate --one-at-a-time`) and with the trace's capacity (the planner's resident sets: every model that
fits stays loaded beside the others), and the most memory held on one device. A trace without a capacity line runs
one model at a time either way ("-"). Exits 1 if a run ever held more memory on a device than the capacity.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _common import print_rows_in_parallel

from flexinfer_cli.simulation import POLICIES, Settings, Trace, load_trace, simulate

ROOT = Path(__file__).resolve().parent.parent
TRACES = ROOT / "examples" / "traces"


def worst_p95(outcome) -> float:  # type: ignore[no-untyped-def]
    return max((p for m in outcome.waits if (p := outcome.percentile(m, 95)) is not None), default=0.0)


def cell(o) -> str:  # type: ignore[no-untyped-def]
    return f"{o.loads} / {o.timed_out} / {worst_p95(o):.0f} s"


def compare(item: tuple[str, Trace, str]) -> tuple[str, bool]:
    name, trace, policy = item
    alone = simulate(trace, [policy], Settings(one_at_a_time=True)).outcomes[policy]
    capacity = trace.capacity
    if capacity is None:
        return f"| {name} | {len(trace.requests)} | - | {cell(alone)} | - | - | - |", True
    side = simulate(trace, [policy]).outcomes[policy]
    peak = side.peak_memory or 0
    card = f"{capacity.devices} x {capacity.memory_per_device / 1024**3:g} GiB"
    saved = alone.loads - side.loads
    row = (
        f"| {name} | {len(trace.requests)} | {card} | {cell(alone)} | {cell(side)} | {saved} | "
        f"{peak / 1024**3:.2f} GiB |"
    )
    return row, peak <= capacity.memory_per_device


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--policy", default="flexinfer", choices=sorted(POLICIES))
    parser.add_argument("--only", default="", help="only traces whose name contains this")
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    items = [(p.stem, load_trace(p), args.policy) for p in sorted(TRACES.glob("*.jsonl")) if args.only in p.stem]
    print(f"policy {args.policy}: swaps / 504 / worst model's p95 wait\n")
    print("| trace | requests | capacity | one at a time | side by side | swaps saved | peak on a device |")
    print("|---|---|---|---|---|---|---|")
    over = print_rows_in_parallel(compare, items, jobs=args.jobs)
    if over:
        print(f"\n{over} trace(s) held more memory on a device than the capacity")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
