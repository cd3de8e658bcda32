"""P4 — demand message to scale command, event-driven (goal: p99 <= 50 ms).

A real scheduler process on embedded PostgreSQL and NATS; this script plays the actuator (it answers every
command at once) and, for each of N groups, publishes a demand for the idle member and times how long until the
scheduler's command to park the incumbent arrives. Run at two sizes, side by side: a small installation and
10,000 models (the periodic full reconcile then takes a large share of the loop, which shows in the tail).
Usage: python bench/scheduler_demand_latency.py [--samples 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

import aiohttp
import nats
from _common import add_models

from flexinfer_cli.embedded import EmbeddedNats, EmbeddedPostgres, free_port
from flexinfer_common.db import create_engine, ensure_database_exists, session_factory, upgrade_database
from flexinfer_common.messages import Demand, RuntimeStatus
from flexinfer_common.subjects import demand_subject, runtime_status_subject


def manifest(name: str, group: str, priority: int) -> dict[str, object]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"gpu": {"shared": group, "priority": priority}, "local": {"command": ["serve", "{port}"]}},
    }


async def seed(url: str, groups: int, per_group: int) -> None:
    await ensure_database_exists(url)
    await upgrade_database(url)
    engine = create_engine(url)
    # member 0 outranks the others: it is its group's fallback, loaded unasked (peers of one priority load nothing
    # until a first request), and the incumbent each sample's demand for member 1 parks (it yields at once: nobody
    # ever asked for it)
    models = [(f"m{g}-{i}", f"g{g}", 20 if i == 0 else 10) for g in range(groups) for i in range(per_group)]
    await add_models(session_factory(engine), ((n, g, p, manifest(n, g, p)) for n, g, p in models))
    await engine.dispose()


async def measure(nats_url: str, groups: int, samples: int, scheduler_url: str) -> list[float]:
    nc = await nats.connect(nats_url)
    js = nc.jetstream()
    parks: dict[str, asyncio.Future[float]] = {}

    async def actuator(msg: nats.aio.msg.Msg) -> None:  # answers at once, like a very fast actuator
        command = json.loads(msg.data)
        key = command["model"]
        if command["action"] == "park" and key in parks and not parks[key].done():
            parks[key].set_result(time.perf_counter())
        phase = "Ready" if command["action"] == "activate" else "Parked"
        status = RuntimeStatus(
            namespace="default",
            model=key,
            phase=phase,
            generation=command["generation"],
            endpoint="http://127.0.0.1:1",
            time=datetime.now(UTC),
        )
        await js.publish(runtime_status_subject("default", key), status.to_bytes())

    answering = await nc.subscribe("flexinfer.actuator.command.>", cb=actuator)
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # every group elected and serving its fallback leader (member 0)
            try:
                async with http.get(scheduler_url + "/api/v1/groups") as resp:
                    items = (await resp.json())["items"]
            except aiohttp.ClientError:
                await asyncio.sleep(0.2)
                continue
            if len(items) == groups and all(g["state"] == "Serving" for g in items):
                break
            await asyncio.sleep(0.5)
        else:
            raise RuntimeError("groups never all served")
    latencies = []
    for i in range(min(samples, groups)):
        target, incumbent = f"m{i}-1", f"m{i}-0"
        parks[incumbent] = asyncio.get_running_loop().create_future()
        start = time.perf_counter()
        demand = Demand(model=target, namespace="default", queued=1, source="bench", time=datetime.now(UTC))
        await js.publish(demand_subject("default", target), demand.to_bytes())
        latencies.append((await asyncio.wait_for(parks[incumbent], 10)) - start)
        await asyncio.sleep(0.01)
    # The actuator's last answers finish publishing (their acks come back) before the connection drains: a drain
    # of the whole connection stops the inbox the acks come to, and an answer in flight then timed out.
    await answering.drain()
    await nc.drain()
    return latencies


def run(groups: int, per_group: int, samples: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        nats_server = EmbeddedNats(Path(tmp) / "nats")
        pg = EmbeddedPostgres(Path(tmp) / "pg", durable=False)
        nats_url = nats_server.start()
        url = pg.start().rsplit("/", 1)[0] + "/bench"
        port = free_port()
        try:
            asyncio.run(seed(url, groups, per_group))
            env = {
                **os.environ,
                "FLEXINFER_DATABASE_URL": url,
                "FLEXINFER_NATS_URL": nats_url,
                "FLEXINFER_SCHEDULER_PORT": str(port),
                "FLEXINFER_BIND_HOST": "127.0.0.1",
                "FLEXINFER_LOG_LEVEL": "WARNING",
            }
            scheduler = subprocess.Popen([sys.executable, "-m", "flexinfer_scheduler"], env=env)
            try:
                latencies = asyncio.run(measure(nats_url, groups, samples, f"http://127.0.0.1:{port}"))
            finally:
                scheduler.terminate()
                scheduler.wait(timeout=30)
        finally:
            pg.stop()
            nats_server.stop()
    latencies.sort()
    p50 = statistics.median(latencies) * 1000
    p99 = latencies[max(0, int(len(latencies) * 0.99) - 1)] * 1000
    return p50, p99, max(latencies) * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--samples", type=int, default=200)
    args = parser.parse_args()
    print("P4 demand message -> scale command, event-driven (goal p99 <= 50 ms)")
    for groups, per_group in ((args.samples, 2), (1000, 10)):
        p50, p99, worst = run(groups, per_group, args.samples)
        print(
            f"  {groups * per_group:>6,} models in {groups:>5,} groups: p50 {p50:6.1f} ms  p99 {p99:6.1f} ms  "
            f"max {worst:6.1f} ms  (p99 = {p99 / 50:.2f} of goal)"
        )


if __name__ == "__main__":
    main()
