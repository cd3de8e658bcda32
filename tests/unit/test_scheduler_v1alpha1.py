"""The v1alpha1 ``GPUGroup`` election (``determine_active_model``), one row per rule of the seed ("Timing constants",
"Priority semantics" for v1alpha1) and docs/reference.md section 6: hysteresis 10 s (a delay: a challenger's demand must
persist that long before it takes the GPU, as in the seed's ``determineActiveModel``), request queue threshold 3,
minimum run duration 30 s (the v1alpha1 swap cooldown), cooldown after preemption 60 s, idle timeout 300 s, demanded
models sorted by priority descending, a GPU lease beats everything, forcePromotion beats the rest.

``Member.queued`` is already the sum over proxies (``Store.load_world`` sums each source's latest count).
"""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from flexinfer_common.enums import GroupPolicy, RuntimePhase
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import ElectionParams, ElectionReason, determine_active_model, elect
from flexinfer_scheduler.domain.model import GroupSnapshot, Lease, Member, V1Alpha1Policy
from flexinfer_scheduler.domain.plan import plan_group
from tests.support.elections import Outcome, outcome, rules
from tests.support.members import member

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
POLICY = V1Alpha1Policy()


def ago(**kw: float) -> datetime:
    return NOW - timedelta(**kw)


def model(
    name: str,
    *,
    priority: int = 100,
    queued: int = 0,
    active: datetime | None = None,
    ready: bool = False,
    ready_since: datetime | None = None,
    preempted: datetime | None = None,
    idle_timeout: timedelta | None = None,
    idle_parked: datetime | None = None,
    failed: datetime | None = None,
    force: bool = False,
    promoted: datetime | None = None,
    demand_since: datetime | None = None,
) -> Member:
    return member(
        name,
        runtime=RuntimePhase.READY if ready else None,
        priority=priority,
        queued=queued,
        last_active_time=active,
        preempted_at=preempted,
        idle_timeout=idle_timeout,
        idle_parked_at=idle_parked,
        failed_at=failed,
        force_promotion=force,
        promoted_at=promoted,
        demand_since=demand_since,
        ready_since=(ready_since or ago(minutes=10)) if ready else None,
    )


def serving(
    name: str = "a",
    *,
    priority: int = 100,
    idle: timedelta | None = timedelta(minutes=2),
    ready_since: datetime | None = None,
    idle_timeout: timedelta | None = None,
) -> Member:
    """The incumbent: Ready (since ten minutes ago by default), its last request ``idle`` ago (None: never used)."""
    return model(
        name,
        priority=priority,
        ready=True,
        active=None if idle is None else NOW - idle,
        ready_since=ready_since,
        idle_timeout=idle_timeout,
    )


def demand(
    name: str = "b",
    *,
    priority: int = 100,
    queued: int = 3,
    seen: timedelta = timedelta(seconds=1),
    lasted: timedelta = timedelta(seconds=15),
) -> Member:
    """A model with ``queued`` requests waiting, last signalled ``seen`` ago, its demand (at or over the threshold)
    lasting for ``lasted`` (past the 10 s hysteresis by default)."""
    return model(name, priority=priority, queued=queued, active=NOW - seen, demand_since=NOW - lasted)


def group(
    *members: Member,
    active: str | None = None,
    leader_since: datetime | None = None,
    lease: Lease | None = None,
    policy: V1Alpha1Policy = POLICY,
) -> GroupSnapshot:
    return GroupSnapshot(
        name="gpu",
        members=members,
        policy=GroupPolicy.V1ALPHA1,
        v1alpha1=policy,
        active=ModelKey("default", active) if active else None,
        leader_since=leader_since if leader_since is not None else (ago(minutes=10) if active else None),
        lease=lease,
    )


