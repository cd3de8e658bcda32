"""The proxy's settings: the shared ``FLEXINFER_*`` ones plus a few of its own (``FLEXINFER_PROXY_*``)."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta
from typing import Annotated

from pydantic import BeforeValidator, Field, SecretStr
from pydantic_settings import NoDecode

from flexinfer_common.settings import CommonSettings, Duration
from flexinfer_proxy.domain.requests import ApiKeys


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
