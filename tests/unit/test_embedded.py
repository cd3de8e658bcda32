"""The pure parts of flexinfer_cli.embedded and of the test-server helpers (URLs, loopback checks, secret files);
the servers themselves are started in tests/integration/test_embedded_servers.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flexinfer_cli.embedded import free_port, mask_url_password, read_or_create_secret
from flexinfer_testbed.servers import (
    ENV_DATABASE_URL,
    ENV_NATS_URL,
    normalize_database_url,
    plain_database_url,
    start_test_servers,
)
from tests.support.processes import alive


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not alive(pid):
            return True
        time.sleep(0.05)
    return not alive(pid)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_free_port_is_bindable() -> None:
    assert _port_free(free_port())


# --------------------------------------------------------------------------------------------------
# flexinfer_testbed/servers.py
# --------------------------------------------------------------------------------------------------


def test_database_url_normalization() -> None:
    assert normalize_database_url("postgresql://u:p@127.0.0.1:5/db") == "postgresql+asyncpg://u:p@127.0.0.1:5/db"
    assert normalize_database_url("postgres://u@localhost/db?sslmode=disable") == (
        "postgresql+asyncpg://u@localhost/db?ssl=disable"
    )
    assert plain_database_url("postgresql+asyncpg://u@localhost/db?ssl=disable") == (
        "postgresql://u@localhost/db?sslmode=disable"
    )
    with pytest.raises(ValueError):
        normalize_database_url("mysql://u@localhost/db")


@pytest.mark.parametrize(
    ("var", "value"),
    [
        (ENV_DATABASE_URL, "postgresql://u@10.1.2.3:5432/db"),
        (ENV_DATABASE_URL, "postgresql://u@db.example.com/db"),
        (ENV_NATS_URL, "nats://127.0.0.1:4222,nats://nats.example.com:4222"),
    ],
)
def test_env_urls_must_be_loopback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    monkeypatch.setenv(ENV_DATABASE_URL, "postgresql://u@127.0.0.1:5432/db")
    monkeypatch.setenv(ENV_NATS_URL, "nats://[::1]:4222")
    monkeypatch.setenv(var, value)
    with pytest.raises(RuntimeError, match="loopback"):
        start_test_servers(tmp_path, use_docker=False)


def test_env_urls_are_used_as_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_DATABASE_URL, "postgresql://u@localhost:5432/admin")
    monkeypatch.setenv(ENV_NATS_URL, "nats://127.0.0.1:4222")
    with start_test_servers(tmp_path, use_docker=False) as servers:
        assert servers.database_url == "postgresql+asyncpg://u@localhost:5432/admin"
        assert servers.nats_url == "nats://127.0.0.1:4222"
        assert (servers.nats_source, servers.database_source) == ("env", "env")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param(
            "postgresql+asyncpg://u:s3cr%40t@127.0.0.1:5/db", "postgresql+asyncpg://u:***@127.0.0.1:5/db", id="masked"
        ),
        pytest.param("postgresql://u@127.0.0.1:5/db", "postgresql://u@127.0.0.1:5/db", id="no-password"),
    ],
)
def test_a_logged_database_url_has_no_password(url: str, shown: str) -> None:
    assert mask_url_password(url) == shown


def test_a_generated_secret_is_private_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "state" / "x.password"
    first = read_or_create_secret(path)
    assert len(first) >= 32 and oct(path.stat().st_mode & 0o777) == "0o600"
    assert read_or_create_secret(path) == first
    path.chmod(0o644)
    assert read_or_create_secret(path) == first
    assert oct(path.stat().st_mode & 0o777) == "0o600"
