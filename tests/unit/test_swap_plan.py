"""The swap as a state machine: park the old model, wait until it reports parked, activate the new one."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from flexinfer_common.enums import (
    ModelPhase,
    RuntimePhase,
    ScaleAction,
    SchedulingPolicy,
    SharedState,
    SwapPhase,
    SwapReason,
)
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import GroupSnapshot, Member
from flexinfer_scheduler.domain.plan import GroupPlan, apply_plan, plan_group
from tests.support.members import member

NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
A, B = ModelKey("default", "a"), ModelKey("default", "b")
RETRY = timedelta(seconds=10)


#: the swap machinery is the same under both policies; these tables use the seed's election, whose rules they cite
SEED = ElectionParams(policy=SchedulingPolicy.SEED)


def plan(
    snapshot: GroupSnapshot,
    now: datetime = NOW,
    params: ElectionParams | None = None,
    *,
    new_swap_id: str = "s1",
    restart_backoff: timedelta = timedelta(0),
) -> GroupPlan:
    return plan_group(
        snapshot, now, params or SEED, command_retry=RETRY, new_swap_id=new_swap_id, restart_backoff=restart_backoff
    )


apply = apply_plan
YIELD = ElectionParams(quiet_period=timedelta(seconds=30))  # FlexInfer's policy, FLEXINFER_QUIET_YIELD=30s


def report(snapshot: GroupSnapshot, key: ModelKey, phase: RuntimePhase, message: str = "") -> GroupSnapshot:
    """The actuator reports ``phase`` (and ``message``) for the command ``key`` was last given."""
    (reported,) = [m for m in snapshot.members if m.key == key]
    fields = {"runtime_message": message} if message else {}
    return with_member(snapshot, key, runtime=phase.value, runtime_generation=reported.command_generation, **fields)


def with_member(snapshot: GroupSnapshot, key: ModelKey, **fields: object) -> GroupSnapshot:
    members = tuple(dataclasses.replace(m, **fields) if m.key == key else m for m in snapshot.members)  # type: ignore[arg-type]
    return dataclasses.replace(snapshot, members=members)


def a_holds(a: Member, since: datetime) -> GroupSnapshot:
    """``a`` has held the GPU since ``since``; ``b`` (priority 5) shares it and is not asked for."""
    return GroupSnapshot("gpu", (a, Member(B, priority=5)), active=A, leader_since=since)


def a_failed(message: str, issued: datetime, **fields: Any) -> GroupSnapshot:
    """``a`` (priority 10), told to activate at ``issued`` and holding the GPU since, reports Failed: ``message``."""
    a = member(A, runtime=RuntimePhase.FAILED, priority=10, runtime_message=message, command_issued_at=issued, **fields)
    return a_holds(a, since=issued)


def serving_a_with_demand_for_b() -> GroupSnapshot:
    a = member(
        A,
        runtime=RuntimePhase.READY,
        priority=10,
        ready_since=NOW - timedelta(minutes=10),
        last_active_time=NOW - timedelta(minutes=3),
    )
    b = Member(B, priority=10, last_active_time=NOW - timedelta(seconds=1))
    return GroupSnapshot("gpu", (a, b), active=A, leader_since=NOW - timedelta(minutes=10))


def test_swap_parks_the_old_model_before_activating_the_new_one() -> None:
    snapshot = serving_a_with_demand_for_b()
    first = plan(snapshot)
    assert first.active == B
    assert [(c.key, c.action) for c in first.commands] == [(A, ScaleAction.PARK)]
    assert first.statuses[B].phase == ModelPhase.LOADING and "waiting for a to park" in first.statuses[B].message
    assert first.patches[A].preempted_at == NOW and first.patches[A].preempted_by == "b"
    (created,) = first.swap_updates
    assert created.created and created.swap.phase == SwapPhase.PARKING and created.swap.reason == SwapReason.DEMAND

    snapshot = apply(snapshot, first)
    still_stopping = plan(report(snapshot, A, RuntimePhase.STOPPING), NOW + timedelta(seconds=1))
    assert still_stopping.commands == []  # B still waits: A has not reported parked

    parked = report(snapshot, A, RuntimePhase.PARKED)
    second = plan(parked, NOW + timedelta(seconds=2))
    assert [(c.key, c.action) for c in second.commands] == [(B, ScaleAction.ACTIVATE)]
    assert second.swap_updates[0].swap.phase == SwapPhase.LOADING

    snapshot = report(apply(parked, second), B, RuntimePhase.READY)
    third = plan(snapshot, NOW + timedelta(seconds=30))
    (done,) = third.swap_updates
    assert done.finished_at is not None and done.swap.phase == SwapPhase.READY
    assert set(done.swap.phases) == {"draining", "parking", "loading"}
    assert done.swap.phases["loading"] == 28.0
    assert third.statuses[B].ready and third.statuses[B].state == SharedState.ACTIVE
    assert third.statuses[A].phase == ModelPhase.PREEMPTED and third.statuses[A].preempted_by == "b"


def test_lost_command_is_reissued_with_the_same_generation() -> None:
    snapshot = apply(serving_a_with_demand_for_b(), plan(serving_a_with_demand_for_b()))
    assert plan(snapshot, NOW + timedelta(seconds=5)).commands == []
    again = plan(snapshot, NOW + RETRY)
    assert [(c.key, c.action, c.generation, c.reissue) for c in again.commands] == [(A, ScaleAction.PARK, 2, True)]


def test_stale_report_does_not_count_as_parked() -> None:
    snapshot = apply(serving_a_with_demand_for_b(), plan(serving_a_with_demand_for_b()))
    # a report for generation 1 (the old activate) says Parked: it answers an older command, so B must wait
    assert plan(with_member(snapshot, A, runtime="Parked"), NOW + timedelta(seconds=1)).commands == []


def test_failed_load_is_reported_and_the_model_left_out() -> None:
    result = plan(a_failed("exit code 1: CUDA out of memory", NOW - timedelta(seconds=20)))
    assert result.patches[A].failed_at == NOW
    assert result.active == B
    assert result.statuses[A].phase == ModelPhase.FAILED
    assert result.statuses[A].failure == "exit code 1: CUDA out of memory"


def test_a_crash_after_ready_is_restarted_no_sooner_than_the_backoff() -> None:
    """A crash loop costs at most one load per back-off (counted from the last activate), like CrashLoopBackOff."""
    started = NOW - timedelta(seconds=3)
    snapshot = a_failed(
        "exit code 139",
        started,
        ready_since=started + timedelta(seconds=1),
        last_active_time=NOW - timedelta(seconds=1),
    )

    def activates(now: datetime) -> list[tuple[ModelKey, int]]:
        result = plan(snapshot, now, ElectionParams(), new_swap_id="s", restart_backoff=timedelta(seconds=10))
        return [(c.key, c.generation) for c in result.commands if c.action == ScaleAction.ACTIVATE]

    assert activates(NOW) == []  # 3 s after its last start: wait
    assert activates(started + timedelta(seconds=10)) == [(A, 2)]  # then a fresh activate


def test_a_quiet_holder_yields_to_lower_priority_requests_without_a_cooldown() -> None:
    """FlexInfer's policy (quiet period 30 s): a lower-priority model's requests wait while the higher-priority
    holder answered nothing for 30 s: the holder is parked as for its idle timeout (no preemption, so no cooldown
    holds the guest), and its next request brings it back once the guest's hold is over."""
    chat = member(
        A,
        runtime=RuntimePhase.READY,
        priority=100,
        ready_since=NOW - timedelta(minutes=10),
        last_active_time=NOW - timedelta(seconds=30),
    )
    embed = Member(B, priority=50, last_active_time=NOW, queued=60, demand_since=NOW - timedelta(seconds=20))
    snapshot = GroupSnapshot("gpu", (chat, embed), active=A, leader_since=NOW - timedelta(minutes=10))

    first = plan(snapshot, params=YIELD)
    assert first.active == B and [(c.key, c.action) for c in first.commands] == [(A, ScaleAction.PARK)]
    assert first.members[A].preempted_at is None and first.members[A].idle_parked_at == NOW
    (created,) = first.swap_updates
    assert created.swap.reason == SwapReason.IDLE
    assert first.cooldown_remaining == timedelta(0)

    # the guest is Ready at +20 s and answers the batch; chat is left out until it is asked again
    snapshot = report(apply(snapshot, first), A, RuntimePhase.PARKED)
    snapshot = report(apply(snapshot, plan(snapshot, NOW + timedelta(seconds=1), params=YIELD)), B, RuntimePhase.READY)
    snapshot = with_member(snapshot, B, queued=0, last_active_time=NOW + timedelta(seconds=9))
    served = plan(snapshot, NOW + timedelta(seconds=20), params=YIELD)
    assert served.active == B and served.statuses[A].phase == ModelPhase.IDLE
    snapshot = apply(snapshot, served)

    # a chat request at +25 s: the guest keeps the GPU for its hold (its own 19 s load, from Ready at +20 s),
    # then chat, of higher priority with a request waiting, takes it back (no 5-minute cooldown holds it out)
    asked = NOW + timedelta(seconds=25)
    snapshot = with_member(snapshot, A, queued=1, last_active_time=asked)
    waiting = plan(snapshot, asked, params=YIELD)
    assert waiting.active == B and waiting.cooldown_remaining == timedelta(seconds=14)
    assert "swap cooldown ends at 12:00:39" in waiting.statuses[A].message
    assert plan(apply(snapshot, waiting), NOW + timedelta(seconds=38), params=YIELD).active == B
    back = plan(apply(snapshot, waiting), NOW + timedelta(seconds=39), params=YIELD)
    assert back.active == A and back.election.reason == "demand"


