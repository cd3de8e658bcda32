"""FlexInfer's default policy (``choose_flexinfer_leader``), one row per rule of its docstring, and the seed's
exact election one setting away (``policy=seed``)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from flexinfer_common.enums import RuntimePhase, ScaleAction, SchedulingPolicy
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import (
    ElectionParams,
    ElectionReason,
    choose_flexinfer_leader,
    cooldown_remaining,
    elect,
    next_change,
)
from flexinfer_scheduler.domain.model import Capacity, GroupSnapshot, Lease, Member
from tests.support.elections import Outcome, outcome, rules
from tests.support.members import member as make_member

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PARAMS = ElectionParams()  # quiet 10 s, hold 1 x the load (10 s .. 5 min), maxWait 4 min, 240 request-seconds


def s(seconds: float) -> datetime:
    return NOW - timedelta(seconds=seconds)


def member(
    name: str,
    *,
    priority: int = 10,
    holds: bool = False,
    loaded_in: float = 30,
    ready_for: float | None = 600,
    last: float | None = None,
    queued: int = 0,
    waited: float | None = None,
    in_flight: int = 0,
    idle_timeout: timedelta | None = None,
    cooldown: timedelta | None = None,
    preempted: float | None = None,
    idle_parked: float | None = None,
    force: bool = False,
) -> Member:
    """``holds``: activated and Ready for ``ready_for`` seconds after a load of ``loaded_in`` (None: loading);
    ``last``: seconds since its last request; ``waited``: seconds since it began to want the GPU."""
    return make_member(
        name,
        runtime=(RuntimePhase.READY if ready_for is not None else RuntimePhase.LOADING) if holds else None,
        priority=priority,
        last_active_time=s(last) if last is not None else None,
        preempted_at=s(preempted) if preempted is not None else None,
        idle_parked_at=s(idle_parked) if idle_parked is not None else None,
        swap_cooldown=cooldown,
        idle_timeout=idle_timeout,
        force_promotion=force,
        command_issued_at=s((ready_for or 0) + loaded_in) if holds else None,
        ready_since=s(ready_for) if holds and ready_for is not None else None,
        demand_since=s(waited) if waited is not None else None,
        queued=queued,
        in_flight=in_flight,
    )


def group(*members: Member, lease: Lease | None = None, capacity: Capacity | None = None) -> GroupSnapshot:
    holder = next((m.key for m in members if m.desired_action is ScaleAction.ACTIVATE), None)
    return GroupSnapshot("gpu", members, active=holder, lease=lease, capacity=capacity)


CASES: dict[str, tuple[Outcome, GroupSnapshot]] = {
    "empty-gpu-goes-to-the-first-in-line": (
        ("b", ElectionReason.DEMAND),
        group(member("a", last=300), member("b", last=1, queued=2, waited=1)),
    ),
    "first-in-line-is-the-highest-priority": (
        ("b", ElectionReason.DEMAND),
        group(member("a", priority=5, queued=1, waited=50), member("b", priority=50, queued=1, waited=1)),
    ),
    "then-the-longest-waiting": (
        ("b", ElectionReason.DEMAND),
        group(member("a", queued=1, waited=5), member("b", queued=1, waited=50)),
    ),
    "nobody-asked-fallback-as-the-seed": (
        ("c", ElectionReason.FALLBACK),
        group(member("a"), member("b", last=400), member("c", priority=50)),
    ),
    "nobody-asked-no-fallback-to-a-model-whose-idle-timeout-ran-out-since-it-was-asked-for": (
        ("b", ElectionReason.FALLBACK),
        group(
            member("a", priority=100, last=240, idle_timeout=timedelta(minutes=3)), member("b", priority=50, last=1800)
        ),
    ),
    "nobody-asked-peers-at-the-top-load-nothing-until-the-first-request": (
        (None, ElectionReason.NO_CANDIDATE),
        group(member("a", priority=50), member("b", priority=50), member("c", priority=5)),
    ),
    "nobody-asked-peers-on-a-card-with-a-capacity-fallback-as-the-seed-the-others-load-beside-it": (
        ("a", ElectionReason.FALLBACK),
        group(member("a", priority=50), member("b", priority=50), capacity=Capacity(1, 24 << 30)),
    ),
    "nobody-asked-one-favourite-among-peers-below-is-the-fallback": (
        ("c", ElectionReason.FALLBACK),
        group(member("a"), member("b"), member("c", priority=50)),
    ),
    "nobody-asked-peers-still-get-back-the-one-used-recently": (
        ("b", ElectionReason.RECENT),
        group(member("a"), member("b", last=200)),
    ),
    "nobody-asked-recent-within-its-idle-timeout": (
        ("a", ElectionReason.RECENT),
        group(member("a", priority=100, last=150, idle_timeout=timedelta(minutes=3)), member("b", priority=50)),
    ),
    "busy-holder-keeps-the-gpu-within-the-bound": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=5, in_flight=1), member("b", queued=9, waited=200)),
    ),
    "bounded-wait-preempts-a-busy-peer": (
        ("b", ElectionReason.MAX_WAIT),
        group(member("a", holds=True, last=1, in_flight=2), member("b", queued=1, waited=241)),
    ),
    "bounded-wait-from-spec-maxWait": (
        ("b", ElectionReason.MAX_WAIT),
        group(
            member("a", holds=True, last=1, in_flight=2),
            dataclasses.replace(member("b", queued=1, waited=31), max_wait=timedelta(seconds=30)),
        ),
    ),
    "bounded-wait-the-longest-overdue-first": (
        ("c", ElectionReason.MAX_WAIT),
        group(
            member("a", holds=True, last=1, in_flight=2),
            member("b", queued=5, waited=250),
            member("c", queued=1, waited=300),
        ),
    ),
    "lower-priority-never-preempts-a-busy-holder": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=1, in_flight=2), member("b", priority=5, queued=50, waited=290)),
    ),
    "higher-priority-with-requests-waiting-preempts-after-the-hold": (
        ("b", ElectionReason.DEMAND),
        group(member("a", priority=5, holds=True, last=1, in_flight=1), member("b", priority=50, queued=1, waited=1)),
    ),
    "hold-pays-for-the-load-30s-loaded-20s-ready": (
        ("a", ElectionReason.COOLDOWN),
        group(
            member("a", priority=5, holds=True, ready_for=20, loaded_in=30, last=1, in_flight=1),
            member("b", priority=50, queued=1, waited=1),
        ),
    ),
    "a-load-with-requests-waiting-is-never-aborted-for-demand": (
        ("a", ElectionReason.COOLDOWN),
        group(member("a", holds=True, ready_for=None, queued=3), member("b", priority=50, queued=1, waited=100)),
    ),
    "a-load-nobody-waits-for-yields": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", holds=True, ready_for=None), member("b", queued=1, waited=1)),
    ),
    "quiet-higher-priority-holder-unasked-2min-yields-to-a-lower-one": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", priority=100, holds=True, last=130), member("b", priority=5, queued=1, waited=1)),
    ),
    "a-peer-just-gone-quiet-keeps-the-gpu-for-one-request": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=12), member("b", queued=1, waited=12)),
    ),
    "a-peer-just-gone-quiet-yields-to-a-burst": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", holds=True, last=12), member("b", queued=30, waited=12)),
    ),
    "a-peer-with-a-few-requests-waits-while-the-holder-was-asked-within-a-minute": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=59), member("b", queued=4, waited=90)),
    ),
    "a-peer-with-a-few-requests-takes-a-holder-not-asked-for-a-minute": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", holds=True, last=60), member("b", queued=1, waited=30)),
    ),
    "a-crowd-of-a-peer-takes-a-quiet-holder-once-its-wait-is-worth-a-load": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", holds=True, last=12), member("b", queued=5, waited=44)),  # 220 >= 240 x (1 - 12/120)
    ),
    "a-crowd-of-a-peer-waits-until-then": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=12), member("b", queued=5, waited=43)),
    ),
    "a-request-of-a-peer-that-waited-the-peer-patience-takes-a-quiet-holder": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", holds=True, last=15), member("b", queued=1, waited=150)),
    ),
    "a-peer-waits-out-a-holder-in-mid-session-past-the-patience-until-then": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=15), member("b", queued=1, waited=149)),
    ),
    "a-crowd-of-a-peer-past-the-patience-still-takes-a-quiet-holder-by-its-weight": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", holds=True, last=15), member("b", queued=5, waited=100)),
    ),
    "a-lower-priority-that-waited-the-patience-takes-a-quiet-holder-too": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", priority=50, holds=True, last=15), member("b", priority=5, queued=1, waited=60)),
    ),
    "a-lower-priority-waits-for-a-quiet-holder-until-then": (
        ("a", ElectionReason.READY),
        group(member("a", priority=50, holds=True, last=15), member("b", priority=5, queued=1, waited=59)),
    ),
    "the-patience-never-preempts-a-busy-holder": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=1, in_flight=1), member("b", queued=1, waited=200)),
    ),
    "a-quiet-peer-nobody-ever-asked-for-yields-to-one-request": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", holds=True, ready_for=11), member("b", queued=1, waited=11)),
    ),
    "a-fallback-nobody-ever-asked-for-yields-at-once-though-just-loaded": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", holds=True, ready_for=1), member("b", queued=1, waited=1)),
    ),
    "not-quiet-within-the-quiet-period": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=5), member("b", queued=30, waited=60)),
    ),
    "a-quiet-guest-yields-to-a-higher-priority-at-once": (
        ("b", ElectionReason.QUIET_YIELD),
        group(member("a", priority=5, holds=True, last=11), member("b", priority=50, queued=1, waited=1)),
    ),
    "a-demand-message-alone-never-preempts-a-busy-holder": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=1, in_flight=1), member("b", last=1, waited=300)),
    ),
    "what-a-parked-model-served-before-is-no-demand": (
        ("a", ElectionReason.READY),
        group(member("a", holds=True, last=200), member("b", last=250, idle_parked=250)),
    ),
    "a-swapCooldown-the-user-set-holds-as-the-seed": (
        ("a", ElectionReason.COOLDOWN),
        group(
            member("a", holds=True, last=1, in_flight=1, cooldown=timedelta(minutes=5)),
            member("b", priority=50, queued=1, waited=1, preempted=60),
        ),
    ),
    "force-promotion-wins": (
        ("b", ElectionReason.FORCE_PROMOTION),
        group(member("a", holds=True, last=1, in_flight=1), member("b", priority=-5, force=True)),
    ),
    "a-lease-beats-everything": (
        (None, ElectionReason.LEASE),
        group(
            member("a", holds=True, last=1, in_flight=1), lease=Lease("l", "gpu", "trainer", NOW + timedelta(minutes=1))
        ),
    ),
    "idle-timeout-parks-the-holder": (
        ("b", ElectionReason.FALLBACK),
        group(member("a", holds=True, last=400, idle_timeout=timedelta(minutes=5)), member("b")),
    ),
}


@pytest.mark.parametrize(("snapshot", "leader", "reason"), rules(CASES))
def test_flexinfer_policy(snapshot: GroupSnapshot, leader: str | None, reason: ElectionReason) -> None:
    election = choose_flexinfer_leader(snapshot, NOW, PARAMS)
    assert outcome(election) == (leader, reason)
    assert elect(snapshot, NOW, PARAMS) == election  # the default policy


def test_the_hold_follows_the_measured_load_within_its_bounds() -> None:
    for loaded_in, expected in ((30, 30), (2, 10), (900, 300)):
        holder = member("a", holds=True, ready_for=0, loaded_in=loaded_in, last=0, in_flight=1)
        snapshot = group(holder, member("b"))
        assert cooldown_remaining(snapshot, NOW, PARAMS) == timedelta(seconds=expected)


@pytest.mark.parametrize(
    ("queue_timeout", "window", "quiet_yield", "drain", "quiet", "bound", "share"),
    [
        pytest.param(300, 120, None, 60, 10, 200, 240, id="the-defaults-leave-a-drain-and-a-load-before-the-timeout"),
        pytest.param(300, 120, None, 200, 10, 150, 240, id="a-long-drain-leaves-at-least-half-the-timeout"),
        pytest.param(45, 120, None, 60, 10, 22.5, 36, id="a-short-queue-timeout-shortens-the-bound-and-the-yield"),
        pytest.param(45, 2, None, 60, 2, 22.5, 36, id="a-short-demand-window-shortens-the-quiet-period"),
        pytest.param(45, 2, 30, 60, 30, 22.5, 36, id="FLEXINFER_QUIET_YIELD-wins"),
        pytest.param(3600, 120, None, 60, 10, 240, 240, id="a-long-queue-timeout-keeps-4-min"),
    ],
)
def test_the_defaults_fit_the_timings_a_user_set(
    queue_timeout: float,
    window: float,
    quiet_yield: float | None,
    drain: float,
    quiet: float,
    bound: float,
    share: float,
) -> None:
    """The bounded wait leaves the busy holder's drain and a load (40 s) before the queue timeout, within [half the
    timeout, 4 min]; what a quiet holder's yield waits for (it parks at once) is at most four fifths of it."""
    seconds = timedelta(seconds=1)
    params = ElectionParams(demand_window=window * seconds).fitted_to(
        queue_timeout * seconds, quiet_yield * seconds if quiet_yield is not None else None, drain * seconds
    )
    assert params.quiet_period == quiet * seconds
    assert params.max_wait(member("b")) == bound * seconds
    assert params.yield_after == share * seconds
    assert params.patience == min(60, share) * seconds
    assert params.peer_patience == min(150, share) * seconds
    assert params.session_gap == min(60, window) * seconds
    assert params.max_wait(dataclasses.replace(member("b"), max_wait=timedelta(seconds=90))) == timedelta(seconds=90)


