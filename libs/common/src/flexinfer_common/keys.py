"""The one model key of every service: ``namespace/name``."""

from __future__ import annotations

from typing import NamedTuple


class ModelKey(NamedTuple):
    """``namespace/name`` (a tuple: cheap to build and hash, which the election does tens of thousands of times;
    equal to the plain ``(namespace, name)`` tuple)."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"
