"""The simulator's throughput: trace events replayed per second, per policy, on the shipped traces (each event is
at least one pass of the real planner); then, per trace, FlexInfer's default against the seed's policy: swaps and
the p95 queue wait over all requests (a timed-out request counts with the whole timeout), and the same with the
opt-in quiet yield (FLEXINFER_QUIET_YIELD=30s).
Usage: python bench/simulate_throughput.py
"""

from __future__ import annotations

import time
from pathlib import Path

from flexinfer_cli.simulation import POLICIES, Outcome, Settings, load_trace, simulate

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"


def p95(outcome: Outcome) -> float:
    waits = sorted(w for per_model in outcome.waits.values() for w in per_model)
    return waits[max(0, int(len(waits) * 0.95) - 1)] if waits else 0.0


def main() -> None:
    print("simulate: trace events per second (virtual clock, the real plan_group on every event)")
    comparisons = []
    for path in sorted(TRACES.glob("*.jsonl")):
        trace = load_trace(path)
        outcomes = {}
        for name in POLICIES:
            start = time.perf_counter()
            # (through simulate: FlexInfer's policy fitted to the settings, as the scheduler runs it)
            outcome = outcomes[name] = simulate(trace, [name], Settings()).outcomes[name]
            elapsed = time.perf_counter() - start
            print(
                f"  {path.stem:<24} {name:<10} {outcome.events:>7,} events in {elapsed:6.2f} s"
                f" = {outcome.events / elapsed:>9,.0f} events/s  ({len(trace.requests):,} requests)"
            )
        yielding = simulate(trace, ["flexinfer"], Settings(quiet_yield=30)).outcomes["flexinfer"]
        comparisons.append((path.stem, outcomes["seed"], outcomes["flexinfer"], yielding))
    print("FlexInfer's default (and with FLEXINFER_QUIET_YIELD=30s) vs the seed's policy: swaps; p95 wait over all")
    print("requests; 504s")
    for stem, seed, flexinfer, yielding in comparisons:
        print(
            f"  {stem:<24} swaps {seed.loads:>4} -> {flexinfer.loads:<4} ({yielding.loads:<4})"
            f" p95 {p95(seed):6.1f} s -> {p95(flexinfer):6.1f} s ({p95(yielding):6.1f} s)"
            f"  504 {seed.timed_out:>4} -> {flexinfer.timed_out} ({yielding.timed_out})"
        )


if __name__ == "__main__":
    main()
