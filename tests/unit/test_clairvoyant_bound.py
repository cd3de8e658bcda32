"""bench/clairvoyant_bound.py: the fewest loads of two models for any policy, by hand-checked small days."""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.fixture
def bound(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    monkeypatch.syspath_prepend(str(BENCH))  # the benches import each other as scripts beside each other
    return importlib.import_module("clairvoyant_bound")


@pytest.mark.parametrize(
    ("arrivals", "limit", "budget", "fewest"),
    [
        # a at 0, b at 10, loads of 1: b must be loaded once its request came, unless it may wait too long
        pytest.param(([0], [10]), 5, 0, 2, id="each-model-once"),
        pytest.param(([0], [10]), 5, 1, 1, id="one-long-wait-saves-a-load"),
        # a, b, a, b ten seconds apart: within a 5 s limit every request is a switch; within 25 s, b's first
        # request can wait while a serves its second, so one switch serves both of b's
        pytest.param(([0, 20], [10, 30]), 5, 0, 4, id="alternation-tight-limit"),
        pytest.param(([0, 20], [10, 30]), 25, 0, 2, id="alternation-loose-limit"),
        # two long waits allowed: b's two requests are left waiting (the day ends with a loaded)
        pytest.param(([0, 20], [10, 30]), 5, 2, 1, id="budget-for-both-of-b"),
    ],
)
def test_fewest_loads_of_small_days(
    bound: ModuleType, arrivals: tuple[list[int], list[int]], limit: int, budget: int, fewest: int
) -> None:
    assert bound.fewest_loads(arrivals, (1, 1), limit, budget) == fewest


def test_the_loads_take_their_time(bound: ModuleType) -> None:
    """a (an 8 s load) asked at 0, b (1 s) at 3: within 10 s a is loaded first and b after it; within 5 s no
    schedule answers both (b waits for a's load, or a for b's and its own), so one of them must wait too long."""
    assert bound.fewest_loads(([0], [3]), (8, 1), 10, 0) == 2
    assert bound.fewest_loads(([0], [3]), (8, 1), 5, 0) is None
    assert bound.fewest_loads(([0], [3]), (8, 1), 5, 1) == 1


def test_a_cap_ends_every_wait(bound: ModuleType) -> None:
    """With a long wait allowed, b's one request may wait all day (one load); capped at 100 s it is answered, a
    second load; a cap no schedule keeps (as the 5 s of test_the_loads_take_their_time) leaves none; a cap at the
    limit spends no long wait."""
    assert bound.fewest_loads(([0], [10]), (1, 1), 5, 1) == 1
    assert bound.fewest_loads(([0], [10]), (1, 1), 5, 1, cap=100) == 2
    assert bound.fewest_loads(([0], [3]), (8, 1), 5, 1, cap=5) is None
    assert bound.fewest_loads(([0, 20], [10, 30]), (1, 1), 5, 2, cap=5) == 4  # as alternation-tight-limit


def test_a_cap_keeps_a_long_wait_that_fits_under_it(bound: ModuleType) -> None:
    """b's first request may wait 15 s (over the 5 s limit, within a 20 s cap) while a serves its second: two
    loads, as without a cap; a 10 s cap forces the alternation."""
    assert bound.fewest_loads(([0, 20], [10, 30]), (1, 1), 5, 1, cap=20) == 2
    assert bound.fewest_loads(([0, 20], [10, 30]), (1, 1), 5, 1, cap=10) > 2
