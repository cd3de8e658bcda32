"""Typed settings, read from ``FLEXINFER_*`` environment variables and validated at start.

Each service subclasses :class:`CommonSettings`; ``load_settings`` turns a validation failure into a
:class:`SettingsError` whose message names the environment variable, so a bad value stops start-up clearly.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import timedelta
from enum import StrEnum
from typing import Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from flexinfer_common.durations import parse_duration

ENV_PREFIX = "FLEXINFER_"

Duration = Annotated[timedelta, BeforeValidator(parse_duration)]


class ActuatorKind(StrEnum):
    KUBERNETES = "kubernetes"
    LOCAL = "local"


class AdminAuth(StrEnum):
    """``FLEXINFER_ADMIN_AUTH``: ``required`` (the default) refuses to serve the admin API on a non-loopback address
    without a token; ``disabled`` allows it (and logs a warning at start)."""

    REQUIRED = "required"
    DISABLED = "disabled"


# The local actuator's default allow-list (``FLEXINFER_LOCAL_COMMANDS`` replaces it): the fake model server that
# ships with FlexInfer and the common model servers. No shell and no interpreter: either would run anything.
DEFAULT_LOCAL_COMMANDS: tuple[str, ...] = (
    "flexinfer-fake-model",
    "vllm",
    "llama-server",
    "ollama",
    "mlc_llm",
    "text-generation-launcher",
    "lmdeploy",
    "llamafile",
    "koboldcpp",
    "tritonserver",
)


def _comma_list(value: object) -> object:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


CommaList = Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)]


class SettingsError(Exception):
    """A setting has a bad value; the message names the environment variable."""


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    nats_url: str = "nats://127.0.0.1:4222"
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/flexinfer"
    admin_token: SecretStr | None = None
    actuator: ActuatorKind = ActuatorKind.LOCAL
    namespace: str = "default"
    log_level: str = "INFO"
    bind_host: str = "127.0.0.1"
    admin_auth: AdminAuth = AdminAuth.REQUIRED
    local_commands: CommaList = DEFAULT_LOCAL_COMMANDS
    instance_id: str = ""

    proxy_port: int = Field(8080, ge=0, le=65535)
    scheduler_port: int = Field(8081, ge=0, le=65535)
    lease_manager_port: int = Field(8082, ge=0, le=65535)
    actuator_port: int = Field(8083, ge=0, le=65535)

    reconcile_interval: Duration = timedelta(seconds=3)
    shared_demand_window: Duration = timedelta(minutes=2)
    recent_leader_window: Duration = timedelta(minutes=5)
    default_swap_cooldown: Duration = timedelta(minutes=5)
    queue_max: int = Field(256, ge=1)
    queue_timeout: Duration = timedelta(minutes=5)
    demand_refresh_interval: Duration = timedelta(seconds=10)
    lease_refresh_interval: Duration = timedelta(seconds=30)
    activity_report_interval: Duration = timedelta(seconds=1)
    park_grace_period: Duration = timedelta(seconds=10)
    readiness_probe_interval: Duration = timedelta(milliseconds=50)
    load_timeout: Duration = timedelta(minutes=10)

    @field_validator("admin_token", mode="before")
    @classmethod
    def _empty_token_is_unset(cls, value: object) -> object:
        # FLEXINFER_ADMIN_TOKEN= (empty, as docker-compose passes an unset variable) means no token, not "".
        return None if value == "" else value

    @field_validator("database_url")
    @classmethod
    def _async_driver(cls, value: str) -> str:
        return normalize_database_url(value)

    @field_validator("nats_url")
    @classmethod
    def _nats_scheme(cls, value: str) -> str:
        for url in value.split(","):
            if urlsplit(url.strip()).scheme not in {"nats", "tls", "ws", "wss"}:
                raise ValueError(f"not a NATS URL: {url!r} (expected nats://host:port)")
        return value

    @field_validator("log_level")
    @classmethod
    def _level(cls, value: str) -> str:
        upper = value.upper()
        if upper not in {"DEBUG", "INFO", "WARNING", "ERROR"}:
            raise ValueError(f"unknown log level {value!r} (DEBUG, INFO, WARNING or ERROR)")
        return upper

    @field_validator("local_commands")
    @classmethod
    def _commands(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from flexinfer_common.local_commands import invalid_entries

        bad = invalid_entries(value)
        if bad:
            raise ValueError(
                f"each entry must be an executable's name or absolute path, not {', '.join(map(repr, bad))}"
            )
        return value

    @model_validator(mode="after")
    def _token_beyond_loopback(self) -> CommonSettings:
        if self.admin_token is None and self.admin_auth is AdminAuth.REQUIRED and not is_loopback_host(self.bind_host):
            raise ValueError(
                f"FLEXINFER_BIND_HOST is {self.bind_host!r}, beyond loopback, and FLEXINFER_ADMIN_TOKEN is not set: "
                "anyone who reaches the port could call the admin API. Set FLEXINFER_ADMIN_TOKEN, or bind to "
                "127.0.0.1, or set FLEXINFER_ADMIN_AUTH=disabled to serve it without a token anyway"
            )
        return self

    def security_warnings(self) -> list[str]:
        """What a service logs as a warning at start about how it is exposed."""
        if self.admin_token is None and not is_loopback_host(self.bind_host):
            return [f"FLEXINFER_ADMIN_AUTH=disabled: the admin API on {self.bind_host} answers anyone without a token"]
        return []

    def secret_values(self) -> list[str]:
        """The values no log line may show: every secret setting, and the password in the database URL."""
        values = [v.get_secret_value() for v in self.__dict__.values() if isinstance(v, SecretStr)]
        for item in self.__dict__.values():
            if isinstance(item, tuple):
                values += [v.get_secret_value() for v in item if isinstance(v, SecretStr)]
        password = urlsplit(self.database_url).password
        if password:
            values.append(password)
        return [v for v in values if v]

    def admin_token_value(self) -> str | None:
        return self.admin_token.get_secret_value() if self.admin_token else None


class KubernetesSettings(CommonSettings):
    """Settings of the services that talk to the Kubernetes API (the actuator's ``kubernetes`` back-end, the lease
    manager)."""

    kubeconfig: str = ""
    """``FLEXINFER_KUBECONFIG``: a kubeconfig file. Empty: the pod's service account when running in a cluster,
    else ``$KUBECONFIG`` or ``~/.kube/config`` (so ``flexinfer up`` on a laptop can drive a cluster)."""
    kube_context: str = ""
    """``FLEXINFER_KUBE_CONTEXT``: a context of the kubeconfig other than its current one."""
    watch_namespaces: str = ""
    """``FLEXINFER_WATCH_NAMESPACES``: comma-separated namespaces to watch for FlexInfer resources; empty: all."""
    leader_election: bool = True
    """``FLEXINFER_LEADER_ELECTION``: one replica acts at a time (a coordination.k8s.io Lease)."""
    leader_election_namespace: str = ""
    """``FLEXINFER_LEADER_ELECTION_NAMESPACE``: where the Lease lives. Empty: the pod's own namespace, else
    ``FLEXINFER_NAMESPACE``."""
    leader_lease_duration: Duration = timedelta(seconds=15)
    leader_renew_deadline: Duration = timedelta(seconds=10)
    leader_retry_period: Duration = timedelta(seconds=2)

    @field_validator("watch_namespaces")
    @classmethod
    def _namespaces(cls, value: str) -> str:
        for name in (part.strip() for part in value.split(",")):
            if name and not _DNS_LABEL.match(name):
                raise ValueError(f"{name!r} is not a namespace name")
        return value

    @model_validator(mode="after")
    def _leader_timings(self) -> KubernetesSettings:
        retry, renew, lease = self.leader_retry_period, self.leader_renew_deadline, self.leader_lease_duration
        if not retry < renew < lease:
            raise ValueError(
                "leader election needs FLEXINFER_LEADER_RETRY_PERIOD < FLEXINFER_LEADER_RENEW_DEADLINE < "
                f"FLEXINFER_LEADER_LEASE_DURATION (got {retry}, {renew}, {lease})"
            )
        return self

    def namespaces(self) -> list[str] | None:
        """The namespaces to watch, or None for all."""
        names = [part.strip() for part in self.watch_namespaces.split(",") if part.strip()]
        return sorted(set(names)) or None


_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def normalize_database_url(value: str) -> str:
    """Accept libpq-style ``postgresql://`` URLs and use the asyncpg driver."""
    for prefix in ("postgres://", "postgresql://", "postgresql+psycopg://", "postgresql+psycopg2://"):
        if value.startswith(prefix):
            return "postgresql+asyncpg://" + value[len(prefix) :]
    if not value.startswith("postgresql+asyncpg://"):
        # The value is not echoed: a URL carries the password.
        raise ValueError("not a PostgreSQL URL (expected postgresql://user:password@host:port/db)")
    return value


def is_loopback_url(url: str) -> bool:
    return is_loopback_host(urlsplit(url).hostname or "")


def is_loopback_host(host: str) -> bool:
    """``127.0.0.0/8``, ``::1`` or ``localhost``; ``0.0.0.0``, ``::`` and every other address are not."""
    host = host.strip().strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# Settings whose values are secrets: a bad value is reported without echoing it.
_SECRET_WORDS = ("token", "key", "password", "secret")


S = TypeVar("S", bound=CommonSettings)


def load_settings(cls: type[S], **overrides: Any) -> S:
    """Build settings from the environment; a bad value raises SettingsError naming the variable."""
    try:
        return cls(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            field = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")
            if not field:  # a rule over several settings: its message names them
                problems.append(message)
                continue
            variable = ENV_PREFIX + field.upper()
            if any(word in field for word in _SECRET_WORDS) or field == "database_url":
                problems.append(f"{variable}: {message}")
            else:
                problems.append(f"{variable}: {message} (got {error.get('input')!r})")
        raise SettingsError("bad setting: " + "; ".join(problems)) from None
