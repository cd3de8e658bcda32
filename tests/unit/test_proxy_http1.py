"""The proxy's lean HTTP/1.1 client against small raw servers on loopback (no NATS): framing, keep-alive,
backpressure and the two kinds of failure."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from flexinfer_proxy.adapters.http1 import (
    HIGH_WATER,
    Http1Client,
    UpstreamConnectionError,
    UpstreamStreamError,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request: (head, body), de-chunking a chunked body."""
    head = await reader.readuntil(b"\r\n\r\n")
    lower = head.lower()
    if b"transfer-encoding: chunked" in lower:
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).strip(), 16)
            data = await reader.readexactly(size + 2)
            if size == 0:
                return head, body
            body += data[:-2]
    length = 0
    for line in lower.split(b"\r\n"):
        if line.startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    return head, await reader.readexactly(length)


class Server:
    """Runs ``script(reader, writer, head)`` for each request; a False return closes the connection."""

    def __init__(self, script: Script) -> None:
        self.script = script
        self.connections = 0
        self.requests: list[tuple[bytes, bytes]] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head, body = await read_request(reader)
                self.requests.append((head, body))
                if not await self.script(reader, writer, head):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def __aenter__(self) -> Server:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()


def ok(body: bytes = b"hello", **headers: str) -> Script:
    async def script(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bool:
        extra = "".join(f"{k.replace('_', '-')}: {v}\r\n" for k, v in headers.items())
        payload = b"" if head.startswith(b"HEAD") else body
        writer.write(f"HTTP/1.1 200 OK\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode() + payload)
        await writer.drain()
        return True

    return script


@pytest.fixture
async def client() -> AsyncIterator[Http1Client]:
    made = Http1Client(connections=10, connect_timeout=2)
    yield made
    await made.close()


async def read_all(answer: object) -> bytes:
    out = b""
    while (chunk := await answer.read()) is not None:  # type: ignore[attr-defined]
        out += chunk
    return out


async def test_keep_alive_reuses_one_connection_and_sends_headers_and_body(client: Http1Client) -> None:
    async with Server(ok(b"pong", X_Model="m")) as server:
        for i in range(3):
            answer = await client.request(
                "POST", "127.0.0.1", server.port, f"/v1/x?i={i}", [(b"Authorization", b"Bearer t")], b"ping"
            )
            assert (answer.status, answer.reason) == (200, "OK")
            assert (b"X-Model", b"m") in answer.headers
            assert await read_all(answer) == b"pong"
            answer.release()
    assert server.connections == 1
    head, body = server.requests[2]
    assert head.startswith(b"POST /v1/x?i=2 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nAuthorization: Bearer t\r\n" in head and b"\r\nContent-Length: 4\r\n" in head
    assert body == b"ping"


async def test_chunked_and_until_close_answers_are_read_to_their_end(client: Http1Client) -> None:
    async def chunked(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _h: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        for part in (b"data: 1\n\n", b"data: 2\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(part), part))
            await writer.drain()
            await asyncio.sleep(0.05)
        writer.write(b"0\r\n\r\n")
        return True

    async with Server(chunked) as server:
        answer = await client.request("GET", "127.0.0.1", server.port, "/sse", [], None)
        first = await answer.read()
        assert first == b"data: 1\n\n", "each piece is handed out as it arrives"
        assert await read_all(answer) == b"data: 2\n\n"
        answer.release()

    async def until_close(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _h: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it")
        await writer.drain()
        return False

    async with Server(until_close) as server:
        answer = await client.request("GET", "127.0.0.1", server.port, "/", [], None)
        assert await read_all(answer) == b"all of it"
        answer.release()


async def test_a_streamed_upload_goes_chunked_or_with_its_length(client: Http1Client) -> None:
    async def parts() -> AsyncIterator[bytes]:
        for part in (b"abc", b"", b"def"):
            yield part

    async with Server(ok()) as server:
        for length in (None, 6):
            answer = await client.request("PUT", "127.0.0.1", server.port, "/u", [], parts(), content_length=length)
            await read_all(answer)
            answer.release()
    (chunked_head, chunked_body), (sized_head, sized_body) = server.requests
    assert b"Transfer-Encoding: chunked" in chunked_head and chunked_body == b"abcdef"
    assert b"Content-Length: 6" in sized_head and sized_body == b"abcdef"


async def test_head_and_204_answers_have_no_body(client: Http1Client) -> None:
    async def no_content(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _h: bytes) -> bool:
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        return True

    async with Server(ok(b"x" * 100)) as server:
        answer = await client.request("HEAD", "127.0.0.1", server.port, "/", [], None)
        assert (b"Content-Length", b"100") in answer.headers
        assert await answer.read() is None
        answer.release()
    async with Server(no_content) as server:
        for _ in range(2):
            answer = await client.request("DELETE", "127.0.0.1", server.port, "/", [], None)
            assert answer.status == 204 and await answer.read() is None
            answer.release()
    assert server.connections == 1


async def test_a_slow_reader_pauses_the_model(client: Http1Client) -> None:
    big = b"y" * (8 * 1024 * 1024)
    async with Server(ok(big)) as server:
        answer = await client.request("GET", "127.0.0.1", server.port, "/big", [], None)
        received = len(await answer.read() or b"")
        await asyncio.sleep(0.2)  # the model keeps writing; the proxy must stop reading
        conn = answer._conn
        assert conn.reading_paused
        assert conn.buffered <= HIGH_WATER + 512 * 1024
        received += len(await read_all(answer))
        answer.release()
    assert received == len(big)


async def test_failures_before_and_after_the_answer_started(client: Http1Client) -> None:
    async def hang_up(_r: asyncio.StreamReader, _w: asyncio.StreamWriter, _h: bytes) -> bool:
        return False

    async def break_mid_body(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _h: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart")
        await writer.drain()
        return False

    async with Server(hang_up) as server:
        with pytest.raises(UpstreamConnectionError, match="closed the connection") as closed:
            await client.request("GET", "127.0.0.1", server.port, "/", [], None)
        assert not closed.value.never_connected, "the request went out"
    async with Server(break_mid_body) as server:
        answer = await client.request("GET", "127.0.0.1", server.port, "/", [], None)
        with pytest.raises(UpstreamStreamError):
            await read_all(answer)
        answer.close()
    unused = server.port  # closed now: nothing listens
    with pytest.raises(UpstreamConnectionError, match="ConnectionRefusedError") as refused:
        await client.request("GET", "127.0.0.1", unused, "/", [], None)
    assert refused.value.never_connected, "nothing was sent"


async def test_a_connection_the_model_closed_while_idle_is_not_reused(client: Http1Client) -> None:
    async def once(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bool:
        await ok()(_r, writer, head)
        return False  # answers, then closes the keep-alive connection

    async with Server(once) as server:
        for _ in range(3):
            answer = await client.request("GET", "127.0.0.1", server.port, "/", [], None)
            assert await read_all(answer) == b"hello"
            answer.release()
            await asyncio.sleep(0.05)
    assert server.connections == 3


async def test_the_connection_limit_makes_requests_wait_for_a_free_one() -> None:
    limited = Http1Client(connections=1, connect_timeout=2)
    gate = asyncio.Event()

    async def slow(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bool:
        await gate.wait()
        return await ok()(_r, writer, head)

    try:
        async with Server(slow) as server:

            async def get() -> bytes:
                answer = await limited.request("GET", "127.0.0.1", server.port, "/", [], None)
                body = await read_all(answer)
                answer.release()
                return body

            tasks = [asyncio.create_task(get()) for _ in range(2)]
            await asyncio.sleep(0.1)
            assert server.connections == 1
            gate.set()
            assert await asyncio.gather(*tasks) == [b"hello", b"hello"]
        assert server.connections == 1
    finally:
        await limited.close()
