"""P5 — one full election pass over 10,000 models in 1,000 groups (goal: <= 1 s on 2 cores, <= 300 MB).

Measured side by side in one run:
  pure      plan_group over every group (the decision alone, no I/O)
  first     Scheduler.election_pass on Postgres + NATS when every group must elect (1,000 activations issued)
  quiet     the same pass when nothing changed (the steady state every reconcile period)
  changed   a pass after 1,000 demand updates (one per group) and the actuator's answers
With ``--capacity`` every group declares a card (``spec.capacity``: 1 x 24 GiB) and every model its memory (4 GiB,
so five of the ten fit at once): the resident-set planner runs instead of the one-model election, and the first
pass loads five models per group (issue 23: <= 1 s).
Starts its own embedded PostgreSQL and NATS in a temporary folder.
Usage: python bench/scheduler_election.py [--groups N] [--capacity]
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import statistics
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from _common import add_models

from flexinfer_cli.embedded import EmbeddedNats, EmbeddedPostgres
from flexinfer_common.bus import Bus
from flexinfer_common.clock import SystemClock
from flexinfer_common.db import ModelRow, create_engine, ensure_database_exists, session_factory, upgrade_database
from flexinfer_common.enums import ScaleAction
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GPUGroup
from flexinfer_common.runner import tune_gc
from flexinfer_scheduler.adapters.bus import AdvisoryLock, NatsSchedulerBus
from flexinfer_scheduler.adapters.store import Store
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import Capacity, GroupSnapshot, Member
from flexinfer_scheduler.domain.plan import plan_group
from flexinfer_scheduler.loop import Scheduler
from flexinfer_scheduler.ports import DemandReport
from flexinfer_scheduler.settings import SchedulerSettings

PER_GROUP = 10
GIB = 1024**3
CARD = Capacity(devices=1, memory_per_device=24 * GIB)  # --capacity: each group's card
MODEL_MEMORY = 4 * GIB  # --capacity: each model's (five of a group's ten fit)


def rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def manifest(name: str, group: str, priority: int, *, capacity: bool) -> dict[str, object]:
    gpu: dict[str, object] = {"shared": group, "priority": priority}
    if capacity:
        gpu["memory"] = "4Gi"
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"gpu": gpu, "local": {"command": ["serve", "{port}"]}},
    }


def card(group: str) -> GPUGroup:
    return GPUGroup.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha1",
            "kind": "GPUGroup",
            "metadata": {"name": group},
            "spec": {"capacity": {"devices": CARD.devices, "memoryPerDevice": "24Gi"}},
        }
    )


def priority(i: int) -> int:
    """Member ``i``'s priority: three levels, and member 0 of each group alone at the top, so that the first
    election loads one model per group (peers of the highest priority would load nothing until asked)."""
    return 3 if i == 0 else i % 3


def pure(groups: int, *, capacity: bool) -> float:
    now = datetime.now(UTC)
    snapshots = [
        GroupSnapshot(
            name=f"g{g}",
            members=tuple(
                Member(
                    ModelKey("default", f"m{g}-{i}"),
                    priority=priority(i),
                    last_active_time=now - timedelta(seconds=i * 20),
                    desired_action=ScaleAction.ACTIVATE if i == 0 else None,
                    runtime="Ready" if i == 0 else None,
                    command_generation=1 if i == 0 else 0,
                    runtime_generation=1 if i == 0 else 0,
                    memory=MODEL_MEMORY if capacity else None,
                    placement=(0,) if capacity and i == 0 else None,
                )
                for i in range(PER_GROUP)
            ),
            active=ModelKey("default", f"m{g}-0"),
            capacity=CARD if capacity else None,
        )
        for g in range(groups)
    ]
    params = ElectionParams()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        for snapshot in snapshots:
            plan_group(snapshot, now, params, command_retry=timedelta(seconds=10), new_swap_id="x")
        times.append(time.perf_counter() - start)
    return statistics.median(times)


async def full(groups: int, tmp: Path, *, capacity: bool) -> dict[str, float]:
    nats = EmbeddedNats(tmp / "nats")
    pg = EmbeddedPostgres(tmp / "pg", durable=False)
    nats_url, admin = nats.start(), pg.start()
    url = admin.rsplit("/", 1)[0] + "/bench"
    try:
        await ensure_database_exists(url)
        await upgrade_database(url)
        engine = create_engine(url)
        sessions = session_factory(engine)
        now = datetime.now(UTC)
        members = [(f"m{g}-{i}", f"g{g}", priority(i)) for g in range(groups) for i in range(PER_GROUP)]
        await add_models(
            sessions, ((name, group, p, manifest(name, group, p, capacity=capacity)) for name, group, p in members)
        )
        bus = Bus(nats_url, name="bench")
        await bus.connect()
        await bus.ensure_streams()
        settings = SchedulerSettings(database_url=url, nats_url=nats_url)
        tune_gc()  # what the scheduler service does once it has started (flexinfer_scheduler.main)
        store = Store(sessions)
        if capacity:
            for g in range(groups):
                await store.put_gpugroup(card(f"g{g}"), now)
        scheduler = Scheduler(
            store=store,
            bus=NatsSchedulerBus(bus),
            lock=AdvisoryLock(url, settings.leader_lock_id),
            settings=settings,
            clock=SystemClock(),
        )
        out: dict[str, float] = {}
        start = time.perf_counter()
        result = await scheduler.election_pass()
        out["first"] = time.perf_counter() - start
        out["first_commands"] = sum(len(p.commands) for p in result.plans)
        quiet = []
        for _ in range(3):
            start = time.perf_counter()
            await scheduler.election_pass()
            quiet.append(time.perf_counter() - start)
        out["quiet"] = statistics.median(quiet)
        # every group: its leader reports Ready, and a request names another member
        async with sessions.begin() as session:
            for g in range(groups):
                await session.execute(
                    ModelRow.__table__.update()
                    .where(ModelRow.group_name == f"g{g}", ModelRow.desired_action == "activate")
                    .values(runtime_phase="Ready", runtime_generation=ModelRow.command_generation)
                )
        for g in range(groups):
            await store.record_demand(
                DemandReport(
                    namespace="default",
                    name=f"m{g}-5",
                    source="bench",
                    queued=1,
                    when=datetime.now(UTC),
                    message_id=f"bench-{g}",
                )
            )
        start = time.perf_counter()
        await scheduler.election_pass()
        out["changed"] = time.perf_counter() - start
        await bus.close()
        await engine.dispose()
        return out
    finally:
        pg.stop()
        nats.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--capacity", action="store_true", help="groups with a card of 24 GiB, models of 4 GiB")
    args = parser.parse_args()
    models = args.groups * PER_GROUP
    pure_s = pure(args.groups, capacity=args.capacity)
    with tempfile.TemporaryDirectory() as tmp:
        figures = asyncio.run(full(args.groups, Path(tmp), capacity=args.capacity))
    shape = ", each with a 24 GiB card and 4 GiB models (resident sets)" if args.capacity else ""
    print(f"P5 election pass over {models:,} models in {args.groups:,} groups{shape} (goal <= 1.0 s, <= 300 MB)")
    print(f"  pure decision (plan_group only)        {pure_s * 1000:8.1f} ms")
    print(
        f"  full pass, first election             {figures['first'] * 1000:8.1f} ms  "
        f"({int(figures['first_commands']):,} commands issued)"
    )
    print(
        f"  full pass, quiet (nothing changed)    {figures['quiet'] * 1000:8.1f} ms  = {figures['quiet']:.2f} of goal"
    )
    print(
        f"  full pass, after 1 demand per group   {figures['changed'] * 1000:8.1f} ms"
        f"  = {figures['changed']:.2f} of goal"
    )
    print(f"  peak RSS                              {rss_mb():8.1f} MB  = {rss_mb() / 300:.2f} of goal")


if __name__ == "__main__":
    main()
