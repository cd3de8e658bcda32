"""The fewest loads any policy could make on a day of two models sharing one GPU, if it knew the whole day in advance,
while keeping both models' p95 wait within a limit: how far issue 21's swap goal is from what can be done at all.

    python bench/clairvoyant_bound.py                       # the two-model kinds, shipped traces and 3 variants each
    python bench/clairvoyant_bound.py --variants 5 --grid 1 # more variants, a finer time grid (slower)

For each trace it takes the two models that get the most requests and the p95 limit of the swap goal's trace (the
better of the seed's and v1alpha1's worst p95, as in ``bench/policy_comparison.py``), and solves exactly, by a dynamic
programme, a relaxation of the real problem:
- service is instant and a swap needs no drain: a model serves every request that arrives while it is loaded at
  once, and a switch to the other model makes it ready after its load time;
- priorities, the bounded wait, the timeout's 504s and every other model of the trace are left out, and the first
  load costs one load at the start of the day (the first model's requests do not wait for it);
- a request "waits too long" when its model becomes ready more than the limit after it arrived; the two models
  together may have as many of those as their p95s allow (each model 5 %, rounded down).
Every real schedule is also a schedule of the relaxation with no more loads and no more long waits, so the relaxed
optimum is a lower bound on the loads of these two models for any policy, online or not. The grid rounds arrivals
and load times down, so a finer grid can give a load less (team-working-day@1001: 52 on the 2 s grid, 51 on 1 s).
Two more columns solve the same relaxation with a cap on every wait: the queue timeout (the fewest loads of a
policy that lets none of these requests time out, as FlexInfer's default on these days) and the p95 limit itself (no
long wait at all: what a policy needs when it cannot tell which 5 % of the requests may wait).
The programme runs over the switch times on the grid; the state is the model switched to, the time and how many
long waits were spent, and a switch's long waits depend only on when its model was last switched away from.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections import Counter

from policy_comparison import TRACES, goals, variants

from flexinfer_cli.simulation import Outcome, Settings, Trace, load_trace, simulate

TWO_MODEL_KINDS = ("bursty-two-models", "adversarial-alternation", "team-working-day")


def fewest_loads(
    arrivals: tuple[list[int], list[int]], loads: tuple[int, int], limit: int, budget: int, cap: int | None = None
) -> int | None:
    """The relaxed optimum (see the module docstring), in grid units: ``arrivals`` sorted per model, ``loads`` the
    two load times, ``limit`` the longest wait that is not too long, ``budget`` the long waits allowed in all,
    ``cap`` the longest any wait may be (None: a long wait may last all day; the queue timeout: no request times
    out). None: no schedule keeps within them."""
    end = max(max(a, default=0) for a in arrivals) + max(loads) + 2  # the last switch may follow the last request
    before = [_count_before(a, end) for a in arrivals]  # before[m][t]: m's arrivals at < t
    width = budget + 1
    never = math.inf
    best = never
    for first in (0, 1):
        # cost[m][t][b]: fewest loads of a schedule that switches to m at t (m starts loading) with b long waits
        cost = [[[never] * width for _ in range(end + 1)] for _ in (0, 1)]
        cost[first][0][0] = 1
        # groups[o][k]: the best cost[o][t] over the switch times t already eligible with before[1 - o][t] == k
        groups: list[dict[int, list[float]]] = [{}, {}]
        for t in range(1, end + 1):
            for o in (0, 1):  # a switch at t away from o needs o loaded: o's own switch at t - loads[o] or before
                eligible = t - loads[o]
                if eligible >= 0:
                    k = before[1 - o][eligible]
                    row = groups[o].get(k)
                    groups[o][k] = cost[o][eligible][:] if row is None else list(map(min, row, cost[o][eligible]))
            for m in (0, 1):
                o = 1 - m
                if t - loads[o] < 0:
                    continue
                # m's requests that arrived since m was switched away from (at t0) and before ``cut`` wait too long
                cut = min(max(0, t + loads[m] - limit), end)
                at_cut = before[m][cut]
                latest = before[m][t - loads[o]]
                # with a cap, m's requests before ``capped`` would wait longer than it: none may be left since t0
                capped = before[m][min(max(0, t + loads[m] - cap), end)] if cap is not None else 0
                row = [never] * width
                for k in range(max(0, at_cut - budget, capped), latest + 1):
                    found = groups[o].get(k)
                    if found is None:
                        continue
                    spent = max(0, at_cut - k)
                    shifted = [never] * spent + found[: width - spent] if spent else found
                    row = list(map(min, row, shifted))
                cost[m][t] = [c + 1 for c in row]
        for m in (0, 1):  # the day ends with m loaded: the other's requests after its last switch away wait forever
            o = 1 - m
            for t in range(end + 1):
                forever = len(arrivals[o]) - before[o][t]
                left = budget - forever
                if left >= 0 and not (cap is not None and forever):
                    best = min(best, min(cost[m][t][: left + 1]))
    return None if best == never else int(best)


def _count_before(times: list[int], end: int) -> list[int]:
    at = Counter(times)
    counts, total = [], 0
    for t in range(end + 2):
        counts.append(total)
        total += at.get(t, 0)
    return counts


def bound(trace: Trace, limit: float, grid: float, cap: float | None = None) -> tuple[tuple[str, str], int | None]:
    """The two busiest models and the fewest loads of those two for any policy keeping their p95 within ``limit``
    (and, with a ``cap``, every wait within it)."""
    a, b = sorted(name for name, _ in Counter(r.model for r in trace.requests).most_common(2))

    def on_grid(name: str) -> tuple[list[int], int]:
        arrivals = sorted(int(r.at // grid) for r in trace.requests if r.model == name)
        return arrivals, max(1, int(trace.models[name].load_seconds // grid))

    (arrivals_a, load_a), (arrivals_b, load_b) = on_grid(a), on_grid(b)
    budget = sum(len(x) - math.ceil(0.95 * len(x)) for x in (arrivals_a, arrivals_b))
    longest = None if cap is None else int(cap // grid)
    return (a, b), fewest_loads((arrivals_a, arrivals_b), (load_a, load_b), int(limit // grid), budget, longest)


def _loads_of(outcome: Outcome, pair: tuple[str, str]) -> int:
    return sum(1 for s in outcome.segments if s.state == "loading" and s.model in pair)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", type=int, default=3, help="new random traces of each two-model kind")
    parser.add_argument("--only", default="", help="only traces whose name contains this")
    parser.add_argument("--grid", type=float, default=2.0, help="the time grid in seconds (default 2)")
    args = parser.parse_args()
    traces = {p.stem: load_trace(p) for p in sorted(TRACES.glob("*.jsonl")) if p.stem in TWO_MODEL_KINDS}
    traces.update((n, t) for n, t in variants(args.variants).items() if n.split("@")[0] in TWO_MODEL_KINDS)
    print("Loads in all (in brackets: of the two models)\n")
    print(
        "| trace | models | p95 limit | swap goal | FlexInfer's loads | v1alpha1's loads | fewest loads (bound) "
        "| no wait past the timeout | no wait past the p95 limit |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for name, trace in ((n, t) for n, t in traces.items() if args.only in n):
        settings = Settings(one_at_a_time=True)
        c = simulate(trace, ("seed", "v1alpha1", "flexinfer", "offline"), settings)
        v1, ours = c.outcomes["v1alpha1"], c.outcomes["flexinfer"]
        _, limit, goal = goals(c)
        # the bound itself; then for a policy that lets no request time out; then for one with no long wait at all
        bounds = [bound(trace, limit, args.grid, cap) for cap in (None, settings.queue_timeout, limit)]
        pair, fewest = bounds[0][0], [f for _, f in bounds]
        cells = " | ".join("-" if f is None else str(f) for f in fewest)
        print(
            f"| {name} | {' + '.join(pair)} | {limit:.0f} s | {goal:.0f} | {ours.loads} ({_loads_of(ours, pair)}) | "
            f"{v1.loads} ({_loads_of(v1, pair)}) | {cells} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
