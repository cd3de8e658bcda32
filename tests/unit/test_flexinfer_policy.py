"""FlexInfer's default policy (``choose_flexinfer_leader``), one row per rule of its docstring, and the seed's
exact election one setting away (``policy=seed``)."""

from __future__ import annotations

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
)
from flexinfer_scheduler.domain.model import GroupSnapshot, Lease, Member

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
    ready_since = s(ready_for) if holds and ready_for is not None else None
    issued = s((ready_for or 0) + loaded_in) if holds else None
    runtime = (RuntimePhase.READY if ready_for is not None else RuntimePhase.LOADING).value if holds else None
    return Member(
        key=ModelKey("default", name),
        priority=priority,
        last_active_time=s(last) if last is not None else None,
        preempted_at=s(preempted) if preempted is not None else None,
        idle_parked_at=s(idle_parked) if idle_parked is not None else None,
        swap_cooldown=cooldown,
        idle_timeout=idle_timeout,
        force_promotion=force,
        runtime=runtime,
        desired_action=ScaleAction.ACTIVATE if holds else None,
        command_generation=1 if holds else 0,
        runtime_generation=1 if holds else 0,
        command_issued_at=issued,
        ready_since=ready_since,
        demand_since=s(waited) if waited is not None else None,
        queued=queued,
        in_flight=in_flight,
    )


def group(*members: Member, lease: Lease | None = None) -> GroupSnapshot:
    holder = next((m.key for m in members if m.desired_action is ScaleAction.ACTIVATE), None)
    return GroupSnapshot("gpu", members, active=holder, lease=lease)


