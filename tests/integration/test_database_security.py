"""The embedded PostgreSQL of ``flexinfer up`` is closed (issue 22, "the database is open"): another local account
cannot connect to it nor read its passwords, and the role the services use cannot run programs or reach other
databases. The server is started by ``Up``'s own start-up code (the NATS URL is given, so only PostgreSQL starts).

The other account is created with ``useradd`` when the tests run as root; otherwise the test is skipped, as
there is no second account to try with.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from flexinfer_cli.embedded import PG_SYSTEM_USER, EmbeddedPostgres, _ensure_system_user, find_postgres_bindir
from flexinfer_cli.local_system import DATABASE_NAME, DATABASE_ROLE, Up, UpOptions
from tests.unit.test_cli_up import base_env

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

ATTACKER = "flexinfer-attacker"


def attacker() -> pwd.struct_passwd:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second, unprivileged local account (useradd) to attack from")
    try:
        return pwd.getpwnam(ATTACKER)
    except KeyError:
        useradd = shutil.which("useradd")
        if useradd is None:
            pytest.skip("running as root but there is no useradd to create the unprivileged account")
        subprocess.run(
            [useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", ATTACKER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(ATTACKER)


def as_attacker(argv: list[str]) -> subprocess.CompletedProcess[str]:
    who = attacker()
    env = {"PATH": "/usr/bin:/bin", "HOME": "/nonexistent"}
    return subprocess.run(
        argv, user=who.pw_uid, group=who.pw_gid, extra_groups=[], env=env, cwd="/", capture_output=True, text=True
    )


@pytest.fixture
async def embedded(tmp_path: Path) -> AsyncIterator[tuple[EmbeddedPostgres, str]]:
    """The embedded PostgreSQL as ``flexinfer up`` starts it, and the database URL the services get."""
    up = Up(UpOptions(state_dir=tmp_path / "state", env=base_env(FLEXINFER_NATS_URL="nats://127.0.0.1:1")))
    try:
        _, database_url = await up._start_infrastructure()
        assert up.postgres is not None
        yield up.postgres, database_url
    finally:
        await up._stop_everything()


def pwned() -> bool:
    """Whether the COPY ... TO PROGRAM below ran its program."""
    return Path("/tmp/flexinfer-pwned").exists()


def psql(pg: EmbeddedPostgres, user: str, database: str) -> list[str]:
    return [
        str(pg.bin_dir / "psql"),
        "-X",
        "-w",  # never prompt: no password is what another account has
        "-h",
        "127.0.0.1",
        "-p",
        str(pg.port),
        "-U",
        user,
        "-d",
        database,
        "-c",
        "SELECT 1",
    ]


async def test_another_local_account_cannot_connect_nor_read_the_passwords(
    embedded: tuple[EmbeddedPostgres, str],
) -> None:
    pg, _ = embedded
    attacker()  # skip early when there is no second account
    for user, database in (("postgres", "postgres"), (DATABASE_ROLE, DATABASE_NAME), ("postgres", DATABASE_NAME)):
        tried = as_attacker(psql(pg, user, database))
        assert tried.returncode != 0, f"{ATTACKER} connected as {user} to {database}: {tried.stdout}"
        # it reached the server (the port answers) and was asked for a password it does not have
        assert "password" in tried.stderr, tried.stderr
    for secret in (pg.password_file, pg.role_password_file(DATABASE_ROLE)):
        assert secret.is_file()
        # the folders are traversable (the server's own system user needs that), the file itself is not readable
        assert as_attacker(["/bin/sh", "-c", f"test -e '{secret}'"]).returncode == 0
        read = as_attacker(["/bin/cat", str(secret)])
        assert read.returncode != 0 and "Permission denied" in read.stderr, read
        assert oct(secret.stat().st_mode & 0o777) == "0o600"
    # the right password does get in: the refusals above are authentication, not an unreachable server
    conn = await asyncpg.connect(pg.dsn(), timeout=10)
    await conn.close()


async def test_the_services_role_cannot_run_programs_or_reach_other_databases(
    embedded: tuple[EmbeddedPostgres, str],
) -> None:
    pg, database_url = embedded
    assert f"//{DATABASE_ROLE}:" in database_url  # what the services get: the owner role, not the superuser
    conn = await asyncpg.connect(pg.dsn(DATABASE_NAME, role=DATABASE_ROLE), timeout=10)
    try:
        # the migrations ran as the role, so it owns FlexInfer's tables
        owners = await conn.fetch("SELECT DISTINCT tableowner FROM pg_tables WHERE schemaname = 'public'")
        assert [row["tableowner"] for row in owners] == [DATABASE_ROLE]
        assert (
            await conn.fetchval(
                "SELECT rolsuper OR rolcreaterole OR rolcreatedb FROM pg_roles WHERE rolname = $1", DATABASE_ROLE
            )
            is False
        )
        with pytest.raises(asyncpg.InsufficientPrivilegeError, match="external program"):
            await conn.execute("COPY (SELECT 1) TO PROGRAM 'id > /tmp/flexinfer-pwned'")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute(f"ALTER ROLE {DATABASE_ROLE} SUPERUSER")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.execute("CREATE ROLE intruder LOGIN SUPERUSER")
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await conn.fetch("SELECT pg_read_file('/etc/passwd')")
    finally:
        await conn.close()
    with pytest.raises(asyncpg.InsufficientPrivilegeError, match="CONNECT"):
        await asyncpg.connect(pg.dsn("postgres", role=DATABASE_ROLE), timeout=10)
    assert not pwned()


def single_user(bindir: Path, pgdata: Path, database: str, sql: str, run_as: dict[str, Any]) -> None:
    """Run SQL on a stopped cluster in single-user mode (nothing listens)."""
    done = subprocess.run(
        [str(bindir / "postgres"), "--single", "-D", str(pgdata), database],
        input=sql,
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
        **run_as,
    )
    assert "ERROR" not in done.stdout + done.stderr, done


def legacy_cluster(tmp_path: Path) -> Path:
    """The data folder of an older release: initdb --auth=trust, no password file, a table owned by postgres."""
    data = tmp_path / "pg"
    pgdata = data / "pgdata"
    pgdata.mkdir(parents=True, mode=0o700)
    run_as: dict[str, Any] = {}
    if os.geteuid() == 0:  # PostgreSQL refuses root: the system user EmbeddedPostgres runs it as
        who = _ensure_system_user(PG_SYSTEM_USER)
        for path in (tmp_path, data):
            path.chmod(0o711)
        os.chown(pgdata, who.uid, who.gid)
        run_as = {"user": who.uid, "group": who.gid, "extra_groups": []}
    bindir = find_postgres_bindir()
    initdb = [str(bindir / "initdb"), "-D", str(pgdata), "--auth=trust", "-U", "postgres", "--no-sync"]
    subprocess.run(initdb, check=True, capture_output=True, cwd="/", **run_as)
    single_user(bindir, pgdata, "postgres", "CREATE DATABASE flexinfer;\n", run_as)
    single_user(bindir, pgdata, "flexinfer", "CREATE TABLE models (name text);\n", run_as)

    return data


async def test_a_cluster_of_an_older_release_is_closed_at_its_next_start(tmp_path: Path) -> None:
    """A state folder made before passwords (initdb --auth=trust, no password file, tables owned by the superuser)
    gets the superuser's password before the server listens, and the database and its tables go to the role."""
    data = legacy_cluster(tmp_path)
    pg = EmbeddedPostgres(data, durable=False)
    assert not pg.password_file.exists()
    with pg:
        pg.ensure_app_database(DATABASE_NAME, DATABASE_ROLE)
        with pytest.raises(asyncpg.InvalidPasswordError):
            await asyncpg.connect(f"postgresql://postgres@127.0.0.1:{pg.port}/postgres", timeout=10)
        conn = await asyncpg.connect(pg.dsn(DATABASE_NAME, role=DATABASE_ROLE), timeout=10)
        try:
            assert await conn.fetchval("SELECT tableowner FROM pg_tables WHERE tablename = 'models'") == DATABASE_ROLE
            assert (
                await conn.fetchval("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = $1", DATABASE_NAME)
                == DATABASE_ROLE
            )
        finally:
            await conn.close()
