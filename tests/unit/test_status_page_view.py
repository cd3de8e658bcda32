"""The status page's view model (pure): who holds the card, the timeline's shading and failure marks, queue depths,
events, leases, and the session cookie's check."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flexinfer_scheduler.ui.routes import BusMessage, event_of, session_valid, session_value
from flexinfer_scheduler.ui.view import (
    DeviceInfo,
    GroupInfo,
    LeaseInfo,
    MemberInfo,
    SwapInfo,
    build_view,
    quantity_bytes,
    swap_outcome,
    timeline,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def at(minutes_ago: float) -> datetime:
    return NOW - timedelta(minutes=minutes_ago)


def swap(
    id: str, frm: str | None, to: str | None, started: float, phase: str, phases: dict[str, float], **kw: object
) -> SwapInfo:
    finished = kw.pop("finished", None)
    return SwapInfo(
        id=id,
        group="gpu",
        from_model=frm,
        to_model=to,
        reason=str(kw.pop("reason", "demand")),
        phase=phase,
        started_at=at(started),
        finished_at=at(finished) if isinstance(finished, int | float) else None,
        phases=phases,
        message=str(kw.pop("message", "")),
    )


def view(**kw: object) -> dict[str, object]:
    args: dict[str, object] = {
        "groups": [GroupInfo("gpu", "Serving", "default/a")],
        "members": [],
        "swaps": [],
        "leases": [],
        "events": [],
        "queue_history": {},
        "now": NOW,
    }
    args.update(kw)
    return build_view(**args)  # type: ignore[arg-type]


def test_the_group_says_who_holds_the_card_and_every_members_numbers() -> None:
    members = [
        MemberInfo("default", "a", "gpu", priority=100, phase="Ready", state="Active", in_flight=2, restarts=1),
        MemberInfo(
            "default",
            "b",
            "gpu",
            priority=50,
            phase="Pending",
            state="Queued",
            queue_position=1,
            waiting=3,
            message="waiting: a holds the GPU (cooldown)",
        ),
    ]
    (group,) = view(members=members)["groups"]  # type: ignore[misc]
    assert group["holders"] == ["default/a"]
    a, b = group["members"]
    assert a["holdsCard"] and a["inFlight"] == 2 and a["restarts"] == 1
    assert not b["holdsCard"] and b["waiting"] == 3 and b["queuePosition"] == 1
    assert b["message"] == "waiting: a holds the GPU (cooldown)"
    assert group["memory"] is None  # no capacity, no declared memory: nothing invented


def test_memory_in_use_is_shown_once_the_data_is_there() -> None:
    members = [
        MemberInfo("default", "a", "gpu", phase="Ready", memory="6Gi"),
        MemberInfo("default", "b", "gpu", phase="Loading", memory="2Gi"),
        MemberInfo("default", "c", "gpu", phase="Pending", memory="10Gi"),  # parked: holds nothing
    ]
    groups = [GroupInfo("gpu", "Serving", "default/a", capacity_memory="24Gi", capacity_devices=1)]
    (group,) = view(groups=groups, members=members)["groups"]  # type: ignore[misc]
    assert group["memory"] == {"usedBytes": 8 * 1024**3, "capacityBytes": 24 * 1024**3}


def test_a_group_with_a_capacity_shows_each_card_as_the_planner_sees_it() -> None:
    """Per card, what its models hold (an estimated size included: the manifest declares none) and what is free,
    from the group API's device view, not from the declared sizes."""
    members = [
        MemberInfo("default", "a", "gpu", phase="Ready", memory="6Gi"),
        MemberInfo("default", "b", "gpu", phase="Ready"),  # estimated from its weights: 3 GiB
    ]
    cards = (
        DeviceInfo(0, used_bytes=6 * 1024**3, free_bytes=18 * 1024**3, models=("default/a",)),
        DeviceInfo(1, used_bytes=3 * 1024**3, free_bytes=21 * 1024**3, models=("default/b",)),
    )
    groups = [GroupInfo("gpu", "Serving", "default/a", capacity_memory="24Gi", capacity_devices=2, devices=cards)]
    (group,) = view(groups=groups, members=members)["groups"]  # type: ignore[misc]
    assert group["memory"] == {
        "usedBytes": 9 * 1024**3,
        "capacityBytes": 48 * 1024**3,
        "devices": [
            {"index": 0, "usedBytes": 6 * 1024**3, "freeBytes": 18 * 1024**3, "models": ["default/a"]},
            {"index": 1, "usedBytes": 3 * 1024**3, "freeBytes": 21 * 1024**3, "models": ["default/b"]},
        ],
    }


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("6Gi", 6 * 1024**3, id="binary"),
        pytest.param("500M", 500 * 10**6, id="decimal"),
        pytest.param("1024", 1024, id="bytes"),
        pytest.param("lots", None, id="not-a-quantity"),
        pytest.param(None, None, id="absent"),
    ],
)
def test_quantities(text: str | None, expected: int | None) -> None:
    assert quantity_bytes(text) == expected


