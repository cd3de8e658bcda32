"""The swap's state machine (``domain/swap.py``): the transition table, the events the planner's facts raise, and
when a drain is over. One row per rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flexinfer_common.enums import RuntimePhase, ScaleAction, SwapPhase, SwapReason
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.model import Member, Swap
from flexinfer_scheduler.domain.swap import TRANSITIONS, SwapEvent, SwapFacts, advance, drained, event_for, may_command

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
TIMEOUT, SETTLE = timedelta(seconds=60), timedelta(seconds=1)


def swap(phase: SwapPhase = SwapPhase.DRAINING, started: float = 0) -> Swap:
    at = NOW - timedelta(seconds=started)
    return Swap("s", ModelKey("default", "a"), ModelKey("default", "b"), SwapReason.DEMAND, phase, at, at)


def serving(*, in_flight: int = 0, last_request: float | None = None) -> Member:
    return Member(
        ModelKey("default", "a"),
        desired_action=ScaleAction.ACTIVATE,
        runtime=RuntimePhase.READY.value,
        command_generation=1,
        runtime_generation=1,
        in_flight=in_flight,
        last_active_time=None if last_request is None else NOW - timedelta(seconds=last_request),
    )


@pytest.mark.parametrize(
    ("outgoing", "started", "expected"),
    [
        pytest.param([], 0, True, id="nothing-serves-nothing-to-drain"),
        pytest.param([serving(last_request=600)], 0, True, id="idle-model-drains-at-once"),
        pytest.param([serving(in_flight=2, last_request=0)], 30, False, id="requests-in-flight-hold-the-drain"),
        pytest.param([serving(in_flight=2, last_request=0)], 60, True, id="drain-timeout-ends-it"),
        pytest.param([serving(last_request=0.5)], 0.5, False, id="busy-lately-waits-for-the-proxies-counts"),
        pytest.param([serving(last_request=0.5)], 1, True, id="none-in-flight-after-the-settle-time"),
    ],
)
def test_drained(outgoing: list[Member], started: float, expected: bool) -> None:
    assert drained(outgoing, swap(started=started), NOW, drain_timeout=TIMEOUT, settle=SETTLE) is expected


FACTS = {"drained": False, "others_parked": False, "has_leader": True, "leader_ready": False}


@pytest.mark.parametrize(
    ("phase", "facts", "event"),
    [
        pytest.param(SwapPhase.DRAINING, {}, None, id="draining-waits"),
        pytest.param(SwapPhase.DRAINING, {"drained": True}, SwapEvent.DRAINED, id="draining-drained"),
        pytest.param(SwapPhase.PARKING, {}, None, id="parking-waits-for-the-actuator"),
        pytest.param(SwapPhase.PARKING, {"others_parked": True}, SwapEvent.PARKED, id="parking-parked"),
        pytest.param(
            SwapPhase.PARKING,
            {"others_parked": True, "has_leader": False},
            SwapEvent.NOTHING_TO_LOAD,
            id="parking-with-no-leader-ends",
        ),
        pytest.param(SwapPhase.LOADING, {"others_parked": True}, None, id="loading-waits-for-ready"),
        pytest.param(SwapPhase.LOADING, {"leader_ready": True}, SwapEvent.LEADER_READY, id="loading-ready"),
    ],
)
def test_events(phase: SwapPhase, facts: dict[str, bool], event: SwapEvent | None) -> None:
    assert event_for(phase, SwapFacts(**{**FACTS, **facts})) == event


def test_the_table_ends_every_swap_and_any_active_phase_can_be_superseded() -> None:
    for phase in (SwapPhase.DRAINING, SwapPhase.PARKING, SwapPhase.LOADING):
        assert TRANSITIONS[(phase, SwapEvent.SUPERSEDED)] is SwapPhase.ABORTED
    assert {TRANSITIONS[k] for k in TRANSITIONS} <= {
        SwapPhase.PARKING,
        SwapPhase.LOADING,
        SwapPhase.READY,
        SwapPhase.ABORTED,
        SwapPhase.FAILED,
    }
    assert TRANSITIONS[(SwapPhase.LOADING, SwapEvent.LOAD_FAILED)] is SwapPhase.FAILED


def test_an_idle_swap_with_everything_parked_runs_to_loading_in_one_pass_and_records_each_phase() -> None:
    facts = SwapFacts(drained=True, others_parked=True, has_leader=True, leader_ready=False)
    result = advance(swap(started=2), facts, NOW)
    assert result.phase is SwapPhase.LOADING
    assert result.phases == {"draining": 2.0, "parking": 0.0}


@pytest.mark.parametrize(
    ("phase", "action", "member", "allowed"),
    [
        pytest.param(SwapPhase.DRAINING, ScaleAction.PARK, serving(), False, id="a-draining-model-is-not-parked"),
        pytest.param(
            SwapPhase.DRAINING,
            ScaleAction.PARK,
            Member(ModelKey("default", "c"), desired_action=ScaleAction.ACTIVATE, runtime="Loading"),
            True,
            id="a-model-that-serves-nothing-may-be-parked-while-another-drains",
        ),
        pytest.param(SwapPhase.DRAINING, ScaleAction.ACTIVATE, serving(), False, id="no-activate-while-draining"),
        pytest.param(SwapPhase.PARKING, ScaleAction.ACTIVATE, serving(), False, id="no-activate-while-parking"),
        pytest.param(SwapPhase.LOADING, ScaleAction.ACTIVATE, serving(), True, id="activate-while-loading"),
        pytest.param(None, ScaleAction.PARK, serving(), True, id="no-swap-anything-goes"),
    ],
)
def test_what_each_phase_lets_the_planner_command(
    phase: SwapPhase | None, action: ScaleAction, member: Member, allowed: bool
) -> None:
    assert may_command(phase, action, member) is allowed
