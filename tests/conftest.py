"""Shared fixtures: real NATS and real Postgres for integration tests.

Servers come from FLEXINFER_TEST_NATS_URL / FLEXINFER_TEST_DATABASE_URL when set, else testcontainers when a
Docker engine answers, else the embedded servers that ``flexinfer up`` uses (see flexinfer_testbed/servers.py).
Each test gets a fresh database with migrations applied and a NATS server with no FlexInfer streams left over.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from flexinfer_testbed.servers import (
    TestServers,
    fresh_database,
    reset_nats,
    start_test_servers,
)
from tests.support.kube_fixtures import kube, kube_system  # noqa: F401  (the emulated Kubernetes cluster fixtures)
from tests.support.run_as import suite_run_as
from tests.support.system import start_system  # noqa: F401  (the whole system on the test's database and NATS)

# what tests measured, shown at the end of the run (tests/support/figures.py)
pytest_plugins = ["tests.support.figures"]

_OWN_BASETEMP: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    """Each test session gets a temporary folder of its own (unless ``--basetemp`` is given). pytest's default
    root, /tmp/pytest-of-<user>, is shared by every session of the user, and each new session resets its mode to
    0700: a concurrent session would cut the embedded PostgreSQL (running as its own system user) off its data."""
    # Every service a test starts in-process or as a child inherits this (see tests/support/run_as.py).
    os.environ.update(suite_run_as())
    if config.option.basetemp is None and not hasattr(config, "workerinput"):
        base = Path(tempfile.mkdtemp(prefix="flexinfer-pytest-"))
        config.option.basetemp = str(base / "t")
        _OWN_BASETEMP.append(base)


# What a test may start, by marker (pyproject's markers list says the same): a test that asks for a fixture
# starting something must carry its marker, and tests/unit holds none of them, so `make test-unit` starts nothing.
STARTS = {"servers": "integration", "kube": "emulator"}
SERVER_MARKERS = frozenset({"integration", "e2e", "chaos"})
UNIT_DIR = Path(__file__).parent / "unit"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    problems = []
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        marks = {mark.name for mark in item.iter_markers()}
        for fixture, marker in STARTS.items():
            if fixture in fixtures and marker not in marks:
                problems.append(f"{item.nodeid} uses the {fixture} fixture but is not marked {marker}")
        if UNIT_DIR in item.path.parents and marks & (SERVER_MARKERS | {"emulator"}):
            problems.append(
                f"{item.nodeid} is marked {sorted(marks & (SERVER_MARKERS | {'emulator'}))}: not a unit test"
            )
    if problems:
        raise pytest.UsageError("test markers that do not tell the truth:\n  " + "\n  ".join(problems))
    # the tests in front of real inference servers run last: on a fresh machine their llama.cpp build (started in
    # the background by .ci/run) then overlaps the rest of the suite instead of blocking it
    items.sort(key=lambda item: item.path.name == "test_real_servers.py")


@pytest.fixture(autouse=True)
def _unmarked_tests_start_no_server(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """A test that starts a server its markers do not name fails, naming it: NATS or PostgreSQL (embedded, or a
    testcontainers one) without integration/e2e/chaos, the Kubernetes API emulator without emulator. The collection
    check above sees the fixtures; this sees a test (or a fixture of its file) that calls the starters directly."""
    marks = {mark.name for mark in request.node.iter_markers()}

    def refuse(what: str, marker: str) -> Callable[..., NoReturn]:
        def refused(*args: object, **_: object) -> NoReturn:
            pytest.fail(f"{request.node.nodeid} started {what} {args} but is not marked {marker}", pytrace=False)

        return refused

    if not marks & SERVER_MARKERS:
        import flexinfer_cli.embedded
        import flexinfer_testbed.servers

        monkeypatch.setattr(flexinfer_cli.embedded, "_popen", refuse("a server", "integration"))
        for starter in ("_start_nats_container", "_start_postgres_container"):
            monkeypatch.setattr(flexinfer_testbed.servers, starter, refuse("a container", "integration"))
    if "emulator" not in marks:
        from flexinfer_testbed.kube.server import Emulator

        monkeypatch.setattr(Emulator, "start", refuse("the Kubernetes API emulator", "emulator"))


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


@pytest.fixture
async def clean_nats(nats_url: str) -> str:
    await reset_nats(nats_url)
    return nats_url


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