def test_the_timeline_shades_draining_and_loading_holds_between_swaps_and_marks_failures() -> None:
    swaps = [
        swap("s1", None, "default/a", 50, "ready", {"draining": 0, "parking": 0, "loading": 60}, finished=49),
        swap("s2", "default/a", "default/b", 30, "ready", {"draining": 30, "parking": 30, "loading": 60}, finished=28),
        swap(
            "s3",
            "default/b",
            "default/c",
            10,
            "failed",
            {"draining": 0, "parking": 0, "loading": 120},
            finished=8,
            message="default/c failed to load: killed by signal 4",
        ),
    ]
    t = timeline(swaps, NOW)
    kinds = [(s["model"], s["kind"]) for s in t["segments"]]
    assert ("default/a", "loading") in kinds and ("default/a", "held") in kinds
    assert ("default/a", "draining") in kinds and ("default/b", "loading") in kinds
    assert ("default/c", "loading") in kinds
    held_a = next(s for s in t["segments"] if s["model"] == "default/a" and s["kind"] == "held")
    assert held_a["end"] == swaps[1].started_at.isoformat().replace("+00:00", "Z")  # until the next swap began
    (mark,) = t["marks"]
    assert mark["kind"] == "failed" and "killed by signal 4" in mark["text"] and mark["model"] == "default/c"


def test_a_running_swap_is_shaded_up_to_now() -> None:
    t = timeline([swap("s1", "default/a", "default/b", 1, "loading", {"draining": 5, "parking": 5})], NOW)
    loading = next(s for s in t["segments"] if s["kind"] == "loading")
    assert loading["end"] == NOW.isoformat().replace("+00:00", "Z")


def test_swaps_older_than_the_hour_are_cut_at_its_start() -> None:
    t = timeline([swap("s1", None, "default/a", 120, "ready", {"loading": 60}, finished=119)], NOW)
    (held,) = t["segments"]
    assert held["kind"] == "held" and held["start"] == at(60).isoformat().replace("+00:00", "Z")


@pytest.mark.parametrize(
    ("phase", "outcome"),
    [
        pytest.param("ready", "ready", id="ready"),
        pytest.param("failed", "failed", id="failed"),
        pytest.param("aborted", "aborted", id="aborted"),
        pytest.param("loading", None, id="running"),
    ],
)
def test_swap_outcome(phase: str, outcome: str | None) -> None:
    assert swap_outcome(phase) == outcome


def test_events_list_swaps_preemptions_and_failures_newest_first() -> None:
    swaps = [
        swap("s1", "default/a", "default/b", 20, "ready", {"loading": 60}, finished=18),
        swap("s2", "default/b", "default/c", 5, "failed", {"loading": 60}, finished=4, message="c failed: oom"),
    ]
    events = view(swaps=swaps)["events"]
    kinds = [e["kind"] for e in events]  # type: ignore[index]
    assert kinds == ["swap.failed", "preemption", "swap.finished", "preemption"]
    assert events[0]["severity"] == "error" and "c failed: oom" in events[0]["text"]  # type: ignore[index]


def test_queue_depths_keep_models_that_had_requests_waiting() -> None:
    history = {"default/a": [(at(10), 0), (at(5), 4), (at(1), 0)], "default/b": [(at(3), 0)]}
    queues = view(queue_history=history)["queues"]
    assert [s["model"] for s in queues["series"]] == ["default/a"]  # type: ignore[index]
    assert queues["peak"] == 4  # type: ignore[index]


def test_leases_count_down_and_an_expired_one_holds_no_group() -> None:
    leases = [
        LeaseInfo("train", "gpu", "alice", NOW + timedelta(seconds=90)),
        LeaseInfo("old", "other", "bob", NOW - timedelta(seconds=1)),
    ]
    document = view(leases=leases, groups=[GroupInfo("gpu", "Leased", None), GroupInfo("other", "Idle", None)])
    by_name = {g["name"]: g for g in document["groups"]}  # type: ignore[union-attr]
    assert by_name["gpu"]["lease"]["remainingSeconds"] == 90.0
    assert by_name["other"]["lease"] is None
    assert [lease["remainingSeconds"] for lease in document["leases"]] == [0.0, 90.0]  # type: ignore[union-attr]


def test_a_crash_event_from_the_bus_is_an_error_line_with_its_reason() -> None:
    data = (
        b'{"kind": "model.crashed", "namespace": "default", "model": "a", "group": "gpu", "restarts": 2,'
        b' "status": {"phase": "Failed", "message": "crashed: killed by signal 9"}, "time": "2026-12-01T12:00:00Z"}'
    )
    event = event_of(BusMessage(subject="flexinfer.events.model.gpu", data=data))
    assert event is not None and event.severity == "error" and "killed by signal 9" in event.text
    assert event_of(BusMessage(subject="flexinfer.events.model.gpu", data=b"not json")) is None


def test_the_session_cookie_is_valid_only_for_its_token_and_until_it_expires() -> None:
    value = session_value("secret", 2_000)
    assert session_valid("secret", value, 1_000)
    assert not session_valid("secret", value, 2_001)  # expired
    assert not session_valid("other", value, 1_000)  # the token changed
    assert not session_valid("secret", "3000." + value.split(".")[1], 1_000)  # expiry forged
    assert not session_valid("secret", None, 1_000)
