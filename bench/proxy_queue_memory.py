"""P6: 10,000 requests held in the queue of one proxy: its memory, and that every one of them completes.

Set-up: nginx answering a fixed completion (the model once it is Ready), embedded NATS, the proxy as its own
process (``FLEXINFER_QUEUE_MAX`` above the count). The model's Route is written parked; 10,000 concurrent
requests are sent and held; the proxy's RSS is read once all of them wait; then the Route is written Ready and
every request must complete with 200, in the order of the queue (drained one after another).

Goal: <= 200 MB RSS of the proxy with 10,000 waiting, 0 lost.

    python bench/proxy_queue_memory.py [--requests 10000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time

import aiohttp
from _common import (
    REQUEST_BODY,
    embedded_nats,
    http_client,
    nginx,
    proxy_process,
    put_route,
    raise_open_files_limit,
    require_tools,
    until_model_state,
    verdict,
    workdir,
)


async def queued(http: aiohttp.ClientSession, proxy_url: str) -> int:
    async with http.get(proxy_url + "/api/v1/queues") as resp:
        return sum(item["queued"] for item in (await resp.json())["items"])


async def run(proxy_url: str, nats_url: str, upstream_url: str, count: int, rss: object) -> dict[str, object]:
    outcomes: collections.Counter[str] = collections.Counter()
    async with http_client(count + 10) as http, aiohttp.ClientSession() as admin:

        async def one() -> None:
            try:
                async with http.post(
                    proxy_url + "/v1/chat/completions",
                    data=REQUEST_BODY,
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    await resp.read()
                    outcomes[str(resp.status)] += 1
            except Exception as exc:
                outcomes[f"error:{type(exc).__name__}"] += 1

        started = time.monotonic()
        tasks = [asyncio.create_task(one()) for _ in range(count)]
        deadline = started + 120
        while (waiting := await queued(admin, proxy_url)) < count:
            if time.monotonic() > deadline or all(t.done() for t in tasks):
                break
            await asyncio.sleep(0.2)
        held_after = time.monotonic() - started
        await asyncio.sleep(1.0)  # let the proxy settle (demand reports, GC) before reading its memory
        rss_held = rss()  # type: ignore[operator]
        released = time.monotonic()
        await put_route(nats_url, "m1", endpoint=upstream_url)
        await asyncio.gather(*tasks)
        drained = time.monotonic() - released
    return {
        "waiting": waiting,
        "held_after": held_after,
        "rss_held": rss_held,
        "drained": drained,
        "outcomes": outcomes,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    args = parser.parse_args()
    require_tools("nginx")
    raise_open_files_limit()
    import uvloop

    with (
        workdir() as tmp,
        nginx(tmp, name="upstream") as upstream,
        embedded_nats(tmp) as nats_url,
        proxy_process(
            nats_url,
            tmp,
            FLEXINFER_QUEUE_MAX=str(args.requests * 2),
            FLEXINFER_QUEUE_TIMEOUT="5m",
            # every client is on loopback: no per-address cap, and room for all of them (the default is 8192)
            FLEXINFER_PROXY_MAX_CONNECTIONS=str(args.requests + 1000),
            FLEXINFER_PROXY_MAX_CONNECTIONS_PER_CLIENT="0",
        ) as proxy,
    ):
        upstream_url = f"http://127.0.0.1:{upstream.port}"
        idle_rss, _ = proxy.rss_mb()
        asyncio.run(put_route(nats_url, "m1", endpoint=None))
        asyncio.run(until_model_state(proxy.url, "m1", ready=False))
        result = uvloop.run(run(proxy.url, nats_url, upstream_url, args.requests, lambda: proxy.rss_mb()[0]))
        _, peak = proxy.rss_mb()

    outcomes: collections.Counter[str] = result["outcomes"]  # type: ignore[assignment]
    ok = outcomes.get("200", 0)
    lost = args.requests - ok
    rss_held: float = result["rss_held"]  # type: ignore[assignment]
    print(
        f"  {result['waiting']:,} requests waiting after {result['held_after']:.1f}s; drained in "
        f"{result['drained']:.1f}s once Ready; outcomes {dict(outcomes)}"
    )
    print(
        f"P6 {args.requests:,} queued: proxy RSS {rss_held:.0f} MB (idle {idle_rss:.0f} MB, "
        f"{(rss_held - idle_rss) * 1024 / max(args.requests, 1):.1f} KB per waiting request, peak {peak:.0f} MB), "
        f"{lost} lost — goal <= 200 MB, 0 lost: {verdict(rss_held <= 200 and lost == 0)}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
