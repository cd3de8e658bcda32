"""The proxy's lean HTTP/1.1 client against small raw servers on loopback (no NATS): framing, keep-alive,
backpressure and the two kinds of failure. The answer is pushed to a sink, as the forwarding exchange gets it."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from flexinfer_proxy.adapters.http1 import (
    Framing,
    Http1Client,
    UpstreamConnection,
    UpstreamConnectionError,
    UpstreamStreamError,
    request_head,
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


def raw(answer: bytes, *, keep: bool) -> Script:
    """Writes ``answer`` as it is to each request; ``keep``: the connection stays open for the next one."""

    async def script(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _h: bytes) -> bool:
        writer.write(answer)
        await writer.drain()
        return keep

    return script


class Sink:
    """Records what a connection pushes (the ``AnswerSink`` port), with events to wait on."""

    def __init__(self, *, dechunk: bool = False) -> None:
        self.dechunk = dechunk
        self.status = 0
        self.head = b""
        self.framing: Framing | None = None
        self.data = b""
        self.pieces: list[bytes] = []
        self.failure: UpstreamConnectionError | UpstreamStreamError | None = None
        self.flushed = asyncio.Event()
        self.ended = asyncio.Event()

    def answer_head(self, status: int, head: bytes, framing: Framing) -> bool:
        self.status, self.head, self.framing = status, head, framing
        return self.dechunk

    def answer_body(self, data: bytes) -> None:
        self.pieces.append(data)

    def answer_flush(self, data: bytes, *, complete: bool) -> None:
        self.data += data
        self.flushed.set()
        if complete:
            self.ended.set()

    def upstream_failed(self, error: UpstreamConnectionError | UpstreamStreamError) -> None:
        self.failure = error
        self.ended.set()

    def upstream_writable(self, writable: bool) -> None:
        pass


@pytest.fixture
async def client() -> AsyncIterator[Http1Client]:
    made = Http1Client(connections=10, connect_timeout=2)
    yield made
    await made.close()


async def send(
    client: Http1Client,
    port: int,
    method: bytes,
    target: bytes,
    *,
    headers: list[tuple[bytes, bytes]] | None = None,
    body: bytes = b"",
    sink: Sink | None = None,
) -> tuple[UpstreamConnection, Sink]:
    """Take a pooled connection (or connect) and write one request; the answer goes to ``sink``."""
    pool = client.pool("127.0.0.1", port)
    conn = pool.take() or await client.connect(pool)
    sink = sink or Sink()
    conn.begin(sink, head_only=method == b"HEAD", may_dechunk=sink.dechunk)
    length = len(body) if body or method == b"POST" else None
    pieces = request_head(method, target, pool.host_header, headers or [], content_length=length, chunked=False)
    conn.write(b"".join(pieces) + body)
    return conn, sink


async def answered(conn: UpstreamConnection, sink: Sink) -> Sink:
    async with asyncio.timeout(5):
        await sink.ended.wait()
    if sink.failure is None:
        conn.release()
    return sink


async def test_keep_alive_reuses_one_connection_and_sends_headers_and_body(client: Http1Client) -> None:
    async with Server(ok(b"pong", X_Model="m")) as server:
        for i in range(3):
            sink = await answered(
                *await send(
                    client,
                    server.port,
                    b"POST",
                    f"/v1/x?i={i}".encode(),
                    headers=[(b"Authorization", b"Bearer t")],
                    body=b"ping",
                )
            )
            assert sink.status == 200
            assert sink.head.startswith(b"HTTP/1.1 200 OK\r\n") and b"\r\nX-Model: m\r\n" in sink.head
            assert sink.head.endswith(b"\r\n\r\n"), "the head is handed over whole, as it came"
            assert sink.framing is Framing.SIZED
            assert sink.data == b"pong"
    assert server.connections == 1
    head, body = server.requests[2]
    assert head.startswith(b"POST /v1/x?i=2 HTTP/1.1\r\nHost: 127.0.0.1:")
    assert b"\r\nAuthorization: Bearer t\r\n" in head and b"\r\nContent-Length: 4\r\n" in head
    assert body == b"ping"


async def test_chunked_answers_come_piece_by_piece_with_their_framing(client: Http1Client) -> None:
    gate = asyncio.Event()

    async def chunked(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _h: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        writer.write(b"9\r\ndata: 1\n\n\r\n")
        await writer.drain()
        await gate.wait()
        writer.write(b"9\r\ndata: 2\n\n\r\n0\r\n\r\n")
        return True

    async with Server(chunked) as server:
        conn, sink = await send(client, server.port, b"GET", b"/sse")
        async with asyncio.timeout(5):
            while b"data: 1" not in sink.data:
                sink.flushed.clear()
                await sink.flushed.wait()
        assert not sink.ended.is_set(), "each piece is handed out as it arrives"
        assert sink.framing is Framing.CHUNKED
        gate.set()
        await answered(conn, sink)
        assert sink.data == b"9\r\ndata: 1\n\n\r\n9\r\ndata: 2\n\n\r\n0\r\n\r\n", "the chunk framing is kept"
        # An HTTP/1.0 client cannot read chunks: the sink may ask for the body de-chunked instead.
        gate.set()
        conn, sink = await send(client, server.port, b"GET", b"/sse", sink=Sink(dechunk=True))
        await answered(conn, sink)
        assert (sink.data, b"".join(sink.pieces)) == (b"", b"data: 1\n\ndata: 2\n\n")
    assert server.connections == 1


async def test_an_answer_without_a_length_ends_when_the_model_closes(client: Http1Client) -> None:
    until_close = raw(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it", keep=False)

    async with Server(until_close) as server:
        sink = await answered(*await send(client, server.port, b"GET", b"/"))
    assert (sink.framing, sink.data, sink.failure) == (Framing.UNTIL_CLOSE, b"all of it", None)


async def test_head_and_204_answers_have_no_body(client: Http1Client) -> None:
    no_content = raw(b"HTTP/1.1 204 No Content\r\n\r\n", keep=True)

    async with Server(ok(b"x" * 100)) as server:
        sink = await answered(*await send(client, server.port, b"HEAD", b"/"))
        assert b"\r\nContent-Length: 100\r\n" in sink.head
        assert (sink.framing, sink.data) == (Framing.NONE, b"")
    async with Server(no_content) as server:
        for _ in range(2):
            sink = await answered(*await send(client, server.port, b"DELETE", b"/"))
            assert (sink.status, sink.data) == (204, b"")
    assert server.connections == 1


async def test_a_paused_sink_pauses_the_model(client: Http1Client) -> None:
    big = b"y" * (8 * 1024 * 1024)
    async with Server(ok(big)) as server:
        conn, sink = await send(client, server.port, b"GET", b"/big")
        async with asyncio.timeout(5):
            await sink.flushed.wait()
        conn.pause_reading()  # the client cannot keep up
        received = len(sink.data)
        await asyncio.sleep(0.2)  # the model keeps writing; the proxy must not read on
        assert len(sink.data) == received
        conn.resume_reading()
        await answered(conn, sink)
    assert len(sink.data) == len(big)


async def test_failures_before_and_after_the_answer_started(client: Http1Client) -> None:
    async def hang_up(_r: asyncio.StreamReader, _w: asyncio.StreamWriter, _h: bytes) -> bool:
        return False

    break_mid_body = raw(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\npart", keep=False)

    async with Server(hang_up) as server:
        sink = await answered(*await send(client, server.port, b"GET", b"/"))
        assert isinstance(sink.failure, UpstreamConnectionError)
        assert "closed the connection" in str(sink.failure)
        assert not sink.failure.never_connected, "the request went out"
    async with Server(break_mid_body) as server:
        sink = await answered(*await send(client, server.port, b"GET", b"/"))
        assert isinstance(sink.failure, UpstreamStreamError)
        assert sink.data == b"part"
    unused = server.port  # closed now: nothing listens
    with pytest.raises(UpstreamConnectionError, match="ConnectionRefusedError") as refused:
        await send(client, unused, b"GET", b"/")
    assert refused.value.never_connected, "nothing was sent"


async def test_a_second_answer_to_one_request_is_a_broken_stream(client: Http1Client) -> None:
    twice = raw(
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nevil", keep=True
    )

    async with Server(twice) as server:
        sink = await answered(*await send(client, server.port, b"GET", b"/"))
    assert isinstance(sink.failure, UpstreamStreamError)
    assert sink.data == b"", "nothing of the packet is relayed"


async def test_a_connection_the_model_closed_while_idle_is_not_reused(client: Http1Client) -> None:
    async def once(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, head: bytes) -> bool:
        await ok()(_r, writer, head)
        return False  # answers, then closes the keep-alive connection

    async with Server(once) as server:
        for _ in range(3):
            sink = await answered(*await send(client, server.port, b"GET", b"/"))
            assert sink.data == b"hello"
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
                sink = await answered(*await send(limited, server.port, b"GET", b"/"))
                return sink.data

            tasks = [asyncio.create_task(get()) for _ in range(2)]
            await asyncio.sleep(0.1)
            assert server.connections == 1
            gate.set()
            assert await asyncio.gather(*tasks) == [b"hello", b"hello"]
        assert server.connections == 1
    finally:
        await limited.close()


class _IdleTransport:
    """A model connection's transport that nobody writes to (the answers are fed by hand)."""

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass


