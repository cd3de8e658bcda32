"""The v1alpha2 election of the seed, one row per rule ("Leader Election Algorithm (v1alpha2)", "Priority
semantics", "Anti-Thrashing Mechanics", "Demand Signaling Lifecycle", "Training on a shared card")."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest

from flexinfer_common.enums import RuntimePhase, ScaleAction, SchedulingPolicy, SwapPhase, SwapReason
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import ElectionParams, ElectionReason, choose_shared_group_leader, elect
from flexinfer_scheduler.domain.model import GroupSnapshot, Lease, Member, Swap

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
#: ``choose_shared_group_leader`` with FlexInfer's old refinements on (bounded wait at the demand window,
#: idle-aware fallback); ``SEED``: the seed's exact rules, what FLEXINFER_SCHEDULING_POLICY=seed runs
PARAMS = ElectionParams(policy=SchedulingPolicy.SEED)
SEED = PARAMS.seed()


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
    runtime = RuntimePhase.READY.value if ready else RuntimePhase.LOADING.value if loading else None
    return Member(
        key=ModelKey("default", name),
        priority=priority,
        last_active_time=active,
        preempted_at=preempted,
        swap_cooldown=cooldown,
        idle_timeout=idle_timeout,
        force_promotion=force,
        runtime=runtime,
        desired_action=ScaleAction.ACTIVATE if runtime else None,
        command_generation=1 if runtime else 0,
        runtime_generation=1 if runtime else 0,
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


CASES = [
    # Stage 1 — anti-thrashing
    pytest.param(
        group(
            model("a", ready=True),
            model("b", priority=100, active=ago(seconds=5), preempted=ago(minutes=1)),
            active="a",
        ),
        "a",
        ElectionReason.COOLDOWN,
        id="cooldown-holds-active-against-higher-priority-demand",
    ),
    pytest.param(
        group(
            model("a", ready=True), model("b", active=ago(seconds=5), preempted=ago(minutes=5, seconds=1)), active="a"
        ),
        "b",
        ElectionReason.DEMAND,
        id="cooldown-over-after-5-minutes-default",
    ),
    pytest.param(
        group(
            model("a", ready=True, cooldown=timedelta(minutes=10)),
            model("b", active=ago(seconds=5), preempted=ago(minutes=7), cooldown=timedelta(minutes=3)),
            active="a",
        ),
        "a",
        ElectionReason.COOLDOWN,
        id="cooldown-is-the-maximum-swapCooldown-of-the-group",
    ),
    pytest.param(
        group(
            model("a", ready=True, cooldown=timedelta(minutes=2)),
            model("b", active=ago(seconds=5), preempted=ago(minutes=3), cooldown=timedelta(minutes=2)),
            active="a",
        ),
        "b",
        ElectionReason.DEMAND,
        id="per-model-swapCooldown-override-shortens-it",
    ),
    # Stage 3 — demand-based preemption and the priority gate
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(minutes=3)),
            model("b", priority=100, active=ago(seconds=1)),
            active="a",
        ),
        "b",
        ElectionReason.DEMAND,
        id="equal-priority-demand-preempts-idle-incumbent",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(minutes=3)),
            model("b", priority=200, active=ago(seconds=1)),
            active="a",
        ),
        "b",
        ElectionReason.DEMAND,
        id="higher-priority-demand-preempts-idle-incumbent",
    ),
    pytest.param(
        group(
            model("a", priority=200, ready=True, active=ago(minutes=3)),
            model("b", priority=100, active=ago(seconds=1)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="lower-priority-demand-never-preempts-even-idle-incumbent",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(seconds=30)),
            model("b", priority=200, active=ago(seconds=1)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="busy-incumbent-is-not-preempted-even-by-higher-priority",
    ),
    pytest.param(
        group(model("a", ready=True, active=None), model("b", active=ago(seconds=1)), active="a"),
        "b",
        ElectionReason.DEMAND,
        id="incumbent-never-used-counts-as-idle",
    ),
    pytest.param(
        group(model("a", ready=True, active=ago(minutes=3)), model("b", active=ago(minutes=2, seconds=1)), active="a"),
        "a",
        ElectionReason.READY,
        id="demand-expires-after-2-minutes",
    ),
    pytest.param(
        group(model("a", priority=10), model("b", priority=5, active=ago(seconds=3))),
        "b",
        ElectionReason.DEMAND,
        id="demanded-wins-when-nothing-is-loaded",
    ),
    # Stage 2 tie-breaks within a category
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(minutes=9)),
            model("b", priority=50, active=ago(seconds=2)),
            model("c", priority=100, active=ago(seconds=10)),
            active="a",
        ),
        "c",
        ElectionReason.DEMAND,
        id="demanded-tie-break-highest-priority",
    ),
    pytest.param(
        group(model("b", priority=10, active=ago(seconds=50)), model("c", priority=10, active=ago(seconds=5))),
        "c",
        ElectionReason.DEMAND,
        id="tie-break-most-recent-lastActiveTime",
    ),
    pytest.param(
        group(model("zeta", priority=10, active=ago(seconds=5)), model("alpha", priority=10, active=ago(seconds=5))),
        "alpha",
        ElectionReason.DEMAND,
        id="tie-break-alphabetical-name",
    ),
    # Stage 4 — fallback order
    pytest.param(
        group(
            model("a", priority=1, ready=True, active=ago(minutes=10)), model("b", priority=9, active=ago(minutes=4))
        ),
        "a",
        ElectionReason.READY,
        id="fallback-ready-leader-first",
    ),
    pytest.param(
        group(model("a", priority=1, active=ago(minutes=4)), model("b", priority=9)),
        "a",
        ElectionReason.RECENT,
        id="fallback-recent-leader-before-plain-fallback",
    ),
    pytest.param(
        group(model("a", priority=1), model("b", priority=9)),
        "b",
        ElectionReason.FALLBACK,
        id="fallback-leader-highest-priority-when-nothing-else",
    ),
    pytest.param(
        group(model("a", priority=1, active=ago(minutes=6)), model("b", priority=9)),
        "b",
        ElectionReason.FALLBACK,
        id="recent-window-is-5-minutes",
    ),
    pytest.param(
        group(model("a", priority=100, loading=True), model("b", priority=100, active=ago(minutes=3))),
        "a",
        ElectionReason.READY,
        id="a-loading-leader-counts-as-ready-so-fallback-does-not-flip",
    ),
    # Idle timeout and failed loads
    pytest.param(
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
        "b",
        ElectionReason.DEMAND,
        id="idle-timeout-parks-incumbent-and-lower-priority-gets-gpu",
    ),
    pytest.param(
        group(model("a", priority=200, idle_parked=ago(minutes=1), active=ago(minutes=12)), model("b", priority=100)),
        "b",
        ElectionReason.FALLBACK,
        id="idle-parked-model-not-re-elected-without-new-demand",
    ),
    pytest.param(
        group(model("a", priority=200, idle_parked=ago(minutes=1), active=ago(seconds=2)), model("b", priority=100)),
        "a",
        ElectionReason.DEMAND,
        id="idle-parked-model-re-elected-after-a-request",
    ),
    pytest.param(
        group(model("a", priority=200, failed=ago(seconds=30), active=ago(minutes=1)), model("b", priority=100)),
        "b",
        ElectionReason.FALLBACK,
        id="failed-model-left-out-until-asked-again",
    ),
    # Overrides
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(seconds=1)),
            model("b", priority=1, force=True, preempted=ago(seconds=10)),
            active="a",
        ),
        "b",
        ElectionReason.FORCE_PROMOTION,
        id="forcePromotion-beats-cooldown-priority-and-busy-incumbent",
    ),
    pytest.param(
        group(
            model("a", ready=True, active=ago(seconds=1)),
            model("b", force=True),
            lease=Lease("l", "gpu", "trainer", NOW + timedelta(minutes=5)),
            active="a",
        ),
        None,
        ElectionReason.LEASE,
        id="gpu-lease-beats-even-forcePromotion",
    ),
    pytest.param(
        group(model("a", ready=True), lease=Lease("l", "gpu", "trainer", NOW), active="a"),
        "a",
        ElectionReason.READY,
        id="expired-lease-is-ignored-at-expiresAt",
    ),
]


BUSY = ago(seconds=5)  # the loaded model answered a request 5 s ago: busy, never idle

# FlexInfer's bounded wait (docs/reference.md sections 1 and 6): a demanded model of priority >= the busy leader's
# gets the GPU once it has waited spec.gpu.maxWait (default: the demand window, 2 min); lower priority never
# preempts; the swap cooldown (stage 1) still holds the active model; within the bound the loaded model keeps serving.
BOUNDED_WAIT = [
    pytest.param(
        group(
            model("a", ready=True, active=BUSY),
            model("b", active=ago(seconds=1), waiting=timedelta(seconds=119)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="bounded-wait-loaded-model-keeps-serving-within-the-bound",
    ),
    pytest.param(
        group(
            model("a", ready=True, active=BUSY),
            model("b", active=ago(seconds=1), waiting=timedelta(minutes=2)),
            active="a",
        ),
        "b",
        ElectionReason.MAX_WAIT,
        id="bounded-wait-equal-priority-takes-a-busy-gpu-at-the-demand-window",
    ),
    pytest.param(
        group(
            model("a", ready=True, active=BUSY),
            model("b", active=ago(seconds=1), waiting=timedelta(seconds=30), max_wait=timedelta(seconds=30)),
            active="a",
        ),
        "b",
        ElectionReason.MAX_WAIT,
        id="bounded-wait-from-spec-maxWait",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=BUSY),
            model("b", priority=50, active=ago(seconds=1), waiting=timedelta(hours=1)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="bounded-wait-lower-priority-never-preempts",
    ),
    pytest.param(
        group(
            dataclasses.replace(model("a", ready=True, active=BUSY), queued=40),
            model("b", active=ago(seconds=1), waiting=timedelta(seconds=119)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="queue-order-loaded-model-serves-its-backlog-within-the-bound",
    ),
    pytest.param(
        group(
            dataclasses.replace(model("a", ready=True, active=BUSY, ready_since=ago(seconds=5)), queued=40),
            model("b", active=ago(seconds=1), waiting=timedelta(minutes=3)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="queue-order-a-model-just-loaded-first-answers-what-waited-through-its-load",
    ),
    pytest.param(
        dataclasses.replace(
            group(
                dataclasses.replace(model("a", ready=True, active=BUSY), queued=3),
                model("b", active=ago(seconds=1), waiting=timedelta(minutes=2, seconds=10)),
                active="b",
            ),
            swap=Swap(
                "s1",
                ModelKey("default", "a"),
                ModelKey("default", "b"),
                SwapReason.MAX_WAIT,
                SwapPhase.DRAINING,
                ago(seconds=10),
                ago(seconds=10),
            ),
        ),
        "b",
        ElectionReason.MAX_WAIT,
        id="queue-order-requests-queued-by-the-drain-do-not-undo-the-swap",
    ),
    pytest.param(
        group(
            dataclasses.replace(model("a", active=ago(seconds=1), waiting=timedelta(seconds=10)), queued=1),
            model("b", active=ago(seconds=5), waiting=timedelta(minutes=2, seconds=20)),
            active="b",
        ),
        "b",
        ElectionReason.MAX_WAIT,
        id="bounded-wait-an-overdue-model-goes-before-a-peer-asked-more-recently-when-nothing-is-loaded",
    ),
    pytest.param(
        group(
            dataclasses.replace(model("a", active=ago(seconds=1), waiting=timedelta(seconds=10)), queued=1),
            model("b", active=ago(seconds=5), waiting=timedelta(minutes=1)),
        ),
        "a",
        ElectionReason.DEMAND,
        id="bounded-wait-within-the-bound-the-seeds-demand-order-holds-when-nothing-is-loaded",
    ),
    pytest.param(
        group(
            model("a", ready=True, active=BUSY),
            model("b", active=ago(seconds=1), waiting=timedelta(minutes=10), preempted=ago(minutes=4)),
            active="a",
        ),
        "a",
        ElectionReason.COOLDOWN,
        id="bounded-wait-swap-cooldown-still-holds",
    ),
    pytest.param(
        group(
            model("a", ready=True, active=BUSY),
            model("b", active=ago(seconds=1), waiting=timedelta(minutes=3)),
            model("c", active=ago(seconds=2), waiting=timedelta(minutes=5)),
            active="a",
        ),
        "c",
        ElectionReason.MAX_WAIT,
        id="bounded-wait-longest-waiting-first-among-equal-priorities",
    ),
    pytest.param(
        group(
            model("a", ready=True, active=BUSY),
            model("b", priority=10, active=ago(seconds=1), waiting=timedelta(minutes=3)),
            model("c", active=ago(seconds=2), waiting=timedelta(minutes=5)),
            active="a",
        ),
        "b",
        ElectionReason.MAX_WAIT,
        id="bounded-wait-higher-priority-first",
    ),
]


QUIET = ago(seconds=30)  # the holder's last request: quiet_after (30 s) ago
YIELD_PARAMS = dataclasses.replace(PARAMS, quiet_after=timedelta(seconds=30))  # FLEXINFER_QUIET_YIELD=30s

# FlexInfer's quiet yield (opt-in, FLEXINFER_QUIET_YIELD; here 30 s): "busy" for the priority gate then means
# answering, queued or asked within quiet_after. A quiet holder is parked as for its idle timeout when requests wait
# for a model of another priority.
QUIET_YIELD = [
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=QUIET),
            model("b", priority=50, active=ago(seconds=1), waiting=timedelta(minutes=1)),
            active="a",
        ),
        "b",
        ElectionReason.QUIET_YIELD,
        id="quiet-yield-lower-priority-gets-a-quiet-gpu",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(seconds=29)),
            model("b", priority=50, active=ago(seconds=1), waiting=timedelta(hours=1)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="quiet-yield-lower-priority-never-preempts-a-holder-asked-within-30s",
    ),
    pytest.param(
        group(
            dataclasses.replace(model("a", priority=100, ready=True, active=ago(minutes=10)), in_flight=1),
            model("b", priority=50, active=ago(seconds=1), waiting=timedelta(hours=1)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="quiet-yield-lower-priority-never-preempts-a-holder-answering-a-request",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(minutes=10)),
            model("b", priority=50, active=ago(seconds=1)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="quiet-yield-needs-requests-waiting-not-only-a-demand-signal",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, ready_since=ago(seconds=10)),
            model("b", priority=50, active=ago(seconds=1), waiting=timedelta(minutes=1)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="quiet-yield-a-holder-never-asked-is-quiet-30s-after-its-load",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=QUIET),
            model("b", priority=50, active=ago(seconds=1), waiting=timedelta(seconds=5)),
            model("c", priority=100, preempted=ago(minutes=1)),
            active="a",
        ),
        "b",
        ElectionReason.QUIET_YIELD,
        id="quiet-yield-ignores-the-swap-cooldown-as-an-idle-timeout-does",
    ),
    pytest.param(
        group(
            model("a", priority=50, ready=True, active=QUIET),
            model("b", priority=100, active=ago(seconds=1), waiting=timedelta(seconds=10)),
            active="a",
        ),
        "b",
        ElectionReason.QUIET_YIELD,
        id="quiet-yield-higher-priority-takes-the-gpu-back-from-a-quiet-guest",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(minutes=1)),
            model("b", priority=100, active=ago(seconds=1), waiting=timedelta(seconds=30)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="quiet-yield-never-between-peers-the-seeds-rules-and-the-bound-decide",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=ago(minutes=1)),
            model("b", priority=100, active=ago(seconds=1), waiting=timedelta(seconds=30)),
            model("c", priority=50, active=ago(seconds=1), waiting=timedelta(minutes=4)),
            active="a",
        ),
        "a",
        ElectionReason.READY,
        id="quiet-yield-not-when-a-peer-of-the-holder-is-first-in-line",
    ),
    pytest.param(
        group(
            model("a", priority=100, ready=True, active=QUIET),
            model("b", priority=10, active=ago(seconds=1), waiting=timedelta(minutes=4)),
            model("c", priority=50, active=ago(seconds=1), waiting=timedelta(minutes=1)),
            active="a",
        ),
        "c",
        ElectionReason.QUIET_YIELD,
        id="quiet-yield-highest-priority-waiting-first",
    ),
]


FALLBACK = [
    pytest.param(
        group(
            model("a", priority=100, active=ago(minutes=4), idle_timeout=timedelta(minutes=3)),
            model("b", priority=50, active=ago(minutes=30)),
        ),
        "b",
        ElectionReason.FALLBACK,
        id="fallback-skips-a-model-whose-idle-timeout-ran-out-since-it-was-asked-for",
    ),
    pytest.param(
        group(
            model("a", priority=100, active=ago(minutes=2, seconds=30), idle_timeout=timedelta(minutes=3)),
            model("b", priority=50),
        ),
        "a",
        ElectionReason.RECENT,
        id="recent-leader-still-within-its-idle-timeout",
    ),
]


@pytest.mark.parametrize(("snapshot", "leader", "reason"), CASES + BOUNDED_WAIT + FALLBACK)
def test_choose_shared_group_leader(snapshot: GroupSnapshot, leader: str | None, reason: ElectionReason) -> None:
    election = choose_shared_group_leader(snapshot, NOW, PARAMS)
    assert (election.leader.name if election.leader else None, election.reason) == (leader, reason)


@pytest.mark.parametrize(("snapshot", "leader", "reason"), QUIET_YIELD)
def test_the_quiet_yield_when_configured(snapshot: GroupSnapshot, leader: str | None, reason: ElectionReason) -> None:
    election = choose_shared_group_leader(snapshot, NOW, YIELD_PARAMS)
    assert (election.leader.name if election.leader else None, election.reason) == (leader, reason)


def test_lease_detail_names_the_owner() -> None:
    snapshot = group(model("a", ready=True), lease=Lease("l", "gpu", "trainer", NOW + timedelta(minutes=1)))
    assert choose_shared_group_leader(snapshot, NOW, PARAMS).detail == "gpu-lease/trainer"


def test_idle_timeout_reports_the_expired_member() -> None:
    snapshot = group(model("a", ready=True, ready_since=ago(minutes=6), idle_timeout=timedelta(minutes=5)), active="a")
    election = choose_shared_group_leader(snapshot, NOW, PARAMS)
    assert election.leader is None
    assert election.idle_expired == (ModelKey("default", "a"),)


def test_the_seeds_exact_rules_never_preempt_a_busy_leader() -> None:
    """With the bounded wait off (the seed's rules, which the simulator compares), a busy leader keeps the GPU."""
    snapshot = group(
        model("a", ready=True, active=BUSY), model("b", active=ago(seconds=1), waiting=timedelta(hours=1)), active="a"
    )
    election = choose_shared_group_leader(snapshot, NOW, ElectionParams(bounded_wait=False))
    assert (election.leader, election.reason) == (ModelKey("default", "a"), ElectionReason.READY)


def test_a_quiet_yield_parks_the_holder_as_its_idle_timeout_would() -> None:
    """The yielded holder is listed with the idle-expired members: it is parked, not preempted (no cooldown), and
    is left out until a request names it again."""
    snapshot = group(
        model("a", priority=100, ready=True, active=QUIET),
        model("b", priority=50, active=ago(seconds=1), waiting=timedelta(minutes=1)),
        active="a",
    )
    election = choose_shared_group_leader(snapshot, NOW, YIELD_PARAMS)
    assert election.idle_expired == (ModelKey("default", "a"),)


@pytest.mark.parametrize("params", [PARAMS, ElectionParams(bounded_wait=False)], ids=["default", "seed"])
def test_without_the_quiet_yield_lower_priority_never_takes_a_quiet_leaders_gpu(params: ElectionParams) -> None:
    """By default (FLEXINFER_QUIET_YIELD unset), as in the seed's "Lower-Priority Model Never Activates", a
    lower-priority model waits for the holder's idle timeout, however long the holder has been idle."""
    snapshot = group(
        model("a", priority=100, ready=True, active=ago(minutes=10)),
        model("b", priority=50, active=ago(seconds=1), waiting=timedelta(hours=1)),
        active="a",
    )
    election = choose_shared_group_leader(snapshot, NOW, params)
    assert (election.leader, election.reason) == (ModelKey("default", "a"), ElectionReason.READY)


@pytest.mark.parametrize(("snapshot", "leader", "reason"), CASES)
def test_the_seed_policy_runs_every_seed_rule(
    snapshot: GroupSnapshot, leader: str | None, reason: ElectionReason
) -> None:
    """FLEXINFER_SCHEDULING_POLICY=seed (or a group's ``spec.scheduling: seed``) runs exactly these rows."""
    election = elect(snapshot, NOW, ElectionParams(policy=SchedulingPolicy.SEED))
    assert (election.leader.name if election.leader else None, election.reason) == (leader, reason)
