"""A GPUGroup's ``spec.scheduling`` through the real scheduler, actuator and proxy on NATS and Postgres: a group
that declares ``seed`` runs the seed's exact election beside a group that runs the default ``flexinfer``."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import pytest

from flexinfer_cli.descriptions import describe_group
from flexinfer_common.admin_api import Group
from flexinfer_testbed.system import System, fake_model
from tests.integration.test_scheduler_policies import members
from tests.integration.test_swap import chat
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def declaration(name: str, scheduling: str) -> dict[str, Any]:
    """A GPUGroup without models: it declares the spec of the v1alpha2 group its models name."""
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPUGroup",
        "metadata": {"name": name},
        "spec": {"scheduling": scheduling},
    }


async def put_gpugroup(system: System, body: dict[str, Any]) -> tuple[int, Any]:
    assert system.http is not None
    url = system.url("scheduler") + f"/api/v1/gpugroups/{body['metadata']['name']}"
    async with system.http.put(url, json=body) as resp:
        return resp.status, await resp.json()


async def test_a_group_declared_seed_keeps_its_quiet_holder_while_a_flexinfer_group_yields(
    start_system: SystemStarter,
) -> None:
    # A 2 s demand window and a 1 s quiet period keep the flexinfer yield quick: a holder quiet for 1 s and not asked
    # for 2 s yields to a waiting model, whatever its priority. The seed never lets a lower priority in while the
    # holder is loaded ("Lower-Priority Model Never Activates"), until the holder's idle timeout (5 m here).
    async with start_system(shared_demand_window=2, quiet_yield=1) as system:
        status, body = await put_gpugroup(system, declaration("seedy", "seed"))
        assert status == 201, body
        status, body = await put_gpugroup(system, declaration("seedy", "Seed"))
        assert status == 422 and "spec.scheduling" in body["error"]["message"], body
        for group in ("seedy", "flexy"):
            await system.put_model(fake_model(f"hi-{group}", priority=10, group=group))
            await system.put_model(fake_model(f"lo-{group}", priority=5, group=group))
        for group in ("seedy", "flexy"):
            status, _, _ = await chat(system, f"hi-{group}", "hello")
            assert status == 200

        seed_wait = asyncio.create_task(chat(system, "lo-seedy", "my turn?"))
        try:
            status, _, _ = await asyncio.wait_for(chat(system, "lo-flexy", "my turn?"), timeout=30)
            assert status == 200  # flexinfer: the quiet holder was parked as idle for it

            flexy = await system.get("scheduler", "/api/v1/groups/flexy")
            assert flexy["scheduling"] == "flexinfer" and flexy["activeModel"]["name"] == "lo-flexy"
            seedy = await system.get("scheduler", "/api/v1/groups/seedy")
            assert seedy["scheduling"] == "seed" and seedy["activeModel"]["name"] == "hi-seedy"
            assert seedy["election"] == {"leader": {"namespace": "default", "name": "hi-seedy"}, "reason": "ready"}

            async def lo_seedy_explains_its_wait() -> bool:
                m = await members(system, "seedy")
                message = m["lo-seedy"]["message"] or ""
                return m["lo-seedy"]["requests"]["waiting"] == 1 and "priority 5 < 10" in message

            await wait_for(lo_seedy_explains_its_wait)
            m = await members(system, "seedy")
            assert m["hi-seedy"]["phase"] == "Ready" and m["lo-seedy"]["phase"] != "Ready"
            assert (
                m["lo-seedy"]["message"]
                == "waiting: hi-seedy holds the GPU; priority 5 < 10: waits until hi-seedy is idle"
            )
            assert not seed_wait.done()  # still queued at the proxy, as the seed would keep it

            # what `flexinfer describe group seedy` prints from this answer
            page = describe_group(
                Group.model_validate(await system.get("scheduler", "/api/v1/groups/seedy")),
                swaps=[],
                now=datetime.now(UTC),
            )
            assert "Scheduling:   seed\n" in page
            assert "Election:     default/hi-seedy leads (ready: it is loaded and no waiting model may take" in page
            assert (
                "  default/lo-seedy   waiting: hi-seedy holds the GPU; priority 5 < 10: waits until hi-seedy is idle"
                in page
            )
        finally:
            seed_wait.cancel()
            await asyncio.gather(seed_wait, return_exceptions=True)
