"""The ports every service shares (each service's own ports extend them)."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel


class Publisher(Protocol):
    """Publishes one message on the bus (JetStream; ``msg_id`` de-duplicates a retried publish)."""

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None: ...
