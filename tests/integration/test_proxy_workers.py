"""``FLEXINFER_PROXY_WORKERS=2``: two worker processes on one port, each its own demand source, metrics summed over
both, and a graceful stop of all of them on SIGTERM. Runs the real ``python -m flexinfer_proxy``."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_cli.embedded import free_port
from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.messages import Demand
from flexinfer_testbed.routes import make_route, write_route
from flexinfer_testbed.system import service_environment
from tests.support.proxy import fake_model_server
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]


def children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


@pytest.fixture
def workers(clean_nats: str, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    port = free_port()
    env = service_environment(
        nats_url=clean_nats, proxy_port=str(port), proxy_workers="2", instance_id="proxy-pair", queue_timeout="20s"
    )
    log = (tmp_path / "proxy.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "flexinfer_proxy"], env=env, stdout=log, stderr=log)
    try:
        yield proc, f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


async def test_two_workers_share_the_port_and_each_signals_its_own_demand(
    workers: tuple[subprocess.Popen[bytes], str], bus: Bus
) -> None:
    proc, base = workers
    demands: list[Demand] = []

    async def on_demand(msg: Any) -> None:
        demands.append(Demand.model_validate_json(msg.data))

    await bus.nc.subscribe(subjects.DEMAND_PREFIX + ".>", cb=on_demand)
    await write_route(bus, make_route("m1"))

    async def ready() -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(base + "/readyz") as resp:
                return resp.status == 200 and len(children(proc.pid)) == 2
        except aiohttp.ClientError:
            return False

    await wait_for(ready)
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    sessions: list[aiohttp.ClientSession] = []
    waiting: list[asyncio.Task[aiohttp.ClientResponse]] = []
    try:
        # One connection per request: the kernel spreads new connections over the workers (once both listen).
        while {d.source for d in demands if d.queued > 0} != {"proxy-pair-w0", "proxy-pair-w1"}:
            assert len(sessions) < 200, f"demand came only from {sorted({d.source for d in demands})}"
            sessions.append(session := aiohttp.ClientSession())
            waiting.append(asyncio.create_task(session.post(base + "/v1/chat/completions", json=body)))
            await asyncio.sleep(0.05)
        async with fake_model_server() as model:
            await write_route(bus, make_route("m1", endpoint=model))
            for resp in await asyncio.gather(*waiting):
                assert resp.status == 200
                assert resp.headers["X-FlexInfer-Cold-Start"] == "true"
                resp.release()
            expected = f'flexinfer_proxy_requests_total{{code="200",model="m1",namespace="default"}} {len(waiting)}.0'

            async def counted_over_both() -> bool:
                async with aiohttp.ClientSession() as http, http.get(base + "/metrics") as resp:
                    return expected in await resp.text()

            await wait_for(counted_over_both, within=10)
    finally:
        for session in sessions:
            await session.close()

    pids = children(proc.pid)
    proc.send_signal(signal.SIGTERM)
    assert await asyncio.to_thread(proc.wait, 30) == 0
    alive = await asyncio.to_thread(lambda: [pid for pid in pids if Path(f"/proc/{pid}").exists()])
    assert alive == [], "every worker stopped"
