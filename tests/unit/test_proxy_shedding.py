"""Shedding: the connection caps and the request deadlines as decisions, and as the server applies them (raw bytes
fed to its protocol, time moved by calling its sweep)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from flexinfer_proxy.adapters.http_server import HttpServer, ServerConnection
from flexinfer_proxy.domain.shedding import Limits, Shed, ShedLog, admit_connection, too_slow
from tests.support import proxy_server
from tests.support.proxy_server import FakeTransport, Handler

LIMITS = Limits(max_connections=4, max_per_client=2, header_timeout=10.0, body_timeout=10.0, body_min_rate=1000.0)


@pytest.mark.parametrize(
    ("open_total", "open_from_client", "expected"),
    [
        pytest.param(0, 0, None, id="first"),
        pytest.param(3, 1, None, id="under-both"),
        pytest.param(3, 2, Shed.MAX_CONNECTIONS_PER_CLIENT, id="address-at-its-cap"),
        pytest.param(4, 0, Shed.MAX_CONNECTIONS, id="total-at-its-cap"),
    ],
)
def test_admit_connection(open_total: int, open_from_client: int, expected: Shed | None) -> None:
    assert admit_connection(LIMITS, open_total, open_from_client) is expected


def test_no_per_client_cap_when_zero() -> None:
    limits = Limits(max_connections=4, max_per_client=0, header_timeout=1, body_timeout=1, body_min_rate=1)
    assert admit_connection(limits, 3, 3) is None


@pytest.mark.parametrize(
    ("elapsed", "head_done", "received", "expected"),
    [
        pytest.param(9.9, False, 0, None, id="head-within-its-deadline"),
        pytest.param(10.1, False, 0, Shed.HEADER_TIMEOUT, id="head-too-slow"),
        pytest.param(10.1, True, 0, Shed.BODY_TIMEOUT, id="body-nothing-after-the-grace"),
        pytest.param(14.0, True, 5000, None, id="body-at-the-minimum-rate"),
        pytest.param(16.0, True, 5000, Shed.BODY_TIMEOUT, id="body-below-the-minimum-rate"),
        pytest.param(30.0, True, 3, Shed.BODY_TIMEOUT, id="slow-loris-one-byte-every-5-s"),
        pytest.param(200.0, True, 1_000_000, None, id="large-upload-above-the-rate"),
    ],
)
def test_too_slow(elapsed: float, head_done: bool, received: int, expected: Shed | None) -> None:
    assert too_slow(LIMITS, 100.0 + elapsed, 100.0, head_done=head_done, received=received) is expected


def test_shed_log_says_at_most_one_line_per_interval_with_the_counts() -> None:
    log = ShedLog(interval=10)
    assert log.shed(Shed.BODY_TIMEOUT, 0.0) == {Shed.BODY_TIMEOUT: 1}
    assert log.shed(Shed.BODY_TIMEOUT, 1.0) is None
    assert log.shed(Shed.MAX_CONNECTIONS, 2.0) is None
    assert log.due(5.0) is None
    assert log.due(10.5) == {Shed.BODY_TIMEOUT: 1, Shed.MAX_CONNECTIONS: 1}
    assert log.due(30.0) is None, "nothing new: no line"


# --------------------------------------------------------------------------- the server applying them


def connect(server: HttpServer, peer: str = "10.0.0.1") -> tuple[ServerConnection, FakeTransport]:
    return proxy_server.connect(server, peer)


def error_of(written: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = written.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


GET = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


async def test_connections_past_the_caps_get_503_once_their_head_is_read_and_the_others_are_served() -> None:
    handler = Handler(at_once=b"{}")
    server = HttpServer(handler, max_body=1024, limits=LIMITS)
    a1, _ = connect(server, "10.0.0.1")
    connect(server, "10.0.0.1")
    a3, t3 = connect(server, "10.0.0.1")  # a third from one address
    a3.data_received(GET)
    status, error = error_of(t3.written)
    assert (status, error["code"]) == (503, "too_many_connections")
    assert "2 from one address" in error["message"]
    assert b"\r\nRetry-After: 1\r\n" in t3.written and b"\r\nConnection: close\r\n" in t3.written
    assert handler.requests == [], "the refused request went nowhere"
    b1, tb1 = connect(server, "10.0.0.2")
    connect(server, "10.0.0.2")
    b3, tb3 = connect(server, "10.0.0.3")  # a fifth: past the total
    b3.data_received(GET)
    assert error_of(tb3.written)[1]["code"] == "too_many_connections"
    b1.data_received(GET)
    assert tb1.written.startswith(b"HTTP/1.1 200"), "an admitted connection is served"
    assert (server.admitted, server.per_client) == (4, {"10.0.0.1": 2, "10.0.0.2": 2})
    a1.connection_lost(None)
    a3.connection_lost(None)
    _, t4 = connect(server, "10.0.0.1")
    assert server.admitted == 4 and t4.written == b"", "a slot freed up: admitted again"


async def test_a_refused_connection_that_sends_no_head_is_closed_after_a_second() -> None:
    server = HttpServer(Handler(at_once=b"{}"), max_body=1024, limits=LIMITS)
    for _ in range(2):
        connect(server)
    conn, transport = connect(server)
    conn.sweep(conn.opened + 0.5, 75.0, LIMITS)
    assert not transport.closed
    conn.sweep(conn.opened + 1.5, 75.0, LIMITS)
    assert transport.closed and transport.written == b""


async def test_past_the_refusal_backlog_connections_are_closed_at_once() -> None:
    limits = Limits(max_connections=1, max_per_client=0, header_timeout=10, body_timeout=10, body_min_rate=1000)
    server = HttpServer(Handler(at_once=b"{}"), max_body=1024, limits=limits)
    connect(server)
    waiting = [connect(server)[1] for _ in range(limits.shed_backlog)]
    _, closed = connect(server)
    assert not any(t.closed for t in waiting) and closed.closed


@pytest.mark.parametrize(
    ("data", "after", "part"),
    [
        pytest.param(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-", 10.5, "headers", id="slow-head"),
        pytest.param(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n{",
            10.5,
            "body",
            id="slow-body",
        ),
    ],
)
async def test_a_request_arriving_too_slowly_gets_408(data: bytes, after: float, part: str) -> None:
    handler = Handler(at_once=b"{}")
    server = HttpServer(handler, max_body=2_000_000, limits=LIMITS)
    conn, transport = connect(server)
    conn.data_received(data)
    assert conn.current is not None
    arrived = conn.current.arrived
    conn.sweep(arrived + after - 1, 75.0, LIMITS)
    assert transport.written == b""
    conn.sweep(arrived + after, 75.0, LIMITS)
    status, error = error_of(transport.written)
    assert (status, error["code"]) == (408, "request_timeout") and part in error["message"]
    assert transport.eof, "half-closed, the rest is dropped"
    assert handler.requests == []


async def test_a_body_at_the_minimum_rate_is_not_cut() -> None:
    handler = Handler(at_once=b"{}")
    server = HttpServer(handler, max_body=2_000_000, limits=LIMITS)
    conn, transport = connect(server)
    conn.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 30000\r\n\r\n")
    assert conn.current is not None
    start = conn.current.arrived
    for second in range(1, 31):  # 1,000 bytes a second: the minimum rate
        conn.data_received(b"x" * 1000)
        if conn.current is not None:
            conn.sweep(start + second, 75.0, LIMITS)
    assert transport.written.startswith(b"HTTP/1.1 200") and len(handler.requests) == 1


async def test_time_paused_by_the_proxy_does_not_count_against_the_body() -> None:
    server = HttpServer(Handler(at_once=b"{}"), max_body=2_000_000, limits=LIMITS)
    conn, transport = connect(server)
    conn.data_received(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n")
    assert conn.current is not None
    start = conn.current.arrived
    conn.pause_reading()  # e.g. the model does not read the upload
    conn.sweep(start + 60, 75.0, LIMITS)
    conn.resume_reading()
    conn.sweep(start + 65, 75.0, LIMITS)
    assert transport.written == b"", "the clock restarted when reading resumed"
    conn.sweep(start + 70.5, 75.0, LIMITS)
    assert transport.written.startswith(b"HTTP/1.1 408")


async def test_a_connection_that_never_sends_a_byte_is_closed_after_the_header_timeout() -> None:
    server = HttpServer(Handler(at_once=b"{}"), max_body=1024, limits=LIMITS)
    conn, transport = connect(server)
    conn.sweep(conn.opened + 9, 75.0, LIMITS)
    assert not transport.closed
    conn.sweep(conn.opened + 11, 75.0, LIMITS)
    assert transport.closed
    kept, kept_transport = connect(server)
    kept.data_received(GET)
    kept.sweep(kept.opened + 11, 75.0, LIMITS)
    assert not kept_transport.closed, "after a request, a keep-alive connection has the idle timeout"


# --------------------------------------------------------------------------- settings, checked at start


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        pytest.param({"proxy_header_timeout": "0s"}, "FLEXINFER_PROXY_HEADER_TIMEOUT", id="header-timeout-zero"),
        pytest.param({"proxy_body_timeout": "0s"}, "FLEXINFER_PROXY_BODY_TIMEOUT", id="body-timeout-zero"),
        pytest.param({"proxy_body_min_rate": 0}, "FLEXINFER_PROXY_BODY_MIN_RATE", id="no-rate"),
        pytest.param({"proxy_max_connections": 0}, "FLEXINFER_PROXY_MAX_CONNECTIONS", id="no-connections"),
        pytest.param(
            {"proxy_max_connections": 10, "proxy_max_connections_per_client": 11},
            "FLEXINFER_PROXY_MAX_CONNECTIONS_PER_CLIENT",
            id="per-client-above-total",
        ),
        pytest.param(
            {"proxy_stream_keepalive_interval": "-1s"}, "FLEXINFER_PROXY_STREAM_KEEPALIVE_INTERVAL", id="negative"
        ),
    ],
)
def test_bad_limits_stop_the_start_naming_the_variable(overrides: dict[str, Any], names: str) -> None:
    from flexinfer_common.settings import SettingsError, load_settings
    from flexinfer_proxy.settings import ProxySettings

    with pytest.raises(SettingsError, match=names):
        load_settings(ProxySettings, **overrides)


def test_an_open_files_limit_below_the_caps_stops_the_start(monkeypatch: pytest.MonkeyPatch) -> None:
    import resource

    from flexinfer_common.settings import SettingsError
    from flexinfer_proxy import main

    limits = {"now": (1024, 4096)}
    monkeypatch.setattr(resource, "getrlimit", lambda _: limits["now"])
    monkeypatch.setattr(resource, "setrlimit", lambda _, value: limits.update(now=value))
    main.ensure_descriptors(3000)
    assert limits["now"] == (3000, 4096), "raised up to what the caps need"
    with pytest.raises(SettingsError, match="FLEXINFER_PROXY_MAX_CONNECTIONS"):
        main.ensure_descriptors(9448)
