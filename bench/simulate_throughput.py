"""The simulator's throughput: trace events replayed per second, per policy, on the shipped traces (each event is
at least one pass of the real planner). Usage: python bench/simulate_throughput.py
"""

from __future__ import annotations

import time
from pathlib import Path

from flexinfer_cli.simulate import POLICIES, Settings, Simulation, load_trace

TRACES = Path(__file__).resolve().parents[1] / "examples" / "traces"


def main() -> None:
    print("simulate: trace events per second (virtual clock, the real plan_group on every event)")
    for path in sorted(TRACES.glob("*.jsonl")):
        trace = load_trace(path)
        for name, policy in POLICIES.items():
            start = time.perf_counter()
            outcome = Simulation(trace, policy, Settings()).run()
            elapsed = time.perf_counter() - start
            print(
                f"  {path.stem:<24} {name:<10} {outcome.events:>7,} events in {elapsed:6.2f} s"
                f" = {outcome.events / elapsed:>9,.0f} events/s  ({len(trace.requests):,} requests)"
            )


if __name__ == "__main__":
    main()
