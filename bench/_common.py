"""Shared helpers for the proxy benchmarks: start what a bench needs on loopback, run wrk, read RSS (and, for the
scheduler's, the models a bench stores in its database).

Everything runs on 127.0.0.1 and is stopped when the bench ends: an embedded NATS (JetStream) in a temp dir, nginx
(the fixed upstream, and nginx as the reference reverse proxy), the proxy as its own process
(``python -m flexinfer_proxy``), and, for streaming, a small SSE upstream (``python bench/_common.py sse-upstream``).
There is no scheduler: a bench writes ``Route`` entries into the routes KV bucket itself.

This machine has 2 cores; nothing is pinned, so wrk, the proxy and the upstream share them. Compare ratios measured
side by side in one run, not absolute numbers across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

import aiohttp
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from flexinfer_cli.embedded import LOOPBACK, EmbeddedNats, free_port
from flexinfer_common.bus import Bus
from flexinfer_common.db import ModelRow
from flexinfer_testbed.routes import make_route, write_route
from flexinfer_testbed.system import service_environment

NAMESPACE = "default"
T = TypeVar("T")
logging.getLogger("flexinfer.bus").setLevel(logging.ERROR)  # the bench's own short NATS connections

#: What the fixed upstream answers to every request: a small, complete chat completion.
COMPLETION = json.dumps(
    {
        "id": "chatcmpl-bench",
        "object": "chat.completion",
        "created": 1767225600,
        "model": "m1",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello there!"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8},
    },
    separators=(",", ":"),
)
REQUEST_BODY = json.dumps(
    {"model": "m1", "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 16},
    separators=(",", ":"),
)


class MissingTool(SystemExit):
    pass


def require_tools(*names: str) -> None:
    """Stop with a readable hint when a tool the bench runs is not installed."""
    missing = [name for name in names if shutil.which(name) is None and not Path(f"/usr/sbin/{name}").exists()]
    if missing:
        hint = "apt-get install -y nginx-light wrk   (Debian/Ubuntu; or the `nginx` package)"
        raise MissingTool(f"missing {', '.join(missing)}: install with\n    {hint}")


def tool(name: str) -> str:
    return shutil.which(name) or f"/usr/sbin/{name}"


def raise_open_files_limit() -> None:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = hard if hard != resource.RLIM_INFINITY else 65536
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


# --------------------------------------------------------------------------------------------- processes


def rss_mb(pid: int) -> tuple[float, float]:
    """(current RSS, peak RSS) of a process in MB, from /proc."""
    values: dict[str, float] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) / 1024
    return values.get("VmRSS", 0.0), values.get("VmHWM", 0.0)


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def _stop(proc: subprocess.Popen[bytes], grace: float = 5.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_port(port: int, *, within: float = 15.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    import socket

    deadline = time.monotonic() + within
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process {proc.args!r} exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection((LOOPBACK, port), timeout=0.2):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"nothing listens on {LOOPBACK}:{port} after {within}s")
        time.sleep(0.02)


@dataclass
class Nginx:
    """nginx with ``workers`` worker processes (1: a single process, no master). ``upstream_port`` set: it is a
    keep-alive reverse proxy to it; else it answers every request with the fixed completion."""

    port: int
    proc: subprocess.Popen[bytes]


@contextlib.contextmanager
def nginx(workdir: Path, *, upstream_port: int | None = None, name: str = "nginx", workers: int = 1) -> Iterator[Nginx]:
    port = free_port()
    prefix = workdir / name
    (prefix / "logs").mkdir(parents=True, exist_ok=True)
    if upstream_port is None:
        body = COMPLETION.replace("\\", "\\\\").replace("'", "\\'")
        location = f"default_type application/json; return 200 '{body}';"
        upstream = ""
    else:
        location = (
            'proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection ""; proxy_buffering off;'
        )
        upstream = f"upstream backend {{ server {LOOPBACK}:{upstream_port}; keepalive 256; }}"
    temp = prefix / "tmp"
    temp.mkdir(exist_ok=True)
    conf = f"""
