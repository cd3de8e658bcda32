"""Typed settings, read from ``FLEXINFER_*`` environment variables and validated at start.

Each service subclasses :class:`CommonSettings`; ``load_settings`` turns a validation failure into a
:class:`SettingsError` whose message names the environment variable, so a bad value stops start-up clearly.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
from datetime import timedelta
from enum import StrEnum
from typing import TYPE_CHECKING, Annotated, Any, TypeVar
from urllib.parse import urlsplit

from pydantic import BeforeValidator, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from flexinfer_common.durations import parse_duration
from flexinfer_common.local_commands import DEFAULT_LOCAL_ENV, invalid_entries, invalid_env_entries

if TYPE_CHECKING:
    from flexinfer_common.nats_auth import NatsAuth

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


def _comma_mapping(value: object) -> object:
    """``a=1,b=2`` (or a JSON object) -> a mapping."""
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("{"):
            return json.loads(text)
        pairs = {}
        for part in (p.strip() for p in text.split(",")):
            if not part:
                continue
            key, sep, item = part.partition("=")
            if not sep or not key.strip() or not item.strip():
                raise ValueError(f"expected name=value pairs separated by commas, got {part!r}")
            pairs[key.strip()] = item.strip()
        return pairs
    return value


CommaMapping = Annotated[dict[str, str], NoDecode, BeforeValidator(_comma_mapping)]


def _refuse(bad: list[str], rule: str) -> None:
    """A ValueError that states ``rule`` and names the entries that break it, if any do."""
    if bad:
        raise ValueError(f"{rule} {', '.join(map(repr, bad))}")


class SettingsError(Exception):
    """A setting has a bad value; the message names the environment variable."""


# The queued-count TTL's margin over three demand refreshes (clock skew between hosts, a slow bus).
QUEUED_TTL_MARGIN = timedelta(seconds=5)


def renewed_count_ttl(refresh_interval: timedelta) -> timedelta:
    """How long a count its sender renews every ``refresh_interval`` stands without a renewal: three renewals
    missed (plus a margin for clock skew and the bus) mean the sender is gone. The proxy sends it with each demand
    message (``validFor``); the scheduler falls back on its own for a message without one."""
    return 3 * refresh_interval + QUEUED_TTL_MARGIN


class CommonSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="ignore", frozen=True)

    nats_url: str = "nats://127.0.0.1:4222"
    """``FLEXINFER_NATS_URL``: the bus; several servers comma-separated; credentials may be in it
    (``nats://user:password@host:port``)."""
    # The bus's credentials and TLS (docs/operations.md, "Bus security"): one way to authenticate at most; empty:
    # not used.
    nats_user: str = ""
    """``FLEXINFER_NATS_USER``: the user to authenticate to NATS as (with ``FLEXINFER_NATS_PASSWORD``)."""
    nats_password: SecretStr | None = None
    """``FLEXINFER_NATS_PASSWORD``: the NATS user's password (never logged)."""
    nats_creds: str = ""
    """``FLEXINFER_NATS_CREDS``: a NATS credentials file (JWT + nkey seed)."""
    nats_nkey: str = ""
    """``FLEXINFER_NATS_NKEY``: an nkey seed file."""
    nats_tls_ca: str = ""
    """``FLEXINFER_NATS_TLS_CA``: a CA file to verify the NATS server with."""
    nats_tls_cert: str = ""
    """``FLEXINFER_NATS_TLS_CERT``: a client certificate for mutual TLS (with ``FLEXINFER_NATS_TLS_KEY``)."""
    nats_tls_key: str = ""
    """``FLEXINFER_NATS_TLS_KEY``: the client certificate's key."""
    # Where this service's replies arrive (it must be allowed to subscribe there); empty: ``_INBOX.<user>`` with a
    # user, else NATS' own ``_INBOX``.
    nats_inbox_prefix: str = ""
    database_url: str = "postgresql+asyncpg://postgres@127.0.0.1:5432/flexinfer"
    """``FLEXINFER_DATABASE_URL``: the PostgreSQL database (``postgresql://user:password@host:port/db`` is accepted
    and run with the asyncpg driver)."""
    admin_token: SecretStr | None = None
    """``FLEXINFER_ADMIN_TOKEN``: when set, every ``/api/v1`` call needs ``Authorization: Bearer <token>``."""
    actuator: ActuatorKind = ActuatorKind.LOCAL
    """``FLEXINFER_ACTUATOR``: ``local`` (model processes on this machine) or ``kubernetes`` (Deployments; the
    lease manager then also syncs GPULeases, Jobs and ModelCaches)."""
    namespace: str = "default"
    """``FLEXINFER_NAMESPACE``: the namespace of FlexInfer's own objects when the pod's is not known (the lease
    manager's GPULeases taken through its API)."""
    log_level: str = "INFO"
    """``FLEXINFER_LOG_LEVEL``: ``DEBUG``, ``INFO``, ``WARNING`` or ``ERROR``."""
    bind_host: str = "127.0.0.1"
    """``FLEXINFER_BIND_HOST``: the address every service listens on; beyond loopback a service needs
    ``FLEXINFER_ADMIN_TOKEN`` (or ``FLEXINFER_ADMIN_AUTH=disabled``)."""
    admin_auth: AdminAuth = AdminAuth.REQUIRED
    """``FLEXINFER_ADMIN_AUTH``: ``required`` refuses to start beyond loopback without a token; ``disabled`` allows
    it (with a warning)."""
    local_commands: CommaList = DEFAULT_LOCAL_COMMANDS
    """``FLEXINFER_LOCAL_COMMANDS``: the executables (names or absolute paths, comma-separated) a
    ``spec.local.command`` may run, replacing the default list; any other is refused with 422."""
    local_env: CommaList = DEFAULT_LOCAL_ENV
    """``FLEXINFER_LOCAL_ENV``: the variable names a model's ``spec.local.env`` may set (``NAME`` or ``PREFIX_*``),
    comma-separated, replacing the default list; the scheduler's API refuses any other with 422, and the local
    actuator checks again before it starts a process."""
    local_engines: CommaMapping = {}
    """``FLEXINFER_LOCAL_ENGINES``: ``backend=executable`` pairs, comma-separated
    (``llama-cpp=/opt/llama/llama-server``): the executable a local backend preset runs instead of the one found on
    PATH (a Python interpreter for the Python engines: ``llama-cpp=/opt/venv/bin/python`` runs llama-cpp-python's
    server). An engine's executable (not an interpreter) is thereby on the command allow-list too."""
    instance_id: str = ""
    """``FLEXINFER_INSTANCE_ID``: this replica's id (a proxy's demand ``source``); empty: made from the host name
    and process id."""

    proxy_port: int = Field(8080, ge=0, le=65535)
    """``FLEXINFER_PROXY_PORT``: the proxy's port (the data plane)."""
    scheduler_port: int = Field(8081, ge=0, le=65535)
    """``FLEXINFER_SCHEDULER_PORT``: the scheduler's admin API and status page."""
    lease_manager_port: int = Field(8082, ge=0, le=65535)
    """``FLEXINFER_LEASE_MANAGER_PORT``: the lease manager's API."""
    actuator_port: int = Field(8083, ge=0, le=65535)
    """``FLEXINFER_ACTUATOR_PORT``: the actuator's operations server (health, metrics, processes)."""

    reconcile_interval: Duration = timedelta(seconds=3)
    """``FLEXINFER_RECONCILE_INTERVAL``: the scheduler's election pass runs at least this often."""
    shared_demand_window: Duration = timedelta(minutes=2)
    """``FLEXINFER_SHARED_DEMAND_WINDOW``: a model asked for within this counts as demanded (v1alpha2)."""
    recent_leader_window: Duration = timedelta(minutes=5)
    """``FLEXINFER_RECENT_LEADER_WINDOW``: with no demanded model, one active within this is preferred (v1alpha2)."""
    default_swap_cooldown: Duration = timedelta(minutes=5)
    """``FLEXINFER_DEFAULT_SWAP_COOLDOWN``: the swap cooldown of a group none of whose members sets
    ``spec.gpu.swapCooldown`` (FlexInfer's policy uses the holder's measured load time unless this is set)."""
    queue_max: int = Field(256, ge=1)
    """``FLEXINFER_QUEUE_MAX``: requests that may wait for one model at a proxy; one more gets 429."""
    queue_timeout: Duration = timedelta(minutes=5)
    """``FLEXINFER_QUEUE_TIMEOUT``: how long a request may wait for its model before 504."""
    demand_refresh_interval: Duration = timedelta(seconds=10)
    """``FLEXINFER_DEMAND_REFRESH_INTERVAL``: how often a proxy renews the demand of its waiting requests."""
    lease_refresh_interval: Duration = timedelta(seconds=30)
    """``FLEXINFER_LEASE_REFRESH_INTERVAL``: the lease manager's reconcile (renewals, expiry, metrics)."""
    activity_report_interval: Duration = timedelta(seconds=1)
    """``FLEXINFER_ACTIVITY_REPORT_INTERVAL``: how often a proxy reports its requests in flight while any is."""
    park_grace_period: Duration = timedelta(seconds=10)
    """``FLEXINFER_PARK_GRACE_PERIOD``: how long a local model process has to exit after SIGTERM before SIGKILL."""
    readiness_probe_interval: Duration = timedelta(milliseconds=50)
    """``FLEXINFER_READINESS_PROBE_INTERVAL``: how often the local actuator probes a loading model's
    readiness path."""
    load_timeout: Duration = timedelta(minutes=10)
    """``FLEXINFER_LOAD_TIMEOUT``: a model not Ready this long after it was started is stopped and Failed."""

    @field_validator("admin_token", "nats_password", mode="before")
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
                # The value is not echoed: a URL may carry a password.
                raise ValueError("not a NATS URL (expected nats://host:port or nats://user:password@host:port)")
        return value

    @field_validator("nats_creds", "nats_nkey", "nats_tls_ca", "nats_tls_cert", "nats_tls_key")
    @classmethod
    def _readable_file(cls, value: str) -> str:
        value = value.strip()
        if value:
            try:
                with open(value, "rb"):
                    pass
            except OSError as exc:
                raise ValueError(f"cannot read {value}: {exc.strerror or exc}") from None
        return value

    @model_validator(mode="after")
    def _nats_auth_complete(self) -> CommonSettings:
        if self.nats_password is not None and not self.nats_user:
            raise ValueError("FLEXINFER_NATS_PASSWORD is set but FLEXINFER_NATS_USER is not")
        if bool(self.nats_tls_cert) != bool(self.nats_tls_key):
            raise ValueError("FLEXINFER_NATS_TLS_CERT and FLEXINFER_NATS_TLS_KEY go together (mutual TLS)")
        given = [
            name
            for name, value in (
                ("FLEXINFER_NATS_USER", self.nats_user),
                ("FLEXINFER_NATS_CREDS", self.nats_creds),
                ("FLEXINFER_NATS_NKEY", self.nats_nkey),
            )
            if value
        ]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} are set: choose one way to authenticate to NATS")
        return self

    def nats_auth(self) -> NatsAuth:
        """How this service authenticates to NATS (and verifies it), for :class:`flexinfer_common.bus.Bus`."""
        from flexinfer_common.nats_auth import NatsAuth

        return NatsAuth(
            user=self.nats_user or None,
            password=self.nats_password.get_secret_value() if self.nats_password else None,
            creds_file=self.nats_creds or None,
            nkey_file=self.nats_nkey or None,
            tls_ca=self.nats_tls_ca or None,
            tls_cert=self.nats_tls_cert or None,
            tls_key=self.nats_tls_key or None,
            inbox_prefix=self.nats_inbox_prefix or None,
        )

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
        _refuse(invalid_entries(value), "each entry must be an executable's name or absolute path, not")
        return value

    @field_validator("local_engines")
    @classmethod
    def _engines(cls, value: dict[str, str]) -> dict[str, str]:
        _refuse(invalid_entries(value.values()), "each executable must be a name or an absolute path, not")
        return value

    @field_validator("local_env")
    @classmethod
    def _env_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        _refuse(
            invalid_env_entries(value),
            "each entry must be a variable name or PREFIX_*, and none may allow a variable that decides which "
            "code runs (PATH, LD_*, PYTHON*):",
        )
        return value

    @field_validator(
        "reconcile_interval",
        "demand_refresh_interval",
        "activity_report_interval",
        "queue_timeout",
        "lease_refresh_interval",
        "readiness_probe_interval",
        "load_timeout",
    )
    @classmethod
    def _positive(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be longer than 0s")
        return value

    @property
    def queued_ttl(self) -> timedelta:
        """How long a source's queued count stands without a newer report: a proxy renews it every
        FLEXINFER_DEMAND_REFRESH_INTERVAL while requests wait and reports 0 when its queue empties, so a count
        unrenewed for three refreshes (plus a margin for clock skew and the bus) is from a proxy that is gone.
        Never shorter than that, however short the demand window; never shorter than the demand window either, so an
        external producer's one message still counts for the window, as before."""
        return max(self.shared_demand_window, renewed_count_ttl(self.demand_refresh_interval))

    @property
    def in_flight_ttl(self) -> timedelta:
        """How long a proxy's in-flight counts stand without a newer report (it reports every
        FLEXINFER_ACTIVITY_REPORT_INTERVAL while any is not zero): a report older than a few is from a proxy
        that is gone."""
        return max(3 * self.activity_report_interval, timedelta(seconds=5))

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
        values += [urlsplit(url.strip()).password or "" for url in self.nats_url.split(",")]
        return [v for v in values if v]

    def admin_token_value(self) -> str | None:
        return self.admin_token.get_secret_value() if self.admin_token else None

    def make_instance_id(self) -> str:
        """This replica's id: FLEXINFER_INSTANCE_ID, else ``<host name>-<process id>``."""
        return self.instance_id or f"{socket.gethostname()}-{os.getpid()}"


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
    """``FLEXINFER_LEADER_LEASE_DURATION``: how long a leader's coordination.k8s.io Lease stands unrenewed."""
    leader_renew_deadline: Duration = timedelta(seconds=10)
    """``FLEXINFER_LEADER_RENEW_DEADLINE``: a leader that could not renew within this stops acting."""
    leader_retry_period: Duration = timedelta(seconds=2)
    """``FLEXINFER_LEADER_RETRY_PERIOD``: how often replicas try to take or renew the Lease."""

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
            if any(word in field for word in _SECRET_WORDS) or field in ("database_url", "nats_url"):
                problems.append(f"{variable}: {message}")
            else:
                problems.append(f"{variable}: {message} (got {error.get('input')!r})")
        raise SettingsError("bad setting: " + "; ".join(problems)) from None
