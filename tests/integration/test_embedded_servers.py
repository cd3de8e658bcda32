"""The embedded NATS and PostgreSQL servers of ``flexinfer up`` (flexinfer_cli.embedded) and the test-server
helpers, started for real. The pure parts (URL handling, loopback checks) are in tests/unit/test_embedded.py."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from urllib.parse import quote

import asyncpg
import nats
import pytest

from flexinfer_cli.embedded import EmbeddedNats, EmbeddedPostgres, EmbeddedServerError
from flexinfer_testbed.servers import (
    ENV_DATABASE_URL,
    ENV_NATS_URL,
    create_test_database,
    drop_test_database,
    plain_database_url,
    start_test_servers,
)
from tests.support.processes import alive
from tests.unit.test_embedded import _dead_pid, _port_free, _wait_dead

pytestmark = pytest.mark.integration


async def test_nats_jetstream_roundtrip(tmp_path: Path) -> None:
    server = EmbeddedNats(tmp_path / "nats")
    url = server.start()
    pid, port = server.pid, server.port
    assert pid is not None
    assert url == f"nats://127.0.0.1:{port}" == server.url
    assert server.start() == url  # idempotent
    try:
        nc = await nats.connect(url, connect_timeout=5)
        try:
            js = nc.jetstream()
            await js.add_stream(name="EMBEDDED", subjects=["embedded.>"])
            ack = await js.publish("embedded.hello", b"hi", timeout=5)
            assert ack.stream == "EMBEDDED" and ack.seq == 1
            sub = await js.pull_subscribe("embedded.hello", durable="d")
            [msg] = await sub.fetch(1, timeout=5)
            assert msg.data == b"hi"
            await msg.ack()
        finally:
            await nc.close()
    finally:
        server.stop()
    assert not alive(pid)
    assert _port_free(port)
    assert (tmp_path / "nats" / "jetstream").is_dir()
    server.stop()  # idempotent


def test_nats_started_from_short_lived_thread_survives(tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG fires when the forking *thread* exits; the spawner thread prevents that."""
    server = EmbeddedNats(tmp_path / "nats")
    worker = threading.Thread(target=server.start)
    worker.start()
    worker.join()
    try:
        time.sleep(0.3)
        assert server.is_running()
        with socket.create_connection(("127.0.0.1", server.port), timeout=2) as sock:
            assert sock.recv(6) == b"INFO {"
    finally:
        server.stop()


def test_nats_explicit_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        with pytest.raises(EmbeddedServerError, match="already in use"):
            EmbeddedNats(tmp_path / "nats", port=sock.getsockname()[1]).start()


async def test_postgres_select_create_database_and_reuse(tmp_path: Path) -> None:
    data_dir = tmp_path / "pg"
    pg = EmbeddedPostgres(data_dir, durable=False)
    with pg:
        url = pg.url
        password = pg.password_file.read_text().strip()
        assert url == f"postgresql+asyncpg://postgres:{quote(password, safe='')}@127.0.0.1:{pg.port}/postgres"
        pid, port = pg.pid, pg.port
        assert pid is not None
        conn = await asyncpg.connect(pg.dsn(), timeout=10)
        try:
            assert await conn.fetchval("select 1") == 1
            assert await conn.fetchval("show fsync") == "off"
        finally:
            await conn.close()
        db_url = pg.create_database("flexinfer_unit")
        assert db_url.endswith(f":{port}/flexinfer_unit")
        assert pg.create_database("flexinfer_unit") == db_url  # exist_ok
        conn = await asyncpg.connect(pg.dsn("flexinfer_unit"), timeout=10)
        try:
            await conn.execute("create table marker (v text); insert into marker values ('kept')")
        finally:
            await conn.close()
    assert not alive(pid)
    assert _port_free(port)

    # a stale postmaster.pid (dead pid) must not prevent a restart
    stale = data_dir / "pgdata" / "postmaster.pid"
    stale.write_text(f"{_dead_pid()}\n{data_dir / 'pgdata'}\n0\n{port}\n\n127.0.0.1\n  0 0\nready\n")

    again = EmbeddedPostgres(data_dir, durable=False)
    with again:
        conn = await asyncpg.connect(again.dsn("flexinfer_unit"), timeout=10)
        try:
            assert await conn.fetchval("select v from marker") == "kept"
        finally:
            await conn.close()


_OWNER_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    from pathlib import Path
    from flexinfer_cli.embedded import EmbeddedNats, EmbeddedPostgres
    pg = EmbeddedPostgres(Path(sys.argv[1]) / "pg", durable=False)
    pg.start()
    nats = EmbeddedNats(Path(sys.argv[1]) / "nats")
    nats.start()
    print(json.dumps({"pg_pid": pg.pid, "pg_port": pg.port, "nats_pid": nats.pid}), flush=True)
    time.sleep(120)
    """
)


def test_servers_die_when_owner_is_sigkilled(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", _OWNER_SCRIPT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert owner.stdout is not None
        line = owner.stdout.readline()
        assert line, f"owner process failed (exit {owner.poll()})"
        info = json.loads(line)
        assert alive(info["pg_pid"]) and alive(info["nats_pid"])
    finally:
        owner.kill()
        owner.wait()
    assert _wait_dead(info["pg_pid"], 10), "postmaster survived its owner's SIGKILL"
    assert _wait_dead(info["nats_pid"], 10), "nats-server survived its owner's SIGKILL"
    assert _port_free(info["pg_port"])


async def test_embedded_test_servers_and_databases(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DATABASE_URL, raising=False)
    monkeypatch.delenv(ENV_NATS_URL, raising=False)
    servers = start_test_servers(tmp_path, use_docker=False)
    try:
        assert (servers.nats_source, servers.database_source) == ("embedded", "embedded")
        db_url = await create_test_database(servers.database_url, "flexinfer_t1")
        assert db_url.startswith("postgresql+asyncpg://") and db_url.endswith("/flexinfer_t1")
        conn = await asyncpg.connect(plain_database_url(db_url), timeout=10)
        try:
            await conn.execute("create table t (x int)")
        finally:
            await conn.close()
        # recreating gives a fresh, empty database even while a session is still connected
        holder = await asyncpg.connect(plain_database_url(db_url), timeout=10)
        try:
            db_url = await create_test_database(servers.database_url, "flexinfer_t1")
        finally:
            await holder.close()
        conn = await asyncpg.connect(plain_database_url(db_url), timeout=10)
        try:
            assert await conn.fetchval("select to_regclass('t')") is None
        finally:
            await conn.close()
        await drop_test_database(servers.database_url, "flexinfer_t1")
        admin = await asyncpg.connect(plain_database_url(servers.database_url), timeout=10)
        try:
            assert await admin.fetchval("select count(*) from pg_database where datname = 'flexinfer_t1'") == 0
        finally:
            await admin.close()
        nc = await nats.connect(servers.nats_url, connect_timeout=5)
        await nc.close()
    finally:
        servers.close()
