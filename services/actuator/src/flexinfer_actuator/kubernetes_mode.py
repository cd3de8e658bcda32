"""The actuator in Kubernetes mode: while this replica leads (a ``coordination.k8s.io`` Lease), it watches the
resources, applies scale commands to Deployments, hands specs to the scheduler and writes statuses back. A replica
that stops leading stops all of that before another may start (the Lease's renew deadline is shorter than its
duration), so one replica acts at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from flexinfer_actuator.adapters.kubernetes import KubernetesScaler
from flexinfer_actuator.adapters.rendered_workloads import WorkloadRenderer
from flexinfer_actuator.adapters.spec_sync import SpecErrors, SpecSync
from flexinfer_actuator.adapters.status_writer import StatusWriter
from flexinfer_actuator.domain.processes import ProcessInfo
from flexinfer_actuator.loop import Actuator, StatusPublisher
from flexinfer_actuator.metrics import ACTUATOR_LEADER
from flexinfer_actuator.settings import ActuatorSettings
from flexinfer_common.bus import Bus
from flexinfer_common.clock import Clock
from flexinfer_common.enums import SharedState
from flexinfer_common.kube.client import (
    DEPLOYMENTS,
    GPUGROUPS,
    MODELS,
    PODS,
    SERVICES,
    KubeClient,
    Object,
)
from flexinfer_common.kube.events import EventRecorder
from flexinfer_common.kube.informer import DELETED, Informer, object_key
from flexinfer_common.kube.leading import Leading
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import ModelStatus, RuntimeSpec

log = get_logger("flexinfer.actuator.kubernetes")

COMPONENT = "flexinfer-actuator"  # the source of the Events it records


@dataclass
class Term:
    """Everything that runs while this replica leads."""

    informers: list[Informer]
    scaler: KubernetesScaler
    spec_sync: SpecSync
    status_writer: StatusWriter
    renderer: WorkloadRenderer
    events: EventRecorder
    actuator: Actuator


class KubernetesMode(Leading[Term]):
    def __init__(
        self,
        *,
        settings: ActuatorSettings,
        bus: Bus,
        client: KubeClient,
        statuses: StatusPublisher,
        instance: str,
        clock: Clock,
    ) -> None:
        super().__init__(client, settings, lease_name=settings.leader_election_lease, instance=instance)
        self.settings = settings
        self.bus = bus
        self.statuses = statuses
        self.clock = clock

    # ------------------------------------------------------------------ what the service shows

    @property
    def leading(self) -> bool:
        return self.term is not None

    def processes(self) -> list[ProcessInfo]:
        return self.term.scaler.snapshot() if self.term is not None else []

    def consuming(self) -> bool:
        """Ready: leading with every cache synced and consuming, or standing by."""
        if self.term is None:
            return True
        return all(i.synced for i in self.term.informers) and self.term.actuator.consuming

    # ------------------------------------------------------------------ running

    async def run(self, stop: asyncio.Event) -> None:
        ACTUATOR_LEADER.set(0)
        await super().run(stop)

    async def _begin(self) -> None:
        self.term = term = self._build_term()
        for informer in term.informers:
            informer.start()
        term.spec_sync.start()
        term.renderer.start()
        await term.status_writer.start()
        # Commands only once the Deployments and Pods are known: a command is judged against them.
        await asyncio.gather(*(i.wait_synced() for i in term.informers))
        await term.actuator.start()
        ACTUATOR_LEADER.set(1)
        log.info(
            "acting: watching resources and applying commands",
            extra={"namespaces": self.namespaces or "all", "actuator": self.instance},
        )

    async def _end(self, term: Term) -> None:
        ACTUATOR_LEADER.set(0)
        with contextlib.suppress(Exception):
            await term.actuator.stop()  # stops consuming; the scaler leaves Deployments as they are
        await term.status_writer.stop()
        await term.spec_sync.stop()
        await term.renderer.stop()
        await term.events.flush()
        for informer in term.informers:
            await informer.stop()
        log.info("stopped acting", extra={"actuator": self.instance})

    def _build_term(self) -> Term:
        client, namespaces = self.client, self.namespaces

        def informer(resource: object) -> Informer:
            return Informer(client, resource, namespaces)  # type: ignore[arg-type]

        models, groups = informer(MODELS), informer(GPUGROUPS)
        deployments, pods, services = informer(DEPLOYMENTS), informer(PODS), informer(SERVICES)
        events = EventRecorder(
            client, informers={"Model": models, "GPUGroup": groups}, instance=self.instance, component=COMPONENT
        )
        errors = SpecErrors()
        spec_sync = SpecSync(
            bus=self.bus,
            models=models,
            groups=groups,
            namespaces=namespaces,
            errors=errors,
            clock=self.clock,
            note=events.record,
        )
        status_writer = StatusWriter(
            bus=self.bus,
            client=client,
            models=models,
            groups=groups,
            services=services,
            errors=errors,
            events=events,
            clock=self.clock,
        )
        renderer = WorkloadRenderer(
            client=client,
            models=models,
            groups=groups,
            deployments=deployments,
            services=services,
            pods=pods,
            settings=self.settings.render_settings(),
            errors=errors,
            note=events.record,
            cleanup_toleration=self.settings.cleanup_toleration,
        )
        scaler = KubernetesScaler(
            client=client,
            deployments=deployments,
            pods=pods,
            on_status=self.statuses.report,
            load_timeout=self.settings.load_timeout,
            events=events,
            clock=self.clock,
        )

        def keep_parked(namespace: str, name: str, status: ModelStatus) -> None:
            obj = models.get(namespace, name)
            if obj is None or status.shared_group.state is SharedState.ACTIVE:
                return  # gone, or about to be activated: its command will come
            spec = obj.get("spec") or {}
            scaler.adopt_parked(
                RuntimeSpec(
                    namespace=namespace,
                    name=name,
                    deployment=str(spec.get("deployment") or name),
                    port=(spec.get("endpoint") or {}).get("port"),
                )
            )

        status_writer.on_model_status.append(keep_parked)

        def forget_deleted(event: str, obj: Object) -> None:
            if event == DELETED:
                scaler.forget(*object_key(obj))

        models.on_change(forget_deleted)
        actuator = Actuator(
            bus=self.bus,
            scaler=scaler,
            statuses=self.statuses,
            instance=self.instance,
            clock=self.clock,
            # Nothing runs in this process: a park still waiting for Pods to go is safely left to the next leader.
            drain_timeout=2.0,
        )
        return Term(
            [models, groups, deployments, pods, services], scaler, spec_sync, status_writer, renderer, events, actuator
        )
