"""Re-queueing a request whose model could not be connected to: the pure decision, and the route table's local
"not Ready" mark (``suspect`` / ``unsuspect``)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from flexinfer_common.enums import ModelPhase, SharedState
from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Route
from flexinfer_proxy.domain.admission import MAX_REQUEUES, ConnectFailure, after_connect_failure
from flexinfer_proxy.domain.routes import RouteTable

KEY = ModelKey("default", "m1")


def ready_route(endpoint: str = "http://10.0.0.1:8000") -> Route:
    return Route(
        namespace="default",
        name="m1",
        ready=True,
        endpoint=endpoint,
        service_labels=["chat"],
        phase=ModelPhase.READY,
        state=SharedState.ACTIVE,
        updated_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


R, U, FULL, DOWN = (
    ConnectFailure.REQUEUE,
    ConnectFailure.UNAVAILABLE,
    ConnectFailure.QUEUE_FULL,
    ConnectFailure.SHUTTING_DOWN,
)


@pytest.mark.parametrize(
    ("never_connected", "body_held", "requeues", "queued", "shutting_down", "expected"),
    [
        pytest.param(True, True, 0, 0, False, R, id="refused-first-time-requeues"),
        pytest.param(True, True, 1, 5, False, R, id="refused-again-requeues-behind-others"),
        pytest.param(True, True, MAX_REQUEUES, 0, False, U, id="bounded-then-502"),
        pytest.param(False, True, 0, 0, False, U, id="closed-after-sending-is-502"),
        pytest.param(True, False, 0, 0, False, U, id="streamed-upload-is-502"),
        pytest.param(False, False, 0, 0, False, U, id="neither"),
        pytest.param(True, True, 0, 10, False, FULL, id="queue-full-is-429"),
        pytest.param(True, True, 0, 0, True, DOWN, id="shutting-down-is-503"),
        pytest.param(False, True, 0, 10, True, U, id="not-requeueable-stays-502-whatever-the-queue"),
    ],
)
def test_after_connect_failure(
    never_connected: bool, body_held: bool, requeues: int, queued: int, shutting_down: bool, expected: ConnectFailure
) -> None:
    answer = after_connect_failure(
        never_connected=never_connected,
        body_held=body_held,
        requeues=requeues,
        queued=queued,
        queue_max=10,
        shutting_down=shutting_down,
    )
    assert answer is expected


@pytest.fixture
def original() -> Route:
    """The model's Ready route, as the KV holds it."""
    return ready_route()


@pytest.fixture
def table(original: Route) -> RouteTable:
    """A table holding ``original``, marked not Ready after a request failed to connect to it."""
    table = RouteTable([original])
    assert table.suspect(KEY, original)
    return table


def test_suspect_marks_the_route_not_ready_until_unsuspect(original: Route, table: RouteTable) -> None:
    marked = table.get(KEY)
    assert marked is not None and not marked.ready and marked.endpoint == original.endpoint
    assert table.resolve("chat", default_namespace="default").route is marked, "the labels stay indexed"
    assert not table.suspect(KEY, original), "marked already"
    assert not table.suspect(KEY, marked), "only a Ready route is marked"
    assert table.unsuspect(KEY, original)
    assert table.get(KEY) is original
    assert not table.unsuspect(KEY, original), "the mark is gone"


def test_a_newer_route_from_the_kv_ends_the_mark_at_once(original: Route, table: RouteTable) -> None:
    newer = ready_route("http://10.0.0.2:8000")
    table.put(newer)
    assert table.get(KEY) is newer
    assert not table.unsuspect(KEY, original), "a late expiry does not bring the old route back"
    assert table.get(KEY) is newer
    assert not table.suspect(KEY, original), "the request failed on a route that is no longer the model's"


def test_a_snapshot_replaces_the_mark_and_a_removal_forgets_it(original: Route, table: RouteTable) -> None:
    assert table.replace([original]) == {KEY}
    assert table.get(KEY) is original, "the KV's route again"
    assert not table.unsuspect(KEY, original)
    assert table.suspect(KEY, original)
    table.remove(KEY)
    assert not table.unsuspect(KEY, original) and table.get(KEY) is None
