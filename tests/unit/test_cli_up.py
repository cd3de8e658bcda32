"""``flexinfer up`` orchestration with stand-in services (tiny aiohttp apps), real NATS and Postgres.

The stand-ins answer ``/readyz``; the scheduler one also takes ``PUT /api/v1/models/...``. Each records the
environment it was given and, on SIGTERM, the order in which it was stopped. The end-to-end test with the real
services lives in tests/e2e.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from flexinfer_cli.client import CliError
from flexinfer_cli.config import Service
from flexinfer_cli.up import STOP_ORDER, Up, UpError, UpOptions

REPO = Path(__file__).resolve().parents[2]
HOMELAB = REPO / "examples" / "homelab.yaml"

STAND_IN = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys
    from pathlib import Path
    from aiohttp import web

    name, journal = sys.argv[1], Path(sys.argv[2])
    mode = os.environ.get("STAND_IN_MODE_" + name.upper().replace("-", "_"), "ok")
    if mode == "crash":
        print(json.dumps({"service": name, "msg": "crashing on purpose"}), file=sys.stderr, flush=True)
        sys.exit(3)
    port = int(os.environ["FLEXINFER_" + name.upper().replace("-", "_") + "_PORT"])
    (journal / (name + ".env.json")).write_text(json.dumps(dict(os.environ)))
    models = {}

    async def ready(_):
        return web.json_response({"ready": True})

    async def put_model(request):
        body = await request.json()
        models[request.match_info["name"]] = body
        (journal / "models.json").write_text(json.dumps(models))
        return web.json_response(body)

    async def main():
        app = web.Application()
        app.router.add_get("/readyz", ready)
        app.router.add_put("/api/v1/models/{ns}/{name}", put_model)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, os.environ["FLEXINFER_BIND_HOST"], port).start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        print(json.dumps({"service": name, "msg": "listening", "port": port}), file=sys.stderr, flush=True)
        await stop.wait()
        with open(journal / "stopped", "a") as f:
            f.write(name + "\\n")
        await runner.cleanup()

    asyncio.run(main())
    """
)


def stand_in_commands(tmp_path: Path) -> dict[Service, tuple[str, ...]]:
    script = tmp_path / "stand_in.py"
    script.write_text(STAND_IN)
    return {service: (sys.executable, str(script), service.value, str(tmp_path)) for service in Service}


def free_service_ports() -> dict[str, str]:
    return {service.port_variable: "0" for service in Service}


async def wait_until(condition: Callable[[], bool], within: float = 60.0) -> None:
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.05)


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXINFER_")}
    return {**env, **free_service_ports(), **extra}


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_up_with_given_nats_and_database(tmp_path: Path, nats_url: str, database_url: str) -> None:
    out = io.StringIO()
    up = Up(
        UpOptions(
            files=[HOMELAB],
            state_dir=tmp_path / "state",
            commands=stand_in_commands(tmp_path),
            env=base_env(FLEXINFER_NATS_URL=nats_url, FLEXINFER_DATABASE_URL=database_url),
            out=out,
        )
    )
    run = asyncio.create_task(up.run())
    try:
        await wait_until(lambda: "FlexInfer is up." in out.getvalue() or run.done())
        assert not run.done(), run.result()
        # applied through the scheduler's admin API, in file order
        assert list(json.loads((tmp_path / "models.json").read_text())) == ["chat-large", "chat-small"]
        env = json.loads((tmp_path / "actuator.env.json").read_text())
        assert env["FLEXINFER_NATS_URL"] == nats_url
        assert env["FLEXINFER_DATABASE_URL"] == database_url
        assert env["FLEXINFER_ACTUATOR"] == "local"
        assert env["FLEXINFER_STATE_DIR"] == str((tmp_path / "state").absolute())
        assert env["FLEXINFER_BIND_HOST"] == "127.0.0.1"
        assert env["FLEXINFER_SCHEDULER_PORT"] != "0"  # "0" resolved to a real port, the same for everyone
        proxy_env = json.loads((tmp_path / "proxy.env.json").read_text())
        assert proxy_env["FLEXINFER_SCHEDULER_PORT"] == env["FLEXINFER_SCHEDULER_PORT"]
        assert up.nats is None and up.postgres is None  # nothing embedded: URLs were given
        banner = out.getvalue()
        assert f"http://127.0.0.1:{env['FLEXINFER_PROXY_PORT']}/v1" in banner
        assert "flexinfer get models" in banner
        assert f"export FLEXINFER_SCHEDULER_URL=http://127.0.0.1:{env['FLEXINFER_SCHEDULER_PORT']}" in banner
    finally:
        up.signals.stop.set()  # what SIGINT/SIGTERM do
        code = await asyncio.wait_for(run, 30)
    assert code == 0
    assert (tmp_path / "stopped").read_text().split() == [s.value for s in STOP_ORDER]


