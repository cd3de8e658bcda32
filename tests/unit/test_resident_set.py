"""Several models on one card (``plan.plan_resident_set``): what fits loads beside the others, what does not evicts
the cheapest set the policy lets it take the card from, an evicted model drains and is parked before the newcomer
starts, and, whatever happens (requests, crashes, leases, forcePromotion, time), the memory of the models not
confirmed parked never exceeds a device's capacity. One row per rule, then a hypothesis state machine."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from flexinfer_common.enums import ModelPhase, RuntimePhase, ScaleAction, SharedState
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import Capacity, GroupSnapshot, Lease, Member
from flexinfer_scheduler.domain.plan import GroupPlan, apply_plan, plan_group
from flexinfer_scheduler.domain.residency import memory_of

GiB = 1 << 30
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
PARAMS = ElectionParams()
CARD = Capacity(devices=1, memory_per_device=24 * GiB)


def key(name: str) -> ModelKey:
    return ModelKey("default", name)


def model(name: str, gib: float | None, *, priority: int = 10, pinned: bool = False, devices: int = 1) -> Member:
    return Member(
        key(name),
        priority=priority,
        memory=int(gib * GiB) if gib is not None else None,
        pinned=pinned,
        devices=devices,
    )


class Card:
    """A group with a capacity, planned pass after pass, with the actuator's answers played at once (or held)."""

    def __init__(self, *members: Member, capacity: Capacity = CARD) -> None:
        self.snapshot = GroupSnapshot("gpu", tuple(members), capacity=capacity)
        self.now = NOW
        self.plan: GroupPlan | None = None
        self.held: set[ModelKey] = set()  # the actuator does not answer these (a slow park or load)

    def member(self, name: str) -> Member:
        found = self.snapshot.member(key(name))
        assert found is not None
        return found

    def update(self, name: str, **fields: object) -> None:
        members = tuple(dataclasses.replace(m, **fields) if m.key == key(name) else m for m in self.snapshot.members)  # type: ignore[arg-type]
        self.snapshot = dataclasses.replace(self.snapshot, members=members)

    def ask(self, name: str, queued: int = 1) -> None:
        self.update(name, queued=queued, last_active_time=self.now)

    def served(self, name: str) -> None:
        self.update(name, queued=0, last_active_time=self.now)

    def step(self, seconds: float = 0.0) -> GroupPlan:
        self.now += timedelta(seconds=seconds)
        plan = plan_group(self.snapshot, self.now, PARAMS, command_retry=timedelta(seconds=10), new_swap_id="s")
        self.snapshot = apply_plan(self.snapshot, plan)
        lease = self.snapshot.lease
        if plan.reservation is not None and lease is not None and lease.device != plan.reservation.device:
            # what the lease manager records from the group status, and the next pass reads back
            self.snapshot = dataclasses.replace(
                self.snapshot, lease=dataclasses.replace(lease, device=plan.reservation.device)
            )
        for command in plan.commands:
            if command.key in self.held:
                continue
            phase = RuntimePhase.READY if command.action is ScaleAction.ACTIVATE else RuntimePhase.PARKED
            self.update(command.key.name, runtime=phase.value, runtime_generation=command.generation)
        self.plan = plan
        return plan

    def settle(self, seconds: float = 0.0) -> GroupPlan:
        plan = self.step(seconds)
        for _ in range(4):
            plan = self.step()
        return plan

    def loaded(self) -> set[str]:
        return {m.key.name for m in self.snapshot.members if m.ready}

    def view(self, name: str) -> tuple[ModelPhase, SharedState, str]:
        assert self.plan is not None
        v = self.plan.statuses[key(name)]
        return v.phase, v.state, v.message


def test_models_that_fit_load_side_by_side_with_no_eviction() -> None:
    card = Card(model("chat", 6), model("code", 5), model("embed", 1))
    for name in ("chat", "code", "embed"):
        card.ask(name)
        card.settle(1)
        card.served(name)
    assert card.loaded() == {"chat", "code", "embed"}
    assert all(m.preempted_at is None and m.evicting_since is None for m in card.snapshot.members)
    assert card.snapshot.swap is None, "a load that fits is no swap"
    assert card.view("code")[:2] == (ModelPhase.READY, SharedState.ACTIVE)


