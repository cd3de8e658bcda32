"""The CLI against real NATS and PostgreSQL: ``flexinfer up`` with stand-in services (given or embedded servers),
``flexinfer demand`` and the events a ``describe`` shows. The same commands without servers are in tests/unit."""

from __future__ import annotations

import asyncio
import io
import json
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from flexinfer_cli.config import ModelRef, Service
from flexinfer_cli.demand_signal import publish_demand
from flexinfer_cli.events import recent_events
from flexinfer_cli.local_system import STOP_ORDER, Up, UpError, UpOptions
from flexinfer_common import subjects
from flexinfer_common.enums import SwapPhase
from tests.support.waiting import wait_for
from tests.unit.test_cli_up import HOMELAB, base_env, stand_in_commands
from tests.unit.test_cli_watch_describe import swap_event

pytestmark = pytest.mark.integration


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
        await wait_for(lambda: "FlexInfer is up." in out.getvalue() or run.done(), within=60)
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
        await wait_for(lambda: "FlexInfer is up." in out.getvalue() or run.done(), within=90)
        assert not run.done(), run.result()
        assert up.nats is not None and up.postgres is not None
        nats_pid, postgres_pid = up.nats.pid, up.postgres.pid
        env: dict[str, Any] = json.loads((tmp_path / "scheduler.env.json").read_text())
        assert env["FLEXINFER_NATS_URL"] == up.nats.url
        # the services connect as the database's owner role, with its password, not as the superuser
        assert env["FLEXINFER_DATABASE_URL"] == up.postgres.url_for("flexinfer", role="flexinfer")
        assert env["FLEXINFER_DATABASE_URL"].startswith("postgresql+asyncpg://flexinfer:")
        assert (state / "nats").is_dir() and (state / "postgres" / "pgdata" / "PG_VERSION").exists()
        # Each service gets its own bus identity, and only its own.
        passwords = json.loads((state / "nats-credentials.json").read_text())
        for service in Service:
            own = json.loads((tmp_path / f"{service.value}.env.json").read_text())
            assert own["FLEXINFER_NATS_USER"] == service.value
            assert own["FLEXINFER_NATS_PASSWORD"] == passwords[service.value]
            assert own["FLEXINFER_NATS_INBOX_PREFIX"] == f"_INBOX.{service.value}"
            others = {v for k, v in passwords.items() if k != service.value}
            assert not others & set(own.values())
        # the migrations ran
        import asyncpg

        conn = await asyncpg.connect(up.postgres.dsn("flexinfer", role="flexinfer"))
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


async def test_demand_publishes_a_demand_message_the_scheduler_can_decode(bus: Any) -> None:
    from flexinfer_common.bus import decode_demand
    from flexinfer_common.subjects import DEMAND_STREAM

    subject = await publish_demand(bus.url, ModelRef("lab", "chat.v2"), queued=3, source="test")
    assert subject == "flexinfer.demand.lab.chat_v2"
    sub = await bus.js.pull_subscribe(subject, durable="cli-test", stream=DEMAND_STREAM)
    [msg] = await sub.fetch(1, timeout=5)
    demand = decode_demand(msg.subject, msg.data)
    assert (demand.namespace, demand.model, demand.queued, demand.source) == ("lab", "chat.v2", 3, "test")
    assert demand.time is not None


async def test_demand_without_the_flexinfer_streams_says_so(clean_nats: str) -> None:
    from flexinfer_cli.client import CliError

    with pytest.raises(CliError, match=r"no JetStream stream stores flexinfer\.demand\.default\.chat"):
        await publish_demand(clean_nats, ModelRef("default", "chat"), queued=1, source="test")


async def test_recent_events_come_from_the_events_stream(bus: Any) -> None:
    now = datetime.now(UTC)
    subject = subjects.event_subject("swap", "homelab-gpu")
    for kind, phase in (("swap.started", SwapPhase.DRAINING), ("swap.finished", SwapPhase.READY)):
        event = swap_event(kind, "default/a", "default/b", phase, now)
        await bus.publish(subject, event, msg_id=f"test-{kind}")
    await bus.publish(
        subjects.event_subject("swap", "other-gpu"),
        swap_event("swap.started", "default/a", "default/b", SwapPhase.DRAINING, now),
        msg_id="test-other-group",
    )
    found = await recent_events(bus.url, group="homelab-gpu", model="default/b", now=now, since=timedelta(hours=1))
    assert found.unavailable is None
    assert [e.kind for e in found.items] == ["swap.started", "swap.finished"]
    nobody = await recent_events(bus.url, group="homelab-gpu", model="default/z", now=now, since=timedelta(hours=1))
    assert nobody.items == ()
