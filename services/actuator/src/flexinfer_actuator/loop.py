"""The actuator's loop: consume scale commands, apply them through a :class:`~flexinfer_actuator.ports.Scaler`,
publish what the back-end observes.

Commands for one model are applied strictly in order by that model's own worker task; different models proceed
concurrently. The bus handler only routes a command to its model's queue, so a slow park never holds up the
consumer or another model. Each worker judges a command's generation first (stale: ignored; repeated: re-report).
"""

from __future__ import annotations

import asyncio
import functools

import stamina

from flexinfer_actuator.domain.commands import GenerationVerdict
from flexinfer_actuator.domain.fencing import EpochVerdict, judge_command
from flexinfer_actuator.domain.processes import Observation
from flexinfer_actuator.metrics import ACTUATOR_COMMANDS
from flexinfer_actuator.ports import Scaler
from flexinfer_common import subjects
from flexinfer_common.bus import Bus, Consumer, Delivery, decode_json
from flexinfer_common.clock import Clock
from flexinfer_common.enums import RuntimePhase, ScaleAction
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import ActuatorHello, RuntimeStatus, ScaleCommand, message_id
from flexinfer_common.ports import Publisher
from flexinfer_common.tasks import Background

log = get_logger("flexinfer.actuator")

DURABLE = "actuator"
COMMAND_FILTER = subjects.COMMAND_PREFIX + ".>"
_PUBLISH_ATTEMPTS = 3
_PUBLISH_RETRY_DELAY = 0.5


class StatusPublisher:
    """Turns a back-end's observations into ``RuntimeStatus`` messages and remembers the last one per model, so a
    repeated command can be answered with the current status. ``report`` never raises. A status the bus did not
    take (it was down, or every attempt failed) is kept, the newest per model, and sent again with a fresh time
    every ``resend_interval`` until the bus takes it or a newer status replaces it (``start`` runs that): the
    scheduler re-issues a command only while no status answers it, so a Ready lost after the Loading that answered
    its activate left the model Loading there until its load timed out, its requests waiting (a NATS restart in
    the chaos suite: 51-101 x 504)."""

    def __init__(self, *, bus: Publisher, actuator: str, clock: Clock, resend_interval: float = 0.5) -> None:
        self._bus = bus
        self._actuator = actuator
        self._clock = clock
        self._last: dict[ModelKey, RuntimeStatus] = {}
        self._unsent: dict[ModelKey, RuntimeStatus] = {}  # the newest status per model the bus did not take
        self._resend_interval = resend_interval
        self._resender = Background("status-resend", self._resend_unsent)

    def last(self, namespace: str, model: str) -> RuntimeStatus | None:
        return self._last.get(ModelKey(namespace, model))

    @property
    def unsent(self) -> int:
        """How many models' newest status waits to be sent again."""
        return len(self._unsent)

    def start(self) -> None:
        self._resender.start()

    async def stop(self) -> None:
        await self._resender.stop()

    async def report(self, observation: Observation) -> None:
        status = RuntimeStatus(
            namespace=observation.namespace,
            model=observation.name,
            phase=observation.phase,
            generation=observation.generation,
            endpoint=observation.endpoint,
            message=observation.message,
            pid=observation.pid,
            gpu_memory=observation.memory,
            time=self._clock.now(),
            actuator=self._actuator,
        )
        self._last[ModelKey(status.namespace, status.model)] = status
        await self._send(status, status)

    async def rereport(self, namespace: str, model: str) -> bool:
        """Publish the model's last status again (fresh time); False when none was reported yet."""
        last = self._last.get(ModelKey(namespace, model))
        if last is None:
            return False
        await self._send(last, last.model_copy(update={"time": self._clock.now()}))
        return True

    def _bus_up(self) -> bool:
        return bool(getattr(self._bus, "connected", True))

    async def _resend_unsent(self) -> None:
        while True:
            await asyncio.sleep(self._resend_interval)
            if not self._bus_up():
                continue  # (tried once it is back, not logged as "bus down" every interval meanwhile)
            for status in list(self._unsent.values()):
                await self._send(status, status.model_copy(update={"time": self._clock.now()}))

    async def _send(self, status: RuntimeStatus, message: RuntimeStatus) -> None:
        """Publish ``message`` (``status``, or it again with a fresh time); keep ``status`` to send again when the
        bus does not take it and it is still the model's newest, forget it once it does."""
        key = ModelKey(status.namespace, status.model)
        if await self._publish(message):
            if self._unsent.get(key) is status or self._last.get(key) is status:
                self._unsent.pop(key, None)  # (what was kept is this status, or older than it)
        elif self._last.get(key) is status:
            self._unsent[key] = status

    async def _publish(self, status: RuntimeStatus) -> bool:
        subject = subjects.runtime_status_subject(status.namespace, status.model)
        # Unique per report (a re-report must not be de-duplicated away), stable across this call's retries.
        msg_id = message_id(self._actuator)
        fields = {
            "namespace": status.namespace,
            "model": status.model,
            "phase": status.phase.value,
            "generation": status.generation,
        }
        try:
            async for attempt in stamina.retry_context(
                on=_publish_failed,
                attempts=_PUBLISH_ATTEMPTS,
                wait_initial=_PUBLISH_RETRY_DELAY,
                wait_max=1.0,
                wait_jitter=0.1,
            ):
                with attempt:
                    if not self._bus_up():
                        # No waiting on a dead bus (it would stall shutdown): kept, and sent once the bus is back.
                        log.warning("bus down: runtime status kept until it is back", extra=fields)
                        return False
                    await self._bus.publish(subject, status, msg_id=msg_id)
        except Exception as exc:
            log.error("could not publish runtime status; kept to send again", extra={**fields, "error": repr(exc)})
            return False
        log.info("runtime status", extra={**fields, "detail": status.message or None})
        return True