daemon off;
master_process {"off" if workers == 1 else "on"};
worker_processes {workers};
pid {prefix}/nginx.pid;
error_log {prefix}/logs/error.log warn;
events {{ worker_connections 20000; }}
http {{
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path {temp}/body; proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fcgi; uwsgi_temp_path {temp}/uwsgi; scgi_temp_path {temp}/scgi;
    {upstream}
    server {{
        listen {LOOPBACK}:{port} backlog=4096{" reuseport" if workers > 1 else ""};
        location / {{ {location} }}
    }}
}}
"""
    conf_path = prefix / "nginx.conf"
    conf_path.write_text(conf)
    proc = subprocess.Popen(
        [tool("nginx"), "-p", str(prefix), "-c", str(conf_path), "-e", str(prefix / "logs" / "error.log")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        try:
            wait_for_port(port, proc=proc)
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}\n{(prefix / 'logs' / 'error.log').read_text()[-2000:]}") from None
        yield Nginx(port, proc)
    finally:
        _stop(proc)


@contextlib.contextmanager
def embedded_nats(workdir: Path) -> Iterator[str]:
    server = EmbeddedNats(workdir / "nats")
    try:
        yield server.start()
    finally:
        server.stop()


@dataclass
class ProxyProcess:
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def rss_mb(self) -> tuple[float, float]:
        """(current, peak) RSS in MB of the proxy, summed over its worker processes when it has several."""
        pids = [self.proc.pid, *children(self.proc.pid)]
        sizes = [rss_mb(pid) for pid in pids]
        return sum(s[0] for s in sizes), sum(s[1] for s in sizes)


def children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(c) for c in path.read_text().split()] if path.exists() else []


@contextlib.contextmanager
def proxy_process(nats_url: str, workdir: Path, **env: str) -> Iterator[ProxyProcess]:
    """``python -m flexinfer_proxy`` on a free loopback port, ready (route snapshot loaded) when yielded."""
    port = free_port()
    environment = {**service_environment(nats_url=nats_url, proxy_port=str(port), instance_id="proxy-bench"), **env}
    log_path = workdir / f"proxy-{port}.log"
    with log_path.open("wb") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "flexinfer_proxy"], env=environment, stdout=log_file, stderr=log_file
        )
    try:
        wait_for_port(port, proc=proc)
        _wait_ready(f"http://{LOOPBACK}:{port}/readyz", proc, log_path)
        yield ProxyProcess(port, proc)
    finally:
        _stop(proc, grace=15.0)


def _wait_ready(url: str, proc: subprocess.Popen[bytes], log_path: Path, within: float = 15.0) -> None:
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + within
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"the proxy exited with {proc.returncode}:\n{log_path.read_text()[-2000:]}")
        with contextlib.suppress(urllib.error.URLError, OSError), urllib.request.urlopen(url, timeout=1) as resp:
            if resp.status == 200:
                return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{url} not ready after {within}s")
        time.sleep(0.05)


@contextlib.contextmanager
def workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="flexinfer-bench-") as path:
        yield Path(path)


# --------------------------------------------------------------------------------------------- routes


async def put_route(nats_url: str, name: str, *, endpoint: str | None) -> None:
    """Play the scheduler: write the model's Route (Ready at ``endpoint``, or parked when None)."""
    bus = Bus(nats_url, name="bench")
    await bus.connect()
    try:
        await bus.ensure_streams()
        await write_route(bus, make_route(name, endpoint=endpoint, namespace=NAMESPACE))
    finally:
        await bus.close()


async def add_models(
    sessions: async_sessionmaker[AsyncSession], models: Iterable[tuple[str, str, int, dict[str, object]]]
) -> None:
    """Store ``(name, group, priority, manifest)`` models of namespace default, as an apply would, at once."""
    now = datetime.now(UTC)
    async with sessions.begin() as session:
        for name, group, priority, manifest in models:
            session.add(
                ModelRow(
                    namespace=NAMESPACE,
                    name=name,
                    manifest=manifest,
                    group_name=group,
                    priority=priority,
                    created_at=now,
                    updated_at=now,
                )
            )


def until_every_worker_sees(proxy_url: str, name: str, *, checks: int = 20, within: float = 15.0) -> None:
    """Until ``checks`` requests in a row, each on a new connection (so each may reach another worker of a proxy
    with several), show the model Ready."""
    import urllib.request

    deadline = time.monotonic() + within
    in_a_row = 0
    while in_a_row < checks:
        with urllib.request.urlopen(proxy_url + "/v1/models", timeout=2) as resp:
            models = {m["id"]: m for m in json.loads(resp.read())["data"]}
        in_a_row = in_a_row + 1 if name in models and models[name]["ready"] else 0
        if time.monotonic() > deadline:
            raise TimeoutError(f"not every worker of the proxy saw {name} Ready within {within}s")


async def until_model_state(proxy_url: str, name: str, *, ready: bool, within: float = 10.0) -> None:
    """Until the proxy's /v1/models shows the model with ``ready``."""
    deadline = time.monotonic() + within
    async with aiohttp.ClientSession() as http:
        while True:
            async with http.get(proxy_url + "/v1/models") as resp:
                models = {m["id"]: m for m in (await resp.json())["data"]}
            if name in models and models[name]["ready"] is ready:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the proxy did not see {name} ready={ready} within {within}s")
            await asyncio.sleep(0.05)


# --------------------------------------------------------------------------------------------- wrk


