"""Demand that never lapses: a source's queued count stands until it reports 0 or misses three demand refreshes,
whatever the demand window; the settings that cannot work are refused at start, naming both."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flexinfer_common.enums import SchedulingPolicy
from flexinfer_common.keys import ModelKey
from flexinfer_common.settings import SettingsError, load_settings
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import GroupSnapshot, Member
from flexinfer_scheduler.domain.plan import apply_plan, plan_group
from flexinfer_scheduler.settings import SchedulerSettings


@pytest.mark.parametrize(
    ("refresh", "ttl"),
    [
        pytest.param(10, 35, id="default-refresh-35s"),
        pytest.param(1, 8, id="fast-refresh"),
        pytest.param(60, 185, id="slow-refresh"),
    ],
)
def test_queued_ttl_follows_the_refresh_not_the_demand_window(refresh: int, ttl: int) -> None:
    settings = SchedulerSettings(demand_refresh_interval=refresh, shared_demand_window=3)
    assert settings.queued_ttl == timedelta(seconds=ttl)
    assert settings.queued_ttl > settings.demand_refresh_interval


def test_prune_shorter_than_the_queued_ttl_is_refused_naming_both(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXINFER_PRUNE_AFTER", "30s")
    with pytest.raises(SettingsError) as raised:
        load_settings(SchedulerSettings)
    assert "FLEXINFER_PRUNE_AFTER" in str(raised.value)
    assert "FLEXINFER_DEMAND_REFRESH_INTERVAL" in str(raised.value)
    monkeypatch.setenv("FLEXINFER_DEMAND_REFRESH_INTERVAL", "5s")
    monkeypatch.setenv("FLEXINFER_SHARED_DEMAND_WINDOW", "3s")  # TTL max(3s, 20s) = 20s < 30s: works
    assert load_settings(SchedulerSettings).queued_ttl == timedelta(seconds=20)


@pytest.mark.parametrize("variable", ["FLEXINFER_DEMAND_REFRESH_INTERVAL", "FLEXINFER_QUEUE_TIMEOUT"])
def test_zero_interval_is_refused(monkeypatch: pytest.MonkeyPatch, variable: str) -> None:
    monkeypatch.setenv(variable, "0s")
    with pytest.raises(SettingsError, match=variable):
        load_settings(SchedulerSettings)


def test_scheduling_policy_setting_and_explicit_cooldown(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(SchedulerSettings).scheduling_policy is SchedulingPolicy.FLEXINFER
    assert load_settings(SchedulerSettings).explicit_swap_cooldown is None
    monkeypatch.setenv("FLEXINFER_SCHEDULING_POLICY", "seed")
    monkeypatch.setenv("FLEXINFER_DEFAULT_SWAP_COOLDOWN", "2m")
    settings = load_settings(SchedulerSettings)
    assert settings.scheduling_policy is SchedulingPolicy.SEED
    assert settings.explicit_swap_cooldown == timedelta(minutes=2)
    monkeypatch.setenv("FLEXINFER_SCHEDULING_POLICY", "fastest")
    with pytest.raises(SettingsError, match="FLEXINFER_SCHEDULING_POLICY"):
        load_settings(SchedulerSettings)


# ---- the planner: a model with requests waiting is never un-demanded ---------------------------------------------

START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


@settings(max_examples=200, deadline=None)
@given(
    window=st.integers(1, 180),
    refresh=st.integers(1, 60),
    reconcile=st.integers(1, 30),
    steps=st.integers(5, 60),
)
def test_a_model_with_requests_waiting_is_never_undemanded(
    window: int, refresh: int, reconcile: int, steps: int
) -> None:
    """B's requests wait behind a busy A; the proxy renews B's count every ``refresh`` s and the scheduler plans
    every ``reconcile`` s, summing counts as the store does (within the queued TTL). Whatever the three, B's
    ``demand_since`` is set from the first pass on and never cleared, and its queued sum never falls to 0."""
    ttl = SchedulerSettings(shared_demand_window=window, demand_refresh_interval=refresh).queued_ttl
    params = ElectionParams(demand_window=timedelta(seconds=window))
    a, b = ModelKey("default", "a"), ModelKey("default", "b")
    snapshot = GroupSnapshot("gpu", (Member(a), Member(b)), active=a)
    reported_at = START  # B's count (2 waiting) as the proxy last renewed it
    now = START
    for step in range(steps):
        now = START + timedelta(seconds=step * reconcile)
        while reported_at + timedelta(seconds=refresh) <= now:
            reported_at += timedelta(seconds=refresh)
        queued = 2 if now - reported_at <= ttl else 0
        assert queued == 2, f"B's count lapsed at {now - START} (refresh {refresh}s, TTL {ttl})"
        members = tuple(dataclasses.replace(m, queued=queued) if m.key == b else m for m in snapshot.members)
        snapshot = GroupSnapshot("gpu", members, active=snapshot.active, swap=snapshot.swap)
        plan = plan_group(snapshot, now, params, command_retry=timedelta(seconds=10), new_swap_id=f"s{step}")
        snapshot = apply_plan(snapshot, plan)
        member_b = snapshot.member(b)
        assert member_b is not None
        if snapshot.active != b:
            assert member_b.demand_since is not None, f"B un-demanded at {now - START} while its requests wait"