CASES = [
    pytest.param(
        group(member("a", last=300), member("b", last=1, queued=2, waited=1)),
        "b",
        ElectionReason.DEMAND,
        id="empty-gpu-goes-to-the-first-in-line",
    ),
    pytest.param(
        group(member("a", priority=5, queued=1, waited=50), member("b", priority=50, queued=1, waited=1)),
        "b",
        ElectionReason.DEMAND,
        id="first-in-line-is-the-highest-priority",
    ),
    pytest.param(
        group(member("a", queued=1, waited=5), member("b", queued=1, waited=50)),
        "b",
        ElectionReason.DEMAND,
        id="then-the-longest-waiting",
    ),
    pytest.param(
        group(member("a"), member("b", last=400), member("c", priority=50)),
        "c",
        ElectionReason.FALLBACK,
        id="nobody-asked-fallback-as-the-seed",
    ),
    pytest.param(
        group(member("a", holds=True, last=5, in_flight=1), member("b", queued=9, waited=200)),
        "a",
        ElectionReason.READY,
        id="busy-holder-keeps-the-gpu-within-the-bound",
    ),
    pytest.param(
        group(member("a", holds=True, last=1, in_flight=2), member("b", queued=1, waited=241)),
        "b",
        ElectionReason.MAX_WAIT,
        id="bounded-wait-preempts-a-busy-peer",
    ),
    pytest.param(
        group(member("a", holds=True, last=1, in_flight=2), member("b", priority=5, queued=50, waited=290)),
        "a",
        ElectionReason.READY,
        id="lower-priority-never-preempts-a-busy-holder",
    ),
    pytest.param(
        group(member("a", priority=5, holds=True, last=1, in_flight=1), member("b", priority=50, queued=1, waited=1)),
        "b",
        ElectionReason.DEMAND,
        id="higher-priority-with-requests-waiting-preempts-after-the-hold",
    ),
    pytest.param(
        group(
            member("a", priority=5, holds=True, ready_for=20, loaded_in=30, last=1, in_flight=1),
            member("b", priority=50, queued=1, waited=1),
        ),
        "a",
        ElectionReason.COOLDOWN,
        id="hold-pays-for-the-load-30s-loaded-20s-ready",
    ),
    pytest.param(
        group(member("a", holds=True, ready_for=None, queued=3), member("b", priority=50, queued=1, waited=100)),
        "a",
        ElectionReason.COOLDOWN,
        id="a-load-with-requests-waiting-is-never-aborted-for-demand",
    ),
    pytest.param(
        group(member("a", holds=True, ready_for=None), member("b", queued=1, waited=1)),
        "b",
        ElectionReason.QUIET_YIELD,
        id="a-load-nobody-waits-for-yields",
    ),
    pytest.param(
        group(member("a", priority=100, holds=True, last=130), member("b", priority=5, queued=1, waited=1)),
        "b",
        ElectionReason.QUIET_YIELD,
        id="quiet-higher-priority-holder-unasked-2min-yields-to-a-lower-one",
    ),
    pytest.param(
        group(member("a", holds=True, last=12), member("b", queued=1, waited=12)),
        "a",
        ElectionReason.READY,
        id="a-peer-just-gone-quiet-keeps-the-gpu-for-one-request",
    ),
    pytest.param(
        group(member("a", holds=True, last=12), member("b", queued=30, waited=12)),
        "b",
        ElectionReason.QUIET_YIELD,
        id="a-peer-just-gone-quiet-yields-to-a-burst",
    ),
    pytest.param(
        group(member("a", holds=True, ready_for=11), member("b", queued=1, waited=11)),
        "b",
        ElectionReason.QUIET_YIELD,
        id="a-quiet-peer-nobody-ever-asked-for-yields-to-one-request",
    ),
    pytest.param(
        group(member("a", holds=True, ready_for=1), member("b", queued=1, waited=1)),
        "b",
        ElectionReason.QUIET_YIELD,
        id="a-fallback-nobody-ever-asked-for-yields-at-once-though-just-loaded",
    ),
    pytest.param(
        group(member("a", holds=True, last=5), member("b", queued=30, waited=60)),
        "a",
        ElectionReason.READY,
        id="not-quiet-within-the-quiet-period",
    ),
    pytest.param(
        group(member("a", priority=5, holds=True, last=11), member("b", priority=50, queued=1, waited=1)),
        "b",
        ElectionReason.QUIET_YIELD,
        id="a-quiet-guest-yields-to-a-higher-priority-at-once",
    ),
    pytest.param(
        group(member("a", holds=True, last=1, in_flight=1), member("b", last=1, waited=300)),
        "a",
        ElectionReason.READY,
        id="a-demand-message-alone-never-preempts-a-busy-holder",
    ),
    pytest.param(
        group(member("a", holds=True, last=200), member("b", last=250, idle_parked=250)),
        "a",
        ElectionReason.READY,
        id="what-a-parked-model-served-before-is-no-demand",
    ),
    pytest.param(
        group(
            member("a", holds=True, last=1, in_flight=1, cooldown=timedelta(minutes=5)),
            member("b", priority=50, queued=1, waited=1, preempted=60),
        ),
        "a",
        ElectionReason.COOLDOWN,
        id="a-swapCooldown-the-user-set-holds-as-the-seed",
    ),
    pytest.param(
        group(
            member("a", holds=True, last=1, in_flight=1),
            member("b", priority=-5, force=True),
        ),
        "b",
        ElectionReason.FORCE_PROMOTION,
        id="force-promotion-wins",
    ),
    pytest.param(
        group(
            member("a", holds=True, last=1, in_flight=1),
            lease=Lease("l", "gpu", "trainer", NOW + timedelta(minutes=1)),
        ),
        None,
        ElectionReason.LEASE,
        id="a-lease-beats-everything",
    ),
    pytest.param(
        group(member("a", holds=True, last=400, idle_timeout=timedelta(minutes=5)), member("b")),
        "b",
        ElectionReason.FALLBACK,
        id="idle-timeout-parks-the-holder",
    ),
]


@pytest.mark.parametrize(("snapshot", "leader", "reason"), CASES)
def test_flexinfer_policy(snapshot: GroupSnapshot, leader: str | None, reason: ElectionReason) -> None:
    election = choose_flexinfer_leader(snapshot, NOW, PARAMS)
    assert (election.leader.name if election.leader else None, election.reason) == (leader, reason)
    assert elect(snapshot, NOW, PARAMS) == election  # the default policy


def test_the_hold_follows_the_measured_load_within_its_bounds() -> None:
    for loaded_in, expected in ((30, 30), (2, 10), (900, 300)):
        holder = member("a", holds=True, ready_for=0, loaded_in=loaded_in, last=0, in_flight=1)
        snapshot = group(holder, member("b"))
        assert cooldown_remaining(snapshot, NOW, PARAMS) == timedelta(seconds=expected)


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