def _publish_failed(exc: Exception) -> bool:
    """Every failure of a status publish is retried (a timeout, a reconnect under way); cancellation is not an
    Exception, so it ends the retries at once."""
    return True


class Actuator:
    """Consumes ``flexinfer.actuator.command.>`` (durable ``actuator``) and applies each command in order per model."""

    def __init__(
        self,
        *,
        bus: Bus,
        scaler: Scaler,
        statuses: StatusPublisher,
        instance: str,
        clock: Clock,
        drain_timeout: float = 15.0,
        gpu_devices: tuple[int, ...] = (),
    ) -> None:
        """``gpu_devices``: the total memory of each GPU device of this machine (local mode; said in the hello)."""
        self.bus = bus
        self.gpu_devices = gpu_devices
        self.scaler = scaler
        self.statuses = statuses
        self.instance = instance
        self.clock = clock
        self.drain_timeout = drain_timeout
        self._consumer: Consumer[ScaleCommand] | None = None
        self._queues: dict[ModelKey, asyncio.Queue[ScaleCommand | None]] = {}
        self._workers: dict[ModelKey, asyncio.Task[None]] = {}
        self._applied: dict[ModelKey, tuple[int, int]] = {}  # (leader epoch, generation) applied last
        self.highest_epoch = 0  # the highest scheduler leader epoch seen (domain/fencing.py)
        self._stopping = False

    @property
    def consuming(self) -> bool:
        return self._consumer is not None and not self._stopping

    async def start(self) -> None:
        """Start consuming, then say hello (the scheduler re-issues the commands it wants applied)."""
        consumer = Consumer(
            self.bus,
            stream=subjects.COMMAND_STREAM,
            durable=DURABLE,
            filter_subject=COMMAND_FILTER,
            decode=functools.partial(decode_json, ScaleCommand),
            handler=self.handle,
        )
        await consumer.start()
        self._consumer = consumer
        now = self.clock.now()
        hello = ActuatorHello(
            actuator=self.instance, backend=self.scaler.backend, time=now, gpu_devices=list(self.gpu_devices)
        )
        await self.bus.publish(subjects.actuator_hello_subject(self.instance), hello, msg_id=message_id(self.instance))
        log.info("actuator consuming commands", extra={"actuator": self.instance, "backend": self.scaler.backend})

    async def handle(self, command: ScaleCommand, delivery: Delivery) -> None:
        """Route a command to its model's worker (the bus acks it once queued)."""
        key = ModelKey(command.namespace, command.model)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = asyncio.Queue()
            self._workers[key] = asyncio.create_task(self._work(key, queue), name=f"model:{key}")
        log.debug(
            "command queued",
            extra={"subject": delivery.subject, "command_id": command.command_id, "generation": command.generation},
        )
        queue.put_nowait(command)

    async def stop(self) -> None:
        """Stop consuming, let each model finish the command it is applying, then stop every runtime."""
        self._stopping = True
        if self._consumer is not None:
            await self._consumer.stop()
        for queue in self._queues.values():
            while not queue.empty():
                queue.get_nowait()
            queue.put_nowait(None)
        workers = list(self._workers.values())
        if workers:
            _, late = await asyncio.wait(workers, timeout=self.drain_timeout)
            for task in late:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        await self.scaler.close()
        log.info("actuator stopped", extra={"actuator": self.instance})

    async def _work(self, key: ModelKey, queue: asyncio.Queue[ScaleCommand | None]) -> None:
        while (command := await queue.get()) is not None:
            try:
                await self._apply(command)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                ACTUATOR_COMMANDS.labels(action=command.action.value, result="error").inc()
                log.exception(
                    "command failed",
                    extra={"namespace": key[0], "model": key[1], "generation": command.generation},
                )
                await self.statuses.report(
                    Observation(
                        key[0], key[1], RuntimePhase.FAILED, command.generation, message=f"actuator error: {exc!r}"
                    )
                )

    async def _apply(self, command: ScaleCommand) -> None:
        key = ModelKey(command.namespace, command.model)
        fields = {
            "namespace": command.namespace,
            "model": command.model,
            "action": command.action.value,
            "generation": command.generation,
            "swap_id": command.swap_id,
        }
        last = self._applied.get(key)
        fence, verdict = judge_command(command, highest_epoch=self.highest_epoch, last_applied=last)
        if fence is EpochVerdict.DEPOSED:
            log.warning(
                "refused a command from a deposed scheduler leader",
                extra={**fields, "leader_epoch": command.leader_epoch, "current_epoch": self.highest_epoch},
            )
            ACTUATOR_COMMANDS.labels(action=command.action.value, result="fenced").inc()
            return
        if fence is EpochVerdict.NEW_LEADER:
            log.info(
                "commands from a new scheduler leader",
                extra={"leader_epoch": command.leader_epoch, "previous_epoch": self.highest_epoch},
            )
            self.highest_epoch = command.leader_epoch
        if verdict is GenerationVerdict.STALE:
            log.info("ignored stale command", extra={**fields, "last_applied": last})
            ACTUATOR_COMMANDS.labels(action=command.action.value, result="stale").inc()
            return
        if verdict is GenerationVerdict.REREPORT and await self.statuses.rereport(*key):
            log.info("repeated command: re-reported the current status", extra=fields)
            ACTUATOR_COMMANDS.labels(action=command.action.value, result="rereported").inc()
            return
        self._applied[key] = (command.leader_epoch, command.generation)
        spec = command.runtime
        if (spec.namespace, spec.name) != key:
            log.warning(
                "runtime spec names another model; using the command's", extra={**fields, "spec_name": spec.name}
            )
            spec = spec.model_copy(update={"namespace": command.namespace, "name": command.model})
        log.info("applying command", extra=fields)
        if command.action is ScaleAction.ACTIVATE:
            await self.scaler.activate(spec, generation=command.generation)
        else:
            await self.scaler.park(spec, generation=command.generation)
        ACTUATOR_COMMANDS.labels(action=command.action.value, result="applied").inc()
