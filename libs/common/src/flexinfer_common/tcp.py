"""A TCP port to give a server that binds it a moment later: the one way FlexInfer picks one (``flexinfer up``'s
embedded servers and services, the local actuator's model processes, the test harness).

A port the kernel hands out for ``bind(0)`` lies in its ephemeral range, the range it also takes the local port of
every outgoing connection from: between the pick and the server's bind, a connection opened meanwhile (a service's
pool to PostgreSQL, say) can take that very port, and the server fails with "address already in use" for as long
as that connection lives. So the port is picked outside the ephemeral range (Linux:
``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default), where nothing is assigned without asking.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LOOPBACK = "127.0.0.1"
#: where a port is picked: above the ports services are commonly configured on, below the usual ephemeral ranges
PICK_FROM, PICK_TO = 20000, 32767
_EPHEMERAL = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TRIES = 64


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        low, high = (int(part) for part in _EPHEMERAL.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


def port_is_free(port: int, host: str = LOOPBACK, *, time_wait_ok: bool = True) -> bool:
    """True if a server could listen on ``port`` now. ``time_wait_ok``: with SO_REUSEADDR, as PostgreSQL,
    nats-server and uvicorn bind, so TIME_WAIT leftovers of an earlier run do not count as "in use"."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        if time_wait_ok:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` right now, outside the ephemeral range (the OS's pick when that range leaves
    no room, or no candidate was free)."""
    low, high = ephemeral_range()
    rng = random.SystemRandom()
    for _ in range(_TRIES):
        port = rng.randint(PICK_FROM, PICK_TO)
        if not low <= port <= high and port_is_free(port, host, time_wait_ok=False):
            return port
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
        return picked
