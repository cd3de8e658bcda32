"""Kubernetes Events as decisions: a pure :class:`Note` that a service's domain returns and its Kubernetes adapter
records (``flexinfer_common.kube.events``), so ``kubectl describe`` tells what FlexInfer did and why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class EventType(StrEnum):
    NORMAL = "Normal"
    WARNING = "Warning"


@dataclass(frozen=True)
class Note:
    """An Event to record on a resource of ``kind`` (a kind the recorder has an informer for)."""

    namespace: str
    name: str
    type: EventType
    reason: str
    message: str
    kind: str = "Model"
