"""The actuator's consumer with the local back-end, against real NATS and real model processes.

Each test drives the actuator the way the scheduler does (ScaleCommand on ``flexinfer.actuator.command.<ns>.<model>``)
and reads what it reports (RuntimeStatus on ``flexinfer.actuator.status.>``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import textwrap
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_actuator.adapters.local import LocalProcessScaler
from flexinfer_actuator.domain.processes import ProcessPhase
from flexinfer_actuator.loop import Actuator, StatusPublisher
from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.clock import SystemClock, utcnow
from flexinfer_common.enums import ParkStrategy, RuntimePhase, ScaleAction
from flexinfer_common.messages import ActuatorHello, RuntimeSpec, RuntimeStatus, ScaleCommand

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

NAMESPACE = "default"
PROBE_INTERVAL = timedelta(milliseconds=50)

# A tiny model server: answers 200 to any GET, and ignores SIGTERM when asked to (argv: port, "ignore-term"?).
TINY_SERVER = textwrap.dedent(
    """
    import http.server, signal, sys
    if len(sys.argv) > 2 and sys.argv[2] == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")
        def log_message(self, *args):
            pass
    print("tiny server up", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)


def fake_model(name: str, *extra: str, startup_delay: float = 0.0) -> list[str]:
    """The argv of the fake OpenAI-compatible model server (tools/fake-model)."""
    return [
        sys.executable,
        "-m",
        "flexinfer_fake_model.server",
        "--port",
        "{port}",
        "--model",
        name,
        "--startup-delay",
        str(startup_delay),
        "--wake-delay",
        "0.1",
        *extra,
    ]


def tiny_server(*, ignore_sigterm: bool = False) -> list[str]:
    return [sys.executable, "-c", TINY_SERVER, "{port}", *(["ignore-term"] if ignore_sigterm else [])]


def process_alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie nobody reaped yet counts as dead)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


