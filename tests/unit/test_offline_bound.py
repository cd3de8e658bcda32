"""`flexinfer simulate`'s offline lower bound is a lower bound: on small random days it is never above the fewest
loads an exhaustive search finds for answering every request within the queue timeout, one model at a time."""

from __future__ import annotations

import heapq
import json

from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer_cli.simulation import offline_lower_bound, read_trace

MODELS = "abc"


def fewest_loads(requests: list[tuple[int, str]], load: dict[str, int], park: dict[str, int], timeout: int) -> int:
    """The fewest loads that answer every request (model loaded at a whole second of ``[at, at + timeout]``) with
    one model at a time: a switch parks the loaded model (``park``) before the next one loads (``load``). A search
    by loads over (second, model, ready at, requests answered); -1 when no schedule answers them all."""
    end = max(at for at, _ in requests) + timeout
    everything = (1 << len(requests)) - 1
    frontier = [(1, 0, model, load[model], 0) for model in load]  # the first load starts at 0
    seen: set[tuple[int, str, int, int]] = set()
    while frontier:
        loads, now, model, ready, answered = heapq.heappop(frontier)
        if (now, model, ready, answered) in seen:
            continue
        seen.add((now, model, ready, answered))
        if now >= ready:
            for i, (at, wanted) in enumerate(requests):
                if wanted == model and at <= now <= at + timeout:
                    answered |= 1 << i
        if answered == everything:
            return loads
        if now > end or any(not answered >> i & 1 and at + timeout < now for i, (at, _) in enumerate(requests)):
            continue
        heapq.heappush(frontier, (loads, now + 1, model, ready, answered))
        if now >= ready:  # (starting a load only to stop it never saves one)
            for other in load:
                if other != model:
                    heapq.heappush(frontier, (loads + 1, now + 1, other, now + park[model] + load[other], answered))
    return -1


@settings(max_examples=150, deadline=None)
@given(
    models=st.integers(2, 3),
    loads=st.lists(st.integers(0, 6), min_size=3, max_size=3),
    parks=st.lists(st.integers(0, 3), min_size=3, max_size=3),
    timeout=st.integers(5, 15),
    arrivals=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 2)), min_size=1, max_size=6),
)
def test_the_offline_bound_is_never_above_the_fewest_loads(
    models: int, loads: list[int], parks: list[int], timeout: int, arrivals: list[tuple[int, int]]
) -> None:
    names = MODELS[:models]
    load, park = dict(zip(names, loads, strict=False)), dict(zip(names, parks, strict=False))
    requests = sorted((at, names[which % models]) for at, which in arrivals)
    lines = [json.dumps({"model": m, "loadSeconds": load[m], "parkSeconds": park[m]}) for m in names]
    lines += [json.dumps({"at": at, "model": m, "serviceSeconds": 1}) for at, m in requests]
    fewest = fewest_loads(requests, load, park, timeout)
    bound = offline_lower_bound(read_trace(lines), queue_timeout=timeout)
    if fewest >= 0:  # (no schedule at all answers some days: nothing to compare)
        assert bound <= fewest
    assert bound >= len({m for _, m in requests})


def test_the_search_finds_the_fewest_loads_of_a_day_worked_by_hand() -> None:
    """The search itself, on the day of test_simulate.py's park-and-load test: with 28 s loads a, b, a is forced
    (three loads); with 10 s loads b can be answered first and a after it (two)."""
    assert fewest_loads([(0, "a"), (280, "b"), (560, "a")], {"a": 28, "b": 28}, {"a": 4, "b": 4}, 300) == 3
    assert fewest_loads([(0, "a"), (280, "b"), (560, "a")], {"a": 10, "b": 10}, {"a": 4, "b": 4}, 300) == 2
