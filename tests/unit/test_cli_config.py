"""MODEL arguments and service addresses of the flexinfer CLI."""

from __future__ import annotations

from pathlib import Path

import pytest

from flexinfer_cli.config import ConfigError, ModelRef, Service, nats_url, parse_model_ref, service_url


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("chat-small", ModelRef("default", "chat-small"), id="name-uses-default-namespace"),
        pytest.param("team-a/chat", ModelRef("team-a", "chat"), id="namespace-slash-name"),
        pytest.param("qwen3.8b", ModelRef("default", "qwen3.8b"), id="dots-allowed"),
        pytest.param("  llama  ", ModelRef("default", "llama"), id="surrounding-space-ignored"),
    ],
)
def test_parse_model_ref(value: str, expected: ModelRef) -> None:
    assert parse_model_ref(value, default_namespace="default") == expected


def test_parse_model_ref_default_namespace_is_the_callers() -> None:
    assert parse_model_ref("chat", default_namespace="lab") == ModelRef("lab", "chat")
    assert str(ModelRef("lab", "chat")) == "lab/chat"


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        pytest.param("", "expected NAME or NAMESPACE/NAME", id="empty"),
        pytest.param("ns/", "expected NAME or NAMESPACE/NAME", id="no-name"),
        pytest.param("/chat", "expected NAME or NAMESPACE/NAME", id="no-namespace"),
        pytest.param("a/b/c", "expected NAME or NAMESPACE/NAME", id="two-slashes"),
        pytest.param("Chat", "'Chat' is not a valid name", id="uppercase"),
        pytest.param("ns/chat_small", "'chat_small' is not a valid name", id="underscore"),
        pytest.param("-chat", "'-chat' is not a valid name", id="leading-dash"),
    ],
)
def test_parse_model_ref_rejects(value: str, fragment: str) -> None:
    with pytest.raises(ConfigError, match="is not a model") as info:
        parse_model_ref(value, default_namespace="default")
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("service", "flag", "env", "expected"),
    [
        pytest.param(Service.SCHEDULER, None, {}, "http://127.0.0.1:8081", id="scheduler-default"),
        pytest.param(Service.PROXY, None, {}, "http://127.0.0.1:8080", id="proxy-default"),
        pytest.param(Service.LEASE_MANAGER, None, {}, "http://127.0.0.1:8082", id="lease-manager-default"),
        pytest.param(
            Service.SCHEDULER, None, {"FLEXINFER_SCHEDULER_PORT": "9181"}, "http://127.0.0.1:9181", id="port-env"
        ),
        pytest.param(
            Service.LEASE_MANAGER,
            None,
            {"FLEXINFER_LEASE_MANAGER_URL": "http://leases:80/", "FLEXINFER_LEASE_MANAGER_PORT": "1"},
            "http://leases:80",
            id="url-env-beats-port",
        ),
        pytest.param(
            Service.PROXY,
            "https://proxy.lab",
            {"FLEXINFER_PROXY_URL": "http://other"},
            "https://proxy.lab",
            id="flag-beats-env",
        ),
    ],
)
def test_service_url(service: Service, flag: str | None, env: dict[str, str], expected: str) -> None:
    assert service_url(service, flag, env) == expected


def test_service_url_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match="FLEXINFER_SCHEDULER_PORT"):
        service_url(Service.SCHEDULER, None, {"FLEXINFER_SCHEDULER_PORT": "http"})
    with pytest.raises(ConfigError, match="FLEXINFER_PROXY_URL"):
        service_url(Service.PROXY, None, {"FLEXINFER_PROXY_URL": "proxy:8080"})
    with pytest.raises(ConfigError, match="--scheduler-url"):
        service_url(Service.SCHEDULER, "localhost:8081", {})


def test_nats_url() -> None:
    assert nats_url(None, {}) == "nats://127.0.0.1:4222"
    assert nats_url(None, {"FLEXINFER_NATS_URL": "nats://n:1"}) == "nats://n:1"
    assert nats_url("nats://flag:2", {"FLEXINFER_NATS_URL": "nats://n:1"}) == "nats://flag:2"


def test_the_cli_finds_the_urls_of_a_running_flexinfer_up_in_its_state_folder(tmp_path: Path) -> None:
    """Issue 24: describe and demand looked for NATS at 127.0.0.1:4222 while `up`'s embedded NATS was elsewhere."""
    import stat as stat_module

    from flexinfer_cli.config import Service, nats_url, running_endpoints, service_url
    from flexinfer_cli.local_system import write_endpoints

    state = tmp_path / "state"
    urls = {service: f"http://127.0.0.1:{40000 + i}" for i, service in enumerate(Service)}
    path = write_endpoints(state, urls, "nats://127.0.0.1:41222")
    assert stat_module.S_IMODE(path.stat().st_mode) == 0o600
    env = {"FLEXINFER_STATE_DIR": str(state)}
    assert service_url(Service.SCHEDULER, env=env) == urls[Service.SCHEDULER]
    assert service_url(Service.PROXY, env=env) == urls[Service.PROXY]
    assert nats_url(env=env) == "nats://127.0.0.1:41222"
    assert running_endpoints(env)["ui"] == urls[Service.SCHEDULER] + "/ui"
    # what the user says still wins: a flag, a URL, a port
    assert service_url(Service.SCHEDULER, env={**env, "FLEXINFER_SCHEDULER_URL": "http://h:1"}) == "http://h:1"
    assert service_url(Service.SCHEDULER, env={**env, "FLEXINFER_SCHEDULER_PORT": "9"}) == "http://127.0.0.1:9"
    assert nats_url("nats://x:1", env=env) == "nats://x:1"
    # no `up` running there: the defaults
    assert service_url(Service.SCHEDULER, env={"FLEXINFER_STATE_DIR": str(tmp_path / "none")}) == (
        "http://127.0.0.1:8081"
    )
