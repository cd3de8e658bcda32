"""The actuator's consumer with the local back-end, against real NATS and real model processes.

Each test drives the actuator the way the scheduler does (ScaleCommand on ``flexinfer.actuator.command.<ns>.<model>``)
and reads what it reports (RuntimeStatus on ``flexinfer.actuator.status.>``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import pwd
import re
import signal
import sys
import textwrap
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
from flexinfer_common.messages import ActuatorHello, RuntimeSpec, RuntimeStatus
from flexinfer_testbed.system import fake_model_command
from tests.support.actuator import scale_command
from tests.support.processes import alive
from tests.support.waiting import wait_for

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
    """The argv of the fake OpenAI-compatible model server (tools/fake-model), run by this interpreter."""
    program = (sys.executable, "-m", "flexinfer_fake_model.server")
    return fake_model_command(name, "--wake-delay", "0.1", *extra, startup_delay=startup_delay, program=program)


def tiny_server(*, ignore_sigterm: bool = False) -> list[str]:
    return [sys.executable, "-c", TINY_SERVER, "{port}", *(["ignore-term"] if ignore_sigterm else [])]


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if item)


def proc_uids(pid: int) -> list[int]:
    status = Path(f"/proc/{pid}/status").read_text()
    return [int(u) for u in next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]]


class StatusLog:
    """Every RuntimeStatus published, in arrival order."""

    def __init__(self) -> None:
        self.items: list[RuntimeStatus] = []

    async def on_message(self, msg: Any) -> None:
        self.items.append(RuntimeStatus.model_validate_json(msg.data))

    def of(self, model: str) -> list[RuntimeStatus]:
        return [s for s in self.items if s.model == model]

    def sequence(self, model: str) -> list[tuple[RuntimePhase, int]]:
        """The phases ``model`` went through, each with its generation. A load that outlasts the probe's quiet
        second repeats Loading with what the probe saw: that is progress within the load, left out here (a repeated
        Ready is an answer to a repeated command, and stays)."""
        phases = [(s.phase, s.generation) for s in self.of(model)]
        return [p for i, p in enumerate(phases) if not (i and p[0] is RuntimePhase.LOADING and phases[i - 1] == p)]

    async def wait_for(
        self, model: str, phase: RuntimePhase, *, generation: int | None = None, within: float = 10.0, count: int = 1
    ) -> RuntimeStatus:
        """The ``count``-th status of ``model`` in ``phase`` (and ``generation`` when given)."""

        def matching() -> list[RuntimeStatus]:
            return [
                s for s in self.of(model) if s.phase is phase and (generation is None or s.generation == generation)
            ]

        await wait_for(
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
    epoch: int = 0,
    **runtime: Any,
) -> None:
    """Publish the scheduler's command (its leader's ``epoch``: 0, a scheduler without fencing) for ``model``."""
    spec = RuntimeSpec(
        namespace=NAMESPACE,
        name=model,
        command=fake_model(model) if command is None else command,
        park_strategy=park_strategy,
        **runtime,
    )
    message = scale_command(
        generation=generation,
        epoch=epoch,
        model=model,
        namespace=NAMESPACE,
        action=action,
        runtime=spec,
        issued_at=utcnow(),
    )
    await bus.publish(subjects.command_subject(NAMESPACE, model), message)


async def activated(bus: Bus, statuses: StatusLog, model: str, generation: int, **options: Any) -> RuntimeStatus:
    """Send ACTIVATE for ``model`` (``send``'s ``options``) and return its Ready status of that ``generation``."""
    await send(bus, model, ScaleAction.ACTIVATE, generation, **options)
    return await statuses.wait_for(model, RuntimePhase.READY, generation=generation)


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

    async def start(
        *,
        grace: float = 1.0,
        load_timeout: float = 10.0,
        local_commands: tuple[str, ...] = (sys.executable, "/nonexistent/serve"),
        **options: Any,
    ) -> Actuator:
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
            local_commands=local_commands,
            clock=clock,
            **options,
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
    await wait_for(lambda: len(hellos) == 1, what="hello")
    assert (hellos[0].actuator, hellos[0].backend) == ("test-actuator", "local")

    ready = await activated(bus, statuses, "alpha", 1, command=fake_model("alpha", startup_delay=0.3))

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
    ready = await activated(bus, statuses, "bravo", 1)
    assert ready.pid is not None and alive(ready.pid)

    await send(bus, "bravo", ScaleAction.PARK, 2)
    parked = await statuses.wait_for("bravo", RuntimePhase.PARKED, generation=2)

    assert statuses.sequence("bravo")[2:] == [(RuntimePhase.STOPPING, 2), (RuntimePhase.PARKED, 2)]
    assert parked.pid is None
    assert not alive(ready.pid)  # Parked means reaped, not merely signalled
    assert actuator.scaler.snapshot() == []

    await send(bus, "bravo", ScaleAction.PARK, 3)  # parking a parked model only reports Parked
    await statuses.wait_for("bravo", RuntimePhase.PARKED, generation=3)
    assert statuses.sequence("bravo")[-1] == (RuntimePhase.PARKED, 3)
    assert (RuntimePhase.STOPPING, 3) not in statuses.sequence("bravo")


async def test_stale_generation_is_ignored_and_a_repeated_one_re_reports(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    ready = await activated(bus, statuses, "charlie", 5)

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
    assert ready.pid is not None and alive(ready.pid)
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
            [sys.executable, "-c", "open('{marker}', 'w')"],
            {"PYTHONPYCACHEPREFIX": "/tmp/planted"},
            "PYTHONPYCACHEPREFIX may not be set",
            id="pycache-prefix-of-issue-22",
        ),
        pytest.param(
            [sys.executable, "-c", "open('{marker}', 'w')"],
            {"MY_UNLISTED_KNOB": "1"},
            "MY_UNLISTED_KNOB is not allowed by FLEXINFER_LOCAL_ENV",
            id="unlisted-variable",
        ),
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
        scale_command(generation=1, model="evil", namespace=NAMESPACE, runtime=spec, issued_at=utcnow()),
    )
    failed = await statuses.wait_for("evil", RuntimePhase.FAILED, generation=1)
    assert rule in failed.message
    assert ("FLEXINFER_LOCAL_ENV" if env else "FLEXINFER_LOCAL_COMMANDS") in failed.message
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
    assert "exited with code 1 before it was ready" in failed.message
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
    assert loading.pid is not None and not alive(loading.pid)
    assert actuator.scaler.snapshot() == []


