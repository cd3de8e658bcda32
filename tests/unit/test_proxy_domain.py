"""The proxy's pure decisions: model resolution, admission, queue actions, the FIFO, demand timing, body parsing."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from flexinfer_common.enums import ModelPhase, SharedState
from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Route
from flexinfer_proxy.domain.admission import (
    Admission,
    ConnectFailure,
    QueueAction,
    TimeoutAnswer,
    admit,
    after_connect_failure,
    fails_waiter,
    failure_mark,
    queue_action,
    timeout_answer,
)
from flexinfer_proxy.domain.demand_reports import (
    DemandReport,
    activity_due,
    demand_check_in,
    demand_due,
    demand_settled,
)
from flexinfer_proxy.domain.errors import ErrorCode, ProxyError
from flexinfer_proxy.domain.fifo import WaitQueue
from flexinfer_proxy.domain.requests import (
    ApiKeys,
    Endpoint,
    model_of,
    parse_endpoint,
    prefixed_target,
    raw_connection_tokens,
    relayed_head,
    retry_safe,
)
from flexinfer_proxy.domain.routes import ResolvedBy, RouteTable

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def route(
    name: str,
    *,
    namespace: str = "default",
    ready: bool = False,
    priority: int = 0,
    labels: tuple[str, ...] = (),
    failure: str | None = None,
) -> Route:
    return Route(
        namespace=namespace,
        name=name,
        priority=priority,
        service_labels=list(labels),
        ready=ready,
        phase=ModelPhase.READY if ready else ModelPhase.IDLE,
        state=SharedState.ACTIVE if ready else SharedState.PARKED,
        endpoint="http://127.0.0.1:9000" if ready else None,
        failure=failure,
        updated_at=T0,
    )


# --------------------------------------------------------------------------- resolution

CATALOGUE = [
    route("llama", ready=True, labels=("chat",)),
    route("qwen", priority=10, labels=("chat", "code")),
    route("mistral", priority=10, labels=("code",)),
    route("coder", namespace="team", labels=("code", "team-chat")),
    route("solo", namespace="team"),
    route("twin", namespace="a"),
    route("twin", namespace="b"),
    route("llama", namespace="team"),
]


@pytest.mark.parametrize(
    ("requested", "expected", "by"),
    [
        pytest.param("team/coder", ("team", "coder"), ResolvedBy.QUALIFIED, id="namespace-slash-name-exact"),
        pytest.param("llama", ("default", "llama"), ResolvedBy.NAME, id="bare-name-prefers-default-namespace"),
        pytest.param("team/llama", ("team", "llama"), ResolvedBy.QUALIFIED, id="qualified-beats-default-namespace"),
        pytest.param("solo", ("team", "solo"), ResolvedBy.NAME, id="bare-name-unique-in-another-namespace"),
        pytest.param("chat", ("default", "llama"), ResolvedBy.SERVICE_LABEL, id="label-goes-to-the-ready-carrier"),
        pytest.param(
            "code", ("default", "mistral"), ResolvedBy.SERVICE_LABEL, id="label-none-ready-highest-priority-then-name"
        ),
        pytest.param("team-chat", ("team", "coder"), ResolvedBy.SERVICE_LABEL, id="label-in-any-namespace"),
        pytest.param("team/code", ("team", "coder"), ResolvedBy.SERVICE_LABEL, id="namespace-slash-label"),
    ],
)
def test_resolution(requested: str, expected: tuple[str, str], by: ResolvedBy) -> None:
    resolved = RouteTable(CATALOGUE).resolve(requested, default_namespace="default")
    assert resolved.key == ModelKey(*expected)
    assert (resolved.route.namespace, resolved.route.name) == expected
    assert resolved.by is by


@pytest.mark.parametrize(
    ("requested", "status", "code"),
    [
        pytest.param("nope", 404, ErrorCode.MODEL_NOT_FOUND, id="unknown-name"),
        pytest.param("team/nope", 404, ErrorCode.MODEL_NOT_FOUND, id="unknown-qualified"),
        pytest.param("default/coder", 404, ErrorCode.MODEL_NOT_FOUND, id="name-in-the-wrong-namespace"),
        pytest.param("default/team-chat", 404, ErrorCode.MODEL_NOT_FOUND, id="label-of-another-namespace"),
        pytest.param("twin", 400, ErrorCode.MODEL_AMBIGUOUS, id="bare-name-in-two-other-namespaces"),
    ],
)
def test_resolution_failures(requested: str, status: int, code: ErrorCode) -> None:
    with pytest.raises(ProxyError) as caught:
        RouteTable(CATALOGUE).resolve(requested, default_namespace="default")
    assert (caught.value.status, caught.value.code) == (status, code)


def test_unknown_model_error_body_is_openai_style() -> None:
    with pytest.raises(ProxyError) as caught:
        RouteTable().resolve("x", default_namespace="default")
    assert caught.value.body() == (
        b'{"error": {"message": "model \'x\' not found", "type": "invalid_request_error", "code": "model_not_found"}}'
    )


def test_table_updates_keep_the_indexes_right() -> None:
    table = RouteTable([route("a", labels=("chat",)), route("b", labels=("chat",), priority=5)])
    assert table.resolve("chat", default_namespace="default").route.name == "b"
    table.put(route("b", labels=()))  # b dropped the label
    assert table.resolve("chat", default_namespace="default").route.name == "a"
    assert table.remove(ModelKey("default", "a")) is not None
    with pytest.raises(ProxyError):
        table.resolve("chat", default_namespace="default")
    changed = table.replace([route("b", ready=True), route("c")])
    assert changed == {ModelKey("default", "b"), ModelKey("default", "c")}
    assert [r.name for r in table] == ["b", "c"]
    assert table.replace([route("b", ready=True)]) == {ModelKey("default", "c")}


# --------------------------------------------------------------------------- admission


@pytest.mark.parametrize(
    ("the_route", "queued", "shutting_down", "expected"),
    [
        pytest.param(route("m", ready=True), 0, False, Admission.FORWARD, id="ready-and-nobody-waits-forwards"),
        pytest.param(route("m", ready=True), 2, False, Admission.QUEUE, id="ready-but-drain-in-progress-queues"),
        pytest.param(route("m", ready=True), 0, True, Admission.FORWARD, id="ready-still-forwards-while-stopping"),
        pytest.param(route("m"), 0, False, Admission.QUEUE, id="parked-queues"),
        pytest.param(route("m"), 3, False, Admission.QUEUE_FULL, id="parked-queue-at-bound-rejects"),
        pytest.param(route("m"), 2, False, Admission.QUEUE, id="parked-queue-below-bound-queues"),
        pytest.param(route("m", failure="oom"), 0, False, Admission.QUEUE, id="failed-model-queues-to-ask-a-retry"),
        pytest.param(route("m", failure="oom"), 3, False, Admission.QUEUE_FULL, id="failed-model-queue-bounded"),
        pytest.param(route("m"), 0, True, Admission.SHUTTING_DOWN, id="shutting-down-queues-nothing"),
    ],
)
def test_admission(the_route: Route, queued: int, shutting_down: bool, expected: Admission) -> None:
    assert admit(route=the_route, queued=queued, queue_max=3, shutting_down=shutting_down) is expected


@pytest.mark.parametrize(
    ("the_route", "held", "queued_bytes", "expected"),
    [
        pytest.param(route("m"), 400, 500, Admission.QUEUE, id="fits-queues"),
        pytest.param(route("m"), 500, 500, Admission.QUEUE, id="exactly-at-the-limit-queues"),
        pytest.param(route("m"), 501, 500, Admission.QUEUE_BYTES_FULL, id="past-the-limit-is-429"),
        pytest.param(route("m"), 1001, 0, Admission.QUEUE_BYTES_FULL, id="one-body-past-the-limit-is-429"),
        pytest.param(route("m", ready=True), 5000, 1000, Admission.FORWARD, id="forwarded-requests-hold-no-queue"),
    ],
)
def test_admission_bounds_the_bytes_held_by_waiting_requests(
    the_route: Route, held: int, queued_bytes: int, expected: Admission
) -> None:
    decision = admit(
        route=the_route,
        queued=0,
        queue_max=3,
        shutting_down=False,
        held=held,
        queued_bytes=queued_bytes,
        queued_bytes_max=1000,
    )
    assert decision is expected


def test_a_requeue_is_bounded_by_the_queued_bytes_too() -> None:
    common = {"never_connected": True, "body_held": True, "requeues": 0, "queued": 0, "queue_max": 3}
    answer = after_connect_failure(**common, shutting_down=False, held=600, queued_bytes=500, queued_bytes_max=1000)
    assert answer is ConnectFailure.QUEUE_BYTES_FULL
    answer = after_connect_failure(**common, shutting_down=False, held=400, queued_bytes=500, queued_bytes_max=1000)
    assert answer is ConnectFailure.REQUEUE


@pytest.mark.parametrize(
    ("the_route", "expected"),
    [
        pytest.param(route("m", ready=True), QueueAction.RELEASE, id="ready-releases"),
        pytest.param(route("m"), QueueAction.HOLD, id="still-loading-holds"),
        pytest.param(route("m", failure="exit 1"), QueueAction.FAIL, id="failure-fails-the-queue"),
        pytest.param(None, QueueAction.REMOVED, id="deleted-route-removes"),
    ],
)
def test_queue_action(the_route: Route | None, expected: QueueAction) -> None:
    assert queue_action(the_route) is expected


@pytest.mark.parametrize(
    ("seen", "the_route", "expected"),
    [
        pytest.param(None, route("m", failure="oom"), True, id="waiting-before-the-failure-is-answered"),
        pytest.param(("oom", 0), route("m", failure="oom"), False, id="joined-after-this-failure-waits-for-retry"),
        pytest.param(("oom", 0), route("m", failure="exit 1"), True, id="a-different-failure-is-news"),
    ],
)
def test_fails_waiter(seen: tuple[str, int] | None, the_route: Route, expected: bool) -> None:
    assert fails_waiter(seen=seen, route=the_route) is expected


def test_a_retry_with_a_new_generation_is_a_new_failure() -> None:
    first = route("m", failure="oom")
    retried = first.model_copy(update={"generation": first.generation + 1})
    assert fails_waiter(seen=failure_mark(first), route=retried)
    assert failure_mark(route("m", ready=True)) is None


@pytest.mark.parametrize(
    ("the_route", "signalled", "expected"),
    [
        pytest.param(route("m"), True, TimeoutAnswer.QUEUE_TIMEOUT, id="loading-too-long-504"),
        pytest.param(route("m"), False, TimeoutAnswer.DEMAND_UNAVAILABLE, id="bus-down-all-along-503"),
        pytest.param(route("m", failure="oom"), True, TimeoutAnswer.MODEL_FAILED, id="still-failed-503"),
        pytest.param(route("m", failure="oom"), False, TimeoutAnswer.DEMAND_UNAVAILABLE, id="bus-down-and-failed"),
        pytest.param(None, True, TimeoutAnswer.QUEUE_TIMEOUT, id="gone-504"),
    ],
)
def test_timeout_answer(the_route: Route | None, signalled: bool, expected: TimeoutAnswer) -> None:
    assert timeout_answer(route=the_route, demand_signalled=signalled) is expected


# --------------------------------------------------------------------------- the FIFO


def test_wait_queue_releases_one_at_a_time_in_arrival_order() -> None:
    queue: WaitQueue[str] = WaitQueue()
    first, second, third = (queue.join(name, now=t) for t, name in enumerate(["a", "b", "c"]))
    assert queue.next_release() is first
    assert queue.next_release() is None, "the next waits until the released head has left"
    queue.leave(first)
    queue.leave(third)  # its client disconnected
    assert queue.next_release() is second
    queue.leave(second)
    assert queue.next_release() is None
    assert len(queue) == 0


def test_wait_queue_bookkeeping() -> None:
    queue: WaitQueue[str] = WaitQueue()
    a = queue.join("a", now=10.0)
    queue.join("b", now=12.0)
    assert queue.oldest_wait(now=15.0) == 5.0
    assert queue.leave(a) is True
    assert queue.leave(a) is False, "leaving twice is harmless"
    assert queue.oldest_wait(now=15.0) == 3.0
    assert [w.payload for w in queue.take_all()] == ["b"]
    assert queue.oldest_wait(now=15.0) == 0.0


# --------------------------------------------------------------------------- demand timing

REFRESH = 10.0


def report(queued: int, *, joins: int = 1, at: float = 0.0, delivered: bool = True) -> DemandReport:
    return DemandReport(queued=queued, joins=joins, at=at, delivered=delivered)


@pytest.mark.parametrize(
    ("queued", "joins", "last", "now", "due"),
    [
        pytest.param(1, 1, None, 0.0, True, id="first-request-queued-reports-at-once"),
        pytest.param(0, 0, None, 0.0, False, id="nothing-queued-nothing-to-say"),
        pytest.param(2, 2, report(1, joins=1), 0.1, True, id="another-request-joined-reports-at-once"),
        pytest.param(1, 1, report(1), 5.0, False, id="waiting-before-refresh-is-quiet"),
        pytest.param(1, 1, report(1), 10.0, True, id="waiting-at-refresh-reports-again"),
        pytest.param(1, 1, report(2, joins=1), 1.0, False, id="one-left-the-count-waits-for-refresh"),
        pytest.param(2, 3, report(2, joins=2), 1.0, True, id="one-left-one-joined-reports-at-once"),
        pytest.param(0, 1, report(1), 0.1, True, id="queue-emptied-final-zero"),
        pytest.param(0, 1, report(0), 50.0, False, id="final-zero-sent-once"),
        pytest.param(1, 1, report(1, delivered=False), 1.0, False, id="bus-down-no-tight-retry"),
        pytest.param(3, 3, report(1, delivered=False), 1.0, False, id="bus-down-new-joins-wait-for-tick"),
        pytest.param(3, 3, report(1, delivered=False), 10.0, True, id="bus-down-retry-on-refresh-tick"),
        pytest.param(0, 1, report(1, delivered=False), 10.0, True, id="bus-down-final-zero-retried"),
        pytest.param(0, 1, report(0, delivered=False), 5.0, False, id="bus-down-final-zero-no-tight-retry"),
        pytest.param(0, 1, report(0, delivered=False), 10.0, True, id="bus-down-lost-final-zero-is-retried"),
    ],
)
def test_demand_due(queued: int, joins: int, last: DemandReport | None, now: float, due: bool) -> None:
    assert demand_due(queued=queued, joins=joins, last=last, now=now, refresh_interval=REFRESH) is due


@pytest.mark.parametrize(
    ("queued", "last", "now", "expected"),
    [
        pytest.param(1, None, 0.0, None, id="no-report-yet-event-driven"),
        pytest.param(1, report(1, at=2.0), 5.0, 7.0, id="waiting-next-refresh"),
        pytest.param(0, report(0), 5.0, None, id="settled"),
        pytest.param(0, report(1, delivered=False, at=2.0), 5.0, 7.0, id="retry-final-zero"),
        pytest.param(0, report(0, delivered=False, at=2.0), 5.0, 7.0, id="retry-lost-final-zero"),
        pytest.param(1, report(1, at=0.0), 50.0, 0.0, id="overdue-now"),
    ],
)
def test_demand_check_in(queued: int, last: DemandReport | None, now: float, expected: float | None) -> None:
    assert demand_check_in(queued=queued, last=last, now=now, refresh_interval=REFRESH) == expected


@pytest.mark.parametrize(
    ("queued", "last", "settled"),
    [
        pytest.param(0, None, True, id="never-queued"),
        pytest.param(0, report(0), True, id="zero-delivered"),
        pytest.param(0, report(1), False, id="zero-not-sent-yet"),
        pytest.param(0, report(0, delivered=False), False, id="zero-not-delivered"),
        pytest.param(2, report(2), False, id="still-waiting"),
    ],
)
def test_demand_settled(queued: int, last: DemandReport | None, settled: bool) -> None:
    assert demand_settled(queued=queued, last=last) is settled


@pytest.mark.parametrize(
    ("last_at", "now", "due"),
    [
        pytest.param(None, 5.0, True, id="first-forward-reports"),
        pytest.param(5.0, 5.5, False, id="busy-model-costs-nothing-more"),
        pytest.param(5.0, 6.0, True, id="once-per-interval"),
    ],
)
def test_activity_due(last_at: float | None, now: float, due: bool) -> None:
    assert activity_due(last_at=last_at, now=now, interval=1.0) is due


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize(
    ("body", "model"),
    [
        pytest.param(b'{"model": "llama", "messages": []}', "llama", id="plain"),
        pytest.param(b'{"model": " team/coder "}', "team/coder", id="qualified-trimmed"),
    ],
)
def test_model_of(body: bytes, model: str) -> None:
    assert model_of(body) == model


@pytest.mark.parametrize(
    "body",
    [
        pytest.param(b"", id="empty"),
        pytest.param(b"{not json", id="not-json"),
        pytest.param(b"[1, 2]", id="not-an-object"),
        pytest.param(b'{"messages": []}', id="no-model"),
        pytest.param(b'{"model": 3}', id="model-not-a-string"),
        pytest.param(b'{"model": "  "}', id="model-blank"),
        pytest.param(b"[" * 3000, id="nested-arrays-3000-deep"),
        pytest.param(b'{"model": "m", "x": ' + b'{"a": ' * 5000, id="nested-objects-5000-deep"),
        pytest.param(b" " + b"[" * 100_000, id="nested-past-the-fast-scanner"),
    ],
)
def test_model_of_rejects(body: bytes) -> None:
    with pytest.raises(ProxyError) as caught:
        model_of(body)
    assert (caught.value.status, caught.value.code) == (400, ErrorCode.INVALID_REQUEST)


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"


@pytest.mark.parametrize(
    ("head", "kwargs", "expected"),
    [
        pytest.param(HEAD + b"\r\n", {}, HEAD + b"\r\n", id="end-to-end-only-unchanged"),
        pytest.param(
            HEAD + b"Connection: keep-alive\r\nKeep-Alive: timeout=5\r\n\r\n",
            {},
            HEAD + b"\r\n",
            id="keep-alive-fields-dropped",
        ),
        pytest.param(
            HEAD + b"connection: close, X-Hop\r\nX-Hop: 1\r\nX-Hopper: 2\r\nProxy-Thing: y\r\nUpgrade: h2c\r\n\r\n",
            {},
            HEAD + b"X-Hopper: 2\r\n\r\n",
            id="fields-named-in-connection-dropped-any-case",
        ),
        pytest.param(
            HEAD + b"\r\n",
            {"keep_framing": False},
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
            id="framing-dropped-for-a-de-chunked-body",
        ),
        pytest.param(
            HEAD + b"\r\n",
            {"extra": [(b"X-FlexInfer-Cold-Start", b"true")], "close": True},
            HEAD + b"X-FlexInfer-Cold-Start: true\r\nConnection: close\r\n\r\n",
            id="extra-fields-and-close-added",
        ),
    ],
)
def test_relayed_head(head: bytes, kwargs: dict[str, Any], expected: bytes) -> None:
    assert relayed_head(head, **kwargs) == expected


def test_raw_connection_tokens() -> None:
    assert raw_connection_tokens(b"Keep-Alive, X-Hop ,, close") == {b"keep-alive", b"x-hop", b"close"}


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        pytest.param("/team/coder/v1/models?x=1", ("team", "coder", "/v1/models?x=1"), id="rest-and-query-kept"),
        pytest.param("/team/coder", ("team", "coder", "/"), id="no-rest"),
        pytest.param("/team/coder?x", ("team", "coder", "/?x"), id="query-only"),
        pytest.param("/team", None, id="no-model"),
        pytest.param("/team//x", None, id="empty-model"),
    ],
)
def test_prefixed_target(target: str, expected: tuple[str, str, str] | None) -> None:
    assert prefixed_target(target) == expected


@pytest.mark.parametrize(
    ("authorization", "allowed"),
    [
        pytest.param(b"Bearer sk-one", True, id="first-key"),
        pytest.param(b"bearer   sk-two ", True, id="second-key-any-case-spaces"),
        pytest.param(b"Bearer sk-three", False, id="unknown-key"),
        pytest.param(b"Bearer sk-on", False, id="prefix-of-a-key"),
        pytest.param(b"Basic sk-one", False, id="not-bearer"),
        pytest.param(b"Bearer ", False, id="empty"),
        pytest.param(None, False, id="missing"),
    ],
)
def test_api_keys(authorization: bytes | None, allowed: bool) -> None:
    keys = ApiKeys(["sk-one", "sk-two"])
    assert keys.allows(authorization) is allowed
    assert "sk-" not in repr(keys)


def test_route_table_version_counts_every_change() -> None:
    table = RouteTable()
    seen = {table.version}
    a = route("a", ready=True)
    table.put(a)
    seen.add(table.version)
    table.suspect(ModelKey("default", "a"), a)
    seen.add(table.version)
    table.remove(ModelKey("default", "a"))
    seen.add(table.version)
    table.replace([route("b")])
    seen.add(table.version)
    assert len(seen) == 5


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        pytest.param("http://10.0.0.5:8000", Endpoint("10.0.0.5", 8000, ""), id="host-port"),
        pytest.param("http://model.ns.svc/", Endpoint("model.ns.svc", 80, ""), id="default-port"),
        pytest.param("http://127.0.0.1:9/base/", Endpoint("127.0.0.1", 9, "/base"), id="base-path"),
    ],
)
def test_parse_endpoint(url: str, expected: Endpoint) -> None:
    assert parse_endpoint(url) == expected


def test_parse_endpoint_refuses_what_the_client_cannot_speak() -> None:
    with pytest.raises(ValueError, match="not an http:// endpoint"):
        parse_endpoint("https://model:443")


@pytest.mark.parametrize(
    ("method", "path", "body_held", "expected"),
    [
        pytest.param("GET", "/v1/models", True, True, id="get"),
        pytest.param("HEAD", "/health", True, True, id="head"),
        pytest.param("OPTIONS", "/", True, True, id="options"),
        pytest.param("POST", "/v1/embeddings", True, True, id="embeddings-are-pure"),
        pytest.param("POST", "/v1/embeddings?x=1", True, True, id="embeddings-with-query"),
        pytest.param("POST", "/v1/embeddings", False, False, id="streamed-body-cannot-be-replayed"),
        pytest.param("POST", "/v1/chat/completions", True, False, id="chat-never"),
        pytest.param("POST", "/v1/completions", True, False, id="completions-never"),
        pytest.param("PUT", "/v1/load_lora_adapter", True, False, id="put-never"),
        pytest.param("DELETE", "/x", True, False, id="delete-never"),
    ],
)
def test_retry_safe(method: str, path: str, body_held: bool, expected: bool) -> None:
    assert retry_safe(method, path, body_held=body_held) is expected