@pytest.mark.parametrize(
    ("first", "then"),
    [
        pytest.param(b"GET", b"GET", id="same-request"),
        pytest.param(b"GET", b"HEAD", id="head-after-get"),
        pytest.param(b"HEAD", b"GET", id="get-after-head"),
    ],
)
async def test_a_head_seen_before_is_framed_as_the_first_time(first: bytes, then: bytes) -> None:
    """Answer heads are remembered by their bytes (a model repeats them): the framing of the second answer with the
    same head is what working it out gives, whatever the request (a HEAD answer has no body either way)."""
    head = b"HTTP/1.1 200 OK\r\nX-Case: %s-%s\r\nContent-Length: 4\r\n\r\n" % (first, then)
    client = Http1Client(connections=1, connect_timeout=1)
    conn = UpstreamConnection(client.pool("127.0.0.1", 9))
    conn.connection_made(_IdleTransport())  # type: ignore[arg-type]
    for method in (first, then):
        sink = Sink()
        conn.begin(sink, head_only=method == b"HEAD")
        conn.data_received(head if method == b"HEAD" else head + b"pong")
        assert sink.ended.is_set() and sink.failure is None
        assert sink.framing is (Framing.NONE if method == b"HEAD" else Framing.SIZED)
        assert sink.data == (b"" if method == b"HEAD" else b"pong")
        assert sink.head == head
        if method == b"HEAD":  # (not reused after a HEAD answer: a fresh connection for the next)
            conn = UpstreamConnection(client.pool("127.0.0.1", 9))
            conn.connection_made(_IdleTransport())  # type: ignore[arg-type]
        else:
            conn.release()


