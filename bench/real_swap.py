"""P9: the client-seen swap to a real llama.cpp server against that server's own cold start alone, side by side.

overhead = time to the first response of a request for a parked model
           - the llama.cpp server's own spawn to the end of its first completion (ready, then at once the same
             one-token request), measured alone

The engine is llama-cpp-python's OpenAI server on SmolLM2-135M-Instruct (a 98 MB GGUF), installed by
scripts/install_real_servers.py (built once per machine, cached in ~/.cache/flexinfer). Two Models on the same
weights, a and b, time-share one group; each request alternates to the parked one, after the other was idle for the
demand window, so every request swaps. The server has no /health: ready is the first 200 of /v1/models, which it
answers only once the weights are loaded (probed every 2 ms when alone; the actuator probes every 50 ms, its shipped
default). Rounds alternate "cold start alone" and "swap", so both see the same machine. Goal: overhead <= 0.1 s, as
P3's for the fake server.

    python bench/real_swap.py [--swaps 6]
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.swap_overhead import bench_servers, local_system, swap_options, until_answering  # noqa: E402
from flexinfer_cli.embedded import free_port  # noqa: E402
from flexinfer_testbed.real_servers import READINESS_PATH, engine_command, install_real_servers, llama_model  # noqa: E402
from flexinfer_testbed.system import System  # noqa: E402

GOAL = 0.1
PROMPT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1, "temperature": 0}


async def cold_start_alone(http: aiohttp.ClientSession, argv: list[str]) -> tuple[float, float]:
    """One llama.cpp server alone: spawn to the first 200 of /v1/models (probed every 2 ms), and spawn to the end of
    its first one-token chat completion, sent at once."""
    port = free_port()
    started = time.perf_counter()
    process = await asyncio.create_subprocess_exec(
        *[a.replace("{port}", str(port)) for a in argv],
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await until_answering(http, f"http://127.0.0.1:{port}{READINESS_PATH}", process)
        ready = time.perf_counter() - started
        # The first completion of a fresh server is not a warm one (its first pass over the weights): the client of a
        # swap waits for exactly this one, so the baseline is spawn to the first completion's last byte.
        async with http.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"model": "m", **PROMPT}) as r:
            await r.read()
            assert r.status == 200, await r.text()
        return ready, time.perf_counter() - started
    finally:
        process.terminate()
        await process.wait()


async def timed_chat(system: System, model: str) -> tuple[float, bool]:
    assert system.http is not None
    started = time.perf_counter()
    async with system.http.post(system.url("proxy") + "/v1/chat/completions", json={"model": model, **PROMPT}) as r:
        await r.read()
        assert r.status == 200, await r.text()
        cold = r.headers.get("X-FlexInfer-Cold-Start") == "true"
    return time.perf_counter() - started, cold


async def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.ERROR)
    servers_ = install_real_servers()
    print(f"== P9 swap to a real llama.cpp server ({args.swaps} swaps; engine found in {servers_.seconds:.1f} s)")
    demand_window = 1.0
    # the engine lives in this user's cache (swap_options runs the model servers as this user)
    options = swap_options(demand_window, local_commands=(str(servers_.server),))
    alone_argv = engine_command(servers_, "m")
    colds, alones, firsts, phases, totals = [], [], [], [], []
    with bench_servers() as (work, test_servers):
        async with (
            local_system(test_servers, work / "local", **options) as system,
            aiohttp.ClientSession() as http,
        ):
            assert system.http is not None
            for name in ("a", "b"):
                await system.put_model(llama_model(servers_, name, group="bench-cpu", priority=10))
            await timed_chat(system, "a")  # a holds the group
            for index in range(args.swaps):
                cold, alone = await cold_start_alone(http, alone_argv)
                colds.append(cold)
                alones.append(alone)
                await asyncio.sleep(demand_window + 0.3)  # a is idle (demand window, quiet period): b may take over
                model = "b" if index % 2 == 0 else "a"
                took, was_cold = await timed_chat(system, model)
                assert was_cold, "the request did not swap"
                firsts.append(took)
                listed = (await system.get("scheduler", "/api/v1/swaps"))["items"]
                phases.append(listed[0]["phases"])
                totals.append(_seconds(listed[0]["finishedAt"]) - _seconds(listed[0]["startedAt"]))

    overheads = [first - alone for first, alone in zip(firsts, alones, strict=True)]
    median = statistics.median(overheads)
    print(
        f"llama.cpp server alone: spawn-to-ready p50 {statistics.median(colds) * 1000:.0f} ms "
        f"({min(colds) * 1000:.0f}-{max(colds) * 1000:.0f}), spawn to its first one-token completion p50 "
        f"{statistics.median(alones) * 1000:.0f} ms ({min(alones) * 1000:.0f}-{max(alones) * 1000:.0f})"
    )
    print(
        f"client-seen swap p50 {statistics.median(firsts) * 1000:.0f} ms "
        f"({min(firsts) * 1000:.0f}-{max(firsts) * 1000:.0f}); overhead p50 {median * 1000:.0f} ms "
        f"(min {min(overheads) * 1000:.0f}, max {max(overheads) * 1000:.0f}); goal {GOAL * 1000:.0f} ms: "
        f"{'met' if median <= GOAL else 'NOT met'}"
    )
    spent = {k: statistics.median(p.get(k, 0.0) for p in phases) for k in ("draining", "parking", "loading")}
    print(
        f"swap (the scheduler's start to finish) p50 {statistics.median(totals) * 1000:.0f} ms; phases p50 "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in spent.items())
    )
    # Per swap, without the run-to-run spread of the engine's load: what the client waited beyond the actuator's
    # spawn-to-ready of that very server (its 50 ms probe included) and the first completion alone.
    first_completion = [a - c for a, c in zip(alones, colds, strict=True)]
    beyond = [f - p.get("loading", 0.0) - i for f, p, i in zip(firsts, phases, first_completion, strict=True)]
    print(
        f"client-seen minus that swap's own loading phase and a first completion: p50 "
        f"{statistics.median(beyond) * 1000:.0f}"
        f" ms (min {min(beyond) * 1000:.0f}, max {max(beyond) * 1000:.0f}); of it parking the incumbent p50 "
        f"{spent['parking'] * 1000:.0f} ms"
    )
    return 0  # a benchmark reports; it does not fail the build


def _seconds(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--swaps", type=int, default=8)
    raise SystemExit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()
