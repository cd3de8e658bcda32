"""GPU leases in the election, failing open on a lease read error, and the v1alpha1 GPUGroup policy — through
the real scheduler and actuator on NATS and Postgres."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest
from sqlalchemy.engine import make_url

from flexinfer_common.bus import Bus
from flexinfer_common.messages import Demand
from flexinfer_common.subjects import demand_subject
from flexinfer_testbed.kube_models import gpu_group
from flexinfer_testbed.system import System, fake_model
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


async def sql(database_url: str, statement: str, *args: Any) -> None:
    url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement, *args)
    finally:
        await conn.close()


async def members(system: System, group: str = "gpu") -> dict[str, dict[str, Any]]:
    body = await system.get("scheduler", f"/api/v1/groups/{group}")
    return {m["name"]: m for m in body["models"]}


async def running(system: System) -> list[str]:
    table = await system.get("actuator", "/api/v1/processes")
    return sorted(p["name"] for p in table["items"] if p["phase"] in {"Loading", "Ready", "Stopping"})


async def demand(bus: Bus, model: str, queued: int) -> None:
    message = Demand(model=model, namespace="default", queued=queued, source="test", time=datetime.now(UTC))
    await bus.publish(demand_subject("default", model), message)


async def test_a_gpu_lease_parks_every_member_and_its_end_re_promotes_serving(
    database_url: str, start_system: SystemStarter
) -> None:
    async with start_system() as system:
        await system.put_model(fake_model("a", priority=10))
        await system.put_model(fake_model("b", priority=5))
        await wait_for(lambda: _phase_is(system, "a", "Ready"))

        now = datetime.now(UTC)
        await sql(
            database_url,
            "INSERT INTO leases (name, namespace, group_name, owner, node, ttl_seconds, acquired_at, expires_at,"
            " renew_time) VALUES ('train-lease', 'default', 'gpu', 'trainer', 'node-1', 600, $1, $2, $1)",
            now,
            now + timedelta(minutes=10),
        )

        async def all_parked() -> bool:
            m = await members(system)
            return all(x["phase"] == "Preempted" and x["preemptedBy"] == "gpu-lease/trainer" for x in m.values())

        await wait_for(all_parked)
        await wait_for(lambda: _nothing_runs(system))
        group = await system.get("scheduler", "/api/v1/groups/gpu")
        assert group["lease"]["owner"] == "trainer" and group["state"] == "Leased" and group["activeModel"] is None

        # a request while leased waits: demand does not beat the lease
        await system.put_model(fake_model("c", priority=100))
        assert await running(system) == []

        await sql(database_url, "DELETE FROM leases WHERE name = 'train-lease'")
        await wait_for(lambda: _phase_is(system, "c", "Ready"))
        assert await running(system) == ["c"]


async def test_a_lease_read_error_fails_open_toward_serving(database_url: str, start_system: SystemStarter) -> None:
    async with start_system() as system:
        await sql(database_url, "ALTER TABLE leases RENAME TO leases_unreadable")
        try:
            await system.put_model(fake_model("a", priority=10))
            await wait_for(lambda: _phase_is(system, "a", "Ready"))
            assert system.http is not None
            async with system.http.get(system.url("scheduler") + "/metrics") as resp:
                text = await resp.text()
            errors = next(line for line in text.splitlines() if line.startswith("flexinfer_lease_read_errors_total "))
            assert float(errors.split()[1]) >= 1
        finally:
            await sql(database_url, "ALTER TABLE leases_unreadable RENAME TO leases")


async def test_v1alpha1_gpugroup_queue_threshold_and_priority(bus: Bus, start_system: SystemStarter) -> None:
    async with start_system() as system:
        group = gpu_group(
            "g1",
            models=[{"name": "a", "priority": 10}, {"name": "b", "priority": 20}],
            policy={"requestQueueThreshold": 3, "minimumRunDurationSeconds": 0, "hysteresisWindowSeconds": 10},
        )
        assert system.http is not None
        # the GPUGroup first, as `flexinfer apply` sends it: a model already running on its own would not be moved
        # into the group while it may hold its GPU (409)
        async with system.http.put(system.url("scheduler") + "/api/v1/gpugroups/g1", json=group) as resp:
            assert resp.status == 201, await resp.text()
        for name in ("a", "b"):
            manifest = fake_model(name)
            del manifest["spec"]["gpu"]  # membership comes from the GPUGroup
            await system.put_model(manifest)

        body = await system.get("scheduler", "/api/v1/groups/g1")
        assert body["policy"] == "v1alpha1" and body["activeModel"] is None  # no demand, no leader

        await demand(bus, "a", 2)  # below the threshold of 3
        await demand(bus, "a", 3)
        await wait_for(lambda: _phase_is(system, "a", "Ready", group="g1"))

        await demand(bus, "b", 1)
        await demand(bus, "b", 2)  # the latest count from this source: 2 < 3, b stays queued
        m = await members(system, "g1")
        assert m["a"]["phase"] == "Ready" and m["b"]["state"] in {"Queued", "Parked"}
        await demand(bus, "b", 3)  # threshold met; b has the higher priority and a has run its minimum (0 s)
        await wait_for(lambda: _phase_is(system, "b", "Ready", group="g1"))
        m = await members(system, "g1")
        assert m["a"]["phase"] == "Preempted" and m["a"]["preemptedBy"] == "b"
        assert await running(system) == ["b"]


async def _phase_is(system: System, name: str, phase: str, group: str = "gpu") -> bool:
    m = await members(system, group)
    return name in m and m[name]["phase"] == phase


async def _nothing_runs(system: System) -> bool:
    return await running(system) == []


async def test_a_gpugroup_that_would_move_a_serving_model_is_refused_until_the_model_is_parked(
    start_system: SystemStarter,
) -> None:
    """Issue 22: a GPUGroup created, changed or deleted through the admin API while a model it would move still
    holds its group's GPU is refused with 409 naming the model and both groups, and nothing changes (the model
    keeps serving in its group); once the model is parked the same call goes through."""
    async with start_system() as system:
        manifest = fake_model("a")
        del manifest["spec"]["gpu"]  # no spec.gpu.shared: a group of its own, or the GPUGroup that lists it
        await system.put_model(manifest)

        async def a_is(phase: str, state: str) -> bool:
            status = (await system.get("scheduler", "/api/v1/models/default/a"))["status"]
            return bool(status["phase"] == phase and status.get("sharedGroup", {}).get("state") == state)

        await wait_for(lambda: a_is("Ready", "Active"))
        group = gpu_group("g1", models=[{"name": "a", "priority": 10}])
        status, body = await system.call("PUT", "scheduler", "/api/v1/gpugroups/g1", group)
        assert status == 409, body
        assert body["error"]["code"] == "conflict" and body["error"]["type"] == "invalid_request_error"
        assert body["error"]["message"] == (
            "GPUGroup 'g1' cannot be created: it would move model default/a from a group of its own to group 'g1' "
            "while it may still hold the GPU of a group of its own. Park it first (or wait until parked), then try "
            "again"
        )
        assert (await system.call("GET", "scheduler", "/api/v1/groups/g1"))[0] == 404  # nothing changed
        assert await a_is("Ready", "Active") and await running(system) == ["a"]

        status, _ = await system.call("POST", "scheduler", "/ui/api/models/default/a/park")  # the status page's Park
        assert status == 200
        await wait_for(lambda: _nothing_runs(system))
        # Idle once the scheduler recorded the actuator's confirmation (Draining until then): the process gone from
        # the actuator's table is not yet that (its Parked report is still on its way to the scheduler)
        await wait_for(lambda: a_is("Idle", "Parked"))
        status, body = await system.call("PUT", "scheduler", "/api/v1/gpugroups/g1", group)
        assert status == 201, body
        assert (await members(system, "g1"))["a"]["priority"] == 10

        # serving in g1: its deletion would move it back to a group of its own
        assert (await system.call("POST", "scheduler", "/api/v1/models/default/a/promote"))[0] == 200
        await wait_for(lambda: _phase_is(system, "a", "Ready", group="g1"))
        status, body = await system.call("DELETE", "scheduler", "/api/v1/gpugroups/g1")
        assert status == 409, body
        assert body["error"]["message"].startswith(
            "GPUGroup 'g1' cannot be deleted: it would move model default/a from group 'g1' to a group of its own "
            "while it may still hold the GPU of group 'g1'."
        )
        g1 = await system.get("scheduler", "/api/v1/groups/g1")
        assert g1["activeModel"] == {"namespace": "default", "name": "a"} and g1["models"][0]["state"] == "Active"
        assert await running(system) == ["a"]

        assert (await system.call("POST", "scheduler", "/ui/api/models/default/a/park"))[0] == 200
        await wait_for(lambda: _nothing_runs(system))
        await wait_for(lambda: _phase_is(system, "a", "Idle", group="g1"))
        assert (await system.call("DELETE", "scheduler", "/api/v1/gpugroups/g1"))[0] == 204

        async def g1_gone() -> bool:  # the group's view goes with the scheduler's next pass
            return (await system.call("GET", "scheduler", "/api/v1/groups/g1"))[0] == 404

        await wait_for(g1_gone, what="group g1 gone after its GPUGroup was deleted")