def test_one_that_does_not_fit_evicts_the_cheapest_and_starts_only_once_it_is_parked() -> None:
    card = Card(model("chat", 12), model("code", 10), model("big", 12))
    for name in ("chat", "code"):
        card.ask(name)
        card.settle(1)
        card.served(name)
    card.step(60)  # chat idle 61 s, code 60 s: both quiet
    card.ask("big", queued=3)
    card.held = {key("chat"), key("code")}
    card.step(200)
    assert card.member("big").desired_action is None, "a loading model starts only after the evicted are parked"
    evicting = {m.key.name for m in card.snapshot.members if m.evicting_since is not None}
    assert evicting == {"chat"}, "the cheapest that frees enough: the one idle longest, and only one of them"
    assert "waiting: evicting chat to make room" in card.view("big")[2]
    assert card.view("chat")[0] is ModelPhase.DRAINING and not card.plan.statuses[key("chat")].ready  # type: ignore[union-attr]
    swap = card.snapshot.swap
    assert swap is not None and (swap.from_model, swap.to_model) == (key("chat"), key("big")), "recorded as a swap"
    card.held = set()
    card.settle(10)  # the park is sent again (command retry) and answered this time
    assert card.loaded() == {"code", "big"}
    assert card.snapshot.swap is None, "the swap ended once big was Ready"
    assert card.plan is not None and not card.plan.swap_id
    assert card.view("chat")[:2] == (ModelPhase.PREEMPTED, SharedState.PARKED)


def test_an_evicted_model_drains_its_requests_in_flight_first() -> None:
    card = Card(model("chat", 20), model("code", 20))
    card.ask("chat")
    card.settle(1)
    card.served("chat")
    card.update("chat", in_flight=2)
    card.ask("code", queued=1)
    card.step(1)  # code wants the card from here (its bounded wait counts from now)
    card.settle(300)  # past chat's hold and code's bounded wait (4 min): code may take the card from a busy peer
    assert card.member("chat").evicting_since is not None
    assert card.member("chat").desired_action is ScaleAction.ACTIVATE, "not parked while requests are in flight"
    card.update("chat", in_flight=0)
    card.settle(1)
    assert card.loaded() == {"code"}


@pytest.mark.parametrize(
    ("resident", "newcomer", "why"),
    [
        pytest.param(model("base", 20, pinned=True), model("other", 10), "pinned", id="pinned-stays-for-equal"),
        pytest.param(
            model("base", 20, priority=50), model("other", 10, priority=5), "priority", id="higher-priority-busy-stays"
        ),
        pytest.param(model("base", 20), model("other", 10), "hold", id="a-busy-peer-keeps-its-hold-and-the-bound"),
    ],
)
def test_what_the_policy_protects_is_not_evicted(resident: Member, newcomer: Member, why: str) -> None:
    card = Card(resident, newcomer)
    card.ask(resident.key.name)
    card.settle(1)
    card.update(resident.key.name, in_flight=1, queued=0, last_active_time=card.now)
    card.ask(newcomer.key.name, queued=5)
    card.settle(30)
    assert card.loaded() == {resident.key.name}, why
    assert card.member(resident.key.name).evicting_since is None
    assert "no room: base hold the card and keep it" in card.view(newcomer.key.name)[2]
    assert card.view(newcomer.key.name)[1] is SharedState.QUEUED


def test_a_pinned_model_goes_for_a_higher_priority_that_cannot_fit_otherwise() -> None:
    card = Card(model("base", 20, pinned=True), model("urgent", 10, priority=100))
    card.ask("base")
    card.settle(1)
    card.served("base")
    card.ask("urgent")
    card.settle(15)
    assert card.loaded() == {"urgent"}


def test_a_lease_parks_the_whole_group_and_nothing_loads_while_it_lasts() -> None:
    card = Card(model("chat", 6), model("code", 5))
    for name in ("chat", "code"):
        card.ask(name)
        card.settle(1)
    card.snapshot = dataclasses.replace(card.snapshot, lease=Lease("l", "gpu", "trainer", NOW + timedelta(hours=1)))
    card.settle(1)
    assert card.loaded() == set()
    assert card.view("chat")[0] is ModelPhase.PREEMPTED