CASES: dict[str, tuple[Outcome, GroupSnapshot]] = {
    # Hysteresis: a challenger's demand must have lasted 10 s before it takes the GPU; the incumbent holds meanwhile.
    "hysteresis-demand-lasting-10s-swaps": (
        ("b", ElectionReason.DEMAND),
        group(serving(), demand(lasted=timedelta(seconds=10)), active="a"),
    ),
    "hysteresis-demand-younger-than-10s-waits": (
        ("a", ElectionReason.HYSTERESIS),
        group(serving(), demand(lasted=timedelta(seconds=9)), active="a"),
    ),
    "hysteresis-three-requests-for-an-idle-group-do-not-swap-at-once": (
        ("a", ElectionReason.HYSTERESIS),
        group(serving(), demand(lasted=timedelta(0)), active="a"),
    ),
    "hysteresis-window-from-policy": (
        ("a", ElectionReason.HYSTERESIS),
        group(
            serving(),
            demand(lasted=timedelta(seconds=25)),
            active="a",
            policy=V1Alpha1Policy(hysteresis_window=timedelta(seconds=30)),
        ),
    ),
    "hysteresis-holds-for-the-winner-not-for-a-lower-challenger": (
        ("a", ElectionReason.HYSTERESIS),
        group(
            serving(priority=50),
            demand("b", priority=50),
            demand("c", priority=100, lasted=timedelta(seconds=2)),
            active="a",
        ),
    ),
    "hysteresis-does-not-delay-loading-an-empty-gpu": (
        ("b", ElectionReason.DEMAND),
        group(model("a"), demand("b", lasted=timedelta(0))),
    ),
    # Request queue threshold: 3 requests (summed over proxies) justify a swap.
    "queue-threshold-3-requests-swaps": (("b", ElectionReason.DEMAND), group(serving(), demand(queued=3), active="a")),
    "queue-below-threshold-does-not-swap": (
        ("a", ElectionReason.READY),
        group(serving(), demand(queued=2), active="a"),
    ),
    "queue-threshold-from-policy": (
        ("b", ElectionReason.DEMAND),
        group(serving(), demand(queued=1), active="a", policy=V1Alpha1Policy(request_queue_threshold=1)),
    ),
    "queue-below-threshold-still-loads-an-empty-gpu": (
        ("b", ElectionReason.DEMAND),
        group(model("a"), demand(queued=1)),
    ),
    # Minimum run duration: the incumbent keeps the GPU for 30 s after it was elected.
    "minimum-run-30s-holds-the-incumbent": (
        ("a", ElectionReason.MINIMUM_RUN),
        group(serving(), demand(), active="a", leader_since=ago(seconds=29)),
    ),
    "minimum-run-over-at-30s": (
        ("b", ElectionReason.DEMAND),
        group(serving(), demand(), active="a", leader_since=ago(seconds=30)),
    ),
    "minimum-run-from-policy": (
        ("a", ElectionReason.MINIMUM_RUN),
        group(
            serving(),
            demand(),
            active="a",
            leader_since=ago(seconds=50),
            policy=V1Alpha1Policy(minimum_run_duration=timedelta(seconds=60)),
        ),
    ),
    # Cooldown after preemption: a preempted model may not take the GPU back within 60 s.
    "preempted-model-cannot-return-within-60s": (
        ("a", ElectionReason.COOLDOWN),
        group(
            serving(),
            model("b", queued=3, active=ago(seconds=1), preempted=ago(seconds=59), demand_since=ago(seconds=15)),
            active="a",
        ),
    ),
    "preempted-model-returns-after-60s": (
        ("b", ElectionReason.DEMAND),
        group(
            serving(),
            model("b", queued=3, active=ago(seconds=1), preempted=ago(seconds=60), demand_since=ago(seconds=15)),
            active="a",
        ),
    ),
    "another-models-preemption-does-not-stretch-the-30s-swap-cooldown": (
        ("b", ElectionReason.DEMAND),
        group(serving(), demand(), model("c", preempted=ago(seconds=20)), active="a", leader_since=ago(seconds=30)),
    ),
    "cooldown-after-preemption-from-policy": (
        ("a", ElectionReason.COOLDOWN),
        group(
            serving(),
            model("b", queued=3, active=ago(seconds=1), preempted=ago(seconds=100), demand_since=ago(seconds=15)),
            active="a",
            policy=V1Alpha1Policy(cooldown_after_preemption=timedelta(seconds=120)),
        ),
    ),
    "cooldown-never-keeps-an-empty-gpu-empty": (
        ("b", ElectionReason.DEMAND),
        group(model("a"), model("b", queued=3, active=ago(seconds=1), preempted=ago(seconds=5))),
    ),
    # Idle timeout: an incumbent without a request for 300 s is parked.
    "idle-timeout-300s-parks-the-incumbent": (
        (None, ElectionReason.NO_CANDIDATE),
        group(serving(idle=timedelta(seconds=300)), active="a"),
    ),
    "idle-timeout-not-before-300s": (
        ("a", ElectionReason.READY),
        group(serving(idle=timedelta(seconds=299)), active="a"),
    ),
    "idle-timeout-counts-from-ready-when-never-used": (
        (None, ElectionReason.NO_CANDIDATE),
        group(serving(idle=None, ready_since=ago(seconds=300)), active="a"),
    ),
    "idle-timeout-from-policy": (
        (None, ElectionReason.NO_CANDIDATE),
        group(
            serving(idle=timedelta(seconds=200)), active="a", policy=V1Alpha1Policy(idle_timeout=timedelta(seconds=120))
        ),
    ),
    "idle-parked-incumbent-hands-the-gpu-to-a-waiting-model": (
        ("b", ElectionReason.DEMAND),
        group(serving(priority=200, idle=timedelta(seconds=400)), demand(priority=50, queued=1), active="a"),
    ),
    # Priority: demanded models sort by priority descending; a busy incumbent takes part in the sort.
    "demanded-sorted-by-priority-desc": (
        ("c", ElectionReason.DEMAND),
        group(model("a"), demand("b", priority=50), demand("c", priority=100)),
    ),
    "equal-priority-most-recent-demand-first": (
        ("c", ElectionReason.DEMAND),
        group(model("a"), demand("b", seen=timedelta(seconds=5)), demand("c", seen=timedelta(seconds=2))),
    ),
    "equal-priority-equal-time-alphabetical": (
        ("alpha", ElectionReason.DEMAND),
        group(model("a"), demand("zeta"), demand("alpha")),
    ),
    "highest-priority-demand-wins-over-more-recent-lower": (
        ("c", ElectionReason.DEMAND),
        group(
            serving(priority=50),
            demand("b", priority=50),
            demand("c", priority=100, seen=timedelta(seconds=8)),
            active="a",
        ),
    ),
    "higher-priority-demand-preempts-a-busy-incumbent": (
        ("b", ElectionReason.DEMAND),
        group(serving(priority=50, idle=timedelta(seconds=2)), demand(priority=100), active="a"),
    ),
    "lower-priority-demand-waits-for-a-busy-incumbent": (
        ("a", ElectionReason.READY),
        group(serving(priority=100, idle=timedelta(seconds=2)), demand(priority=50, queued=10), active="a"),
    ),
    "equal-priority-busy-incumbent-keeps-the-gpu": (
        ("a", ElectionReason.READY),
        group(serving(priority=100, idle=timedelta(seconds=2)), demand(priority=100), active="a"),
    ),
    "lower-priority-demand-wins-once-the-incumbent-is-idle": (
        ("b", ElectionReason.DEMAND),
        group(serving(priority=100, idle=timedelta(seconds=11)), demand(priority=50), active="a"),
    ),
    "busy-incumbent-is-no-minimum-run-question": (
        ("a", ElectionReason.READY),
        group(
            serving(priority=100, idle=timedelta(seconds=2)),
            demand(priority=50),
            active="a",
            leader_since=ago(seconds=5),
        ),
    ),
    # GPU lease and overrides.
    "gpu-lease-beats-demand-busy-incumbent-and-forcePromotion": (
        (None, ElectionReason.LEASE),
        group(
            serving(idle=timedelta(seconds=1)),
            model("b", force=True),
            demand("c", priority=1000),
            active="a",
            lease=Lease("l", "gpu", "trainer", NOW + timedelta(minutes=5)),
        ),
    ),
    "expired-lease-is-ignored-at-expiresAt": (
        ("a", ElectionReason.READY),
        group(serving(idle=timedelta(seconds=1)), active="a", lease=Lease("l", "gpu", "trainer", NOW)),
    ),
    "forcePromotion-beats-minimum-run-cooldown-priority-and-busy-incumbent": (
        ("b", ElectionReason.FORCE_PROMOTION),
        group(
            serving(priority=200, idle=timedelta(seconds=1)),
            model("b", priority=1, force=True, preempted=ago(seconds=5)),
            active="a",
            leader_since=ago(seconds=1),
        ),
    ),
    "promote-call-beats-demand": (
        ("b", ElectionReason.FORCE_PROMOTION),
        group(serving(idle=timedelta(seconds=1)), model("b", promoted=ago(seconds=1)), demand("c"), active="a"),
    ),
    # Nothing to do, and models that may not run.
    "no-demand-no-leader": ((None, ElectionReason.NO_CANDIDATE), group(model("a"), model("b"))),
    "failed-model-left-out-until-asked-again": (
        (None, ElectionReason.NO_CANDIDATE),
        group(model("a", failed=ago(seconds=30), queued=3, active=ago(seconds=31)), model("b")),
    ),
    "failed-model-back-once-asked-again": (
        ("a", ElectionReason.DEMAND),
        group(model("a", failed=ago(seconds=30), queued=3, active=ago(seconds=1)), model("b")),
    ),
}


