"""What the actuator knows about one model's runtime: a local process, or a Deployment in Kubernetes mode."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from flexinfer_common.enums import RuntimePhase
from flexinfer_common.messages import RuntimeSpec


class ProcessPhase(StrEnum):
    """The phase of a runtime that exists (a parked or failed model has no runtime at all)."""

    LOADING = "Loading"
    READY = "Ready"
    STOPPING = "Stopping"
    SLEEPING = "Sleeping"


@dataclass(frozen=True)
class ProcessInfo:
    """One row of the process table (``GET /api/v1/processes``): a local process, or a model's Pod."""

    namespace: str
    name: str
    pid: int | None  # a local process; None for a Pod
    port: int
    phase: ProcessPhase
    generation: int
    started_at: datetime
    endpoint: str
    pod: str | None = None  # the Pod serving the model (Kubernetes back-end)


@dataclass(frozen=True)
class Observation:
    """A back-end's report about one model; the loop turns it into a ``RuntimeStatus`` on the bus.

    ``generation`` is the command generation the observation answers.
    """

    namespace: str
    name: str
    phase: RuntimePhase
    generation: int
    endpoint: str | None = None
    message: str = ""
    pid: int | None = None
    memory: int | None = None  # the GPU memory its processes hold on the device where they hold most (measured)


def log_fields(spec: RuntimeSpec, generation: int, **more: object) -> dict[str, object]:
    """The fields that name a model's runtime in a back-end's log lines, the same in both back-ends: the model, what
    the back-end runs it as (``more``: a Deployment, a pid and port) and the command generation it answers."""
    return {"namespace": spec.namespace, "model": spec.name, **more, "generation": generation}
