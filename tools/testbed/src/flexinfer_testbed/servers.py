"""NATS + PostgreSQL for the test-suite.

Resolution order, independently for NATS and for PostgreSQL:

1. ``FLEXINFER_TEST_NATS_URL`` / ``FLEXINFER_TEST_DATABASE_URL`` when set. They must point at a
   loopback host (tests drop databases ``WITH (FORCE)``); a libpq ``postgresql://`` URL is accepted
   and normalized to ``postgresql+asyncpg://``.
2. testcontainers (``nats:2.10 -js``, ``postgres:16-alpine``) when a Docker engine answers a ping
   within ~2 s (set ``FLEXINFER_TEST_DOCKER=0`` to skip Docker).
3. The embedded servers from :mod:`flexinfer_cli.embedded`, with their data in ``tmp_root``.

Usage (e.g. in a session fixture)::

    servers = start_test_servers(tmp_path_factory.mktemp("servers"))
    try:
        db_url = await create_test_database(servers.database_url, "t_scheduler")
        ...
    finally:
        servers.close()
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import secrets
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.engine import make_url

from flexinfer_cli.embedded import EmbeddedNats, EmbeddedPostgres, mask_url_password
from flexinfer_common.nats_auth import Identity, redact_url

__all__ = [
    "ENV_DATABASE_URL",
    "ENV_NATS_URL",
    "TestServers",
    "create_test_database",
    "docker_available",
    "drop_test_database",
    "identity_url",
    "normalize_database_url",
    "plain_database_url",
    "reset_nats",
    "start_test_servers",
]

log = logging.getLogger("flexinfer.tests.servers")

ENV_NATS_URL = "FLEXINFER_TEST_NATS_URL"
ENV_DATABASE_URL = "FLEXINFER_TEST_DATABASE_URL"
ENV_DOCKER = "FLEXINFER_TEST_DOCKER"
NATS_IMAGE = "nats:2.10"
POSTGRES_IMAGE = "postgres:16-alpine"

Source = Literal["env", "docker", "embedded"]


class TestServers:
    """Where the test NATS and PostgreSQL live; ``close()`` stops whatever we started."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        nats_url: str,
        database_url: str,
        *,
        nats_source: Source,
        database_source: Source,
        closers: list[Callable[[], None]] | None = None,
    ) -> None:
        self.nats_url = nats_url
        #: SQLAlchemy asyncpg URL of an admin database (create test databases from it).
        self.database_url = database_url
        self.nats_source: Source = nats_source
        self.database_source: Source = database_source
        self._closers = list(closers or [])

    def close(self) -> None:
        """Stop servers we started (in reverse start order). Idempotent."""
        while self._closers:
            closer = self._closers.pop()
            try:
                closer()
            except Exception:
                log.exception("failed to stop a test server")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"TestServers(nats={redact_url(self.nats_url)!r} [{self.nats_source}], "
            f"database={mask_url_password(self.database_url)!r} [{self.database_source}])"
        )


# --------------------------------------------------------------------------------------------------
# URLs
# --------------------------------------------------------------------------------------------------