async def test_unexpected_death_while_ready_reports_failed(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    ready = await activated(bus, statuses, "golf", 1)
    assert ready.pid is not None

    os.kill(ready.pid, signal.SIGKILL)
    failed = await statuses.wait_for("golf", RuntimePhase.FAILED, generation=1)

    assert "killed by signal 9 (SIGKILL) after it was Ready" in failed.message
    assert actuator.scaler.snapshot() == []
    await send(bus, "golf", ScaleAction.ACTIVATE, 2)  # the scheduler may try again: a fresh process
    again = await statuses.wait_for("golf", RuntimePhase.READY, generation=2)
    assert again.pid != ready.pid


async def test_sleep_park_keeps_the_process_and_activate_wakes_it(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    actuator = await start_actuator()
    sleep = ParkStrategy.SLEEP
    ready = await activated(bus, statuses, "hotel", 1, park_strategy=sleep)
    assert ready.endpoint is not None

    await send(bus, "hotel", ScaleAction.PARK, 2, park_strategy=sleep)
    parked = await statuses.wait_for("hotel", RuntimePhase.PARKED, generation=2)
    assert statuses.sequence("hotel")[2:] == [(RuntimePhase.STOPPING, 2), (RuntimePhase.PARKED, 2)]
    assert parked.pid == ready.pid and alive(ready.pid or 0)
    assert (await get_json(ready.endpoint + "/is_sleeping")) == {"is_sleeping": True}
    assert [(row.pid, row.phase) for row in actuator.scaler.snapshot()] == [(ready.pid, ProcessPhase.SLEEPING)]

    woken = await activated(bus, statuses, "hotel", 3, park_strategy=sleep)
    assert statuses.sequence("hotel")[4:] == [(RuntimePhase.LOADING, 3), (RuntimePhase.READY, 3)]
    assert woken.pid == ready.pid and woken.endpoint == ready.endpoint
    assert (await get_json(ready.endpoint + "/is_sleeping")) == {"is_sleeping": False}


async def test_activate_after_a_sleeping_process_died_starts_afresh(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    await start_actuator()
    sleep = ParkStrategy.SLEEP
    ready = await activated(bus, statuses, "india", 1, park_strategy=sleep)
    await send(bus, "india", ScaleAction.PARK, 2, park_strategy=sleep)
    await statuses.wait_for("india", RuntimePhase.PARKED, generation=2)
    assert ready.pid is not None
    os.kill(ready.pid, signal.SIGKILL)
    await wait_for(lambda: not alive(ready.pid or 0), what="the sleeping process to die")

    woken = await activated(bus, statuses, "india", 3, park_strategy=sleep)
    assert woken.pid != ready.pid
    assert all(s.phase is not RuntimePhase.FAILED for s in statuses.of("india"))


async def test_a_slow_park_does_not_hold_up_another_model_and_sigkill_follows_the_grace(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    await start_actuator(grace=1.5)
    stubborn = await activated(bus, statuses, "juliet", 1, command=tiny_server(ignore_sigterm=True))

    await send(bus, "juliet", ScaleAction.PARK, 2)
    await send(bus, "kilo", ScaleAction.ACTIVATE, 1, command=tiny_server())
    stopping = await statuses.wait_for("juliet", RuntimePhase.STOPPING, generation=2)
    other_ready = await statuses.wait_for("kilo", RuntimePhase.READY, generation=1)
    parked = await statuses.wait_for("juliet", RuntimePhase.PARKED, generation=2, within=5)

    assert other_ready.time < parked.time  # the models proceed concurrently
    assert (parked.time - stopping.time).total_seconds() >= 1.4  # SIGTERM ignored: SIGKILL after the grace
    assert stubborn.pid is not None and not alive(stubborn.pid)


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
    assert all(pid is not None and alive(pid) for pid in pids)

    await actuator.stop()

    assert [pid for pid in pids if pid is not None and alive(pid)] == []
    assert actuator.scaler.snapshot() == []
    for model in ("lima", "mike", "november"):
        parked = await statuses.wait_for(model, RuntimePhase.PARKED, within=2)
        assert parked.message == "actuator stopped"


# -- issue 24: what the probe gets while loading, and why a Ready model is gone ------------------------------


async def test_a_probe_answering_404_shows_in_the_loading_message(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    await start_actuator(load_timeout=2.5)
    await send(bus, "oscar", ScaleAction.ACTIVATE, 1, readiness_path="/no-such-path")
    loading = await statuses.wait_for("oscar", RuntimePhase.LOADING, generation=1, count=2, within=5)

    assert re.fullmatch(r"GET /no-such-path → 404, \d+ tries", loading.message), loading.message
    assert loading.pid is not None  # the same process, still loading
    failed = await statuses.wait_for("oscar", RuntimePhase.FAILED, generation=1, within=5)
    assert re.search(r"load timeout \(2\.5s\): GET /no-such-path → 404, \d+ tries; process stopped", failed.message)


async def test_a_quick_load_reports_no_probe_answers(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    await start_actuator()
    await send(bus, "papa", ScaleAction.ACTIVATE, 1, command=fake_model("papa", startup_delay=0.3))
    await statuses.wait_for("papa", RuntimePhase.READY, generation=1)
    assert [s.message for s in statuses.of("papa")] == ["", ""]  # Loading, Ready: nothing to explain


async def test_a_crash_after_ready_reports_the_signal_and_the_log(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    """The issue's SIGILL build: the reason is in the status the scheduler shows, not only in the actuator's log."""
    await start_actuator()
    ready = await activated(bus, statuses, "quebec", 1, command=fake_model("quebec"))
    assert ready.pid is not None

    os.kill(ready.pid, signal.SIGILL)
    failed = await statuses.wait_for("quebec", RuntimePhase.FAILED, generation=1)

    assert failed.message.startswith("process killed by signal 4 (SIGILL) after it was Ready; last log lines:\n")
    assert "model loaded" in failed.message  # what the server logged last


async def test_a_process_exiting_after_ready_reports_its_exit_code(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator, tmp_path: Path
) -> None:
    quit_file = tmp_path / "quit"
    server = TINY_SERVER.replace(
        'print("tiny server up", flush=True)',
        "import os, threading, time\n"
        f"def watch():\n    while not os.path.exists({str(quit_file)!r}): time.sleep(0.02)\n"
        "    print('fatal: out of memory', flush=True); os._exit(1)\n"
        "threading.Thread(target=watch, daemon=True).start()",
    )
    await start_actuator()
    await send(bus, "romeo", ScaleAction.ACTIVATE, 1, command=[sys.executable, "-c", server, "{port}"])
    await statuses.wait_for("romeo", RuntimePhase.READY, generation=1)
    quit_file.touch()
    failed = await statuses.wait_for("romeo", RuntimePhase.FAILED, generation=1)
    assert failed.message == "process exited with code 1 after it was Ready; last log lines:\nfatal: out of memory"


# -- issue 22: least privilege ------------------------------------------------------------------------------


async def test_the_model_environment_is_an_allow_list_and_the_log_is_private(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLEXINFER_ADMIN_TOKEN", "t0ken-that-no-model-sees")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-for-models")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    await start_actuator()
    ready = await activated(bus, statuses, "sierra", 1, env={"FAKE_MODEL_TOKEN_DELAY": "0"})

    environ = proc_environ(ready.pid or 0)
    assert "FLEXINFER_ADMIN_TOKEN" not in environ and "AWS_SECRET_ACCESS_KEY" not in environ
    assert not [k for k in environ if k.startswith("FLEXINFER_")]
    assert environ["CUDA_VISIBLE_DEVICES"] == "1"  # on FLEXINFER_LOCAL_ENV's list: passed through
    assert environ["FAKE_MODEL_TOKEN_DELAY"] == "0" and environ["PORT"].isdigit()
    log_file = tmp_path / "state" / "logs" / "default_sierra.log"
    assert log_file.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "state" / "logs").stat().st_mode & 0o777 == 0o700


# Runs on the system's Python (the venv's may live under /root, out of nobody's reach): reports its uid and whether
# it could read the admin token, then serves readiness.
AS_NOBODY = textwrap.dedent(
    """
    import http.server, os, sys
    try:
        open(sys.argv[2]).read()
        print("token: READ", flush=True)
    except OSError as exc:
        print(f"token: denied ({type(exc).__name__})", flush=True)
    print(f"uid={os.getuid()} gid={os.getgid()} groups={os.getgroups()} home={os.environ['HOME']}", flush=True)
    print(f"cwd={os.getcwd()}", flush=True)
    open("scratch", "w").write("a model may write in its own folder")
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
    """
)
SYSTEM_PYTHON = "/usr/bin/python3"


def _check_what_nobody_logged(log_path: Path, nobody: pwd.struct_passwd) -> Path:
    """The model's own output (after the actuator's header line, which quotes the script) says it ran as nobody,
    without root's groups, in a private folder it owns, and could not read the token. Returns that folder."""
    output = log_path.read_text()
    assert re.findall(r"^token: .*$", output, re.MULTILINE) == ["token: denied (PermissionError)"]
    # no supplementary group of root
    home = re.search(rf"^uid={nobody.pw_uid} gid={nobody.pw_gid} groups=\[\] home=(\S+)$", output, re.MULTILINE)
    assert home is not None, output
    assert re.search(rf"^cwd={re.escape(home.group(1))}$", output, re.MULTILINE)
    workdir = Path(home.group(1))
    assert workdir.stat().st_uid == nobody.pw_uid and workdir.stat().st_mode & 0o777 == 0o700
    assert (workdir / "scratch").exists()
    assert log_path.stat().st_mode & 0o077 == 0  # neither world- nor group-readable
    return workdir


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the actuator drops to FLEXINFER_LOCAL_RUN_AS only as root")
@pytest.mark.skipif(not os.path.exists(SYSTEM_PYTHON), reason=f"needs {SYSTEM_PYTHON}, which nobody can run")
async def test_a_model_process_runs_as_nobody_and_cannot_read_the_admin_token(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    token = state / "admin-token"  # as `flexinfer up` keeps it
    token.write_text("s3cret-admin-token\n")
    token.chmod(0o600)
    nobody = pwd.getpwnam("nobody")

    await start_actuator(local_commands=(SYSTEM_PYTHON,), run_as="nobody")
    ready = await activated(bus, statuses, "tango", 1, command=[SYSTEM_PYTHON, "-c", AS_NOBODY, "{port}", str(token)])

    assert set(proc_uids(ready.pid or 0)) == {nobody.pw_uid}  # real, effective, saved and filesystem uid
    workdir = _check_what_nobody_logged(state / "logs" / "default_tango.log", nobody)

    await send(bus, "tango", ScaleAction.PARK, 2, command=[SYSTEM_PYTHON])
    await statuses.wait_for("tango", RuntimePhase.PARKED, generation=2)
    await wait_for(lambda: not workdir.exists(), what="the private folder to be removed")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the actuator drops to FLEXINFER_LOCAL_RUN_AS only as root")
async def test_a_model_the_run_as_user_cannot_execute_fails_with_a_hint(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator, tmp_path: Path
) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    server = private / "serve"
    server.write_text("#!/bin/sh\nexit 0\n")
    server.chmod(0o700)
    await start_actuator(local_commands=(str(server),), run_as="nobody")
    await send(bus, "uniform", ScaleAction.ACTIVATE, 1, command=[str(server)])
    failed = await statuses.wait_for("uniform", RuntimePhase.FAILED, generation=1)
    assert "Permission denied" in failed.message and "FLEXINFER_LOCAL_RUN_AS" in failed.message


# -- issue 25: backend presets ----------------------------------------------------------------------------

# A stand-in for llama.cpp's llama-server: records its argv, then serves as the fake model under the --alias.
FAKE_LLAMA_SERVER = """#!{python}
import json, sys
args = sys.argv[1:]
with open({record!r}, "w") as out:
    json.dump(args, out)
opts = dict(zip(args[::2], args[1::2]))
from flexinfer_fake_model.server import main
main(["--model", opts["--alias"], "--host", opts["--host"], "--port", opts["--port"]])
"""


async def test_a_llama_cpp_preset_runs_the_engine_named_in_settings(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator, tmp_path: Path
) -> None:
    record = tmp_path / "argv.json"
    engine = tmp_path / "bin" / "llama-server"
    engine.parent.mkdir()
    engine.write_text(FAKE_LLAMA_SERVER.format(python=sys.executable, record=str(record)))
    engine.chmod(0o755)
    weights = tmp_path / "smollm2.gguf"
    weights.write_bytes(b"GGUF")
    # Nothing on the command allow-list: the preset's engine is allowed by being named in FLEXINFER_LOCAL_ENGINES.
    await start_actuator(local_commands=(), local_engines={"llama-cpp": str(engine)})
    ready = await activated(bus, statuses, "victor", 1, command=[], backend="llama-cpp", source=str(weights))

    assert ready.endpoint is not None
    port = ready.endpoint.rsplit(":", 1)[1]
    assert json.loads(record.read_text()) == [
        *("--model", str(weights), "--alias", "victor"),
        *("--host", "127.0.0.1", "--port", port),
    ]
    models = await get_json(ready.endpoint + "/v1/models")
    assert [m["id"] for m in models["data"]] == ["victor"]


async def test_a_preset_without_its_engine_fails_saying_what_to_install_or_set(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no llama-server anywhere (and llama_cpp is not installed here)
    await start_actuator()
    await send(bus, "whiskey", ScaleAction.ACTIVATE, 1, command=[], backend="llama-cpp", source="/srv/m.gguf")
    failed = await statuses.wait_for("whiskey", RuntimePhase.FAILED, generation=1)
    assert "no engine found" in failed.message and "FLEXINFER_LOCAL_ENGINES" in failed.message


async def test_the_fake_preset_serves_the_model_under_its_name(
    bus: Bus, statuses: StatusLog, start_actuator: StartActuator
) -> None:
    await start_actuator(local_commands=())
    await send(
        bus, "xray", ScaleAction.ACTIVATE, 1, command=[], backend="fake", env={"FAKE_MODEL_STARTUP_DELAY": "0.2"}
    )
    ready = await statuses.wait_for("xray", RuntimePhase.READY, generation=1)
    assert ready.endpoint is not None
    models = await get_json(ready.endpoint + "/v1/models")
    assert [m["id"] for m in models["data"]] == ["xray"]
