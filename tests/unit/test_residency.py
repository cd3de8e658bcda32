"""The resident set (issue 23): fitting, eviction choice and pinning, and the capacity invariant as a property."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.model import Capacity, Member
from flexinfer_scheduler.domain.residency import ResidencyReason, memory_of, plan_residency

GI = 1024**3
NOW = datetime(2026, 1, 1, tzinfo=UTC)
CARD = Capacity(devices=1, memory_per_device=24 * GI)


def m(name: str, gib: float | None, **kw: object) -> Member:
    return Member(key=ModelKey("default", name), memory=None if gib is None else int(gib * GI), **kw)  # type: ignore[arg-type]


def loaded_in(seconds: float) -> dict[str, object]:
    """A member loaded ``seconds`` after its activate (its measured reload time)."""
    ready = NOW - timedelta(seconds=600)
    return {"ready_since": ready, "command_issued_at": ready - timedelta(seconds=seconds)}


def k(name: str) -> ModelKey:
    return ModelKey("default", name)


@pytest.mark.parametrize(
    ("members", "loaded", "candidate", "evict", "reason"),
    [
        pytest.param([m("chat", 6), m("code", 5)], ["chat"], "code", [], ResidencyReason.FITS, id="fits-beside"),
        pytest.param([m("chat", 6)], ["chat"], "chat", [], ResidencyReason.ALREADY_LOADED, id="already-loaded"),
        pytest.param(
            [m("chat", 6), m("img", 10), m("big", 16)],
            ["chat", "img"],
            "big",
            ["img"],
            ResidencyReason.EVICTS,
            id="evict-only-what-must-go",
        ),
        pytest.param(
            [m("chat", 6, in_flight=2), m("code", 6), m("big", 18)],
            ["chat", "code"],
            "big",
            ["code"],
            ResidencyReason.EVICTS,
            id="evict-the-idle-one-before-the-busy-one",
        ),
        pytest.param(
            [m("chat", 12, priority=1), m("code", 12), m("big", 12)],
            ["chat", "code"],
            "big",
            ["code"],
            ResidencyReason.EVICTS,
            id="evict-lower-priority-first",
        ),
        pytest.param(
            [m("chat", 12, pinned=True), m("big", 20)],
            ["chat"],
            "big",
            [],
            ResidencyReason.NO_ROOM,
            id="pinned-stays-for-equal-priority",
        ),
        pytest.param(
            [m("chat", 12, pinned=True), m("big", 20, priority=5)],
            ["chat"],
            "big",
            ["chat"],
            ResidencyReason.EVICTS,
            id="pinned-yields-to-higher-priority",
        ),
        pytest.param(
            [m("chat", 12, priority=5, queued=1), m("big", 20)],
            ["chat"],
            "big",
            [],
            ResidencyReason.NO_ROOM,
            id="busy-higher-priority-stays",
        ),
        pytest.param(
            [
                m("chat", 10, last_active_time=NOW - timedelta(seconds=40), **loaded_in(0.31)),
                m("code", 10, last_active_time=NOW - timedelta(seconds=5), **loaded_in(0.25)),
                m("big", 12),
            ],
            ["chat", "code"],
            "big",
            ["chat"],
            ResidencyReason.EVICTS,
            id="of-two-quick-loaders-the-one-idle-longer-goes",
        ),
        pytest.param(
            [
                m("slow", 10, last_active_time=NOW - timedelta(seconds=60), **loaded_in(300)),
                m("quick", 10, last_active_time=NOW - timedelta(seconds=60), **loaded_in(20)),
                m("big", 12),
            ],
            ["slow", "quick"],
            "big",
            ["quick"],
            ResidencyReason.EVICTS,
            id="equally-idle-the-quicker-reload-goes",
        ),
        pytest.param([m("huge", 30)], [], "huge", [], ResidencyReason.NO_ROOM, id="larger-than-a-device"),
        pytest.param(
            [m("chat", 6), m("nomem", None)],
            ["chat"],
            "nomem",
            ["chat"],
            ResidencyReason.EVICTS,
            id="undeclared-takes-a-whole-device",
        ),
    ],
)
def test_resident_set(
    members: list[Member], loaded: list[str], candidate: str, evict: list[str], reason: ResidencyReason
) -> None:
    placements = {k(n): (0,) for n in loaded}
    plan = plan_residency(CARD, tuple(members), placements, k(candidate), NOW)
    assert plan.reason is reason
    assert set(plan.evict) == {k(n) for n in evict}
    if reason in (ResidencyReason.FITS, ResidencyReason.EVICTS):
        assert k(candidate) in plan.placements
        assert not set(plan.evict) & plan.placements.keys()


def test_placement_is_best_fit_on_two_devices() -> None:
    card = Capacity(devices=2, memory_per_device=24 * GI)
    members = (m("a", 20), m("b", 4), m("c", 3))
    plan = plan_residency(card, members, {k("a"): (0,), k("b"): (1,)}, k("c"), NOW)
    assert plan.reason is ResidencyReason.FITS
    assert plan.placements[k("c")] == (0,)  # device 0 has 4 GiB free: the tighter fit


def test_a_tensor_parallel_model_takes_two_devices() -> None:
    card = Capacity(devices=2, memory_per_device=24 * GI)
    plan = plan_residency(card, (m("tp", 20, devices=2),), {}, k("tp"), NOW)
    assert plan.placements[k("tp")] == (0, 1)


@st.composite
def worlds(draw: st.DrawFn) -> tuple[Capacity, tuple[Member, ...], dict[ModelKey, tuple[int, ...]], ModelKey]:
    card = Capacity(devices=draw(st.integers(1, 3)), memory_per_device=draw(st.integers(1, 48)) * GI)
    count = draw(st.integers(1, 8))
    members = tuple(
        Member(
            key=k(f"m{i}"),
            memory=draw(st.one_of(st.none(), st.integers(1, 48).map(lambda g: g * GI))),
            devices=draw(st.integers(1, 3)),
            pinned=draw(st.booleans()),
            priority=draw(st.integers(0, 3)),
            in_flight=draw(st.integers(0, 2)),
            queued=draw(st.integers(0, 2)),
            last_active_time=NOW - timedelta(seconds=draw(st.integers(0, 3600))),
        )
        for i in range(count)
    )
    # build a valid starting set by loading members one by one where they fit
    placements: dict[ModelKey, tuple[int, ...]] = {}
    for member in members[:-1]:
        if draw(st.booleans()):
            plan = plan_residency(card, members, placements, member.key, NOW)
            if plan.reason is ResidencyReason.FITS:
                placements = plan.placements
    return card, members, placements, draw(st.sampled_from([x.key for x in members]))


@settings(max_examples=300, deadline=None)
@given(worlds())
def test_the_chosen_resident_set_fits_every_device(
    world: tuple[Capacity, tuple[Member, ...], dict[ModelKey, tuple[int, ...]], ModelKey],
) -> None:
    card, members, placements, candidate = world
    by_key = {x.key: x for x in members}
    plan = plan_residency(card, members, placements, candidate, NOW)
    used = [0] * card.devices
    for key, devices in plan.placements.items():
        assert len(devices) == by_key[key].devices == len(set(devices))
        for device in devices:
            used[device] += memory_of(by_key[key], card)
    assert all(u <= card.memory_per_device for u in used)
    for key in plan.evict:  # never a pinned model for a lower or equal priority
        assert not (by_key[key].pinned and by_key[key].priority >= by_key[candidate].priority)
