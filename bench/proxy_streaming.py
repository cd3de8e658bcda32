"""P8: 1,000 concurrent streaming (SSE) responses through one proxy: its memory, and the delay it adds per chunk.

Set-up: a small SSE model (``_common.py sse-upstream``, its own process) that streams ``--chunks`` events per request,
``--interval`` seconds apart, each stamped with the CLOCK_MONOTONIC time it was written; embedded NATS; the proxy as
its own process, with the model's Route written Ready. The same 1,000 concurrent streams run twice: straight to the
model, then through the proxy; the streams start spread over ``--ramp`` seconds (real token streams are not in
lock-step). Each received event's delay is (time received - time written); the proxy's added delay per chunk is the
difference between the two runs, at p50 and p99, over the events written once every stream is running (steady
state: during the ramp the client itself is busy opening 1,000 connections). The first event of each stream also
carries the request's own way through the proxy: it is reported apart, as time to first chunk. The proxy's RSS is
sampled during its run.

Goal: <= 300 MB RSS of the proxy, <= 2 ms added per chunk at p99.

    python bench/proxy_streaming.py [--streams 1000] [--chunks 20] [--interval 0.2] [--ramp 1]
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import threading
import time

from _common import (
    embedded_nats,
    http_client,
    percentile,
    proxy_process,
    put_route,
    raise_open_files_limit,
    sse_upstream,
    until_model_state,
    verdict,
    workdir,
)

STAMP = re.compile(rb'"t":(\d+)')
BODY = b'{"model":"m1","stream":true,"messages":[{"role":"user","content":"count"}]}'


async def stream_all(
    url: str, streams: int, chunks: int, ramp: float, interval: float
) -> tuple[list[float], list[float], int, int]:
    """Run ``streams`` concurrent SSE requests (started spread over ``ramp``); return the delays (ms) of the first
    events and of the later ones written in steady state, complete streams, failures."""
    steady_from = time.monotonic_ns() + int((ramp + interval) * 1e9)
    firsts: list[float] = []
    delays: list[float] = []
    complete = 0
    failed = 0
    async with http_client(streams + 10) as http:

        async def one(index: int) -> None:
            nonlocal complete, failed
            seen = 0
            await asyncio.sleep(ramp * index / streams)
            try:
                async with http.post(url, data=BODY, headers={"Content-Type": "application/json"}) as resp:
                    async for line in resp.content:
                        now = time.monotonic_ns()
                        match = STAMP.search(line)
                        if match is not None:
                            written = int(match.group(1))
                            if not seen:
                                firsts.append((now - written) / 1e6)
                            elif written >= steady_from:
                                delays.append((now - written) / 1e6)
                            seen += 1
                        elif line.startswith(b"data: [DONE]"):
                            break
            except Exception:
                failed += 1
                return
            if seen == chunks:
                complete += 1
            else:
                failed += 1

        await asyncio.gather(*(one(i) for i in range(streams)))
    return firsts, delays, complete, failed


class RssSampler:
    def __init__(self, read: object) -> None:
        self._read = read
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak = max(self.peak, self._read())  # type: ignore[operator]

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--chunks", type=int, default=20)
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--ramp", type=float, default=1.0)
    args = parser.parse_args()
    raise_open_files_limit()
    import uvloop

    with (
        workdir() as tmp,
        sse_upstream(chunks=args.chunks, interval=args.interval) as model_port,
        embedded_nats(tmp) as nats_url,
        # (every stream comes from loopback: no per-address cap, 1,024 by default)
        proxy_process(nats_url, tmp, FLEXINFER_PROXY_MAX_CONNECTIONS_PER_CLIENT="0") as proxy,
    ):
        model_url = f"http://127.0.0.1:{model_port}"
        asyncio.run(put_route(nats_url, "m1", endpoint=model_url))
        asyncio.run(until_model_state(proxy.url, "m1", ready=True))
        uvloop.run(stream_all(model_url + "/v1/chat/completions", 50, args.chunks, 0.1, args.interval))  # warm-up
        direct_first, direct, direct_ok, direct_failed = uvloop.run(
            stream_all(model_url + "/v1/chat/completions", args.streams, args.chunks, args.ramp, args.interval)
        )
        idle_rss, _ = proxy.rss_mb()
        with RssSampler(lambda: proxy.rss_mb()[0]) as sampler:
            started = time.monotonic()
            proxied_first, proxied, proxied_ok, proxied_failed = uvloop.run(
                stream_all(proxy.url + "/v1/chat/completions", args.streams, args.chunks, args.ramp, args.interval)
            )
            took = time.monotonic() - started

    def stats(values: list[float]) -> tuple[float, float]:
        return percentile(values, 50), percentile(values, 99)

    d50, d99 = stats(direct)
    p50, p99 = stats(proxied)
    f50, f99 = stats(direct_first)
    g50, g99 = stats(proxied_first)
    print(
        f"  direct:  {direct_ok} streams complete, {direct_failed} failed; chunk delay p50 {d50:.2f} ms, "
        f"p99 {d99:.2f} ms; first chunk p50 {f50:.2f} ms, p99 {f99:.2f} ms"
    )
    print(
        f"  proxied: {proxied_ok} streams complete, {proxied_failed} failed in {took:.1f}s; "
        f"chunk delay p50 {p50:.2f} ms, p99 {p99:.2f} ms ({len(proxied):,} steady-state chunks); "
        f"first chunk p50 {g50:.2f} ms, p99 {g99:.2f} ms"
    )
    print(f"  time to first chunk added by the proxy: p50 +{g50 - f50:.2f} ms, p99 +{g99 - f99:.2f} ms")
    added99 = p99 - d99
    print(
        f"P8 {args.streams:,} concurrent streams: proxy RSS peak {sampler.peak:.0f} MB (idle {idle_rss:.0f} MB), "
        f"added per chunk p50 +{p50 - d50:.2f} ms, p99 +{added99:.2f} ms — goal <= 300 MB, <= 2 ms: "
        f"{verdict(sampler.peak <= 300 and added99 <= 2 and proxied_failed == 0)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
