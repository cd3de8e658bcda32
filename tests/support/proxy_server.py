"""The proxy's HTTP server protocol fed raw bytes without sockets: a transport that records what the protocol does to
it, a handler that collects the requests, and a connection between them."""

from __future__ import annotations

from typing import Any

from flexinfer_proxy.adapters.http_server import HttpServer, Request, ServerConnection


class FakeTransport:
    """What was written, whether it was closed, half-closed (``eof``) or paused; ``peer``: the client's address
    (``get_extra_info("peername")``; None: no address, as for a Unix socket)."""

    def __init__(self, peer: str | None = None) -> None:
        self.peer = peer
        self.written = b""
        self.closed = False
        self.eof = False
        self.paused = False

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return (self.peer, 40000) if name == "peername" and self.peer is not None else default


class Handler:
    """Collects whole requests; with ``at_once`` (a body), answers each with 200 and it as it comes, else each waits
    for ``Handler.answer``."""

    def __init__(self, at_once: bytes | None = None) -> None:
        self.at_once = at_once
        self.requests: list[Request] = []

    def head(self, request: Request) -> bool:
        return False

    def request(self, request: Request) -> None:
        self.requests.append(request)
        if self.at_once is not None:
            request.conn.respond(request, 200, self.at_once)

    @staticmethod
    def answer(request: Request) -> None:
        """200 with the request's target as the body."""
        request.conn.respond(request, 200, request.url)


def connect(server: HttpServer, peer: str | None = None) -> tuple[ServerConnection, FakeTransport]:
    """A connection of ``server`` from ``peer``, made."""
    conn = ServerConnection(server)
    transport = FakeTransport(peer)
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport
