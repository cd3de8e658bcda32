"""The proxy's Python cost per forwarded request, without sockets: the real server, handler and forwarding objects
(assembled by ``flexinfer_proxy.app.Proxy``, no bus connected) fed the bytes wrk and nginx exchange with it.

Each request: the client's bytes go to the server protocol's ``data_received`` (parse, resolve, forward: the
request is "written" to a fake model transport), then the model's answer to the pooled connection's
``data_received`` (relay to a fake client transport, release, tally). What it leaves out is the kernel and the
event loop: compare code with it, alternating runs, then confirm with ``proxy_throughput.py``.

    python bench/proxy_feed.py [--requests 200000] [--rounds 5] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time

import uvloop
from _common import COMPLETION, NAMESPACE, REQUEST_BODY

from flexinfer_common.bus import Bus
from flexinfer_common.runner import tune_gc
from flexinfer_proxy.adapters.http1 import UpstreamConnection
from flexinfer_proxy.adapters.http_server import ServerConnection
from flexinfer_proxy.app import Proxy
from flexinfer_proxy.settings import ProxySettings
from flexinfer_testbed.routes import make_route

UPSTREAM = "127.0.0.1:9"
#: What wrk sends (``bench/_common.wrk_script``) and what the nginx upstream answers, byte for byte.
REQUEST = (
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\nContent-Type: application/json\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(REQUEST_BODY), REQUEST_BODY.encode())
)
ANSWER = (
    b"HTTP/1.1 200 OK\r\nServer: nginx/1.24.0\r\nDate: Tue, 01 Dec 2026 06:00:00 GMT\r\n"
    b"Content-Type: application/json\r\nContent-Length: %d\r\nConnection: keep-alive\r\n\r\n%s"
    % (len(COMPLETION), COMPLETION.encode())
)


class FakeTransport:
    """Enough of ``asyncio.Transport`` for both sides; counts the bytes written."""

    def __init__(self) -> None:
        self.written = 0

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str, default: object = None) -> object:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        raise AssertionError("a keep-alive connection was closed")

    abort = close


def assemble() -> tuple[Proxy, ServerConnection, UpstreamConnection, FakeTransport]:
    settings = ProxySettings(nats_url="nats://127.0.0.1:1")
    proxy = Proxy(settings, Bus(settings.nats_url, name="feed"))
    proxy.routes.put(make_route("m1", endpoint=f"http://{UPSTREAM}", namespace=NAMESPACE))
    proxy.watcher.loaded.set()
    proxy.forwarder.start()
    # One pooled keep-alive connection to the model, as ``Http1Client.connect`` and a first answer leave it.
    client = proxy.forwarder._client
    assert client is not None
    host, port = UPSTREAM.split(":")
    pool = client.pool(host, int(port))
    upstream = UpstreamConnection(pool)
    upstream.connection_made(FakeTransport())
    client._open += 1
    upstream.reused = True
    upstream.idle_since = time.monotonic() + 1e9  # never too old to reuse
    pool.idle.append(upstream)
    server = ServerConnection(proxy.server)
    to_client = FakeTransport()
    server.connection_made(to_client)
    return proxy, server, upstream, to_client


def feed(server: ServerConnection, upstream: UpstreamConnection, requests: int) -> float:
    """CPU seconds for ``requests`` requests through both protocols."""
    to_server = server.data_received
    to_upstream = upstream.data_received
    started = time.process_time()  # (CPU time: other processes on the machine count less)
    for _ in range(requests):
        to_server(REQUEST)
        to_upstream(ANSWER)
    return time.process_time() - started


async def run(args: argparse.Namespace) -> None:
    proxy, server, upstream, to_client = assemble()
    feed(server, upstream, 1000)  # warm the caches (resolution, answer heads)
    relayed = len(ANSWER) - len(b"Connection: keep-alive\r\n")  # (hop-by-hop: not relayed)
    if to_client.written != 1000 * relayed or [a[1] for a in proxy.tally.answers] != [200] * 1000:
        sys.exit(f"unexpected answers: {to_client.written} bytes for 1000 answers of {relayed}")
    tune_gc()
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(feed, server, upstream, args.requests)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(60)
        return
    figures = []
    for _ in range(args.rounds):
        figures.append(feed(server, upstream, args.requests) / args.requests * 1e6)
        proxy.tally.flush()  # (once a second in the proxy: a few hundred microseconds per 20,000 answers)
    print(f"µs per request: best {min(figures):.2f}, all " + " ".join(f"{f:.2f}" for f in figures))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="cProfile one round instead of timing")
    args = parser.parse_args()
    uvloop.run(run(args))  # (the proxy's loop: see flexinfer_common.runner)
    return 0


if __name__ == "__main__":
    sys.exit(main())
