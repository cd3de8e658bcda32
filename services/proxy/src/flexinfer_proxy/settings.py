"""The proxy's settings: the shared ``FLEXINFER_*`` ones plus a few of its own (``FLEXINFER_PROXY_*``)."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import timedelta

from pydantic import Field

from flexinfer_common.settings import CommonSettings, Duration


class ProxySettings(CommonSettings):
    proxy_max_request_body: int = Field(
        64 * 1024 * 1024, ge=1024, description="Largest request body the proxy accepts, in bytes"
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

    def make_instance_id(self) -> str:
        """The id this proxy signs its demand with (``source``): FLEXINFER_INSTANCE_ID, else a new unique one
        (so call it once, at start)."""
        if self.instance_id:
            return self.instance_id
        return f"proxy-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
