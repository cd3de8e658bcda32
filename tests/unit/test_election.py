"""The v1alpha2 election of the seed, one row per rule ("Leader Election Algorithm (v1alpha2)", "Priority
semantics", "Anti-Thrashing Mechanics", "Demand Signaling Lifecycle", "Training on a shared card")."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flexinfer_common.enums import RuntimePhase, SchedulingPolicy
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import ElectionParams, ElectionReason, choose_shared_group_leader, elect
from flexinfer_scheduler.domain.model import GroupSnapshot, Lease, Member
from tests.support.elections import Outcome, outcome, rules
from tests.support.members import member

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
#: the seed's exact rules, what FLEXINFER_SCHEDULING_POLICY=seed runs
SEED = ElectionParams().seed()


def ago(**kw: float) -> datetime:
    return NOW - timedelta(**kw)


def model(
    name: str,
    *,
    priority: int = 0,
    ready: bool = False,
    loading: bool = False,
    active: datetime | None = None,
    preempted: datetime | None = None,
    cooldown: timedelta | None = None,
    idle_timeout: timedelta | None = None,
    ready_since: datetime | None = None,
    force: bool = False,
    idle_parked: datetime | None = None,
    failed: datetime | None = None,
    waiting: timedelta | None = None,
    max_wait: timedelta | None = None,
) -> Member:
    return member(
        name,
        runtime=RuntimePhase.READY if ready else RuntimePhase.LOADING if loading else None,
        priority=priority,
        last_active_time=active,
        preempted_at=preempted,
        swap_cooldown=cooldown,
        idle_timeout=idle_timeout,
        force_promotion=force,
        ready_since=ready_since,
        idle_parked_at=idle_parked,
        failed_at=failed,
        demand_since=None if waiting is None else NOW - waiting,
        queued=0 if waiting is None else 1,  # requests wait for it
        max_wait=max_wait,
    )


def group(*members: Member, active: str | None = None, lease: Lease | None = None) -> GroupSnapshot:
    return GroupSnapshot(
        name="gpu",
        members=members,
        active=ModelKey("default", active) if active else None,
        lease=lease,
    )


def swap_back(
    preempted: datetime, *, priority: int = 0, cooldowns: tuple[timedelta | None, timedelta | None] = (None, None)
) -> GroupSnapshot:
    """Stage 1's cast: "a" holds the GPU it took from "b" at ``preempted``, and "b" (at ``priority``) was asked for
    5 s ago. ``cooldowns``: the swapCooldown of "a" and of "b" (None: the default)."""
    return group(
        model("a", ready=True, cooldown=cooldowns[0]),
        model("b", priority=priority, active=ago(seconds=5), preempted=preempted, cooldown=cooldowns[1]),
        active="a",
    )


def gate(holder_priority: int, holder_active: datetime | None, priority: int) -> GroupSnapshot:
    """Stage 3's cast: "a" holds the GPU (Ready, its last request at ``holder_active``; None: never used) and "b",
    at ``priority``, was asked for a second ago: the priority gate's rows differ in these three alone."""
    return group(
        model("a", priority=holder_priority, ready=True, active=holder_active),
        model("b", priority=priority, active=ago(seconds=1)),
        active="a",
    )