# ---- a lease with memory: a reservation on one device (GPULease spec.memory) ---------------------------------------

TWO = Capacity(devices=2, memory_per_device=24 * GiB)


def memory_lease(gib: float) -> Lease:
    return Lease("l", "gpu", "trainer", NOW + timedelta(hours=1), memory=int(gib * GiB))


def loaded_card(capacity: Capacity | None, *members: tuple[Member, float, int]) -> Card:
    """A card with ``members`` loaded, each (model, seconds since it was last asked, requests in flight)."""
    card = Card(*(m for m, _, _ in members), capacity=capacity or CARD)
    if capacity is None:
        card.snapshot = dataclasses.replace(card.snapshot, capacity=None)
    for m, _, _ in members:
        card.ask(m.key.name)
        card.settle(1)
        card.served(m.key.name)
    card.step(600)  # past every hold and cooldown
    for m, idle, busy in members:
        card.update(m.key.name, last_active_time=card.now - timedelta(seconds=idle), in_flight=busy)
    return card


@pytest.mark.parametrize(
    ("capacity", "members", "gib", "parked", "device"),
    [
        pytest.param(
            CARD,
            ((model("chat", 12), 10, 0), (model("code", 6), 5, 0)),
            4,
            set(),
            0,
            id="R-free-already-nothing-parks",
        ),
        pytest.param(
            CARD,
            ((model("chat", 12), 300, 0), (model("code", 10), 5, 0)),
            8,
            {"chat"},
            0,
            id="R-evicts-the-cheapest-one-that-frees-enough",
        ),
        pytest.param(
            CARD,
            ((model("chat", 4), 300, 0), (model("code", 4), 300, 0), (model("big", 14), 5, 0)),
            8,
            {"chat", "code"},
            0,
            id="R-never-more-than-needed-two-small-before-a-recent-big-one",
        ),
        pytest.param(
            CARD,
            ((model("chat", 12), 5, 3), (model("code", 10), 5, 0)),
            8,
            {"code"},
            0,
            id="R-a-model-with-requests-in-flight-is-dearer",
        ),
        pytest.param(
            TWO,
            ((model("busy", 20), 1, 2), (model("quiet", 20), 600, 0)),
            10,
            {"quiet"},
            1,
            id="R-the-device-where-freeing-costs-least",
        ),
        pytest.param(
            TWO,
            ((model("a", 20), 600, 0), (model("b", 10), 600, 0)),
            12,
            set(),
            1,
            id="R-a-device-with-room-first",
        ),
        pytest.param(
            CARD,
            ((model("base", 20, pinned=True), 600, 0),),
            8,
            {"base"},
            0,
            id="R-a-lease-beats-a-pinned-model-as-a-whole-group-lease-does",
        ),
        pytest.param(
            CARD,
            ((model("chat", 6), 300, 0), (model("code", 5), 5, 0)),
            30,
            {"chat", "code"},
            None,
            id="R-more-than-a-device-parks-the-whole-group",
        ),
    ],
)
def test_a_lease_with_memory_parks_only_what_must_go_on_one_device(
    capacity: Capacity, members: tuple[tuple[Member, float, int], ...], gib: float, parked: set[str], device: int | None
) -> None:
    card = loaded_card(capacity, *members)
    card.snapshot = dataclasses.replace(card.snapshot, lease=memory_lease(gib))
    plan = card.settle(1)
    names = {m.key.name for m, _, _ in members}
    for m, _, _ in members:
        card.update(m.key.name, in_flight=0)  # (what was in flight finishes)
    plan = card.settle(1)
    assert names - card.loaded() == parked
    for name in parked:
        assert card.member(name).preempted_by == "gpu-lease/trainer"
    if device is None:
        assert plan.reservation is None and plan.lease is not None, "the whole group is leased"
    else:
        assert plan.reservation is not None and plan.reservation.device == device
        assert plan.reservation.free, "free once everything that had to go is confirmed parked"
        assert plan.lease is not None and plan.lease.name == "l"