@pytest.mark.parametrize("params", [SEED, ElectionParams()], ids=["seed", "flexinfer"])
def test_a_model_parked_by_hand_shows_idle_only_once_the_actuator_confirmed_the_park(params: ElectionParams) -> None:
    """The status page's Park (as its idle timeout would): phase Idle says the model is off the GPU, so that a change
    refused while it may hold the GPU ("park it first, or wait until parked": a GPUGroup moving it) goes through
    once it shows Idle. Until the actuator confirms the park it is Draining, as in a group with a capacity."""
    held = NOW - timedelta(minutes=10)
    a = member(A, runtime=RuntimePhase.READY, priority=10, ready_since=held, idle_parked_at=NOW)
    snapshot = GroupSnapshot("gpu", (a,), active=A, leader_since=held)

    parking = plan(snapshot, params=params)
    assert [(c.key, c.action) for c in parking.commands] == [(A, ScaleAction.PARK)]
    assert parking.statuses[A][:2] == (ModelPhase.DRAINING, SharedState.PARKED)
    assert parking.statuses[A].message == "parking while idle"
    snapshot = apply(snapshot, parking)
    stopping = plan(report(snapshot, A, RuntimePhase.STOPPING), NOW + timedelta(seconds=1), params=params)
    assert stopping.statuses[A].phase == ModelPhase.DRAINING
    parked = plan(report(snapshot, A, RuntimePhase.PARKED), NOW + timedelta(seconds=2), params=params)
    assert parked.statuses[A][:2] == (ModelPhase.IDLE, SharedState.PARKED)
    assert parked.statuses[A].message.startswith("parked while idle")


