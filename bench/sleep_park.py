"""P7: a swap whose models park by sleeping (vLLM sleep mode: the server stays, its weights leave the GPU) against the
same swap when they park by stopping (scale to zero), on the same fake backend, local mode and emulated Kubernetes
mode, side by side in one run.

    ratio = time to first response of a request for the parked model, parkStrategy Sleep
            / the same with parkStrategy ScaleToZero                                      (goal <= 0.1)

The fake model server takes --startup-delay to "load its weights" (2 s, as in the demo) and --wake-delay to wake
(0.2 s, its default); a woken server answers at once (POST /wake_up's answer is the readiness signal). Services run
in this process with their shipped default settings.

    python bench/sleep_park.py [--swaps 5] [--startup-delay 2]
"""

from __future__ import annotations

import argparse
import asyncio
import getpass
import logging
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from swap_overhead import bench_servers, database, reset_streams, shipped_timings, timed_chat  # noqa: E402

from flexinfer_testbed.kube import NodeConfig, running_cluster  # noqa: E402
from flexinfer_testbed.kube_models import create, model_deployment, model_resource  # noqa: E402
from flexinfer_testbed.system import System, fake_model, running_system  # noqa: E402

GOAL = 0.1
DEMAND_WINDOW = 1.0


async def alternate(system: System, swaps: int) -> list[float]:
    """a, b, a, b ...: each request is for the parked model; the first two load both (not measured)."""
    await timed_chat(system, "a")
    await asyncio.sleep(DEMAND_WINDOW + 0.3)
    await timed_chat(system, "b")
    times = []
    for index in range(swaps):
        await asyncio.sleep(DEMAND_WINDOW + 0.3)
        times.append(await timed_chat(system, "a" if index % 2 == 0 else "b"))
    return times


async def local(url: str, nats_url: str, work: Path, strategy: str, args: argparse.Namespace) -> list[float]:
    # the fake model servers run as this user: nobody, the default FLEXINFER_LOCAL_RUN_AS, may not reach this
    # checkout's .venv (as in swap_overhead.swap_options)
    options = {**shipped_timings(), "shared_demand_window": DEMAND_WINDOW, "local_run_as": getpass.getuser()}
    async with running_system(database_url=url, nats_url=nats_url, state_dir=work, **options) as system:
        for name in ("a", "b"):
            model = fake_model(name, priority=10, startup_delay=args.startup_delay)
            model["spec"]["gpu"].update(swapCooldown="0s", parkStrategy=strategy)
            await system.put_model(model)
        return await alternate(system, args.swaps)


async def kubernetes(url: str, nats_url: str, work: Path, strategy: str, args: argparse.Namespace) -> list[float]:
    options: dict[str, Any] = {**shipped_timings(), "shared_demand_window": DEMAND_WINDOW}
    # A sleeping model keeps its Pod and its GPU request: the node shares its GPU (device plugin time-slicing).
    async with running_cluster(work / "kube", node=NodeConfig(capacity={"nvidia.com/gpu": 2})) as kube:
        for name in ("a", "b"):
            await create(kube, model_deployment(name, startup_delay=args.startup_delay))
            resource = model_resource(name, priority=10)
            resource["spec"]["gpu"].update(swapCooldown="0s", parkStrategy=strategy)
            await create(kube, resource)
        async with running_system(
            database_url=url, nats_url=nats_url, state_dir=work, kubeconfig=kube.kubeconfig, **options
        ) as system:
            for _ in range(200):
                if len((await system.get("scheduler", "/api/v1/models"))["items"]) == 2:
                    break
                await asyncio.sleep(0.05)
            return await alternate(system, args.swaps)


async def run(args: argparse.Namespace) -> None:
    logging.basicConfig(level=logging.ERROR)
    print(f"== P7 sleep-park swap / scale-to-zero swap ({args.swaps} swaps each; startup delay {args.startup_delay}s)")
    results: dict[tuple[str, str], list[float]] = {}
    with bench_servers() as (work, servers):
        for mode, runner in (("local", local), ("kubernetes", kubernetes)):
            for strategy in ("ScaleToZero", "Sleep"):
                async with database(servers) as url:
                    results[(mode, strategy)] = await runner(
                        url, servers.nats_url, work / f"{mode}-{strategy}", strategy, args
                    )
                await reset_streams(servers.nats_url)
    print(f"{'mode':<12}{'scale-to-zero p50':>20}{'sleep p50':>12}{'ratio':>8}{'goal':>7}")
    for mode in ("local", "kubernetes"):
        stop = statistics.median(results[(mode, "ScaleToZero")])
        sleep = statistics.median(results[(mode, "Sleep")])
        ratio = sleep / stop
        verdict = "met" if ratio <= GOAL else "NOT met"
        print(f"{mode:<12}{stop * 1000:>17.0f} ms{sleep * 1000:>9.0f} ms{ratio:>8.3f}{GOAL:>7}  {verdict}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--swaps", type=int, default=5)
    parser.add_argument("--startup-delay", type=float, default=2.0)
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