def normalize_database_url(url: str) -> str:
    """``postgres://`` / ``postgresql://`` / ``postgresql+psycopg[2]://`` -> ``postgresql+asyncpg://``.

    A libpq ``sslmode`` query parameter is renamed to asyncpg's ``ssl``.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() not in ("postgresql", "postgres"):
        raise ValueError(f"not a PostgreSQL URL: {url!r}")
    parsed = parsed.set(drivername="postgresql+asyncpg")
    if "sslmode" in parsed.query:
        query = dict(parsed.query)
        query["ssl"] = query.pop("sslmode")
        parsed = parsed.set(query=query)
    return parsed.render_as_string(hide_password=False)


def plain_database_url(url: str) -> str:
    """SQLAlchemy URL -> libpq/asyncpg DSN (``postgresql://...``)."""
    parsed = make_url(normalize_database_url(url)).set(drivername="postgresql")
    if "ssl" in parsed.query:
        query = dict(parsed.query)
        query["sslmode"] = query.pop("ssl")
        parsed = parsed.set(query=query)
    return parsed.render_as_string(hide_password=False)


def _is_loopback_host(host: str | None) -> bool:
    if not host:
        return False
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    if host.startswith("/"):
        return True  # unix-domain socket directory: local by construction
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _require_loopback(var: str, hosts: list[str | None]) -> None:
    bad = [h for h in hosts if not _is_loopback_host(h)]
    if bad:
        raise RuntimeError(
            f"{var} must point at a loopback server (127.0.0.0/8, localhost or ::1) because the tests "
            f"create and force-drop databases/streams there; refusing host(s) {bad!r}"
        )


def _nats_url_from_env(value: str) -> str:
    hosts: list[str | None] = []
    for part in value.split(","):
        part = part.strip()
        hosts.append(urlsplit(part if "://" in part else f"nats://{part}").hostname)
    _require_loopback(ENV_NATS_URL, hosts)
    return value


def _database_url_from_env(value: str) -> str:
    url = normalize_database_url(value)
    parsed = make_url(url)
    host = parsed.host or parsed.query.get("host")
    _require_loopback(ENV_DATABASE_URL, [host if isinstance(host, str) else None])
    return url


# --------------------------------------------------------------------------------------------------
# Docker / testcontainers
# --------------------------------------------------------------------------------------------------


def docker_available(timeout: float = 2.0) -> bool:
    """True if a Docker engine answers a ping within ``timeout`` seconds."""
    if os.environ.get(ENV_DOCKER, "").strip().lower() in ("0", "false", "no", "off"):
        return False
    try:
        import docker
    except ImportError:
        return False
    try:
        client = docker.from_env(timeout=max(1, round(timeout)))
        try:
            return bool(client.ping())
        finally:
            client.close()
    except Exception as exc:  # docker.errors.DockerException, requests errors, ...
        log.debug("no Docker engine: %s", exc)
        return False


def _start_nats_container() -> tuple[str, Callable[[], None]]:
    nats_cls: Any = None
    try:
        from testcontainers.community.nats import NatsContainer

        nats_cls = NatsContainer
    except ImportError:  # testcontainers < 4.10
        with contextlib.suppress(ImportError):
            from testcontainers.nats import NatsContainer as OldNatsContainer

            nats_cls = OldNatsContainer
    container: Any
    if nats_cls is not None:
        container = nats_cls(NATS_IMAGE, jetstream=True)
        container.start()
        url = container.nats_uri()
    else:
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.waiting_utils import wait_for_logs

        container = DockerContainer(NATS_IMAGE).with_command("-js").with_exposed_ports(4222)
        container.start()
        wait_for_logs(container, "Server is ready", timeout=60)
        url = f"nats://{container.get_container_host_ip()}:{container.get_exposed_port(4222)}"
    return url, container.stop


def _start_postgres_container() -> tuple[str, Callable[[], None]]:
    try:
        from testcontainers.community.postgres import PostgresContainer
    except ImportError:  # testcontainers < 4.10
        from testcontainers.postgres import PostgresContainer
    container = PostgresContainer(
        POSTGRES_IMAGE, username="postgres", password="postgres", dbname="postgres", driver="asyncpg"
    ).with_command("postgres -c fsync=off -c synchronous_commit=off -c full_page_writes=off")
    container.start()
    url = normalize_database_url(container.get_connection_url())
    return url, container.stop


# --------------------------------------------------------------------------------------------------
# bus identities of the embedded test NATS
# --------------------------------------------------------------------------------------------------

#: The passwords of each embedded test NATS (by its URL without credentials).
NATS_PASSWORDS: dict[str, dict[Identity, str]] = {}


def _bare(url: str) -> str:
    split = urlsplit(url)
    return urlunsplit(split._replace(netloc=f"{split.hostname}:{split.port}"))


def identity_url(url: str, identity: Identity | str) -> str:
    """``url`` (of a test NATS, with or without credentials) as ``identity`` connects to it; unchanged for a NATS
    without authorization (one from FLEXINFER_TEST_NATS_URL or Docker)."""
    bare = _bare(url)
    passwords = NATS_PASSWORDS.get(bare)
    if passwords is None:
        return url
    split = urlsplit(bare)
    who = Identity(identity)
    return urlunsplit(split._replace(netloc=f"{who.value}:{passwords[who]}@{split.netloc}"))


def bare_url(url: str) -> str:
    """``url`` without credentials (an unauthenticated client's)."""
    return _bare(url)


# --------------------------------------------------------------------------------------------------
# entry point
# --------------------------------------------------------------------------------------------------


def start_test_servers(tmp_root: Path, *, use_docker: bool | None = None) -> TestServers:
    """Find or start NATS and PostgreSQL for tests (see module docstring for the order).

    ``use_docker``: ``None`` = auto-detect, ``False`` = never use testcontainers.
    Embedded servers keep their data under ``tmp_root``; PostgreSQL runs with ``durable=False``.
    """
    nats_env = os.environ.get(ENV_NATS_URL, "").strip()
    db_env = os.environ.get(ENV_DATABASE_URL, "").strip()
    closers: list[Callable[[], None]] = []
    nats_url = _nats_url_from_env(nats_env) if nats_env else None
    database_url = _database_url_from_env(db_env) if db_env else None
    nats_source: Source = "env"
    database_source: Source = "env"

    try:
        if nats_url is None or database_url is None:
            docker_ok = docker_available() if use_docker is None else use_docker
            if docker_ok:
                try:
                    if database_url is None:
                        database_url, stop = _start_postgres_container()
                        closers.append(stop)
                        database_source = "docker"
                    if nats_url is None:
                        nats_url, stop = _start_nats_container()
                        closers.append(stop)
                        nats_source = "docker"
                except Exception:
                    log.warning("testcontainers failed; falling back to embedded servers", exc_info=True)
            tmp_root = Path(tmp_root)
            if database_url is None:
                pg = EmbeddedPostgres(tmp_root / "postgres", durable=False)
                database_url = pg.start()
                closers.append(pg.stop)
                database_source = "embedded"
            if nats_url is None:
                # With the bus's authorization, as `flexinfer up` runs it: the fixtures connect as the admin, the
                # services of flexinfer_testbed.system each as its own identity (see identity_url).
                passwords = {identity: secrets.token_urlsafe(16) for identity in Identity}
                nats = EmbeddedNats(tmp_root / "nats", passwords=passwords)
                plain = nats.start()
                NATS_PASSWORDS[plain] = passwords
                nats_url = identity_url(plain, Identity.ADMIN)
                closers.append(nats.stop)
                nats_source = "embedded"
    except BaseException:
        for closer in reversed(closers):
            with contextlib.suppress(Exception):
                closer()
        raise

    servers = TestServers(
        nats_url,
        database_url,
        nats_source=nats_source,
        database_source=database_source,
        closers=closers,
    )
    log.info("test servers: %r", servers)
    return servers


# --------------------------------------------------------------------------------------------------
# per-test databases
# --------------------------------------------------------------------------------------------------


def _ident(name: str) -> str:
    if not name or len(name.encode()) > 63:
        raise ValueError(f"invalid PostgreSQL database name {name!r} (1..63 bytes)")
    return '"' + name.replace('"', '""') + '"'


async def create_test_database(admin_url: str, name: str) -> str:
    """(Re)create database ``name`` (dropping any old one WITH (FORCE)); return its SQLAlchemy URL."""
    import asyncpg

    ident = _ident(name)
    conn = await asyncpg.connect(plain_database_url(admin_url), timeout=10)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {ident} WITH (FORCE)")
        await conn.execute(f"CREATE DATABASE {ident}")
    finally:
        await conn.close()
    return make_url(normalize_database_url(admin_url)).set(database=name).render_as_string(hide_password=False)


async def drop_test_database(admin_url: str, name: str) -> None:
    """Drop database ``name`` if it exists, disconnecting its sessions."""
    import asyncpg

    ident = _ident(name)
    conn = await asyncpg.connect(plain_database_url(admin_url), timeout=10)
    try:
        await conn.execute(f"DROP DATABASE IF EXISTS {ident} WITH (FORCE)")
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def fresh_database(servers: TestServers, *, prefix: str = "flexinfer_test") -> AsyncIterator[str]:
    """A new database named ``<prefix>_<random>`` with the migrations applied, dropped afterwards."""
    from flexinfer_common.db import upgrade_database

    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    url = await create_test_database(servers.database_url, name)
    await upgrade_database(url)
    try:
        yield url
    finally:
        await drop_test_database(servers.database_url, name)


async def reset_nats(url: str) -> None:
    """Delete every FlexInfer stream and bucket, so a test sees no messages or consumers of an earlier one."""
    import nats
    from nats.js.errors import NotFoundError

    from flexinfer_common.bus import STREAMS
    from flexinfer_common.subjects import ROUTES_BUCKET

    nc = await nats.connect(url)
    try:
        js = nc.jetstream()
        for name in [s.name for s in STREAMS] + [f"KV_{ROUTES_BUCKET}"]:
            with contextlib.suppress(NotFoundError):
                await js.delete_stream(name or "")
    finally:
        await nc.close()