def test_a_lease_with_memory_in_a_group_without_a_capacity_leases_the_whole_group() -> None:
    card = Card(model("chat", 1), model("code", 1))
    card.snapshot = dataclasses.replace(card.snapshot, capacity=None)
    card.ask("chat")
    card.settle(1)
    card.snapshot = dataclasses.replace(card.snapshot, lease=memory_lease(1))
    plan = card.settle(1)
    assert card.loaded() == set() and plan.reservation is None and plan.lease is not None


def test_a_reservation_is_free_only_once_what_goes_is_confirmed_parked() -> None:
    card = loaded_card(CARD, (model("chat", 12), 300, 0), (model("code", 10), 5, 0))
    card.held = {key("chat")}  # a slow park
    card.snapshot = dataclasses.replace(card.snapshot, lease=memory_lease(8))
    plan = card.settle(1)
    assert plan.reservation is not None and not plan.reservation.free, "chat still holds its memory"
    assert card.view("code")[:2] == (ModelPhase.READY, SharedState.ACTIVE), "code keeps serving"
    card.held = set()
    plan = card.settle(15)
    assert plan.reservation is not None and plan.reservation.free
    assert card.loaded() == {"code"}


def test_nothing_loads_into_a_reservation_and_a_release_lets_the_parked_model_back() -> None:
    card = loaded_card(CARD, (model("chat", 12), 300, 0), (model("code", 10), 5, 0))
    card.snapshot = dataclasses.replace(card.snapshot, lease=memory_lease(8))
    card.settle(1)
    assert card.loaded() == {"code"}
    card.ask("chat", queued=3)
    card.update("code", in_flight=1, last_active_time=card.now)  # code is serving: it keeps its hold
    plan = card.settle(5)
    assert card.loaded() == {"code"}, "chat would fit only in the reserved bytes"
    assert card.view("chat")[1] is SharedState.QUEUED
    assert "gpu-lease/trainer (device 0)" in card.view("chat")[2]
    assert plan.reservation is not None and plan.reservation.free
    card.snapshot = dataclasses.replace(card.snapshot, lease=None)
    card.ask("chat", queued=3)
    card.settle(1)
    assert card.loaded() == {"chat", "code"}, "released: chat loads again, beside code"


def test_a_model_parked_by_hand_leaves_the_card_and_the_others_stay() -> None:
    """The status page's Park (``idle_parked_at``, as its idle timeout would): the model is evicted as idle (no
    preemption), the one beside it keeps serving, and a request for it brings it back."""
    card = Card(model("chat", 6), model("code", 5))
    for name in ("chat", "code"):
        card.ask(name)
        card.settle(1)
        card.served(name)
    card.update("chat", idle_parked_at=card.now)
    card.settle(1)
    assert card.loaded() == {"code"}
    assert card.member("chat").preempted_at is None and card.view("chat")[0] is ModelPhase.IDLE
    card.settle(5)
    assert card.loaded() == {"code"}, "it stays parked until asked"
    card.ask("chat")
    card.settle(1)
    assert card.loaded() == {"chat", "code"}


def test_a_model_larger_than_a_device_waits_and_says_why() -> None:
    card = Card(model("huge", 40))
    card.ask("huge")
    card.settle(1)
    assert card.loaded() == set()
    assert "more than the group's 1 x" in card.view("huge")[2]


def test_a_model_without_a_declared_size_takes_a_whole_device() -> None:
    card = Card(model("chat", 6), model("unknown", None), capacity=Capacity(devices=2, memory_per_device=24 * GiB))
    for name in ("chat", "unknown"):
        card.ask(name)
        card.settle(1)
    assert card.loaded() == {"chat", "unknown"}
    assert {card.member("chat").placement, card.member("unknown").placement} == {(0,), (1,)}


def test_tensor_parallel_models_are_placed_on_as_many_devices() -> None:
    card = Card(model("tp", 20, devices=2), model("small", 2), capacity=Capacity(devices=2, memory_per_device=24 * GiB))
    for name in ("tp", "small"):
        card.ask(name)
        card.settle(1)
    assert card.member("tp").placement == (0, 1)
    assert card.loaded() == {"tp", "small"}