CASES: dict[str, tuple[Outcome, GroupSnapshot]] = {
    # Stage 1 — anti-thrashing
    "cooldown-holds-active-against-higher-priority-demand": (
        ("a", ElectionReason.COOLDOWN),
        swap_back(ago(minutes=1), priority=100),
    ),
    "cooldown-over-after-5-minutes-default": (("b", ElectionReason.DEMAND), swap_back(ago(minutes=5, seconds=1))),
    "cooldown-is-the-maximum-swapCooldown-of-the-group": (
        ("a", ElectionReason.COOLDOWN),
        swap_back(ago(minutes=7), cooldowns=(timedelta(minutes=10), timedelta(minutes=3))),
    ),
    "per-model-swapCooldown-override-shortens-it": (
        ("b", ElectionReason.DEMAND),
        swap_back(ago(minutes=3), cooldowns=(timedelta(minutes=2), timedelta(minutes=2))),
    ),
    # Stage 3 — demand-based preemption and the priority gate
    "equal-priority-demand-preempts-idle-incumbent": (("b", ElectionReason.DEMAND), gate(100, ago(minutes=3), 100)),
    "higher-priority-demand-preempts-idle-incumbent": (("b", ElectionReason.DEMAND), gate(100, ago(minutes=3), 200)),
    "lower-priority-demand-never-preempts-even-idle-incumbent": (
        ("a", ElectionReason.READY),
        gate(200, ago(minutes=3), 100),
    ),
    "busy-incumbent-is-not-preempted-even-by-higher-priority": (
        ("a", ElectionReason.READY),
        gate(100, ago(seconds=30), 200),
    ),
    "incumbent-never-used-counts-as-idle": (("b", ElectionReason.DEMAND), gate(0, None, 0)),
    "demand-expires-after-2-minutes": (
        ("a", ElectionReason.READY),
        group(model("a", ready=True, active=ago(minutes=3)), model("b", active=ago(minutes=2, seconds=1)), active="a"),
    ),
    "demanded-wins-when-nothing-is-loaded": (
        ("b", ElectionReason.DEMAND),
        group(model("a", priority=10), model("b", priority=5, active=ago(seconds=3))),
    ),
    # Stage 2 tie-breaks within a category
    "demanded-tie-break-highest-priority": (
        ("c", ElectionReason.DEMAND),
        group(
            model("a", priority=100, ready=True, active=ago(minutes=9)),
            model("b", priority=50, active=ago(seconds=2)),
            model("c", priority=100, active=ago(seconds=10)),
            active="a",
        ),
    ),
    "tie-break-most-recent-lastActiveTime": (
        ("c", ElectionReason.DEMAND),
        group(model("b", priority=10, active=ago(seconds=50)), model("c", priority=10, active=ago(seconds=5))),
    ),
    "tie-break-alphabetical-name": (
        ("alpha", ElectionReason.DEMAND),
        group(model("zeta", priority=10, active=ago(seconds=5)), model("alpha", priority=10, active=ago(seconds=5))),
    ),
    # Stage 4 — fallback order
    "fallback-ready-leader-first": (
        ("a", ElectionReason.READY),
        group(
            model("a", priority=1, ready=True, active=ago(minutes=10)), model("b", priority=9, active=ago(minutes=4))
        ),
    ),
    "fallback-recent-leader-before-plain-fallback": (
        ("a", ElectionReason.RECENT),
        group(model("a", priority=1, active=ago(minutes=4)), model("b", priority=9)),
    ),
    "fallback-leader-highest-priority-when-nothing-else": (
        ("b", ElectionReason.FALLBACK),
        group(model("a", priority=1), model("b", priority=9)),
    ),
    "recent-window-is-5-minutes": (
        ("b", ElectionReason.FALLBACK),
        group(model("a", priority=1, active=ago(minutes=6)), model("b", priority=9)),
    ),
    "a-loading-leader-counts-as-ready-so-fallback-does-not-flip": (
        ("a", ElectionReason.READY),
        group(model("a", priority=100, loading=True), model("b", priority=100, active=ago(minutes=3))),
    ),
    # Idle timeout and failed loads
    "idle-timeout-parks-incumbent-and-lower-priority-gets-gpu": (
        ("b", ElectionReason.DEMAND),
        group(
            model(
                "a",
                priority=200,
                ready=True,
                ready_since=ago(minutes=20),
                active=ago(minutes=11),
                idle_timeout=timedelta(minutes=10),
            ),
            model("b", priority=100, active=ago(seconds=3)),
            active="a",
        ),
    ),
    "idle-parked-model-not-re-elected-without-new-demand": (
        ("b", ElectionReason.FALLBACK),
        group(model("a", priority=200, idle_parked=ago(minutes=1), active=ago(minutes=12)), model("b", priority=100)),
    ),
    "idle-parked-model-re-elected-after-a-request": (
        ("a", ElectionReason.DEMAND),
        group(model("a", priority=200, idle_parked=ago(minutes=1), active=ago(seconds=2)), model("b", priority=100)),
    ),
    "failed-model-left-out-until-asked-again": (
        ("b", ElectionReason.FALLBACK),
        group(model("a", priority=200, failed=ago(seconds=30), active=ago(minutes=1)), model("b", priority=100)),
    ),
    # Overrides
    "forcePromotion-beats-cooldown-priority-and-busy-incumbent": (
        ("b", ElectionReason.FORCE_PROMOTION),
        group(
            model("a", priority=100, ready=True, active=ago(seconds=1)),
            model("b", priority=1, force=True, preempted=ago(seconds=10)),
            active="a",
        ),
    ),
    "gpu-lease-beats-even-forcePromotion": (
        (None, ElectionReason.LEASE),
        group(
            model("a", ready=True, active=ago(seconds=1)),
            model("b", force=True),
            lease=Lease("l", "gpu", "trainer", NOW + timedelta(minutes=5)),
            active="a",
        ),
    ),
    "expired-lease-is-ignored-at-expiresAt": (
        ("a", ElectionReason.READY),
        group(model("a", ready=True), lease=Lease("l", "gpu", "trainer", NOW), active="a"),
    ),
}


