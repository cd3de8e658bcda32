"""The narrow interfaces the actuator's loop needs. Both back-ends implement :class:`Scaler` (``local``:
:class:`~flexinfer_actuator.adapters.local.LocalProcessScaler`, ``kubernetes``:
:class:`~flexinfer_actuator.adapters.kubernetes.KubernetesScaler`); the loop hands each a :data:`StatusSink` to
report what it observes."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

from flexinfer_actuator.domain.gpu_memory import GpuDevice, ProcessMemory
from flexinfer_actuator.domain.processes import Observation, ProcessInfo
from flexinfer_common.messages import RuntimeSpec

StatusSink = Callable[[Observation], Awaitable[None]]
"""Receives every observation, in the order the back-end made them for a model; never raises."""


class Scaler(Protocol):
    """Applies activate and park to one model's runtime and reports through its :data:`StatusSink`.

    The loop calls ``activate`` and ``park`` for one model strictly one after another (different models
    concurrently). ``activate`` returns once the runtime is accepted (``Loading`` reported), not when it is Ready;
    ``park`` returns once the runtime is parked (``Parked`` reported). Each observation carries ``generation``, the
    command it answers. Both are idempotent: activating a Ready model only reports Ready again.
    """

    backend: str

    async def activate(self, spec: RuntimeSpec, *, generation: int) -> None: ...

    async def park(self, spec: RuntimeSpec, *, generation: int) -> None: ...

    def snapshot(self) -> list[ProcessInfo]:
        """The runtimes that exist now (Loading, Ready, Stopping or Sleeping)."""
        ...

    async def close(self) -> None:
        """Stop every runtime this back-end started (actuator shutdown)."""
        ...


class GpuMemory(Protocol):
    """GPU memory per process and the devices' total memory, as this machine's driver reports them (NVML, amdsmi;
    the null one on a machine without a GPU). Calls are blocking (the driver's library): run them off the loop."""

    name: str

    def devices(self) -> list[GpuDevice]:
        """This machine's devices, by index (empty: no GPU)."""
        ...

    def processes(self) -> list[ProcessMemory]:
        """Every process using a device now and what it holds there."""
        ...

    def close(self) -> None: ...