def test_under_a_short_queue_timeout_one_request_takes_a_quiet_gpu_before_it_times_out() -> None:
    """A lower priority has no bounded wait; its one request behind a quiet holder asked 31 s ago waits for its wait
    to be worth a load. With the default 240 request-seconds that is past a 45 s queue timeout (the GPU idle all
    along); fitted to the timeout, 36 request-seconds, it takes the GPU."""
    snapshot = group(member("a", priority=50, holds=True, last=31), member("b", priority=10, queued=1, waited=30))
    assert outcome(choose_flexinfer_leader(snapshot, NOW, PARAMS)) == ("a", ElectionReason.READY)
    fitted = PARAMS.fitted_to(timedelta(seconds=45))
    assert outcome(choose_flexinfer_leader(snapshot, NOW, fitted)) == ("b", ElectionReason.QUIET_YIELD)


@pytest.mark.parametrize("by", ["setting", "group"])
def test_the_seed_policy_is_one_setting_away(by: str) -> None:
    """A quiet peer holder yields to a burst under FlexInfer's policy; the seed keeps it until it was not asked for
    the demand window (2 min), whether chosen by the setting or by the group's ``spec.scheduling``."""
    snapshot = group(member("a", holds=True, last=30), member("b", last=1, queued=30, waited=30))
    assert elect(snapshot, NOW, PARAMS).leader == ModelKey("default", "b")
    if by == "setting":
        seed = elect(snapshot, NOW, ElectionParams(policy=SchedulingPolicy.SEED))
    else:
        seed = elect(GroupSnapshot(**{**snapshot.__dict__, "scheduling": SchedulingPolicy.SEED}), NOW, PARAMS)
    assert seed.leader == ModelKey("default", "a") and seed.reason == ElectionReason.READY


