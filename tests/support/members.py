"""Members of a shared GPU group as the scheduler's domain sees them (``flexinfer_scheduler.domain.model.Member``)."""

from __future__ import annotations

from typing import Any

from flexinfer_common.enums import RuntimePhase, ScaleAction
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.model import Member


def member(model: str | ModelKey, *, runtime: RuntimePhase | None = None, generation: int = 1, **fields: Any) -> Member:
    """A member (a name is a model of namespace ``default``); with ``runtime``, one the scheduler told to activate
    (command ``generation``) whose actuator answered that command with ``runtime`` (Loading, Ready, Failed …)."""
    key = model if isinstance(model, ModelKey) else ModelKey("default", model)
    if runtime is None:
        return Member(key, **fields)
    return Member(
        key,
        runtime=runtime.value,
        desired_action=ScaleAction.ACTIVATE,
        command_generation=generation,
        runtime_generation=generation,
        **fields,
    )