BUSY = ago(seconds=5)  # the loaded model answered a request 5 s ago: busy, never idle


@pytest.mark.parametrize(("snapshot", "leader", "reason"), rules(CASES))
def test_choose_shared_group_leader(snapshot: GroupSnapshot, leader: str | None, reason: ElectionReason) -> None:
    election = choose_shared_group_leader(snapshot, NOW, SEED)
    assert outcome(election) == (leader, reason)


def test_lease_detail_names_the_owner() -> None:
    snapshot = group(model("a", ready=True), lease=Lease("l", "gpu", "trainer", NOW + timedelta(minutes=1)))
    assert choose_shared_group_leader(snapshot, NOW, SEED).detail == "gpu-lease/trainer"


def test_idle_timeout_reports_the_expired_member() -> None:
    snapshot = group(model("a", ready=True, ready_since=ago(minutes=6), idle_timeout=timedelta(minutes=5)), active="a")
    election = choose_shared_group_leader(snapshot, NOW, SEED)
    assert election.leader is None
    assert election.idle_expired == (ModelKey("default", "a"),)


def test_the_seeds_exact_rules_never_preempt_a_busy_leader() -> None:
    """The seed has no bounded wait: a busy leader keeps the GPU however long a peer waits."""
    snapshot = group(
        model("a", ready=True, active=BUSY), model("b", active=ago(seconds=1), waiting=timedelta(hours=1)), active="a"
    )
    election = choose_shared_group_leader(snapshot, NOW, SEED)
    assert (election.leader, election.reason) == (ModelKey("default", "a"), ElectionReason.READY)


def test_under_the_seeds_stages_lower_priority_never_takes_a_quiet_leaders_gpu() -> None:
    """Under the seed's four stages, as in the seed's "Lower-Priority Model Never
    Activates", a lower-priority model waits for the holder's idle timeout, however long the holder has been idle
    (FlexInfer's policy yields a quiet GPU instead: tests/unit/test_flexinfer_policy.py)."""
    snapshot = group(
        model("a", priority=100, ready=True, active=ago(minutes=10)),
        model("b", priority=50, active=ago(seconds=1), waiting=timedelta(hours=1)),
        active="a",
    )
    election = choose_shared_group_leader(snapshot, NOW, SEED)
    assert (election.leader, election.reason) == (ModelKey("default", "a"), ElectionReason.READY)


@pytest.mark.parametrize(("snapshot", "leader", "reason"), rules(CASES))
def test_the_seed_policy_runs_every_seed_rule(
    snapshot: GroupSnapshot, leader: str | None, reason: ElectionReason
) -> None:
    """FLEXINFER_SCHEDULING_POLICY=seed (or a group's ``spec.scheduling: seed``) runs exactly these rows."""
    election = elect(snapshot, NOW, ElectionParams(policy=SchedulingPolicy.SEED))
    assert outcome(election) == (leader, reason)
