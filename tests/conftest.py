"""Shared fixtures: real NATS and real Postgres for integration tests.

Servers come from FLEXINFER_TEST_NATS_URL / FLEXINFER_TEST_DATABASE_URL when set, else testcontainers when a
Docker engine answers, else the embedded servers that ``flexinfer up`` uses (see tests/support/servers.py).
Each test gets a fresh database with migrations applied and a NATS server with no FlexInfer streams left over.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.kube.fixtures import kube  # noqa: F401  (the emulated Kubernetes cluster fixture)
from tests.support.servers import TestServers, create_test_database, drop_test_database, start_test_servers

_OWN_BASETEMP: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    """Each test session gets a temporary folder of its own (unless ``--basetemp`` is given). pytest's default
    root, /tmp/pytest-of-<user>, is shared by every session of the user, and each new session resets its mode to
    0700: a concurrent session would cut the embedded PostgreSQL (running as its own system user) off its data."""
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        base = Path(tempfile.mkdtemp(prefix="flexinfer-pytest-"))
        config.option.basetemp = str(base / "t")
        _OWN_BASETEMP.append(base)


def pytest_unconfigure(config: pytest.Config) -> None:
    failed = getattr(config, "_flexinfer_failed", False)
    for base in _OWN_BASETEMP:
        if not failed:
            shutil.rmtree(base, ignore_errors=True)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._flexinfer_failed = exitstatus != 0  # type: ignore[attr-defined]  # keep the evidence


@pytest.fixture(scope="session")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestServers]:
    started = start_test_servers(Path(tmp_path_factory.mktemp("servers")))
    try:
        yield started
    finally:
        started.close()


@pytest.fixture
def nats_url(servers: TestServers) -> str:
    return servers.nats_url


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


@pytest.fixture
async def clean_nats(nats_url: str) -> str:
    await reset_nats(nats_url)
    return nats_url


@contextlib.asynccontextmanager
async def fresh_database(servers: TestServers) -> AsyncIterator[str]:
    """A new database with the migrations applied, dropped afterwards."""
    from flexinfer_common.db import upgrade_database

    name = f"flexinfer_test_{uuid.uuid4().hex[:12]}"
    url = await create_test_database(servers.database_url, name)
    await upgrade_database(url)
    try:
        yield url
    finally:
        await drop_test_database(servers.database_url, name)


@pytest.fixture
async def database_url(servers: TestServers) -> AsyncIterator[str]:
    async with fresh_database(servers) as url:
        yield url


@pytest.fixture
async def bus(clean_nats: str) -> AsyncIterator[object]:
    from flexinfer_common.bus import Bus

    connected = Bus(clean_nats, name="test")
    await connected.connect()
    await connected.ensure_streams()
    try:
        yield connected
    finally:
        await connected.close()
