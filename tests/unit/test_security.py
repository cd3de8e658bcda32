"""Secure defaults (docs/reference.md sections 4 and 8): loopback binding, the admin token rule, the local-command
allow-list, the one error shape, secrets kept out of logs, and the admin token `flexinfer up` generates."""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from flexinfer_cli.config import admin_token
from flexinfer_cli.local_system import ensure_admin_token
from flexinfer_common.errors import ApiError
from flexinfer_common.local_commands import (
    DEFAULT_LOCAL_ENV,
    CommandRule,
    allowed_commands,
    check_local_command,
    check_local_env,
    check_local_process,
    invalid_env_entries,
)
from flexinfer_common.logs import REDACTED, JsonFormatter
from flexinfer_common.messages import message_id
from flexinfer_common.service import admin_app, admin_router, install_error_handlers
from flexinfer_common.settings import DEFAULT_LOCAL_COMMANDS, CommonSettings, SettingsError, load_settings


@pytest.fixture(autouse=True)
def no_flexinfer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("FLEXINFER_"):
            monkeypatch.delenv(name)


# -- binding and the admin token rule ---------------------------------------------------------------------


def test_services_bind_to_loopback_by_default() -> None:
    settings = load_settings(CommonSettings)
    assert settings.bind_host == "127.0.0.1"
    assert settings.security_warnings() == []


@pytest.mark.parametrize(
    "host", [pytest.param("0.0.0.0", id="all-v4"), pytest.param("::", id="all-v6"), pytest.param("10.1.2.3", id="lan")]
)
def test_beyond_loopback_without_a_token_refuses_to_start(monkeypatch: pytest.MonkeyPatch, host: str) -> None:
    monkeypatch.setenv("FLEXINFER_BIND_HOST", host)
    with pytest.raises(SettingsError) as caught:
        load_settings(CommonSettings)
    text = str(caught.value)
    assert "FLEXINFER_BIND_HOST" in text and "FLEXINFER_ADMIN_TOKEN" in text and "FLEXINFER_ADMIN_AUTH=disabled" in text


@pytest.mark.parametrize(
    ("env", "warned"),
    [
        pytest.param({"FLEXINFER_ADMIN_TOKEN": "t0ken-value"}, False, id="token-given"),
        pytest.param({"FLEXINFER_ADMIN_AUTH": "disabled"}, True, id="explicit-opt-out-warns"),
    ],
)
def test_beyond_loopback_starts_with_a_token_or_an_explicit_opt_out(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], warned: bool
) -> None:
    monkeypatch.setenv("FLEXINFER_BIND_HOST", "0.0.0.0")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    settings = load_settings(CommonSettings)
    assert bool(settings.security_warnings()) is warned


def test_a_bad_secret_setting_is_reported_without_its_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXINFER_DATABASE_URL", "mysql://user:hunter22@db/x")
    with pytest.raises(SettingsError) as caught:
        load_settings(CommonSettings)
    assert "FLEXINFER_DATABASE_URL" in str(caught.value)
    assert "hunter22" not in str(caught.value)


def test_local_commands_is_a_comma_separated_list_replacing_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(CommonSettings).local_commands == DEFAULT_LOCAL_COMMANDS
    monkeypatch.setenv("FLEXINFER_LOCAL_COMMANDS", "vllm, /opt/llama/llama-server,,")
    assert load_settings(CommonSettings).local_commands == ("vllm", "/opt/llama/llama-server")
    monkeypatch.setenv("FLEXINFER_LOCAL_COMMANDS", "bin/serve")
    with pytest.raises(SettingsError, match=r"FLEXINFER_LOCAL_COMMANDS: .*'bin/serve'"):
        load_settings(CommonSettings)


# -- the allow-list rule ----------------------------------------------------------------------------------

ALLOWED = ("vllm", "flexinfer-fake-model", "/opt/llama/llama-server")