@pytest.mark.parametrize(("snapshot", "leader", "reason"), rules(CASES))
def test_determine_active_model(snapshot: GroupSnapshot, leader: str | None, reason: ElectionReason) -> None:
    assert snapshot.v1alpha1 is not None
    election = determine_active_model(snapshot, NOW, snapshot.v1alpha1)
    assert outcome(election) == (leader, reason)


def test_defaults_are_the_seeds() -> None:
    policy = V1Alpha1Policy()
    assert policy.hysteresis_window == timedelta(seconds=10)
    assert policy.request_queue_threshold == 3
    assert policy.minimum_run_duration == timedelta(seconds=30)
    assert policy.cooldown_after_preemption == timedelta(seconds=60)
    assert policy.drain_timeout == timedelta(seconds=60)
    assert policy.idle_timeout == timedelta(seconds=300)


def test_idle_timeout_reports_the_parked_incumbent() -> None:
    election = determine_active_model(group(serving(idle=timedelta(seconds=301)), active="a"), NOW, POLICY)
    assert election.idle_expired == (ModelKey("default", "a"),)


def test_the_group_policy_not_the_model_spec_sets_the_idle_timeout() -> None:
    incumbent = serving(idle=timedelta(seconds=120), idle_timeout=timedelta(seconds=60))
    assert determine_active_model(group(incumbent, active="a"), NOW, POLICY).leader == incumbent.key


