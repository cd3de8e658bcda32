"""The scheduler's bus inputs: each message is recorded in the store, then the groups it touched are kicked for an
election pass. A demand (the requests waiting for a model), a proxy's in-flight counts, an actuator's runtime
status (a crash announced with an event and a metric; the GPU memory measured kept, with a warning when it exceeds
the model's declaration), an actuator's hello (its models' runtime forgotten so their commands go again; the local
machine's GPUs recorded as the capacity of a group that declares none).

Only the leading replica consumes these (``Scheduler._become_leader``); the intake itself holds no state.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

from flexinfer_common import subjects
from flexinfer_common.bus import Delivery
from flexinfer_common.clock import Clock
from flexinfer_common.enums import ModelPhase, RuntimePhase
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import (
    ActuatorHello,
    Demand,
    InFlightReport,
    MemoryStatus,
    ModelEvent,
    ModelStatus,
    RuntimeStatus,
)
from flexinfer_scheduler.domain.manifests import visible_group
from flexinfer_scheduler.domain.model import memory_exceeded
from flexinfer_scheduler.metrics import MODEL_RESTARTS
from flexinfer_scheduler.ports import (
    LOCAL_BACKEND,
    DemandReport,
    MeasuredMemory,
    RuntimeReport,
    SchedulerStore,
)
from flexinfer_scheduler.publishing import PassPublisher

log = get_logger("flexinfer.scheduler")


class BusIntake:
    """The handlers of the scheduler's consumers. ``kick(group)`` asks for a pass of that group (None: of all)."""

    def __init__(
        self, store: SchedulerStore, publisher: PassPublisher, clock: Clock, kick: Callable[[str | None], None]
    ) -> None:
        self.store = store
        self.publisher = publisher
        self.clock = clock
        self.kick = kick

    async def on_demand(self, demand: Demand, delivery: Delivery) -> None:
        now = self.clock.now()
        when = min(demand.time, now) if demand.time else now
        group = await self.store.record_demand(
            DemandReport(
                namespace=demand.namespace,
                name=demand.model,
                source=demand.source,
                queued=demand.queued,
                when=when,
                message_id=delivery.message_id,
                valid_for=timedelta(seconds=demand.valid_for) if demand.valid_for is not None else None,
            )
        )
        if group is not None:
            self.kick(group)
        else:
            log.info(
                "demand ignored (unknown model or repeated message)",
                extra={"model": f"{demand.namespace}/{demand.model}"},
            )

    async def on_in_flight(self, report: InFlightReport, _: Delivery) -> None:
        now = self.clock.now()
        counts = {ModelKey(c.namespace, c.model): c.in_flight for c in report.models}
        for group in await self.store.record_in_flight(source=report.source, counts=counts, when=min(report.time, now)):
            self.kick(group)  # a count fell to zero: a drain may be over

    async def on_runtime_status(self, status: RuntimeStatus, _: Delivery) -> None:
        if status.phase is RuntimePhase.FAILED:
            crash = await self.store.note_crash(
                namespace=status.namespace, name=status.model, generation=status.generation
            )
            if crash is not None:
                await self._announce_crash(status, restarts=crash[0], group=crash[1])
        group = await self.store.record_runtime(
            RuntimeReport(
                namespace=status.namespace,
                name=status.model,
                phase=status.phase.value,
                generation=status.generation,
                endpoint=status.endpoint,
                message=status.message,
                when=status.time,
            )
        )
        if group is not None:
            if status.gpu_memory is not None:
                await self._record_measured_memory(status, status.gpu_memory)
            self.kick(group)
        else:
            log.debug("stale runtime status ignored", extra={"model": f"{status.namespace}/{status.model}"})

    async def _record_measured_memory(self, status: RuntimeStatus, measured: int) -> None:
        """Keep what the model was measured to hold (status.memory; fitting counts it where it exceeds the declared
        or estimated figure), and warn once when it newly exceeds that figure."""
        found = await self.store.record_measured_memory(
            namespace=status.namespace, name=status.model, measured=measured
        )
        if found is None or found.previous == measured:
            return
        if memory_exceeded(found.reference, measured, found.previous):
            await self._warn_memory(status, measured, found)

    async def _warn_memory(self, status: RuntimeStatus, measured: int, found: MeasuredMemory) -> None:
        model = f"{status.namespace}/{status.model}"
        message = (
            f"measured {measured} bytes of GPU memory, more than its {found.source} {found.reference} bytes: "
            "fitting counts the measured figure"
        )
        log.warning("model holds more GPU memory than it declares", extra={"model": model, "detail": message})
        event = ModelEvent(
            kind="model.memory",
            namespace=status.namespace,
            model=status.model,
            group=visible_group(found.group) if found.group else None,
            status=ModelStatus(
                phase=ModelPhase.READY, message=message, memory=MemoryStatus(bytes=measured, source="measured")
            ),
            time=status.time,
        )
        subject = subjects.event_subject("model", found.group or "none")
        await self.publisher.publish_all([(subject, event, f"memory:{model}:{status.generation}:{measured}")])

    async def _announce_crash(self, status: RuntimeStatus, *, restarts: int, group: str | None) -> None:
        """A model that was Ready crashed: an event with the exit reason and a metric (the restart follows from the
        next pass, after the back-off)."""
        MODEL_RESTARTS.inc(status.namespace, status.model)
        reason = status.message or "exited"
        log.warning(
            "model crashed after it was Ready; restarting",
            extra={
                "model": f"{status.namespace}/{status.model}",
                "reason": reason[:500],
                "restarts": restarts,
            },
        )
        event = ModelEvent(
            kind="model.crashed",
            namespace=status.namespace,
            model=status.model,
            group=visible_group(group) if group else None,
            status=ModelStatus(phase=ModelPhase.FAILED, message=f"crashed: {reason}", restarts=restarts),
            restarts=restarts,
            time=status.time,
        )
        subject = subjects.event_subject("model", group or "none")
        await self.publisher.publish_all(
            [(subject, event, f"crash:{status.namespace}/{status.model}:{status.generation}")]
        )

    async def on_actuator_hello(self, hello: ActuatorHello, _: Delivery) -> None:
        count = await self.store.forget_runtime()
        log.info("actuator started; re-issuing commands", extra={"actuator": hello.actuator, "models": count})
        if hello.backend == LOCAL_BACKEND:
            # its machine's GPUs (none: no GPU there) are the capacity of the groups that declare none
            changed = await self.store.record_gpu_inventory(
                backend=hello.backend, actuator=hello.actuator, device_memory=hello.gpu_devices, when=hello.time
            )
            if changed:
                log.info(
                    "GPU devices discovered by the local actuator",
                    extra={"actuator": hello.actuator, "devices": len(hello.gpu_devices)},
                )
            groups = await self.store.group_names() if hello.gpu_devices else []
            if len(groups) > 1:  # domain.manifests.machine_capacity
                log.warning(
                    "GPU devices discovered, but several groups share this machine: none gets them as its capacity "
                    "(each would count every device); declare spec.capacity on each group's GPUGroup to load several "
                    "models per card",
                    extra={"groups": groups, "devices": len(hello.gpu_devices)},
                )
        self.kick(None)  # every group
