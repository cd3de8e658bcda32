"""The real ``python -m flexinfer_actuator`` process: hello, ops endpoints, the process table, and what happens to
its model processes when it is stopped (SIGTERM) or killed (SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.enums import RuntimePhase, ScaleAction
from flexinfer_common.messages import ActuatorHello
from flexinfer_common.tcp import free_port
from tests.integration import test_actuator_local as local
from tests.integration.test_actuator_local import StatusLog, send
from tests.support.processes import alive
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

statuses = local.statuses  # the fixture: every RuntimeStatus published

INSTANCE = "actuator-under-test"
TOKEN = "t0ken"


@dataclass
class RunningActuator:
    process: asyncio.subprocess.Process
    base_url: str
    log_path: Path
    hellos: list[ActuatorHello]

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]


@pytest.fixture
async def actuator(bus: Bus, tmp_path: Path) -> AsyncIterator[RunningActuator]:
    hellos: list[ActuatorHello] = []

    async def on_hello(msg: Any) -> None:
        hellos.append(ActuatorHello.model_validate_json(msg.data))

    hello_sub = await bus.nc.subscribe(subjects.ACTUATOR_HELLO_PREFIX + ".>", cb=on_hello)
    port = free_port()
    env = {
        **os.environ,
        "FLEXINFER_NATS_URL": bus.url,
        "FLEXINFER_ACTUATOR_PORT": str(port),
        "FLEXINFER_BIND_HOST": "127.0.0.1",
        "FLEXINFER_STATE_DIR": str(tmp_path / "state"),
        "FLEXINFER_READINESS_PROBE_INTERVAL": "50ms",
        "FLEXINFER_PARK_GRACE_PERIOD": "1s",
        "FLEXINFER_INSTANCE_ID": INSTANCE,
        "FLEXINFER_ADMIN_TOKEN": TOKEN,
        "FLEXINFER_LOCAL_COMMANDS": sys.executable,  # the fake model runs on this Python
    }
    log_path = tmp_path / "actuator.log"
    with log_path.open("wb") as log_file:
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "flexinfer_actuator", env=env, stdout=log_file, stderr=log_file
        )
    running = RunningActuator(process, f"http://127.0.0.1:{port}", log_path, hellos)
    try:
        await wait_for(
            lambda: bool(hellos) or process.returncode is not None, within=60, what="actuator hello"
        )  # a process start: imports, bus
        assert hellos, f"actuator exited with {process.returncode}:\n{running.log()}"
        yield running
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await hello_sub.unsubscribe()


async def http_get(url: str, *, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, headers=headers, timeout=aiohttp.ClientTimeout(total=5)) as response,
    ):
        return response.status, await response.json()


async def activate_one(bus: Bus, statuses: StatusLog, actuator: RunningActuator, model: str) -> int:
    """Activate ``model``; check the process table lists it; return its pid."""
    await send(bus, model, ScaleAction.ACTIVATE, 1)
    ready = await statuses.wait_for(model, RuntimePhase.READY, generation=1, within=10)
    assert ready.pid is not None and ready.actuator == INSTANCE
    status, table = await http_get(actuator.base_url + "/api/v1/processes", token=TOKEN)
    assert status == 200
    [row] = table["items"]
    assert (row["name"], row["pid"], row["phase"], row["endpoint"]) == (model, ready.pid, "Ready", ready.endpoint)
    return ready.pid


async def test_the_service_says_hello_and_serves_its_ops_endpoints(actuator: RunningActuator) -> None:
    assert [(h.actuator, h.backend) for h in actuator.hellos] == [(INSTANCE, "local")]
    assert (await http_get(actuator.base_url + "/healthz"))[0] == 200
    status, body = await http_get(actuator.base_url + "/readyz")
    assert (status, body["checks"]) == (200, {"bus": True, "consumer": True})
    assert (await http_get(actuator.base_url + "/api/v1/processes"))[0] == 401  # the admin token is set
    assert await http_get(actuator.base_url + "/api/v1/processes", token=TOKEN) == (200, {"items": []})


async def test_sigkilled_actuator_takes_its_model_processes_down(
    bus: Bus, statuses: StatusLog, actuator: RunningActuator
) -> None:
    model_pid = await activate_one(bus, statuses, actuator, "oscar")

    actuator.process.send_signal(signal.SIGKILL)
    await actuator.process.wait()

    await wait_for(lambda: not alive(model_pid), within=5, what="the model process to die with its actuator")


async def test_sigterm_stops_every_model_process_and_exits_zero(
    bus: Bus, statuses: StatusLog, actuator: RunningActuator
) -> None:
    model_pid = await activate_one(bus, statuses, actuator, "papa")

    actuator.process.send_signal(signal.SIGTERM)
    returncode = await asyncio.wait_for(actuator.process.wait(), timeout=10)

    assert returncode == 0, actuator.log()
    assert not alive(model_pid)
    parked = await statuses.wait_for("papa", RuntimePhase.PARKED, within=2)
    assert parked.message == "actuator stopped"
