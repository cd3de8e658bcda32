"""The proxy's own HTTP server and forwarding path, from the wire: API keys, size limits, malformed and pipelined
requests, hop-by-hop fields of answers, HTTP/1.0 clients, streamed uploads, and the per-model in-flight count.

Raw sockets where an HTTP client library would smooth over what is being checked (framing, pipelining, refusals).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from flexinfer_common.keys import ModelKey
from tests.integration import test_proxy_service as service
from tests.integration.test_proxy_service import Harness, Recorder, StartProxy

# The proxy harness and model servers of the service tests.
start_proxy = service.start_proxy
proxy = service.proxy
fake_model = service.fake_model
recorder = service.recorder

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


async def exchange_raw(port: int, data: bytes) -> bytes:
    """Send ``data`` on a fresh connection and read what comes back until the proxy closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        out = b""
        while chunk := await reader.read(65536):
            out += chunk
        return out
    finally:
        writer.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1])


def error_of(answer: bytes) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(answer.partition(b"\r\n\r\n")[2])
    return body["error"]


@contextlib.asynccontextmanager
async def raw_model(answer: bytes, *, close: bool = False) -> AsyncIterator[str]:
    """A model server that answers every request with ``answer`` (bytes as given), then closes the connection when
    ``close``, else waits for the next request on it."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.lower().split(b"\r\n")
                        if line.startswith(b"content-length:")
                    ),
                    0,
                )
                await reader.readexactly(length)
                writer.write(answer)
                await writer.drain()
                if close:
                    writer.close()
                    return

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        server.close()


# --------------------------------------------------------------------------- API keys


async def test_api_keys_guard_the_data_plane_and_are_not_passed_on(
    start_proxy: StartProxy, recorder: tuple[Recorder, str]
) -> None:
    rec, base = recorder
    harness = await start_proxy(proxy_api_keys="sk-one, sk-two")
    await harness.put_route("m1", endpoint=base)
    http = harness.http
    for method, path, body in (
        ("GET", "/v1/models", None),
        ("POST", "/v1/chat/completions", CHAT),
        ("GET", "/default/m1/v1/models", None),
    ):
        for headers in ({}, {"Authorization": "Bearer sk-three"}, {"Authorization": "Basic sk-one"}):
            async with http.request(method, harness.base + path, json=body, headers=headers) as resp:
                assert resp.status == 401, (path, headers)
                assert resp.headers["WWW-Authenticate"] == "Bearer"
                error = (await resp.json())["error"]
                assert (error["code"], error["type"]) == ("unauthorized", "authentication_error")
                assert "sk-" not in error["message"]
    assert rec.seen == [], "nothing reached the model"
    for key in ("sk-one", "sk-two"):
        headers = {"Authorization": f"Bearer {key}"}
        async with http.post(harness.base + "/v1/chat/completions", json=CHAT, headers=headers) as resp:
            assert resp.status == 200
        async with http.get(harness.base + "/default/m1/v1/models", headers=headers) as resp:
            assert resp.status == 200
    assert all("authorization" not in {k.lower() for k in seen["headers"]} for seen in rec.seen), (
        "the proxy's key is not the model's to see"
    )
    async with http.get(harness.base + "/healthz") as resp:
        assert resp.status == 200, "operations endpoints stay open"


# --------------------------------------------------------------------------- size limits


async def test_a_50_mb_body_is_refused_without_being_held_and_the_proxy_keeps_serving(
    proxy: Harness, fake_model: str
) -> None:
    await proxy.put_route("m1", endpoint=fake_model)
    port = proxy.proxy.port
    limit = proxy.proxy.settings.proxy_max_request_body
    # Announced: refused from the head alone, before a byte of the body (no 100 Continue either).
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 50000000\r\n\r\n"
    answer = await exchange_raw(port, head)
    assert status_of(answer) == 413 and b"100 Continue" not in answer
    assert b"\r\nConnection: close\r\n" in answer
    assert error_of(answer)["code"] == "body_too_large"

    # Chunked (no length): cut off once past the limit, while the client is still sending.
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n")
    piece = b"x" * (1024 * 1024)
    sent = 0
    answered = asyncio.create_task(reader.read(65536))
    with contextlib.suppress(ConnectionError):
        while sent < 50 * 1024 * 1024 and not answered.done():
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            sent += len(piece)
            await asyncio.sleep(0)
    answer = await asyncio.wait_for(answered, timeout=5)
    writer.close()
    assert status_of(answer) == 413
    assert error_of(answer)["code"] == "body_too_large"
    assert sent < 50 * 1024 * 1024, "answered before the 50 MB were sent"
    assert limit < sent <= limit + 8 * 1024 * 1024

    async with await proxy.chat("m1") as resp:
        assert resp.status == 200, "the proxy keeps serving"


async def test_bytes_held_by_waiting_requests_are_bounded(start_proxy: StartProxy) -> None:
    harness = await start_proxy(proxy_max_queued_bytes=4096)
    await harness.put_route("m1")  # parked: requests wait
    padding = "x" * 2500
    first = asyncio.create_task(harness.chat("m1", padding))
    await harness.until_queued("m1", 1)
    async with await harness.chat("m1", padding) as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "5"
        error = (await resp.json())["error"]
    assert (error["code"], error["type"]) == ("queue_bytes_full", "rate_limit_error")
    small = asyncio.create_task(harness.chat("m1", "small"))
    await harness.until_queued("m1", 2)  # a small one still fits
    for task in (small, first):
        task.cancel()
    for task in (small, first):
        with contextlib.suppress(asyncio.CancelledError):
            await task
    await harness.until_queued("m1", 0)
    second = asyncio.create_task(harness.chat("m1", padding))
    await harness.until_queued("m1", 1)  # the bytes of the one that left no longer count
    second.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await second


# --------------------------------------------------------------------------- malformed and pipelined requests

GOOD = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"


@pytest.mark.parametrize(
    ("request_bytes", "status", "code"),
    [
        pytest.param(
            b"POST /default/m1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\n\r\n",
            400,
            "invalid_request",
            id="content-length-and-chunked",
        ),
        pytest.param(
            b"POST /default/m1/x HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabcd",
            400,
            "invalid_request",
            id="two-content-lengths",
        ),
        pytest.param(b"GET /healthz HTTP/1.1\nHost: x\n\n", 400, "invalid_request", id="bare-lf"),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\nHost: x\r\n" + b"X-Big: " + b"y" * 70_000 + b"\r\n\r\n",
            431,
            "headers_too_large",
            id="200-kb-headers",
        ),
        pytest.param(
            b"GET /healthz HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n",
            431,
            "headers_too_large",
            id="too-many-headers",
        ),
        pytest.param(b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n", 414, "uri_too_long", id="long-target"),
        pytest.param(
            b"POST /default/m1/x HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n",
            501,
            "unsupported_transfer_encoding",
            id="coded-body",
        ),
    ],
)
async def test_malformed_requests_are_refused_and_the_proxy_keeps_serving(
    proxy: Harness, request_bytes: bytes, status: int, code: str
) -> None:
    answer = await exchange_raw(proxy.proxy.port, request_bytes)
    assert status_of(answer) == status
    assert error_of(answer)["code"] == code
    assert b"\r\nContent-Type: application/json\r\n" in answer
    assert (
        status_of(await exchange_raw(proxy.proxy.port, GOOD + b"GET /healthz HTTP/1.1\r\nConnection: close\r\n\r\n"))
        == 200
    )


async def test_pipelined_requests_are_answered_in_order_on_one_connection(
    proxy: Harness, recorder: tuple[Recorder, str]
) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    pipelined = (
        b"".join(b"GET /default/m1/n%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(3))
        + b"GET /default/m1/last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    answer = await exchange_raw(proxy.proxy.port, pipelined)
    bodies = [
        json.loads(part.partition(b"\r\n\r\n")[2].split(b"HTTP/1.1")[0]) for part in answer.split(b"HTTP/1.1 ")[1:]
    ]
    assert [b["path_qs"] for b in bodies] == ["/n0", "/n1", "/n2", "/last"]
    assert [seen["path_qs"] for seen in rec.seen] == ["/n0", "/n1", "/n2", "/last"]


# --------------------------------------------------------------------------- answers


async def test_hop_by_hop_fields_of_an_answer_are_not_relayed(proxy: Harness) -> None:
    answer = (
        b"HTTP/1.1 201 Created\r\nContent-Type: application/json\r\nConnection: keep-alive, X-Hop\r\nX-Hop: 1\r\n"
        b"Keep-Alive: timeout=5\r\nX-End-To-End: yes\r\nContent-Length: 2\r\n\r\n{}"
    )
    async with raw_model(answer) as base:
        await proxy.put_route("m1", endpoint=base)
        for _ in range(2):  # the model's connection is reused
            async with await proxy.chat("m1") as resp:
                assert resp.status == 201
                assert resp.headers["X-End-To-End"] == "yes"
                assert "X-Hop" not in resp.headers and "Keep-Alive" not in resp.headers
                assert await resp.read() == b"{}"


async def test_an_http10_client_gets_a_body_it_can_read(proxy: Harness, recorder: tuple[Recorder, str]) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    rec.gate.set()
    answer = await exchange_raw(proxy.proxy.port, b"GET /default/m1/sse HTTP/1.0\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert status_of(answer) == 200
    assert b"transfer-encoding" not in head.lower(), "no chunk framing for an HTTP/1.0 client"
    assert body == b"data: one\n\ndata: two\n\ndata: [DONE]\n\n"


async def test_an_answer_that_ends_with_the_model_connection_ends_the_client_one(proxy: Harness) -> None:
    async with raw_model(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close", close=True) as base:
        await proxy.put_route("m1", endpoint=base)
        answer = await exchange_raw(proxy.proxy.port, b"GET /default/m1/x HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(answer) == 200
    assert b"\r\nConnection: close\r\n" in answer and answer.endswith(b"until close")


# --------------------------------------------------------------------------- uploads and in-flight counts


async def test_a_chunked_upload_streams_to_the_model(proxy: Harness, recorder: tuple[Recorder, str]) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)

    async def parts() -> AsyncIterator[bytes]:
        for i in range(5):
            yield b"part-%d;" % i

    async with proxy.http.put(proxy.base + "/default/m1/upload", data=parts()) as resp:
        assert resp.status == 200
    assert rec.seen[-1]["body"] == b"part-0;part-1;part-2;part-3;part-4;"


async def test_requests_in_flight_are_counted_per_model(proxy: Harness, recorder: tuple[Recorder, str]) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    forwarder = proxy.proxy.forwarder
    assert forwarder.in_flight() == {}
    async with proxy.http.post(proxy.base + "/default/m1/sse") as resp:
        assert await resp.content.readuntil(b"\n\n") == b"data: one\n\n"
        assert forwarder.in_flight() == {ModelKey("default", "m1"): 1}
        # A client that leaves mid-answer ends its exchange too.
        async with aiohttp.ClientSession() as leaving, leaving.post(proxy.base + "/default/m1/sse") as second:
            await second.content.readuntil(b"\n\n")
            assert forwarder.in_flight() == {ModelKey("default", "m1"): 2}
        await proxy.until(lambda: forwarder.in_flight() == {ModelKey("default", "m1"): 1})
        rec.gate.set()
        await resp.read()
    await proxy.until(lambda: forwarder.in_flight() == {})
    async with proxy.http.get(proxy.base + "/default/m1/teapot") as resp:
        assert resp.status == 418
    assert forwarder.in_flight() == {}, "an error answer ends the exchange as well"


async def test_a_model_is_reported_in_use_as_soon_as_a_request_is_forwarded(
    proxy: Harness, recorder: tuple[Recorder, str]
) -> None:
    """Not when the answer ends: a model busy with a long stream must not look idle to the scheduler meanwhile."""
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    async with proxy.http.post(proxy.base + "/default/m1/sse") as resp:
        assert await resp.content.readuntil(b"\n\n") == b"data: one\n\n"
        _, demand = await proxy.next_demand()  # while the answer is still streaming
        assert (demand.model, demand.queued, demand.source) == ("m1", 0, "proxy-test-1")
        rec.gate.set()
        await resp.read()
