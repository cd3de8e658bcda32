"""P1 and P2: the proxy's throughput and added latency, side by side with nginx as a reverse proxy.

Set-up (all on loopback, started and stopped here): nginx answering every request with a fixed completion (the
upstream); nginx as a keep-alive reverse proxy to it (the reference); the FlexInfer proxy as its own process with the
upstream's Route written Ready into the routes KV bucket (embedded NATS, no scheduler).

- P1: ``wrk -t1 -c64 -d5s`` POSTing a small chat completion through each proxy. Goal: proxy/nginx >= 0.5, one
  proxy process against one nginx worker; then the same with 2 proxy workers (``FLEXINFER_PROXY_WORKERS=2``,
  SO_REUSEPORT) against 2 nginx workers.
- P2: added latency vs calling the upstream directly, 64 connections. Reported twice: closed loop (wrk at full
  speed: latency there is mostly waiting behind the other 63 connections, i.e. 64 / throughput) and paced (each
  connection waits ``--pace-ms`` between requests, so the proxy is not saturated and the added time is its own).
  Goal: p50 <= 1 ms, p99 <= 5 ms added.

    python bench/proxy_throughput.py [--duration 5] [--connections 64] [--pace-ms 20] [--workers 2]
"""

from __future__ import annotations

import argparse
import asyncio
import sys

from _common import (
    WrkResult,
    cpu_seconds,
    embedded_nats,
    nginx,
    proxy_process,
    put_route,
    require_tools,
    run_wrk,
    until_every_worker_sees,
    until_model_state,
    verdict,
    warm_up,
    workdir,
    wrk_script,
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument("--pace-ms", type=float, default=20.0)
    parser.add_argument("--workers", type=int, default=2, help="the second P1 comparison (0: skip it)")
    args = parser.parse_args()
    require_tools("nginx", "wrk")

    with (
        workdir() as tmp,
        nginx(tmp, name="upstream") as upstream,
        nginx(tmp, upstream_port=upstream.port, name="reference") as reference,
        embedded_nats(tmp) as nats_url,
        proxy_process(nats_url, tmp) as proxy,
    ):
        upstream_url = f"http://127.0.0.1:{upstream.port}"
        asyncio.run(put_route(nats_url, "m1", endpoint=upstream_url))
        asyncio.run(until_model_state(proxy.url, "m1", ready=True))
        script = wrk_script(tmp)
        paced = wrk_script(tmp, delay_ms=args.pace_ms)
        targets = {
            "direct": upstream_url + "/v1/chat/completions",
            "nginx": f"http://127.0.0.1:{reference.port}/v1/chat/completions",
            "proxy": proxy.url + "/v1/chat/completions",
        }
        for url in targets.values():
            warm_up(url, script)

        # CPU time per request of the process doing the forwarding: less sensitive than req/s to what else runs
        # on the two cores (other processes take CPU time from both, but not the work each request costs).
        forwarders = {"nginx": reference.proc.pid, "proxy": proxy.proc.pid}
        closed: dict[str, WrkResult] = {}
        cpu_us: dict[str, float] = {}
        for name, url in targets.items():
            before = cpu_seconds(forwarders[name]) if name in forwarders else 0.0
            closed[name] = run_wrk(url, script, connections=args.connections, duration=args.duration)
            if name in forwarders:
                cpu_us[name] = (cpu_seconds(forwarders[name]) - before) / max(closed[name].requests, 1) * 1e6
        open_ = {
            name: run_wrk(url, paced, connections=args.connections, duration=args.duration)
            for name, url in targets.items()
        }
        rss, peak = proxy.rss_mb()

        several: dict[str, WrkResult] = {}
        if args.workers > 1:
            with (
                nginx(tmp, upstream_port=upstream.port, name="reference-n", workers=args.workers) as reference_n,
                proxy_process(nats_url, tmp, FLEXINFER_PROXY_WORKERS=str(args.workers)) as proxy_n,
            ):
                until_every_worker_sees(proxy_n.url, "m1")
                pair = {
                    "nginx": f"http://127.0.0.1:{reference_n.port}/v1/chat/completions",
                    "proxy": proxy_n.url + "/v1/chat/completions",
                }
                for url in pair.values():
                    warm_up(url, script)
                several = {
                    name: run_wrk(url, script, connections=args.connections, duration=args.duration)
                    for name, url in pair.items()
                }
                rss_n, _ = proxy_n.rss_mb()

    for name, result in closed.items():
        cpu = f"; {cpu_us[name]:.1f} µs CPU per request" if name in cpu_us else ""
        print(f"  closed loop, {args.connections} connections, {name:>6}: {result.describe()}{cpu}")
    for name, result in open_.items():
        print(f"  paced {args.pace_ms:g} ms/connection,        {name:>6}: {result.describe()}")
    ratio = closed["proxy"].requests_per_second / closed["nginx"].requests_per_second
    print(
        f"P1 proxy/nginx = {ratio:.2f} (proxy {closed['proxy'].requests_per_second:,.0f} req/s, "
        f"nginx {closed['nginx'].requests_per_second:,.0f} req/s) — goal >= 0.5: {verdict(ratio >= 0.5)}"
    )
    if several:
        for name, result in several.items():
            print(f"  closed loop, {args.workers} workers each,   {name:>6}: {result.describe()}")
        ratio_n = several["proxy"].requests_per_second / several["nginx"].requests_per_second
        proxy_rps, nginx_rps = several["proxy"].requests_per_second, several["nginx"].requests_per_second
        print(
            f"P1 with {args.workers} workers: proxy/nginx = {ratio_n:.2f} (proxy {proxy_rps:,.0f} req/s, nginx "
            f"{nginx_rps:,.0f} req/s; proxy RSS {rss_n:.0f} MB in all) — goal >= 0.5: {verdict(ratio_n >= 0.5)}"
        )
    for label, results in (("closed loop", closed), (f"paced {args.pace_ms:g} ms", open_)):
        p50 = results["proxy"].p50_ms - results["direct"].p50_ms
        p99 = results["proxy"].p99_ms - results["direct"].p99_ms
        nginx_p50 = results["nginx"].p50_ms - results["direct"].p50_ms
        nginx_p99 = results["nginx"].p99_ms - results["direct"].p99_ms
        print(
            f"P2 added latency ({label}, {args.connections} conns): p50 +{p50:.2f} ms, p99 +{p99:.2f} ms "
            f"(nginx: +{nginx_p50:.2f} / +{nginx_p99:.2f} ms) — goal <= 1 / <= 5 ms: {verdict(p50 <= 1 and p99 <= 5)}"
        )
    print(f"  proxy RSS {rss:.0f} MB (peak {peak:.0f} MB); 2 cores shared by wrk, the proxy and the upstream")
    bad = sum(r.errors + r.non_2xx for r in (*closed.values(), *open_.values(), *several.values()))
    if bad:
        print(f"  WARNING: {bad} errors or non-2xx answers during the runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