@pytest.mark.parametrize(
    ("command", "env", "rule"),
    [
        pytest.param(["vllm", "serve", "m"], {}, CommandRule.ALLOWED, id="listed-name"),
        pytest.param(["/opt/llama/llama-server", "-m", "x"], {}, CommandRule.ALLOWED, id="listed-absolute-path"),
        pytest.param(["/opt/llama/../llama/llama-server"], {}, CommandRule.ALLOWED, id="same-path-normalised"),
        pytest.param([], {}, CommandRule.NO_COMMAND, id="no-command-left-to-the-actuator"),
        pytest.param(["sh", "-c", "touch pwned"], {}, CommandRule.NOT_ALLOWED, id="shell-refused"),
        pytest.param(["python", "-c", "print(1)"], {}, CommandRule.NOT_ALLOWED, id="interpreter-refused"),
        pytest.param(["/tmp/vllm"], {}, CommandRule.NOT_ALLOWED, id="listed-name-elsewhere-refused"),
        pytest.param(["llama-server"], {}, CommandRule.NOT_ALLOWED, id="base-name-of-a-path-entry-refused"),
        pytest.param(["./vllm"], {}, CommandRule.RELATIVE_PATH, id="relative-path-refused"),
        pytest.param(["vllm"], {"PATH": "/tmp/evil"}, CommandRule.ENV_CODE_LOADING, id="env-path-refused"),
        pytest.param(["vllm"], {"LD_PRELOAD": "/x.so"}, CommandRule.ENV_CODE_LOADING, id="env-ld-preload-refused"),
        pytest.param(["vllm"], {"pythonpath": "/x"}, CommandRule.ENV_CODE_LOADING, id="env-any-case-refused"),
        pytest.param(["vllm"], {"CUDA_VISIBLE_DEVICES": "0"}, CommandRule.ALLOWED, id="ordinary-env-allowed"),
        pytest.param([], {"MY_KNOB": "1"}, CommandRule.ENV_NOT_ALLOWED, id="env-judged-without-a-command-too"),
        pytest.param(["sh"], {"MY_KNOB": "1"}, CommandRule.NOT_ALLOWED, id="command-judged-first"),
    ],
)
def test_local_command_rule(command: list[str], env: dict[str, str], rule: CommandRule) -> None:
    verdict = check_local_process(command, env, allowed=ALLOWED, allowed_env=DEFAULT_LOCAL_ENV)
    assert verdict.rule is rule
    assert verdict.allowed is (rule in (CommandRule.ALLOWED, CommandRule.NO_COMMAND))
    if not verdict.allowed:
        setting = "FLEXINFER_LOCAL_ENV" if rule.value.startswith("env-") else "FLEXINFER_LOCAL_COMMANDS"
        assert setting in verdict.message


# The env rule: an allow-list, because the deny-list it replaces let PYTHONPYCACHEPREFIX through (issue 22). A refusal
# names the variable refused, where it is set and the setting that would list it.
@pytest.mark.parametrize(
    ("env", "allowed", "rule"),
    [
        pytest.param({"CUDA_VISIBLE_DEVICES": "0"}, DEFAULT_LOCAL_ENV, CommandRule.ALLOWED, id="listed-name"),
        pytest.param({"LLAMA_ARG_CTX_SIZE": "4096"}, DEFAULT_LOCAL_ENV, CommandRule.ALLOWED, id="prefix-entry"),
        pytest.param({"FAKE_MODEL_TOKEN_DELAY": "0"}, DEFAULT_LOCAL_ENV, CommandRule.ALLOWED, id="fake-model-knob"),
        pytest.param({"PYTHONUNBUFFERED": "1"}, DEFAULT_LOCAL_ENV, CommandRule.ALLOWED, id="harmless-python-knob"),
        pytest.param({}, (), CommandRule.ALLOWED, id="nothing-set-nothing-needed"),
        pytest.param(
            {"PYTHONPYCACHEPREFIX": "/tmp/x"},
            DEFAULT_LOCAL_ENV,
            CommandRule.ENV_CODE_LOADING,
            id="pycache-prefix-refused",
        ),
        pytest.param({"PYTHONPLATLIBDIR": "x"}, DEFAULT_LOCAL_ENV, CommandRule.ENV_CODE_LOADING, id="platlib"),
        pytest.param({"PYTHONWARNINGS": "x"}, DEFAULT_LOCAL_ENV, CommandRule.ENV_CODE_LOADING, id="warnings"),
        pytest.param({"PYTHONPATH": "/x"}, ("PYTHONPATH",), CommandRule.ENV_CODE_LOADING, id="listed-but-loads-code"),
        pytest.param({"MY_KNOB": "1"}, DEFAULT_LOCAL_ENV, CommandRule.ENV_NOT_ALLOWED, id="unlisted-name"),
        pytest.param({"MY_KNOB": "1"}, ("MY_KNOB",), CommandRule.ALLOWED, id="operator-lists-it"),
        pytest.param({"cuda_visible_devices": "0"}, DEFAULT_LOCAL_ENV, CommandRule.ENV_NOT_ALLOWED, id="case-matters"),
        pytest.param({"LLAMA_ARGX": "1"}, DEFAULT_LOCAL_ENV, CommandRule.ENV_NOT_ALLOWED, id="prefix-is-a-prefix"),
        pytest.param(
            {"FLEXINFER_ADMIN_TOKEN": "x"},
            ("FLEXINFER_ADMIN_TOKEN",),
            CommandRule.ENV_NOT_ALLOWED,
            id="own-settings-never",
        ),
    ],
)
def test_local_env_rule(env: dict[str, str], allowed: tuple[str, ...], rule: CommandRule) -> None:
    verdict = check_local_env(env, allowed=allowed)
    assert verdict.rule is rule
    if rule is not CommandRule.ALLOWED:
        (name,) = env
        assert name in verdict.message and "spec.local.env" in verdict.message
        assert "FLEXINFER_LOCAL_ENV" in verdict.message