def test_elect_uses_the_v1alpha1_rules_for_a_gpugroup() -> None:
    """The same snapshot elects differently under v1alpha2: there the 3-request threshold does not exist."""
    snapshot = group(serving(idle=timedelta(minutes=3)), demand(queued=1), active="a")
    assert elect(snapshot, NOW, ElectionParams()).leader == ModelKey("default", "a")
    v1alpha2 = GroupSnapshot("gpu", snapshot.members, active=snapshot.active)
    assert elect(v1alpha2, NOW, ElectionParams()).leader == ModelKey("default", "b")


def test_a_swap_starts_the_preemption_cooldown_and_the_minimum_run() -> None:
    """Through the planner: the swap marks the old model preempted, and the new one runs at least 30 s."""
    first = plan_group(
        group(serving(), demand(), active="a"),
        NOW,
        ElectionParams(),
        command_retry=timedelta(seconds=10),
        new_swap_id="s1",
    )
    assert first.active == ModelKey("default", "b")
    assert first.patches[ModelKey("default", "a")].preempted_at == NOW
    assert first.leader_since == NOW

    def challenged_at(seconds: int) -> GroupSnapshot:
        """``a`` (priority 200, preempted by that swap) has 3 requests waiting ``seconds`` after it."""
        now = NOW + timedelta(seconds=seconds)
        return group(
            model("a", priority=200, queued=3, active=now, preempted=NOW, demand_since=now - timedelta(seconds=15)),
            model("b", ready=True, ready_since=NOW, active=now - timedelta(seconds=20)),
            active="b",
            leader_since=NOW,
        )

    def elected(seconds: int) -> tuple[str | None, ElectionReason]:
        election = determine_active_model(challenged_at(seconds), NOW + timedelta(seconds=seconds), POLICY)
        return outcome(election)

    assert elected(29) == ("b", ElectionReason.MINIMUM_RUN)
    assert elected(45) == ("b", ElectionReason.COOLDOWN)
    assert elected(60) == ("a", ElectionReason.DEMAND)


def test_hysteresis_is_a_delay_and_a_dip_below_the_threshold_restarts_it() -> None:
    """Through the planner, as time passes: b's demand reaches the threshold at 0 s, dips to 2 requests at 6 s,
    is back at 3 from 8 s; a (idle, serving) keeps the GPU until b's demand has lasted 10 s without a dip: 18 s."""
    from flexinfer_scheduler.domain.plan import apply_plan

    snapshot = group(serving(idle=timedelta(minutes=2)), model("b"), active="a")
    queued_at = {0: 3, 2: 3, 4: 3, 6: 2, 8: 3, 10: 3, 12: 3, 14: 3, 16: 3, 17: 3, 18: 3}
    leaders = {}
    for second, queued in queued_at.items():
        now = NOW + timedelta(seconds=second)
        members = tuple(
            dataclasses.replace(m, queued=queued, last_active_time=now) if m.key.name == "b" else m
            for m in snapshot.members
        )
        snapshot = dataclasses.replace(snapshot, members=members)
        p = plan_group(snapshot, now, ElectionParams(), command_retry=timedelta(seconds=10), new_swap_id=f"s{second}")
        snapshot = apply_plan(snapshot, p)
        leaders[second] = (p.election.leader.name if p.election.leader else None, p.election.reason)
    assert leaders[4] == ("a", ElectionReason.HYSTERESIS)
    assert leaders[8] == ("a", ElectionReason.HYSTERESIS)  # the clock restarted at 8 s
    assert leaders[16] == ("a", ElectionReason.HYSTERESIS)
    assert leaders[17] == ("a", ElectionReason.HYSTERESIS)
    assert leaders[18] == ("b", ElectionReason.DEMAND)
