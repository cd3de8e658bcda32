"""Where the CLI finds the services, and how it reads a MODEL argument.

Every address resolves the same way: the command-line flag, else ``FLEXINFER_<SERVICE>_URL``, else
``http://127.0.0.1:<FLEXINFER_<SERVICE>_PORT or the contract's default port>``. Nothing here does I/O beyond
reading the environment it is given and the admin token file of ``flexinfer up``.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

DEFAULT_NAMESPACE = "default"
DEFAULT_NATS_URL = "nats://127.0.0.1:4222"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class Service(StrEnum):
    """The services the CLI talks to; the value is how messages name them."""

    PROXY = "proxy"
    SCHEDULER = "scheduler"
    LEASE_MANAGER = "lease-manager"
    ACTUATOR = "actuator"

    @property
    def env_prefix(self) -> str:
        return "FLEXINFER_" + self.value.upper().replace("-", "_")

    @property
    def url_variable(self) -> str:
        return self.env_prefix + "_URL"

    @property
    def port_variable(self) -> str:
        return self.env_prefix + "_PORT"

    @property
    def default_port(self) -> int:
        return DEFAULT_PORTS[self]

    @property
    def url_flag(self) -> str:
        return f"--{self.value}-url"


DEFAULT_PORTS: dict[Service, int] = {
    Service.PROXY: 8080,
    Service.SCHEDULER: 8081,
    Service.LEASE_MANAGER: 8082,
    Service.ACTUATOR: 8083,
}


class ConfigError(ValueError):
    """An address or argument cannot be used; the message says which and why."""


def service_port(service: Service, env: Mapping[str, str] | None = None) -> int:
    """``FLEXINFER_<SERVICE>_PORT`` or the contract's default; a bad value names the variable."""
    env = os.environ if env is None else env
    raw = env.get(service.port_variable, "").strip()
    if not raw:
        return service.default_port
    try:
        port = int(raw)
    except ValueError:
        raise ConfigError(f"{service.port_variable}: not a port number (got {raw!r})") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"{service.port_variable}: must be between 0 and 65535 (got {port})")
    return port


def service_url(service: Service, flag: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The base URL of a service's HTTP API (no trailing slash)."""
    env = os.environ if env is None else env
    url = flag or env.get(service.url_variable, "").strip()
    if not url and not env.get(service.port_variable, "").strip():
        url = running_endpoints(env).get(service.value, "")
    if not url:
        url = f"http://127.0.0.1:{service_port(service, env)}"
    if not url.startswith(("http://", "https://")):
        source = service.url_flag if flag else service.url_variable
        raise ConfigError(f"{source}: not an http(s) URL (got {url!r})")
    return url.rstrip("/")


def nats_url(flag: str | None = None, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return flag or env.get("FLEXINFER_NATS_URL", "").strip() or running_endpoints(env).get("nats") or DEFAULT_NATS_URL


DEFAULT_STATE_DIR = ".flexinfer"
TOKEN_FILE_NAME = "admin-token"


def state_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where ``flexinfer up`` keeps its state: ``FLEXINFER_STATE_DIR``, else ``.flexinfer`` here."""
    env = os.environ if env is None else env
    return Path(env.get("FLEXINFER_STATE_DIR", "").strip() or DEFAULT_STATE_DIR)


ENDPOINTS_FILE_NAME = "endpoints.json"


def endpoints_file(directory: Path) -> Path:
    """The URLs a running ``flexinfer up`` serves (mode 0600; removed when it stops)."""
    return directory / ENDPOINTS_FILE_NAME


def running_endpoints(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The URLs of the ``flexinfer up`` whose state folder is ``FLEXINFER_STATE_DIR`` (default ``.flexinfer``):
    ``proxy``, ``scheduler``, ``lease-manager``, ``actuator``, ``nats``; empty when none runs there."""
    env = os.environ if env is None else env
    try:
        data = json.loads(endpoints_file(state_dir(env)).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, str) and v}


def token_file(directory: Path) -> Path:
    """The admin token ``flexinfer up`` generated for the services it runs (mode 0600)."""
    return directory / TOKEN_FILE_NAME


def admin_token(env: Mapping[str, str] | None = None) -> str | None:
    """The bearer token for the admin APIs: ``FLEXINFER_ADMIN_TOKEN``, else the one ``flexinfer up`` keeps in its
    state folder (``FLEXINFER_STATE_DIR``, default ``.flexinfer``), else none."""
    env = os.environ if env is None else env
    given = env.get("FLEXINFER_ADMIN_TOKEN", "").strip()
    if given:
        return given
    try:
        return token_file(state_dir(env)).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def default_namespace(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get("FLEXINFER_NAMESPACE", "").strip() or DEFAULT_NAMESPACE


@dataclass(frozen=True)
class ModelRef:
    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


def parse_model_ref(value: str, *, default_namespace: str) -> ModelRef:
    """``name`` or ``namespace/name``; either part must be a Kubernetes name (lowercase, digits, '-', '.')."""
    text = value.strip()
    namespace, slash, name = text.rpartition("/")
    if not slash:
        namespace = default_namespace
    if not name or (slash and not namespace) or "/" in namespace:
        raise ConfigError(f"{value!r} is not a model: expected NAME or NAMESPACE/NAME")
    for part in (namespace, name):
        if len(part) > 253 or not _NAME.match(part):
            raise ConfigError(
                f"{value!r} is not a model: {part!r} is not a valid name (lowercase letters, digits, '-' and '.')"
            )
    return ModelRef(namespace=namespace, name=name)