@pytest.mark.parametrize(
    ("entry", "valid"),
    [
        pytest.param("MY_KNOB", True, id="name"),
        pytest.param("VLLM_*", True, id="prefix"),
        pytest.param("*", False, id="everything"),
        pytest.param("PY*", False, id="covers-pythonpath"),
        pytest.param("LD_*", False, id="covers-ld-preload"),
        pytest.param("PATH", False, id="loads-code"),
        pytest.param("FLEX*", False, id="covers-own-settings"),
        pytest.param("A B", False, id="not-a-name"),
    ],
)
def test_local_env_setting_entries(monkeypatch: pytest.MonkeyPatch, entry: str, valid: bool) -> None:
    assert (invalid_env_entries([entry]) == []) is valid
    monkeypatch.setenv("FLEXINFER_LOCAL_ENV", f"HF_HOME,{entry}")
    if valid:
        assert load_settings(CommonSettings).local_env == ("HF_HOME", entry)
    else:
        with pytest.raises(SettingsError, match="FLEXINFER_LOCAL_ENV"):
            load_settings(CommonSettings)


def test_an_engine_named_in_settings_is_allowed_but_never_an_interpreter() -> None:
    engines = {"llama-cpp": "/opt/llama/llama-server", "sglang": "/opt/venv/bin/python3"}
    allowed = allowed_commands(DEFAULT_LOCAL_COMMANDS, engines)
    assert check_local_command(["/opt/llama/llama-server", "-m", "x"], allowed=allowed).allowed
    assert not check_local_command(["/opt/venv/bin/python3", "-c", "print(1)"], allowed=allowed).allowed


def test_the_default_allow_list_has_no_shell_or_interpreter() -> None:
    for executable in ("sh", "bash", "python", "python3", "env", "perl", "node"):
        assert not check_local_command([executable], allowed=DEFAULT_LOCAL_COMMANDS).allowed
    assert check_local_command(["flexinfer-fake-model"], allowed=DEFAULT_LOCAL_COMMANDS).allowed


# -- one error shape --------------------------------------------------------------------------------------


async def ready() -> dict[str, bool]:
    return {"ok": True}


def app_with_errors(token: str | None = None) -> FastAPI:
    app = admin_app("t", "0", ready)
    api = admin_router(token)

    @api.get("/boom")
    async def boom() -> dict[str, str]:
        raise RuntimeError("secret internal detail at /srv/db.py")

    @api.get("/conflict")
    async def conflict() -> dict[str, str]:
        raise ApiError(409, "group g is leased by job-1")

    @api.get("/items/{n}")
    async def item(n: int) -> dict[str, int]:
        return {"n": n}

    app.include_router(api)
    return app


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        pytest.param("GET", "/api/v1/boom", 500, "internal_error", id="unhandled-500"),
        pytest.param("GET", "/api/v1/conflict", 409, "conflict", id="api-error"),
        pytest.param("GET", "/api/v1/items/x", 422, "invalid_request", id="validation"),
        pytest.param("GET", "/api/v1/nothing", 404, "not_found", id="unknown-path"),
        pytest.param("POST", "/api/v1/conflict", 405, "method_not_allowed", id="wrong-method"),
    ],
)
async def test_every_error_is_the_one_json_shape(method: str, path: str, status: int, code: str) -> None:
    app = app_with_errors()
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.request(method, path)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code"}
    assert body["error"]["code"] == code
    assert "secret internal detail" not in response.text and "/srv" not in response.text


