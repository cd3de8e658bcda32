"""The proxy's HTTP server protocol fed raw bytes (no sockets): what it reads from a request, what it forwards,
pipelining, refusals and lingering."""

from __future__ import annotations

import pytest

from flexinfer_proxy.adapters.http_server import HttpServer, ServerConnection
from tests.support.proxy_server import FakeTransport, Handler, connect


def connection(max_body: int = 1024) -> tuple[ServerConnection, FakeTransport, Handler]:
    handler = Handler()
    conn, transport = connect(HttpServer(handler, max_body=max_body))
    return conn, transport, handler


async def test_hop_by_hop_fields_and_framing_are_read_not_forwarded() -> None:
    conn, _, handler = connection()
    conn.data_received(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
        b"Keep-Alive: 5\r\nProxy-Authorization: Basic x\r\nTE: trailers\r\nAuthorization: Bearer sk\r\n"
        b"Content-Type: application/json\r\nContent-Length: 2\r\nExpect: 100-continue\r\n\r\n{}"
    )
    (request,) = handler.requests
    assert request.headers == [(b"Authorization", b"Bearer sk"), (b"Content-Type", b"application/json")]
    assert (request.authorization, request.content_length, request.body) == (b"Bearer sk", 2, b"{}")
    assert request.expect_continue


async def test_pipelined_requests_wait_their_turn_and_are_answered_in_order() -> None:
    conn, transport, handler = connection()
    conn.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\nGET /c HTTP/1.1\r\n")
    assert [r.url for r in handler.requests] == [b"/a"], "one at a time"
    assert transport.paused, "no more is read while answers are due"
    Handler.answer(handler.requests[0])
    assert [r.url for r in handler.requests] == [b"/a", b"/b"]
    Handler.answer(handler.requests[1])
    assert not transport.paused, "the third one is still arriving"
    conn.data_received(b"Host: x\r\n\r\n")
    Handler.answer(handler.requests[2])
    bodies = [part.rpartition(b"\r\n\r\n")[2] for part in transport.written.split(b"HTTP/1.1 200 OK")[1:]]
    assert bodies == [b"/a", b"/b", b"/c"]
    assert not transport.closed


@pytest.mark.parametrize(
    ("data", "status"),
    [
        pytest.param(b"POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2048\r\n\r\n", b"413", id="announced-too-large"),
        pytest.param(
            b"POST /x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n" + b"y" * 2048,
            b"413",
            id="chunked-past-the-limit",
        ),
    ],
)
async def test_a_refusal_mid_request_lingers_before_closing(data: bytes, status: bytes) -> None:
    conn, transport, handler = connection()
    conn.data_received(data)
    assert transport.written.startswith(b"HTTP/1.1 " + status)
    assert b"\r\nConnection: close\r\n" in transport.written
    assert transport.eof and not transport.closed, "half-closed: the client reads the answer, not a reset"
    conn.data_received(b"more of the body, dropped")
    assert transport.written.count(b"HTTP/1.1 ") == 1
    assert handler.requests == []


PIPELINE = (
    b"POST /a HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc"
    b"GET /b HTTP/1.1\r\nHost: x\r\nX-Trace: 1\r\n\r\n"
    b"POST /c HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nxyz\r\n0\r\n\r\n"
)


@pytest.mark.parametrize("piece", [pytest.param(1, id="byte-by-byte"), pytest.param(7, id="small-packets")])
async def test_heads_split_over_packets_are_read_whole(piece: int) -> None:
    conn, transport, handler = connection()
    for i in range(0, len(PIPELINE), piece):
        conn.data_received(PIPELINE[i : i + piece])
        if handler.requests and not handler.requests[-1].finished:
            Handler.answer(handler.requests[-1])
    assert [(r.method, r.url, r.body, r.headers) for r in handler.requests] == [
        (b"POST", b"/a", b"abc", []),
        (b"GET", b"/b", b"", [(b"X-Trace", b"1")]),
        (b"POST", b"/c", b"xyz", []),
    ]
    assert transport.written.count(b"HTTP/1.1 200 OK") == 3 and not transport.closed