def test_a_member_built_from_its_fields_equals_one_built_by_keyword_and_needs_every_field() -> None:
    """``Member.of`` (what a store builds each loaded model with) gives the same member as the constructor, and
    refuses a field set that misses or misnames one: no member is built with a field left out."""
    member = Member(A, priority=3, queued=2, service_labels=("x",))
    fields = {f.name: getattr(member, f.name) for f in dataclasses.fields(Member)}
    assert Member.of(fields) == member and Member.of(fields).ready == member.ready
    with pytest.raises(TypeError, match="queued"):
        Member.of({k: v for k, v in fields.items() if k != "queued"})
    with pytest.raises(TypeError, match="qeued"):
        Member.of({**{k: v for k, v in fields.items() if k != "queued"}, "qeued": 2})


def test_the_election_reads_of_a_manifest_what_the_whole_manifest_says() -> None:
    """The election parses only its part of a manifest (``spec.gpu``, ``spec.serverless``, ``spec.serviceLabels``):
    what it reads must equal what the whole ``Model`` says, from a dict or from JSON text."""
    import json

    from flexinfer_common.manifests import Model
    from flexinfer_scheduler.domain.manifests import spec_facts

    manifest = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "a", "namespace": "default"},
        "spec": {
            "gpu": {"shared": "gpu", "priority": 3, "swapCooldown": "2m", "forcePromotion": True, "maxWait": "45s"},
            "serverless": {"idleTimeout": "10m"},
            "serviceLabels": ["chat", "code"],
            "endpoint": {"port": 8000},
            "local": {"command": ["serve", "{port}"], "env": {"TOKEN": "x"}},
        },
    }
    spec = Model.model_validate(manifest).spec
    expected = (
        spec.gpu.swap_cooldown,
        spec.serverless.idle_timeout,
        spec.gpu.force_promotion,
        tuple(spec.service_labels),
        spec.gpu.max_wait,
    )
    assert expected == (timedelta(minutes=2), timedelta(minutes=10), True, ("chat", "code"), timedelta(seconds=45))
    for source in (manifest, json.dumps(manifest)):
        facts = spec_facts(source)
        got = (facts.swap_cooldown, facts.idle_timeout, facts.force_promotion, facts.service_labels, facts.max_wait)
        assert got == expected
        assert facts.model.spec == spec and facts.runtime("default", "a").port == 8000