def test_a_group_without_a_capacity_still_holds_one_model() -> None:
    card = Card(model("chat", 1), model("code", 1), capacity=None)  # type: ignore[arg-type]
    card.snapshot = dataclasses.replace(card.snapshot, capacity=None)
    card.ask("chat")
    card.settle(1)
    card.served("chat")
    card.ask("code")
    card.settle(30)
    assert len(card.loaded()) == 1


# ---- the capacity invariant, under any sequence of events --------------------------------------------------------

NAMES = ("a", "b", "c", "d", "e")


class CapacityMachine(RuleBasedStateMachine):
    """Requests, answers, crashes, slow parks, leases and forcePromotion in any order: on every device, the memory of
    the models not confirmed parked never exceeds its capacity."""

    def __init__(self) -> None:
        super().__init__()
        sizes = (9, 7, 12, 4, 20)
        self.card = Card(
            *(model(n, s, priority=p) for n, s, p in zip(NAMES, sizes, (10, 10, 50, 5, 10), strict=True)),
            capacity=Capacity(devices=2, memory_per_device=24 * GiB),
        )

    @rule(name=st.sampled_from(NAMES), queued=st.integers(0, 5))
    def request(self, name: str, queued: int) -> None:
        self.card.ask(name, queued)

    @rule(name=st.sampled_from(NAMES), busy=st.integers(0, 2))
    def serving(self, name: str, busy: int) -> None:
        if self.card.member(name).ready:
            self.card.update(name, in_flight=busy, last_active_time=self.card.now)

    @rule(name=st.sampled_from(NAMES))
    def slow_actuator(self, name: str) -> None:
        self.card.held ^= {key(name)}

    @rule(name=st.sampled_from(NAMES))
    def crash(self, name: str) -> None:
        m = self.card.member(name)
        if m.desired_action is ScaleAction.ACTIVATE and m.runtime == RuntimePhase.READY.value:
            self.card.update(name, runtime=RuntimePhase.FAILED.value, runtime_message="exited")

    @rule(on=st.booleans(), gib=st.sampled_from([None, 3, 10, 24, 30]))
    def lease(self, on: bool, gib: int | None) -> None:
        """A lease on the whole group, or with memory (30 GiB: more than a device, so the whole group too)."""
        memory = gib * GiB if gib is not None else None
        lease = Lease("l", "gpu", "trainer", self.card.now + timedelta(minutes=2), memory=memory) if on else None
        self.card.snapshot = dataclasses.replace(self.card.snapshot, lease=lease)

    @rule(name=st.sampled_from(NAMES))
    def force(self, name: str) -> None:
        for other in NAMES:
            self.card.update(other, force_promotion=other == name)

    @rule(seconds=st.sampled_from([0, 1, 5, 30, 120, 400]))
    def time_passes(self, seconds: int) -> None:
        self.card.step(seconds)

    @invariant()
    def never_over_capacity(self) -> None:
        capacity = self.card.snapshot.capacity
        assert capacity is not None
        used = [0] * capacity.devices
        for m in self.card.snapshot.members:
            if not m.parked:
                assert m.placement is not None, f"{m.key} holds memory with no placement"
                for device in m.placement:
                    used[device] += memory_of(m, capacity)
        assert all(u <= capacity.memory_per_device for u in used), used
        plan = self.card.plan
        if plan is not None and plan.reservation is not None and plan.reservation.free:
            # the holder was told the bytes are free: they stay so, beside what is not confirmed parked
            reserved = plan.reservation
            assert used[reserved.device] + reserved.memory <= capacity.memory_per_device, (used, reserved)

    @invariant()
    def a_free_reservation_stays_free(self) -> None:
        """Once free, no pass gives the reserved bytes to a model while the same lease holds."""
        plan = self.card.plan
        lease = plan.lease if plan is not None else None  # the lease the last pass planned for
        if plan is None or plan.reservation is None or lease is None:
            self.free_for = None
            return
        planned_for = (lease.memory, lease.expires_at)
        if getattr(self, "free_for", None) == planned_for:
            assert plan.reservation.free, "a reservation once free was taken back"
        self.free_for = planned_for if plan.reservation.free else None


TestCapacityMachine = CapacityMachine.TestCase
TestCapacityMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
