"""The bus credentials of `flexinfer up` (cli/bus_credentials.py), the services' NATS settings and what they log."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from flexinfer_cli.bus_credentials import cli_auth, credentials_file, ensure_credentials
from flexinfer_common.nats_auth import Identity, NatsAuth, redact_url
from flexinfer_common.settings import CommonSettings, SettingsError, load_settings


def test_credentials_are_private_and_reused_across_restarts(tmp_path: Path) -> None:
    state = tmp_path / "state"
    first = ensure_credentials(state)
    assert set(first) == set(Identity) and len(set(first.values())) == len(Identity)
    assert all(len(p) >= 32 for p in first.values())
    path = credentials_file(state)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) & 0o066 == 0
    assert ensure_credentials(state) == first  # the same state folder, the same passwords
    path.chmod(0o644)
    assert ensure_credentials(state) == first and stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_credentials_file_missing_an_identity_gets_one_and_keeps_the_others(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    credentials_file(state).write_text(json.dumps({"proxy": "kept-password"}))
    passwords = ensure_credentials(state)
    assert passwords[Identity.PROXY] == "kept-password"
    assert json.loads(credentials_file(state).read_text())["scheduler"] == passwords[Identity.SCHEDULER]


@pytest.mark.parametrize(
    ("env", "url", "expected_user"),
    [
        pytest.param({}, "nats://127.0.0.1:4222", "demand", id="state-folder-identity"),
        pytest.param({"FLEXINFER_NATS_USER": "ops", "FLEXINFER_NATS_PASSWORD": "pw"}, "nats://h:1", "ops", id="env"),
        pytest.param({}, "nats://me:pw@127.0.0.1:4222", None, id="url-credentials-win"),
    ],
)
def test_the_cli_finds_its_identity(tmp_path: Path, env: dict[str, str], url: str, expected_user: str | None) -> None:
    ensure_credentials(tmp_path)
    assert cli_auth(Identity.DEMAND, url, env, tmp_path).user == expected_user


def test_the_cli_without_readable_credentials_connects_without(tmp_path: Path) -> None:
    assert cli_auth(Identity.DEMAND, "nats://127.0.0.1:4222", {}, tmp_path) == NatsAuth()


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        pytest.param("nats://proxy:s3cret@127.0.0.1:4222", "nats://proxy:***@127.0.0.1:4222", id="password"),
        pytest.param("nats://a:x@h1:1,nats://h2:2", "nats://a:***@h1:1,nats://h2:2", id="list"),
        pytest.param("nats://127.0.0.1:4222", "nats://127.0.0.1:4222", id="none"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_connect_options_use_the_identitys_own_inbox() -> None:
    options = NatsAuth(user="proxy", password="pw").connect_options("nats://h:1")
    assert options == {"user": "proxy", "password": "pw", "inbox_prefix": "_INBOX.proxy"}
    assert NatsAuth().connect_options("nats://actuator:pw@h:1") == {"inbox_prefix": "_INBOX.actuator"}
    assert "pw" not in repr(NatsAuth(user="proxy", password="pw"))


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"nats_password": "pw"}, "FLEXINFER_NATS_USER is not", id="password-without-user"),
        pytest.param({"nats_creds": "/nonexistent/x.creds"}, "FLEXINFER_NATS_CREDS: cannot read", id="creds-missing"),
        pytest.param({"nats_tls_cert": "/etc/hostname"}, "go together", id="cert-without-key"),
        pytest.param({"nats_user": "a", "nats_nkey": "/etc/hostname"}, "choose one way", id="two-ways"),
        pytest.param({"nats_url": "http://u:s3cret@h"}, "FLEXINFER_NATS_URL: not a NATS URL", id="bad-url"),
    ],
)
def test_bad_nats_settings_stop_the_service_naming_the_variable(values: dict[str, str], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as caught:
        load_settings(CommonSettings, **values)
    assert "s3cret" not in str(caught.value)


def test_the_bus_password_is_a_secret_no_log_shows() -> None:
    settings = load_settings(
        CommonSettings, nats_user="proxy", nats_password="pw-1", nats_url="nats://x:pw-2@127.0.0.1:4222"
    )
    assert {"pw-1", "pw-2"} <= set(settings.secret_values())
    assert "pw-1" not in repr(settings)