def test_a_swap_whose_model_fails_to_load_ends_failed_with_why() -> None:
    """`get swaps` and the status page tell a swap that failed from one that served (issue 24)."""
    snapshot = serving_a_with_demand_for_b()
    snapshot = apply(snapshot, plan(snapshot))
    parked = report(snapshot, A, RuntimePhase.PARKED)
    loading = apply(parked, plan(parked, NOW + timedelta(seconds=2)))
    assert loading.swap is not None and loading.swap.phase == SwapPhase.LOADING
    failed_load = report(loading, B, RuntimePhase.FAILED, "killed by signal 4")
    failed = plan(failed_load, NOW + timedelta(seconds=5), ElectionParams(), new_swap_id="s2")
    (ended,) = [u for u in failed.swap_updates if u.swap.id == "s1"]
    assert ended.swap.phase == SwapPhase.FAILED and ended.finished_at is not None
    assert ended.message == "default/b failed to load: killed by signal 4"


def test_preempted_by_is_cleared_once_the_model_holds_the_gpu_again() -> None:
    a = member(
        A,
        runtime=RuntimePhase.READY,
        generation=3,
        priority=10,
        ready_since=NOW - timedelta(minutes=1),
        preempted_at=NOW - timedelta(minutes=10),
        preempted_by="gpu-lease/root",
    )
    result = plan(a_holds(a, since=NOW - timedelta(minutes=1)))
    assert result.statuses[A].state == SharedState.ACTIVE and result.statuses[A].preempted_by is None


def test_a_crashed_model_says_why_while_it_waits_for_its_restart() -> None:
    crashed = a_failed(
        "killed by signal 9",
        NOW - timedelta(seconds=3),
        ready_since=NOW - timedelta(seconds=2),
        last_active_time=NOW - timedelta(seconds=1),
    )
    result = plan(crashed, NOW, ElectionParams(), restart_backoff=timedelta(seconds=10))
    assert result.statuses[A].message == "crashed: killed by signal 9; restarting"


def test_a_loading_model_shows_what_the_actuator_says_of_its_probe() -> None:
    a = member(
        A,
        runtime=RuntimePhase.LOADING,
        priority=10,
        runtime_message="GET /health → 404, 12 tries",
        command_issued_at=NOW - timedelta(seconds=30),
    )
    result = plan(GroupSnapshot("gpu", (a,), active=A, leader_since=NOW - timedelta(seconds=30)))
    assert result.statuses[A].message == "loading: GET /health → 404, 12 tries"