async def wait_until(predicate: Callable[[], bool], *, within: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {within}s waiting for {what}")
        await asyncio.sleep(0.02)


class StatusLog:
    """Every RuntimeStatus published, in arrival order."""

    def __init__(self) -> None:
        self.items: list[RuntimeStatus] = []

    async def on_message(self, msg: Any) -> None:
        self.items.append(RuntimeStatus.model_validate_json(msg.data))

    def of(self, model: str) -> list[RuntimeStatus]:
        return [s for s in self.items if s.model == model]

    def sequence(self, model: str) -> list[tuple[RuntimePhase, int]]:
        return [(s.phase, s.generation) for s in self.of(model)]

    async def wait_for(
        self, model: str, phase: RuntimePhase, *, generation: int | None = None, within: float = 10.0, count: int = 1
    ) -> RuntimeStatus:
        """The ``count``-th status of ``model`` in ``phase`` (and ``generation`` when given)."""

        def matching() -> list[RuntimeStatus]:
            return [
                s for s in self.of(model) if s.phase is phase and (generation is None or s.generation == generation)
            ]

        await wait_until(
            lambda: len(matching()) >= count,
            within=within,
            what=f"{model} {phase} (generation {generation}); seen {self.sequence(model)}",
        )
        return matching()[count - 1]


async def send(
    bus: Bus,
    model: str,
    action: ScaleAction,
    generation: int,
    *,
    command: list[str] | None = None,
    park_strategy: ParkStrategy = ParkStrategy.SCALE_TO_ZERO,
) -> None:
    spec = RuntimeSpec(
        namespace=NAMESPACE,
        name=model,
        command=fake_model(model) if command is None else command,
        park_strategy=park_strategy,
    )
    message = ScaleCommand(
        namespace=NAMESPACE,
        model=model,
        action=action,
        generation=generation,
        runtime=spec,
        issued_at=utcnow(),
    )
    await bus.publish(subjects.command_subject(NAMESPACE, model), message)


StartActuator = Callable[..., Awaitable[Actuator]]


@pytest.fixture(autouse=True)
def debug_logs(caplog: pytest.LogCaptureFixture) -> None:
    """Log at DEBUG, so every log call's fields are built (a bad ``extra`` key fails the test)."""
    caplog.set_level(logging.DEBUG, logger="flexinfer")


@pytest.fixture
async def statuses(bus: Bus) -> AsyncIterator[StatusLog]:
    log = StatusLog()
    sub = await bus.nc.subscribe(subjects.RUNTIME_STATUS_PREFIX + ".>", cb=log.on_message)
    yield log
    await sub.unsubscribe()


@pytest.fixture
async def start_actuator(bus: Bus, tmp_path: Path) -> AsyncIterator[StartActuator]:
    running: list[Actuator] = []

    async def start(*, grace: float = 1.0, load_timeout: float = 10.0) -> Actuator:
        clock = SystemClock()
        publisher = StatusPublisher(bus=bus, actuator="test-actuator", clock=clock)
        scaler = LocalProcessScaler(
            state_dir=tmp_path / "state",
            on_status=publisher.report,
            readiness_probe_interval=PROBE_INTERVAL,
            park_grace_period=timedelta(seconds=grace),
            load_timeout=timedelta(seconds=load_timeout),
            # The operator's allow-list for these tests: this Python (the fake model and the tiny server run
            # on it) and a path that does not exist.
            local_commands=(sys.executable, "/nonexistent/serve"),
            clock=clock,
        )
        actuator = Actuator(
            bus=bus, scaler=scaler, statuses=publisher, instance="test-actuator", clock=clock, drain_timeout=grace + 5
        )
        await actuator.start()
        running.append(actuator)
        return actuator

    yield start
    for actuator in running:
        await actuator.stop()


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as http, http.get(url, timeout=aiohttp.ClientTimeout(total=5)) as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def test_activate_reports_loading_then_ready_with_an_endpoint_that_answers(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator, tmp_path: Path
) -> None:
    hellos: list[ActuatorHello] = []

    async def on_hello(msg: Any) -> None:
        hellos.append(ActuatorHello.model_validate_json(msg.data))

    await bus.nc.subscribe(subjects.ACTUATOR_HELLO_PREFIX + ".>", cb=on_hello)
    actuator = await start_actuator()
    await wait_until(lambda: len(hellos) == 1, what="hello")
    assert (hellos[0].actuator, hellos[0].backend) == ("test-actuator", "local")

    await send(bus, "alpha", ScaleAction.ACTIVATE, 1, command=fake_model("alpha", startup_delay=0.3))
    ready = await statuses.wait_for("alpha", RuntimePhase.READY, generation=1)

    assert statuses.sequence("alpha") == [(RuntimePhase.LOADING, 1), (RuntimePhase.READY, 1)]
    assert ready.endpoint is not None and ready.endpoint.startswith("http://127.0.0.1:")
    assert ready.actuator == "test-actuator" and ready.pid is not None
    models = await get_json(ready.endpoint + "/v1/models")
    assert [m["id"] for m in models["data"]] == ["alpha"]
    [row] = actuator.scaler.snapshot()
    assert (row.name, row.pid, row.phase, row.generation) == ("alpha", ready.pid, ProcessPhase.READY, 1)
    assert ready.endpoint == row.endpoint == f"http://127.0.0.1:{row.port}"
    log_file = tmp_path / "state" / "logs" / "default_alpha.log"
    assert "model loaded" in log_file.read_text()


async def test_park_reports_stopping_then_parked_and_the_process_is_gone(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    await send(bus, "bravo", ScaleAction.ACTIVATE, 1)
    ready = await statuses.wait_for("bravo", RuntimePhase.READY, generation=1)
    assert ready.pid is not None and process_alive(ready.pid)

    await send(bus, "bravo", ScaleAction.PARK, 2)
    parked = await statuses.wait_for("bravo", RuntimePhase.PARKED, generation=2)

    assert statuses.sequence("bravo")[2:] == [(RuntimePhase.STOPPING, 2), (RuntimePhase.PARKED, 2)]
    assert parked.pid is None
    assert not process_alive(ready.pid)  # Parked means reaped, not merely signalled
    assert actuator.scaler.snapshot() == []

    await send(bus, "bravo", ScaleAction.PARK, 3)  # parking a parked model only reports Parked
    await statuses.wait_for("bravo", RuntimePhase.PARKED, generation=3)
    assert statuses.sequence("bravo")[-1] == (RuntimePhase.PARKED, 3)
    assert (RuntimePhase.STOPPING, 3) not in statuses.sequence("bravo")


async def test_stale_generation_is_ignored_and_a_repeated_one_re_reports(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    await send(bus, "charlie", ScaleAction.ACTIVATE, 5)
    ready = await statuses.wait_for("charlie", RuntimePhase.READY, generation=5)

    await send(bus, "charlie", ScaleAction.PARK, 4)  # stale: must not stop the model
    await send(bus, "charlie", ScaleAction.ACTIVATE, 3)  # stale
    await send(bus, "charlie", ScaleAction.ACTIVATE, 5)  # repeated: re-report Ready
    again = await statuses.wait_for("charlie", RuntimePhase.READY, generation=5, count=2)
    await asyncio.sleep(0.3)

    assert again.endpoint == ready.endpoint and again.pid == ready.pid
    assert statuses.sequence("charlie") == [
        (RuntimePhase.LOADING, 5),
        (RuntimePhase.READY, 5),
        (RuntimePhase.READY, 5),
    ]
    assert ready.pid is not None and process_alive(ready.pid)
    assert [row.pid for row in actuator.scaler.snapshot()] == [ready.pid]

    await send(bus, "charlie", ScaleAction.ACTIVATE, 6)  # newer, while Ready: only reports Ready under generation 6
    newer = await statuses.wait_for("charlie", RuntimePhase.READY, generation=6)
    assert newer.pid == ready.pid
    assert (RuntimePhase.LOADING, 6) not in statuses.sequence("charlie")


async def test_missing_command_reports_failed_with_a_readable_message(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    await send(bus, "delta", ScaleAction.ACTIVATE, 1, command=[])
    failed = await statuses.wait_for("delta", RuntimePhase.FAILED, generation=1)
    assert "spec.local.command is missing" in failed.message
    assert actuator.scaler.snapshot() == []


async def test_unknown_executable_reports_failed_naming_it(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    await start_actuator()
    await send(bus, "delta2", ScaleAction.ACTIVATE, 1, command=["/nonexistent/serve", "--port", "{port}"])
    failed = await statuses.wait_for("delta2", RuntimePhase.FAILED, generation=1)
    assert "/nonexistent/serve" in failed.message


@pytest.mark.parametrize(
    ("command", "env", "rule"),
    [
        pytest.param(["sh", "-c", "touch {marker}; sleep 100"], {}, "executable 'sh' is not allowed", id="shell"),
        pytest.param(
            ["/bin/sh", "-c", "touch {marker}"], {}, "executable '/bin/sh' is not allowed", id="absolute-path"
        ),
        pytest.param(["./serve", "{port}"], {}, "'./serve' is a relative path", id="relative-path"),
        pytest.param(
            [sys.executable, "-c", "open('{marker}', 'w')"],
            {"LD_PRELOAD": "/tmp/evil.so"},
            "LD_PRELOAD may not be set",
            id="allowed-executable-hostile-env",
        ),
    ],
)
async def test_a_command_off_the_allow_list_never_runs(
    bus: Bus,
    statuses: StatusLog,
    start_actuator: StartActuator,
    tmp_path: Path,
    command: list[str],
    env: dict[str, str],
    rule: str,
) -> None:
    actuator = await start_actuator()
    marker = tmp_path / "pwned"
    argv = [arg.replace("{marker}", str(marker)) for arg in command]
    spec = RuntimeSpec(namespace=NAMESPACE, name="evil", command=argv, env=env)
    await bus.publish(
        subjects.command_subject(NAMESPACE, "evil"),
        ScaleCommand(
            namespace=NAMESPACE,
            model="evil",
            action=ScaleAction.ACTIVATE,
            generation=1,
            runtime=spec,
            issued_at=utcnow(),
        ),
    )
    failed = await statuses.wait_for("evil", RuntimePhase.FAILED, generation=1)
    assert rule in failed.message
    assert "FLEXINFER_LOCAL_COMMANDS" in failed.message
    assert actuator.scaler.snapshot() == []
    assert not marker.exists()


async def test_process_that_fails_to_load_reports_failed_with_its_exit_code_and_log(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    command = fake_model("echo", "--fail-load", startup_delay=0.1)
    await send(bus, "echo", ScaleAction.ACTIVATE, 1, command=command)
    failed = await statuses.wait_for("echo", RuntimePhase.FAILED, generation=1)

    assert statuses.sequence("echo") == [(RuntimePhase.LOADING, 1), (RuntimePhase.FAILED, 1)]
    assert "before it was ready (exit code 1)" in failed.message
    assert "load failed" in failed.message  # the last lines of its log
    assert actuator.scaler.snapshot() == []


async def test_load_timeout_stops_the_process_and_reports_failed(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator(load_timeout=1.0)
    await send(bus, "foxtrot", ScaleAction.ACTIVATE, 1, command=fake_model("foxtrot", startup_delay=60))
    loading = await statuses.wait_for("foxtrot", RuntimePhase.LOADING, generation=1)
    failed = await statuses.wait_for("foxtrot", RuntimePhase.FAILED, generation=1, within=5)

    assert "not ready within the load timeout (1s)" in failed.message
    assert loading.pid is not None and not process_alive(loading.pid)
    assert actuator.scaler.snapshot() == []


async def test_unexpected_death_while_ready_reports_failed(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    await send(bus, "golf", ScaleAction.ACTIVATE, 1)
    ready = await statuses.wait_for("golf", RuntimePhase.READY, generation=1)
    assert ready.pid is not None

    os.kill(ready.pid, signal.SIGKILL)
    failed = await statuses.wait_for("golf", RuntimePhase.FAILED, generation=1)

    assert "after it was Ready (killed by signal 9 (SIGKILL))" in failed.message
    assert actuator.scaler.snapshot() == []
    await send(bus, "golf", ScaleAction.ACTIVATE, 2)  # the scheduler may try again: a fresh process
    again = await statuses.wait_for("golf", RuntimePhase.READY, generation=2)
    assert again.pid != ready.pid


async def test_sleep_park_keeps_the_process_and_activate_wakes_it(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    sleep = ParkStrategy.SLEEP
    await send(bus, "hotel", ScaleAction.ACTIVATE, 1, park_strategy=sleep)
    ready = await statuses.wait_for("hotel", RuntimePhase.READY, generation=1)
    assert ready.endpoint is not None

    await send(bus, "hotel", ScaleAction.PARK, 2, park_strategy=sleep)
    parked = await statuses.wait_for("hotel", RuntimePhase.PARKED, generation=2)
    assert statuses.sequence("hotel")[2:] == [(RuntimePhase.STOPPING, 2), (RuntimePhase.PARKED, 2)]
    assert parked.pid == ready.pid and process_alive(ready.pid or 0)
    assert (await get_json(ready.endpoint + "/is_sleeping")) == {"is_sleeping": True}
    assert [(row.pid, row.phase) for row in actuator.scaler.snapshot()] == [(ready.pid, ProcessPhase.SLEEPING)]

    await send(bus, "hotel", ScaleAction.ACTIVATE, 3, park_strategy=sleep)
    woken = await statuses.wait_for("hotel", RuntimePhase.READY, generation=3)
    assert statuses.sequence("hotel")[4:] == [(RuntimePhase.LOADING, 3), (RuntimePhase.READY, 3)]
    assert woken.pid == ready.pid and woken.endpoint == ready.endpoint
    assert (await get_json(ready.endpoint + "/is_sleeping")) == {"is_sleeping": False}


async def test_activate_after_a_sleeping_process_died_starts_afresh(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    await start_actuator()
    sleep = ParkStrategy.SLEEP
    await send(bus, "india", ScaleAction.ACTIVATE, 1, park_strategy=sleep)
    ready = await statuses.wait_for("india", RuntimePhase.READY, generation=1)
    await send(bus, "india", ScaleAction.PARK, 2, park_strategy=sleep)
    await statuses.wait_for("india", RuntimePhase.PARKED, generation=2)
    assert ready.pid is not None
    os.kill(ready.pid, signal.SIGKILL)
    await wait_until(lambda: not process_alive(ready.pid or 0), what="the sleeping process to die")

    await send(bus, "india", ScaleAction.ACTIVATE, 3, park_strategy=sleep)
    woken = await statuses.wait_for("india", RuntimePhase.READY, generation=3)
    assert woken.pid != ready.pid
    assert all(s.phase is not RuntimePhase.FAILED for s in statuses.of("india"))


async def test_a_slow_park_does_not_hold_up_another_model_and_sigkill_follows_the_grace(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    await start_actuator(grace=1.5)
    await send(bus, "juliet", ScaleAction.ACTIVATE, 1, command=tiny_server(ignore_sigterm=True))
    stubborn = await statuses.wait_for("juliet", RuntimePhase.READY, generation=1)

    await send(bus, "juliet", ScaleAction.PARK, 2)
    await send(bus, "kilo", ScaleAction.ACTIVATE, 1, command=tiny_server())
    stopping = await statuses.wait_for("juliet", RuntimePhase.STOPPING, generation=2)
    other_ready = await statuses.wait_for("kilo", RuntimePhase.READY, generation=1)
    parked = await statuses.wait_for("juliet", RuntimePhase.PARKED, generation=2, within=5)

    assert other_ready.time < parked.time  # the models proceed concurrently
    assert (parked.time - stopping.time).total_seconds() >= 1.4  # SIGTERM ignored: SIGKILL after the grace
    assert stubborn.pid is not None and not process_alive(stubborn.pid)


async def test_actuator_shutdown_leaves_no_model_process_behind(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator(grace=1.0)
    await send(bus, "lima", ScaleAction.ACTIVATE, 1)
    await send(bus, "mike", ScaleAction.ACTIVATE, 1, command=tiny_server(ignore_sigterm=True))
    await send(bus, "november", ScaleAction.ACTIVATE, 1, command=fake_model("november", startup_delay=60))
    lima = await statuses.wait_for("lima", RuntimePhase.READY)
    mike = await statuses.wait_for("mike", RuntimePhase.READY)
    november = await statuses.wait_for("november", RuntimePhase.LOADING)
    pids = [s.pid for s in (lima, mike, november)]
    assert all(pid is not None and process_alive(pid) for pid in pids)

    await actuator.stop()

    assert [pid for pid in pids if pid is not None and process_alive(pid)] == []
    assert actuator.scaler.snapshot() == []
    for model in ("lima", "mike", "november"):
        parked = await statuses.wait_for(model, RuntimePhase.PARKED, within=2)
        assert parked.message == "actuator stopped"