@dataclass(frozen=True)
class WrkResult:
    requests_per_second: float
    requests: int
    p50_ms: float
    p99_ms: float
    mean_ms: float
    errors: int
    non_2xx: int

    def describe(self) -> str:
        return (
            f"{self.requests_per_second:,.0f} req/s, p50 {self.p50_ms:.2f} ms, p99 {self.p99_ms:.2f} ms"
            + (f", {self.errors} socket errors" if self.errors else "")
            + (f", {self.non_2xx} non-2xx" if self.non_2xx else "")
        )


_UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([\d.]+)(us|ms|s)", text.strip())
    if match is None:
        raise ValueError(f"not a wrk duration: {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def wrk_script(workdir: Path, *, body: str = REQUEST_BODY, delay_ms: float | None = None) -> Path:
    """A wrk Lua script that POSTs ``body`` as JSON (and waits ``delay_ms`` between requests per connection)."""
    lua = [
        'wrk.method = "POST"',
        f"wrk.body = {json.dumps(body)}",
        'wrk.headers["Content-Type"] = "application/json"',
    ]
    if delay_ms is not None:
        # random around the mean, so the connections do not fire in lock-step bursts
        lua.append(f"function delay() return math.random(0, {2 * delay_ms:g}) end")
    path = workdir / f"post-{delay_ms}.lua"
    path.write_text("\n".join(lua) + "\n")
    return path


def run_wrk(url: str, script: Path, *, connections: int = 64, duration: float = 5.0, threads: int = 1) -> WrkResult:
    out = subprocess.run(
        [
            tool("wrk"),
            f"-t{threads}",
            f"-c{connections}",
            f"-d{duration:g}s",
            "--latency",
            "-s",
            str(script),
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))  # type: ignore[union-attr]
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    mean = _ms(re.search(r"Latency\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p50 = _ms(re.search(r"\s50%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    p99 = _ms(re.search(r"\s99%\s+(\S+)", out).group(1))  # type: ignore[union-attr]
    errors_match = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    errors = sum(int(x) for x in errors_match.groups()) if errors_match else 0
    non_2xx_match = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    non_2xx = int(non_2xx_match.group(1)) if non_2xx_match else 0
    return WrkResult(rps, total, p50, p99, mean, errors, non_2xx)


def warm_up(url: str, script: Path) -> None:
    run_wrk(url, script, connections=16, duration=1)


# --------------------------------------------------------------------------------------------- SSE upstream


async def _sse_upstream(port: int, chunks: int, interval: float) -> None:
    """Every request streams ``chunks`` OpenAI-style SSE events, ``interval`` s apart; each event carries the
    CLOCK_MONOTONIC nanoseconds at which it was written (``t``), so a client can measure each chunk's delay."""
    from aiohttp import web

    async def stream(request: web.BaseRequest) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for i in range(chunks):
            if i:
                await asyncio.sleep(interval)
            payload = '{"object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"tok"}}],"t":%d}'
            await response.write(b"data: " + (payload % time.monotonic_ns()).encode() + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    server = web.Server(stream, access_log=None)
    runner = web.ServerRunner(server)
    await runner.setup()
    await web.TCPSite(runner, LOOPBACK, port, backlog=4096).start()
    await asyncio.Event().wait()


@contextlib.contextmanager
def sse_upstream(*, chunks: int, interval: float) -> Iterator[int]:
    port = free_port()
    argv = [sys.executable, __file__, "sse-upstream", "--port", str(port)]
    argv += ["--chunks", str(chunks), "--interval", str(interval)]
    proc = subprocess.Popen(argv)
    try:
        wait_for_port(port, proc=proc)
        yield port
    finally:
        _stop(proc)


@contextlib.asynccontextmanager
async def http_client(connections: int) -> AsyncIterator[aiohttp.ClientSession]:
    connector = aiohttp.TCPConnector(limit=connections, limit_per_host=0, force_close=False)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        yield http


def print_rows_in_parallel(judge: Callable[[T], tuple[str, bool]], items: Iterable[T], *, jobs: int) -> int:
    """Judge every item in ``jobs`` processes (``judge`` gives a table row and whether the item met its goal); print
    the rows in order as they come; return how many missed."""
    missed = 0
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        for row, ok in pool.map(judge, items):
            print(row, flush=True)
            missed += not ok
    return missed


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def verdict(ok: bool) -> str:
    return "goal met" if ok else "goal NOT met"


def _main(argv: list[str]) -> None:
    if not argv:  # `make bench` runs every bench/*.py, this one too: it only holds helpers
        print("(helpers for the proxy benchmarks; nothing to measure here)")
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("what", choices=["sse-upstream"])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.05)
    args = parser.parse_args(argv)
    raise_open_files_limit()
    import uvloop

    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(_sse_upstream(args.port, args.chunks, args.interval))


if __name__ == "__main__":
    _main(sys.argv[1:])