@pytest.mark.integration
@pytest.mark.timeout(90)
async def test_up_gives_up_on_a_service_that_keeps_crashing(tmp_path: Path, nats_url: str, database_url: str) -> None:
    up = Up(
        UpOptions(
            state_dir=tmp_path / "state",
            commands=stand_in_commands(tmp_path),
            env=base_env(
                FLEXINFER_NATS_URL=nats_url, FLEXINFER_DATABASE_URL=database_url, STAND_IN_MODE_ACTUATOR="crash"
            ),
            out=io.StringIO(),
        )
    )
    with pytest.raises(UpError, match=r"the actuator exited 3 times while starting \(last: exit code 3\)"):
        await up.run()
    assert up.supervisor is not None
    assert [r.delay for r in up.supervisor.restarts if r.service == "actuator"][:2] == [0.5, 1.0]
    # everything it started is stopped
    assert all(up.supervisor.pid(name) is None for name in up.supervisor.names)


@pytest.mark.integration
@pytest.mark.timeout(120)
async def test_up_starts_and_stops_embedded_nats_and_postgres(tmp_path: Path) -> None:
    out = io.StringIO()
    state = tmp_path / "state"
    up = Up(
        UpOptions(
            files=[HOMELAB],
            state_dir=state,
            commands=stand_in_commands(tmp_path),
            env=base_env(),
            out=out,
        )
    )
    run = asyncio.create_task(up.run())
    try:
        await wait_until(lambda: "FlexInfer is up." in out.getvalue() or run.done(), within=90)
        assert not run.done(), run.result()
        assert up.nats is not None and up.postgres is not None
        nats_pid, postgres_pid = up.nats.pid, up.postgres.pid
        env: dict[str, Any] = json.loads((tmp_path / "scheduler.env.json").read_text())
        assert env["FLEXINFER_NATS_URL"] == up.nats.url
        assert env["FLEXINFER_DATABASE_URL"] == up.postgres.url_for("flexinfer")
        assert (state / "nats").is_dir() and (state / "postgres" / "pgdata" / "PG_VERSION").exists()
        # the migrations ran
        import asyncpg

        conn = await asyncpg.connect(up.postgres.dsn("flexinfer"))
        try:
            assert await conn.fetchval("SELECT count(*) FROM alembic_version") == 1
        finally:
            await conn.close()
    finally:
        up.signals.stop.set()
        code = await asyncio.wait_for(run, 60)
    assert code == 0
    assert nats_pid is not None and postgres_pid is not None
    for pid in (nats_pid, postgres_pid):
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


async def test_up_refuses_a_port_in_use(tmp_path: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        up = Up(
            UpOptions(
                state_dir=tmp_path / "state",
                env=base_env(FLEXINFER_PROXY_PORT=str(port)),
                out=io.StringIO(),
            )
        )
        with pytest.raises(CliError, match=f"port {port} for the proxy is already in use \\(FLEXINFER_PROXY_PORT\\)"):
            await up.run()
    assert not (tmp_path / "state").exists()