@pytest.mark.parametrize(
    ("snapshot", "after"),
    [
        pytest.param(
            group(member("a", holds=True, last=3), member("b", last=3, queued=30, waited=3)),
            7,
            id="a-holder-yields-to-a-crowd-when-its-quiet-period-ends",
        ),
        pytest.param(
            group(
                member("a", holds=True, ready_for=5, loaded_in=30, last=1, in_flight=1),
                member("b", priority=20, last=5, queued=1, waited=5),
            ),
            25,
            id="a-busy-holder-gives-way-to-a-higher-priority-when-its-hold-ends",
        ),
        pytest.param(
            group(member("a", holds=True, last=30), member("b", priority=5, last=40, queued=1, waited=40)),
            20,
            id="a-lower-priority-when-its-patience-ends",
        ),
        pytest.param(
            group(member("a", holds=True, last=1, in_flight=1), member("b", last=230, queued=1, waited=230)),
            10,
            id="a-peer-behind-a-busy-holder-when-its-bound-ends",
        ),
        pytest.param(
            group(member("a", holds=True, last=20), member("b", last=10, queued=5, waited=10)),
            150 / 7,
            id="a-crowd-when-its-wait-is-worth-a-load-as-the-quiet-holder-cools",
        ),
        pytest.param(group(member("a", holds=True, last=600), member("b")), None, id="nothing-ends-by-time"),
    ],
)
def test_a_group_is_passed_again_when_a_rule_of_time_ends(snapshot: GroupSnapshot, after: float | None) -> None:
    """``next_change``: the first instant a rule of time could change the election with nothing reported; the
    scheduler passes the group again then (not at its next reconcile). In each row b is elected at that instant
    and not a moment before."""
    change = next_change(snapshot, NOW, PARAMS)
    if after is None:
        assert change is None
        return
    assert change is not None
    assert abs((change - NOW).total_seconds() - after) < 1e-6
    b = ModelKey("default", "b")
    assert elect(snapshot, change - timedelta(milliseconds=1), PARAMS).leader != b
    assert elect(snapshot, change + timedelta(microseconds=1), PARAMS).leader == b


def test_the_seeds_policy_acts_at_its_reconcile_only() -> None:
    """The seed's policy (and a v1alpha1 group) is passed at the reconcile, as the seed was: no ``next_change``."""
    snapshot = group(member("a", holds=True, last=3), member("b", last=3, queued=30, waited=3))
    assert next_change(snapshot, NOW, PARAMS) is not None
    assert next_change(snapshot, NOW, ElectionParams(policy=SchedulingPolicy.SEED)) is None
