"""A stand-in actuator's side of the bus, for tests that run the scheduler against a memory bus: what it reports
when it has carried out a command at once; and a command as the actuator's own rules receive it."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from flexinfer_common import subjects
from flexinfer_common.enums import RuntimePhase, ScaleAction
from flexinfer_common.messages import RuntimeSpec, RuntimeStatus, ScaleCommand

#: where a model that a stand-in actuator reports Ready "serves" (nothing listens there)
ENDPOINT = "http://127.0.0.1:9"


def scale_command(
    *,
    generation: int,
    epoch: int = 0,
    model: str = "m",
    namespace: str = "default",
    action: ScaleAction = ScaleAction.ACTIVATE,
    runtime: RuntimeSpec | None = None,
    issued_at: datetime | None = None,
) -> ScaleCommand:
    """The scheduler's command ``action`` (an activate unless told) for ``namespace/model`` of ``generation``, sent
    by the scheduler leader of ``epoch`` (0: a scheduler without fencing) at ``issued_at`` (a fixed instant unless
    told); it runs ``runtime`` (``serve`` unless told)."""
    return ScaleCommand(
        namespace=namespace,
        model=model,
        action=action,
        generation=generation,
        leader_epoch=epoch,
        runtime=runtime or RuntimeSpec(namespace=namespace, name=model, command=["serve"]),
        issued_at=issued_at or datetime(2026, 1, 1, tzinfo=UTC),
    )


def done(command: ScaleCommand) -> RuntimePhase:
    """The phase of a model once ``command`` is carried out: Ready after an activate, Parked after a park."""
    return RuntimePhase.READY if command.action == ScaleAction.ACTIVATE else RuntimePhase.PARKED


def reported(
    namespace: str, model: str, phase: RuntimePhase, generation: int, now: datetime, **fields: Any
) -> tuple[str, RuntimeStatus]:
    """The subject and the status by which the actuator says that ``model`` is in ``phase`` for command
    ``generation`` (serving at ``ENDPOINT``)."""
    status = RuntimeStatus(
        namespace=namespace, model=model, phase=phase, generation=generation, endpoint=ENDPOINT, time=now, **fields
    )
    return subjects.runtime_status_subject(namespace, model), status
