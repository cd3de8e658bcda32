"""The proxy's settings: the shared ``FLEXINFER_*`` ones plus a few of its own (``FLEXINFER_PROXY_*``)."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator, Field, SecretStr, model_validator
from pydantic_settings import NoDecode

from flexinfer_common.settings import CommonSettings, Duration
from flexinfer_proxy.domain.requests import ApiKeys
from flexinfer_proxy.domain.shedding import Limits


def _keys(value: object) -> object:
    """``key1,key2`` -> one secret per key (so each is redacted from the logs on its own)."""
    if isinstance(value, str):
        return tuple(key.strip() for key in value.split(",") if key.strip())
    return value


#: Comma-separated secrets; an empty value means none.
SecretList = Annotated[tuple[SecretStr, ...], NoDecode, BeforeValidator(_keys)]


class ProxySettings(CommonSettings):
    proxy_max_request_body: int = Field(
        16 * 1024 * 1024, ge=1024, description="Largest request body the proxy accepts, in bytes (else 413)"
    )
    proxy_max_queued_bytes: int = Field(
        256 * 1024 * 1024,
        ge=1024,
        description="Bytes all waiting requests together may hold (their bodies); a request that would pass it "
        "gets 429",
    )
    proxy_api_keys: SecretList = Field(
        (),
        description="Comma-separated API keys: when set, /v1/* and /{namespace}/{model}/... need "
        "Authorization: Bearer <key>",
    )
    proxy_workers: int = Field(
        1, ge=1, le=64, description="Processes serving the port together (SO_REUSEPORT), each with its own queues"
    )
    proxy_upstream_connections: int = Field(
        1000, ge=1, description="Keep-alive connection pool size towards the models"
    )
    proxy_connect_timeout: Duration = Field(
        timedelta(seconds=10), description="How long connecting to a model may take before answering 502"
    )
    proxy_suspect_for: Duration = Field(
        timedelta(seconds=2),
        description="After connecting to a Ready model failed, how long it counts as not Ready here (its requests "
        "wait) unless a newer route comes first",
    )
    proxy_retry_after: int = Field(5, ge=1, description="Retry-After seconds on a 429 (queue full)")
    proxy_shutdown_timeout: Duration = Field(
        timedelta(seconds=10), description="How long in-flight requests may run on after SIGTERM"
    )

    proxy_max_connections: int = Field(
        8192,
        ge=1,
        description="Client connections open at once; one more is refused at once (503 too_many_connections once "
        "its request head is read, or closed)",
    )
    proxy_max_connections_per_client: int = Field(
        1024,
        ge=0,
        description="Client connections open at once from one address (0: no such cap); behind a load balancer "
        "every client has its address, so raise it or set 0",
    )
    proxy_header_timeout: Duration = Field(
        timedelta(seconds=10),
        description="How long a request head may take from its first byte (from the connection's opening for the "
        "first request) before 408 request_timeout",
    )
    proxy_body_timeout: Duration = Field(
        timedelta(seconds=10),
        description="How long a request body may take beyond its size at FLEXINFER_PROXY_BODY_MIN_RATE before 408 "
        "request_timeout",
    )
    proxy_body_min_rate: int = Field(
        8192,
        ge=1,
        description="Bytes per second a request body must keep up, on average, after FLEXINFER_PROXY_BODY_TIMEOUT",
    )

    proxy_stream_keepalive_interval: Duration = Field(
        timedelta(seconds=5),
        description="A stream: true request that waits this long gets its 200 text/event-stream head early, then "
        "an SSE comment line this often until its answer begins (0s: never)",
    )

    @model_validator(mode="after")
    def _limits_make_sense(self) -> ProxySettings:
        if self.proxy_stream_keepalive_interval.total_seconds() < 0:
            raise ValueError("FLEXINFER_PROXY_STREAM_KEEPALIVE_INTERVAL must not be negative")
        for name in ("proxy_header_timeout", "proxy_body_timeout"):
            if getattr(self, name).total_seconds() <= 0:
                raise ValueError(f"FLEXINFER_{name.upper()} must be more than 0 seconds")
        if self.proxy_max_connections_per_client > self.proxy_max_connections:
            raise ValueError(
                "FLEXINFER_PROXY_MAX_CONNECTIONS_PER_CLIENT must not be more than FLEXINFER_PROXY_MAX_CONNECTIONS "
                f"({self.proxy_max_connections_per_client} > {self.proxy_max_connections})"
            )
        return self

    def limits(self) -> Limits:
        """The client connection caps and request deadlines (``domain.shedding``)."""
        return Limits(
            max_connections=self.proxy_max_connections,
            max_per_client=self.proxy_max_connections_per_client,
            header_timeout=self.proxy_header_timeout.total_seconds(),
            body_timeout=self.proxy_body_timeout.total_seconds(),
            body_min_rate=float(self.proxy_body_min_rate),
        )

    def descriptors_needed(self) -> int:
        """File descriptors the proxy may need at once: client and model connections, plus a margin (the bus,
        logs, the listening socket)."""
        return self.proxy_max_connections + self.proxy_upstream_connections + 256

    def api_keys(self) -> ApiKeys | None:
        """The data plane's API keys, or None when the data plane is open."""
        if not self.proxy_api_keys:
            return None
        return ApiKeys(key.get_secret_value() for key in self.proxy_api_keys)

    def make_instance_id(self) -> str:
        """The id this proxy signs its demand with (``source``): FLEXINFER_INSTANCE_ID, else a new unique one
        (so call it once, at start)."""
        if self.instance_id:
            return self.instance_id
        return f"proxy-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