@pytest.mark.parametrize(
    ("body", "headers", "status"),
    [
        pytest.param(b"\x00not json", {}, {401}, id="no-token-not-json-is-401-not-4xx-about-the-body"),
        pytest.param(b'{"n": "x"}', {"Authorization": "Bearer wrong"}, {401}, id="wrong-token-bad-body-is-401"),
        pytest.param(
            b"\x00not json", {"Authorization": "Bearer tok"}, {400, 422}, id="with-the-token-the-body-is-judged"
        ),
    ],
)
async def test_the_token_is_checked_before_the_body_is_read(
    body: bytes, headers: dict[str, str], status: set[int]
) -> None:
    app = admin_app("t", "0", ready)
    api = admin_router("tok")

    @api.post("/things")
    async def things(payload: dict[str, int]) -> dict[str, int]:
        return payload

    app.include_router(api)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
        response = await http.post(
            "/api/v1/things", content=body, headers={"Content-Type": "application/json", **headers}
        )
    assert response.status_code in status
    if status == {401}:
        assert response.headers["www-authenticate"] == "Bearer"


async def test_openapi_documents_the_bearer_scheme_and_the_error_shape() -> None:
    spec = app_with_errors("tok").openapi()
    assert spec["components"]["securitySchemes"]["adminToken"] == {
        "type": "http",
        "scheme": "bearer",
        "description": spec["components"]["securitySchemes"]["adminToken"]["description"],
    }
    responses = spec["paths"]["/api/v1/items/{n}"]["get"]["responses"]
    for status in ("401", "404", "422", "500"):
        assert responses[status]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    assert "HTTPValidationError" not in spec["components"]["schemas"]


def test_one_install_error_handlers_for_every_service() -> None:
    # the services build their apps through admin_app, so they all get this formatter
    assert install_error_handlers.__module__ == "flexinfer_common.service"


# -- secrets never in a log -------------------------------------------------------------------------------


def test_the_log_formatter_redacts_registered_secrets() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter("t", secrets=("s3cr3t-token-value", "pw")))
    logger = logging.getLogger("flexinfer.test.redact")
    logger.addHandler(handler)
    try:
        logger.warning("header was Bearer s3cr3t-token-value", extra={"url": "x?k=s3cr3t-token-value"})
    finally:
        logger.removeHandler(handler)
    line = json.loads(stream.getvalue())
    assert "s3cr3t-token-value" not in stream.getvalue()
    assert line["msg"] == f"header was Bearer {REDACTED}"
    assert JsonFormatter("t", secrets=("pw",)).secrets == ()


def test_settings_name_their_secret_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEXINFER_ADMIN_TOKEN", "tok-123456")
    monkeypatch.setenv("FLEXINFER_DATABASE_URL", "postgresql://u:db-password@h/d")
    assert sorted(load_settings(CommonSettings).secret_values()) == ["db-password", "tok-123456"]


# -- the admin token of `flexinfer up` --------------------------------------------------------------------


def test_up_generates_a_private_token_once_and_the_cli_finds_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    token = ensure_admin_token({}, state)
    path = state / "admin-token"
    assert path.stat().st_mode & 0o777 == 0o600
    assert len(token) >= 32
    assert ensure_admin_token({}, state) == token  # kept across restarts
    assert admin_token({"FLEXINFER_STATE_DIR": str(state)}) == token
    assert admin_token({"FLEXINFER_STATE_DIR": str(state), "FLEXINFER_ADMIN_TOKEN": "given"}) == "given"
    assert admin_token({"FLEXINFER_STATE_DIR": str(tmp_path / "none")}) is None


def test_a_given_token_wins_and_a_loose_token_file_is_made_private(tmp_path: Path) -> None:
    assert ensure_admin_token({"FLEXINFER_ADMIN_TOKEN": "from-env"}, tmp_path) == "from-env"
    assert not (tmp_path / "admin-token").exists()
    loose = tmp_path / "admin-token"
    loose.write_text("old-token\n")
    loose.chmod(0o644)
    assert ensure_admin_token({}, tmp_path) == "old-token"
    assert loose.stat().st_mode & 0o777 == 0o600


# -- one message-id scheme --------------------------------------------------------------------------------


def test_message_ids_are_unique_even_for_the_same_origin() -> None:
    ids: list[Any] = [message_id("proxy-0") for _ in range(10_000)]
    assert len(set(ids)) == len(ids)
    assert all(i.startswith("proxy-0:") for i in ids)
