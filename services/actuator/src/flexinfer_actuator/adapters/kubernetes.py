"""The ``kubernetes`` back-end: each model is a Deployment, scaled between 0 and 1 through its ``scale``
subresource; what it reports comes from the watched Deployment and its Pods.

Level-triggered: every change of a model's Deployment or of one of its Pods (and a tick, for load timeouts)
re-judges the model with the pure rules of :mod:`flexinfer_actuator.domain.workloads` against its last command,
reports what changed and writes the replicas the rules ask for. So a Deployment scaled or restarted by someone else
is handled by the same rules as a crash, and a write that was lost is made again.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import stamina

from flexinfer_actuator.adapters.sleep_mode import SleepMode
from flexinfer_actuator.domain.processes import Observation, ProcessInfo, ProcessPhase, log_fields
from flexinfer_actuator.domain.workloads import (
    DEFAULT_MODEL_PORT,
    RunState,
    Verdict,
    Want,
    WorkloadFacts,
    endpoint,
    judge_park,
    judge_run,
    selector_matches,
    workload_facts,
)
from flexinfer_actuator.ports import StatusSink
from flexinfer_common.clock import Clock, SystemClock
from flexinfer_common.enums import ParkStrategy, RuntimePhase
from flexinfer_common.keys import ModelKey
from flexinfer_common.kube.client import DEPLOYMENTS, KubeClient, KubeError, Object
from flexinfer_common.kube.events import EventRecorder
from flexinfer_common.kube.informer import Informer
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import RuntimeSpec
from flexinfer_common.notes import EventType, Note
from flexinfer_common.tasks import Background

log = get_logger("flexinfer.actuator.kubernetes")

# A scale write not yet seen in the watched Deployment is written again after this long.
_REWRITE_AFTER = 2.0


def _retryable(exc: Exception) -> bool:
    return isinstance(exc, KubeError) and (exc.status == 0 or exc.status == 429 or exc.status >= 500)


@dataclass
class _Model:
    spec: RuntimeSpec
    want: Want
    generation: int
    loading_since: float
    parked: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    write_seen: bool = False
    written_at: float | None = None
    was_ready: bool = False
    timed_out: str | None = None
    finished: bool = False  # a Failed verdict was reported: nothing more until the next command
    reported: tuple[RuntimePhase, str | None, str] | None = None
    started_at: datetime | None = None
    sleeping_pod: str | None = None  # parked asleep in this Pod (parkStrategy Sleep)
    woken_pod: str | None = None  # woken in this Pod: Ready by wake_up's answer
    sleep_fallback: str = ""  # why a Sleep park scaled to zero instead
    restarting: str | None = None  # waking failed: restarting

    @property
    def deployment(self) -> str:
        return self.spec.deployment or self.spec.name

    @property
    def wanted_replicas(self) -> int:
        return 1 if self.want is Want.RUN else 0

    def command(self, spec: RuntimeSpec, want: Want, generation: int) -> None:
        """A new command: what was judged for the previous one no longer holds."""
        self.spec, self.want, self.generation = spec, want, generation
        self.write_seen = self.finished = False
        self.written_at = self.reported = None
        self.timed_out = self.restarting = self.woken_pod = None
        self.sleep_fallback = ""

    @property
    def where(self) -> dict[str, object]:
        return log_fields(self.spec, self.generation, deployment=self.deployment)


class KubernetesScaler:
    """The :class:`~flexinfer_actuator.ports.Scaler` for models served by Deployments."""

    backend = "kubernetes"

    def __init__(
        self,
        *,
        client: KubeClient,
        deployments: Informer,
        pods: Informer,
        on_status: StatusSink,
        load_timeout: timedelta,
        events: EventRecorder | None = None,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        tick: float = 0.5,
    ) -> None:
        self.client = client
        self.deployments = deployments
        self.pods = pods
        self._on_status = on_status
        self._load_timeout = load_timeout.total_seconds()
        self._events = events
        self._clock = clock or SystemClock()
        self._monotonic = monotonic
        self._tick = tick
        self._models: dict[ModelKey, _Model] = {}
        self._dirty: set[ModelKey] = set()
        self._wake = asyncio.Event()
        self._worker = Background("kubernetes-scaler", self._run)
        self._sleep_mode = SleepMode(timeout=self._load_timeout)
        deployments.on_change(self._deployment_changed)
        pods.on_change(self._pod_changed)

    # ------------------------------------------------------------------ the Scaler protocol

    async def activate(self, spec: RuntimeSpec, *, generation: int) -> None:
        model = await self._commanded(spec)
        async with model.lock:
            model.command(spec, Want.RUN, generation)
            model.loading_since = self._monotonic()
            model.was_ready = False
            model.started_at = self._clock.now()
            log.info("activate", extra=model.where)
            if model.sleeping_pod is not None:
                await self._wake_up(model)
            await self._judge(model)

    async def park(self, spec: RuntimeSpec, *, generation: int) -> None:
        model = await self._commanded(spec)
        async with model.lock:
            model.command(spec, Want.PARK, generation)
            model.parked = asyncio.Event()
            log.info("park", extra=model.where)
            if spec.park_strategy is ParkStrategy.SLEEP and model.sleeping_pod is None:
                await self._sleep_it(model)
            await self._judge(model)
            parked = model.parked
        await parked.wait()

    async def _sleep_it(self, model: _Model) -> None:
        """Park by putting the serving Pod's server to sleep; when that fails, the park scales to zero instead."""
        serving = self._facts(model).serving
        if not serving:
            return  # nothing serves: nothing to put to sleep (a loading Pod is stopped, whatever the strategy)
        pod = serving[-1]
        await self._report(model, RuntimePhase.STOPPING, message=f"putting pod {pod.name} to sleep")
        problem = await self._sleep_mode.sleep(endpoint(pod, model.spec.port))
        if problem is None:
            model.sleeping_pod = pod.name
            log.info("model sleeps", extra={**model.where, "pod": pod.name})
        else:
            model.sleep_fallback = f"sleep failed ({problem}): scaled to zero instead"
            log.warning("sleep failed; scaling to zero instead", extra={**model.where, "why": problem})

    async def _wake_up(self, model: _Model) -> None:
        pod = next((p for p in self._facts(model).alive if p.name == model.sleeping_pod and not p.terminating), None)
        model.sleeping_pod = None
        if pod is None or not pod.ip:
            return  # its Pod is gone: a fresh start, by the usual rules
        problem = await self._sleep_mode.wake(endpoint(pod, model.spec.port))
        if problem is None:
            model.woken_pod = pod.name
            log.info("model woken", extra={**model.where, "pod": pod.name})
        else:
            model.restarting = f"wake_up failed ({problem}): restarting the model"
            log.warning("wake_up failed; restarting the model", extra={**model.where, "why": problem})

    async def _commanded(self, spec: RuntimeSpec) -> _Model:
        """The model a command names, once the caches it is judged against are filled."""
        self._ensure_started()
        await self.deployments.wait_synced()
        await self.pods.wait_synced()
        return self._model(spec)

    def adopt_parked(self, spec: RuntimeSpec) -> None:
        """A model the scheduler shows as not holding the GPU, and that this back-end has no command for (it was
        never started, or this actuator just took over): its Deployment is kept at zero like any parked model's,
        so a Deployment created with replicas 1, or scaled up by hand, cannot put a second model on the GPU.
        A command for it (generation 1 and up) replaces this; a report made meanwhile answers generation 0."""
        key = ModelKey(spec.namespace, spec.name)
        model = self._models.get(key)
        if model is not None and model.generation > 0:
            return
        if model is None:
            model = self._models[key] = _Model(spec, Want.PARK, 0, self._monotonic())
            model.reported = (RuntimePhase.PARKED, None, "")  # nothing to say while it is parked
        model.spec = spec
        self._ensure_started()
        self._mark(key)

    def forget(self, namespace: str, name: str) -> None:
        """The Model is gone: its Deployment is no longer ours to keep parked."""
        model = self._models.get(ModelKey(namespace, name))
        if model is not None and model.generation == 0:
            del self._models[ModelKey(namespace, name)]

    def snapshot(self) -> list[ProcessInfo]:
        rows = []
        for model in self._models.values():
            facts = self._facts(model)
            for pod in facts.alive:
                if pod.terminating:
                    phase = ProcessPhase.STOPPING
                elif pod.name == model.sleeping_pod:
                    phase = ProcessPhase.SLEEPING
                elif pod.ready and model.want is Want.RUN:
                    phase = ProcessPhase.READY
                elif model.want is Want.RUN:
                    phase = ProcessPhase.LOADING
                else:
                    phase = ProcessPhase.STOPPING
                rows.append(
                    ProcessInfo(
                        namespace=model.spec.namespace,
                        name=model.spec.name,
                        pid=None,
                        port=model.spec.port or pod.port or DEFAULT_MODEL_PORT,
                        phase=phase,
                        generation=model.generation,
                        started_at=model.started_at or self._clock.now(),
                        endpoint=endpoint(pod, model.spec.port) if pod.ip else "",
                        pod=pod.name,
                    )
                )
        return rows

    async def close(self) -> None:
        """Stop judging. Deployments stay as they are: the next actuator takes them over."""
        await self._worker.stop()
        await self._sleep_mode.close()

    # ------------------------------------------------------------------ watching

    def _model(self, spec: RuntimeSpec) -> _Model:
        key = ModelKey(spec.namespace, spec.name)
        model = self._models.get(key)
        if model is None:
            model = self._models[key] = _Model(spec, Want.PARK, 0, self._monotonic())
        return model

    def _deployment_changed(self, _: str, obj: Object) -> None:
        meta = obj.get("metadata") or {}
        namespace, name = meta.get("namespace"), meta.get("name")
        replicas = workload_facts(namespace or "", name or "", obj, ()).replicas
        for key, model in self._models.items():
            if model.spec.namespace == namespace and model.deployment == name:
                # Seen here, on each change, not only when judged: changes are judged together, and ours followed
                # at once by someone else's would otherwise look like ours not yet seen (and theirs go unnoticed).
                if replicas == model.wanted_replicas:
                    model.write_seen = True
                self._mark(key)

    def _pod_changed(self, _: str, obj: Object) -> None:
        meta = obj.get("metadata") or {}
        namespace, labels = meta.get("namespace"), meta.get("labels") or {}
        for key, model in self._models.items():
            if model.spec.namespace != namespace:
                continue
            deployment = self.deployments.get(namespace, model.deployment)
            if deployment is not None and selector_matches((deployment.get("spec") or {}).get("selector"), labels):
                self._mark(key)

    def _mark(self, key: ModelKey) -> None:
        self._dirty.add(key)
        self._wake.set()

    def _ensure_started(self) -> None:
        self._worker.start()

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._tick):
                    await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            due = dirty | {key for key, m in self._models.items() if self._loading(m)}
            busy = False
            for key in due:
                model = self._models.get(key)
                if model is None or model.lock.locked():
                    if model is not None:
                        self._dirty.add(key)  # a command is being applied: judge again right after it
                        busy = True
                    continue
                try:
                    async with model.lock:
                        await self._judge(model)
                except Exception:
                    log.exception("could not judge a model; trying again", extra=model.where)
                    self._dirty.add(key)
            if busy:
                await asyncio.sleep(0.01)
                self._wake.set()

    @staticmethod
    def _loading(model: _Model) -> bool:
        """Whether the model is (re)loading: judged on every tick, as its load timeout runs on our clock."""
        if model.want is not Want.RUN or model.finished:
            return False
        return model.reported is None or model.reported[0] is not RuntimePhase.READY

    # ------------------------------------------------------------------ judging

    def _facts(self, model: _Model) -> WorkloadFacts:
        namespace = model.spec.namespace
        deployment = self.deployments.get(namespace, model.deployment)
        pods = [p for (ns, _), p in self.pods.cache.items() if ns == namespace]
        return workload_facts(namespace, model.deployment, deployment, pods)

    async def _judge(self, model: _Model) -> None:
        """Compare the model's Deployment and Pods with its last command; scale and report as the rules say."""
        if model.finished:
            return
        facts = self._facts(model)
        now = self._monotonic()
        if model.want is Want.RUN:
            if not model.write_seen and facts.exists and facts.replicas == 1:
                model.write_seen = True
            verdict = judge_run(
                facts,
                RunState(
                    spec_port=model.spec.port,
                    load_seconds=now - model.loading_since,
                    load_timeout=self._load_timeout,
                    write_seen=model.write_seen,
                    was_ready=model.was_ready,
                    timed_out=model.timed_out,
                    rendered=model.spec.rendered,
                    woken_pod=model.woken_pod,
                    restarting=model.restarting,
                ),
            )
            if model.restarting is not None and not facts.alive and verdict.replicas == 1:
                model.restarting = None  # the old Pod is gone; from here on a load like any other
                model.loading_since = now
                model.write_seen = False
            if verdict.phase is None and verdict.replicas == 0 and model.timed_out is None:
                model.timed_out = verdict.message
                log.warning(
                    "not ready within the load timeout; scaling to 0", extra={**model.where, "why": verdict.message}
                )
        else:
            if not model.write_seen and facts.replicas == 0:
                model.write_seen = True
            if model.sleeping_pod is not None and not any(p.name == model.sleeping_pod for p in facts.alive):
                model.sleeping_pod = None  # its Pod went away: parked by the usual rules now
            verdict = judge_park(
                facts, write_seen=model.write_seen, sleeping_pod=model.sleeping_pod, fallback=model.sleep_fallback
            )
        await self._scale_as_judged(model, facts, verdict)
        await self._report_verdict(model, verdict)

    async def _scale_as_judged(self, model: _Model, facts: WorkloadFacts, verdict: Verdict) -> None:
        if verdict.replicas is None or not facts.exists:
            return
        recently = model.written_at is not None and self._monotonic() - model.written_at < _REWRITE_AFTER
        if verdict.outside_change is None and recently:
            return  # ours is on its way
        if verdict.outside_change is not None:
            log.warning(
                "scaled outside FlexInfer; scaling back", extra={**model.where, "detail": verdict.outside_change}
            )
            self._note(model, EventType.WARNING, "ScaledOutsideFlexInfer", verdict.outside_change)
            model.write_seen = False
        await self._scale(model, verdict.replicas)

    async def _scale(self, model: _Model, replicas: int) -> None:
        """``PATCH .../deployments/<name>/scale``: the only write the back-end makes to a Deployment."""
        model.written_at = self._monotonic()
        try:
            async for attempt in stamina.retry_context(on=_retryable, attempts=3, wait_initial=0.2, wait_max=1.0):
                with attempt:
                    await self.client.patch(
                        DEPLOYMENTS,
                        model.spec.namespace,
                        model.deployment,
                        {"spec": {"replicas": replicas}},
                        subresource="scale",
                    )
            log.info("scaled", extra={**model.where, "replicas": replicas})
        except KubeError as exc:
            # Judged again on the next change or tick: the write is made again while it is not seen.
            log.warning("scale failed", extra={**model.where, "replicas": replicas, "error": str(exc)})

    async def _report_verdict(self, model: _Model, verdict: Verdict) -> None:
        if verdict.phase is None:
            return
        if verdict.phase is RuntimePhase.READY:
            model.was_ready = True
        elif verdict.phase is RuntimePhase.LOADING and model.reported and model.reported[0] is RuntimePhase.READY:
            model.loading_since = self._monotonic()  # a restart gets a load timeout of its own
        if (verdict.phase, verdict.endpoint, verdict.message) == model.reported:
            return
        if verdict.phase is RuntimePhase.FAILED:
            model.finished = True
            log.warning("model failed", extra={**model.where, "reason": verdict.message})
            self._note(model, EventType.WARNING, "RuntimeFailed", verdict.message)
        elif verdict.phase is RuntimePhase.READY:
            log.info("model ready", extra={**model.where, "endpoint": verdict.endpoint})
        await self._report(model, verdict.phase, endpoint=verdict.endpoint, message=verdict.message)
        if verdict.phase is RuntimePhase.PARKED:
            model.parked.set()

    async def _report(
        self, model: _Model, phase: RuntimePhase, *, endpoint: str | None = None, message: str = ""
    ) -> None:
        """Report ``phase`` for the command the model answers now, and remember it (a verdict is reported once)."""
        model.reported = (phase, endpoint, message)
        await self._on_status(
            Observation(
                model.spec.namespace, model.spec.name, phase, model.generation, endpoint=endpoint, message=message
            )
        )

    def _note(self, model: _Model, kind: EventType, reason: str, message: str) -> None:
        if self._events is not None:
            self._events.record(Note(model.spec.namespace, model.spec.name, kind, reason, message))