@pytest.mark.parametrize(
    "then",
    [
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Id: 1\r\nContent-Length: 4\r\n\r\n", id="same-head"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Id: 2\r\nContent-Length: 4\r\n\r\n", id="same-length-other-head"),
        pytest.param(b"HTTP/1.1 200 OK\r\nX-Id: 12\r\nContent-Length: 4\r\n\r\n", id="longer-head"),
        pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n", id="shorter-head"),
        pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX: 1\r\n\r\n", id="same-length-chunked"),
    ],
)
async def test_where_a_head_ends_does_not_depend_on_the_head_before(then: bytes) -> None:
    """Where an answer head ends is taken from the last head's length when the bytes up to it are a head seen
    before: whatever the next head is, it is handed over whole, with its own framing, and the body after it."""
    first = b"HTTP/1.1 200 OK\r\nX-Id: 1\r\nContent-Length: 4\r\n\r\n"
    client = Http1Client(connections=1, connect_timeout=1)
    conn = UpstreamConnection(client.pool("127.0.0.1", 9))
    conn.connection_made(_IdleTransport())  # type: ignore[arg-type]
    for head in (first, first, then):
        chunked = b"Transfer-Encoding" in head
        body = b"4\r\npong\r\n0\r\n\r\n" if chunked else b"pong"
        sink = Sink()
        conn.begin(sink, head_only=False)
        conn.data_received(head + body)
        assert sink.ended.is_set() and sink.failure is None
        assert (sink.head, sink.data) == (head, body)
        assert sink.framing is (Framing.CHUNKED if chunked else Framing.SIZED)
        conn.release()
