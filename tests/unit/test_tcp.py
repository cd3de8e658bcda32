"""The one way FlexInfer picks a port for a server that binds it a moment later (flexinfer_common.tcp)."""

from __future__ import annotations

import socket

import pytest

from flexinfer_common import tcp


def test_a_picked_port_is_free_and_outside_the_range_outgoing_connections_take_theirs_from() -> None:
    # An outgoing connection made between the pick and the bind (a service's pool to PostgreSQL) takes its local port
    # from the ephemeral range: a port outside it cannot be taken that way ("address already in use" in CI).
    low, high = tcp.ephemeral_range()
    for _ in range(50):
        port = tcp.free_port()
        assert not low <= port <= high, (port, low, high)
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # free: a server can listen there


def test_a_port_taken_by_a_listener_is_not_picked(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        monkeypatch.setattr(tcp, "PICK_FROM", busy)
        monkeypatch.setattr(tcp, "PICK_TO", busy)
        monkeypatch.setattr(tcp, "ephemeral_range", lambda: (1, 2))
        assert tcp.free_port() != busy, "the only candidate is taken: the OS picks one"


def test_when_the_ephemeral_range_leaves_no_room_the_os_picks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tcp, "ephemeral_range", lambda: (1024, 65535))
    port = tcp.free_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))


def test_a_port_with_a_listener_is_not_free_and_one_closed_a_moment_ago_is() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not tcp.port_is_free(port)
    assert tcp.port_is_free(port)
