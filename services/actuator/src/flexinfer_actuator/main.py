"""Entry point: ``python -m flexinfer_actuator`` / ``flexinfer-actuator``.

Builds the settings, connects the bus, starts the back-end and the ops HTTP server, and on SIGTERM/SIGINT stops
consuming and exits 0. The ``local`` back-end runs here and stops its model processes on the way out; the
``kubernetes`` back-end acts only while this replica holds the actuator Lease, and leaves Deployments as they are.
"""

from __future__ import annotations

import asyncio
import contextlib
import os

from flexinfer_actuator import __version__
from flexinfer_actuator.adapters.gpu import open_gpu_memory
from flexinfer_actuator.adapters.local import LocalProcessScaler
from flexinfer_actuator.api import build_app
from flexinfer_actuator.kubernetes_mode import KubernetesMode
from flexinfer_actuator.loop import Actuator, StatusPublisher
from flexinfer_actuator.metrics import ACTUATOR_LEADER
from flexinfer_actuator.settings import ActuatorSettings
from flexinfer_common.bus import Bus
from flexinfer_common.clock import SystemClock
from flexinfer_common.kube.client import KubeClient, connect_from_settings
from flexinfer_common.kube.mode import check_kubernetes_settings
from flexinfer_common.logs import get_logger
from flexinfer_common.service import HttpServer, run_service
from flexinfer_common.settings import ActuatorKind
from flexinfer_common.startup import connect_bus

log = get_logger("flexinfer.actuator")


def connect_kubernetes(settings: ActuatorSettings, instance: str = "") -> KubeClient:
    """The Kubernetes API client, or SettingsError naming what is wrong with the configuration."""
    agent = f"flexinfer-actuator/{__version__}" + (f" ({instance})" if instance else "")
    return connect_from_settings(settings, user_agent=agent)


async def serve(settings: ActuatorSettings, stop: asyncio.Event) -> None:
    instance = settings.make_instance_id()
    clock = SystemClock()
    kube = connect_kubernetes(settings, instance) if settings.actuator is ActuatorKind.KUBERNETES else None
    bus = await connect_bus(settings, f"flexinfer-actuator:{instance}")
    statuses = StatusPublisher(bus=bus, actuator=instance, clock=clock)
    statuses.start()
    try:
        if kube is not None:
            await _serve_kubernetes(settings, stop, bus=bus, kube=kube, statuses=statuses, instance=instance)
        else:
            await _serve_local(settings, stop, bus=bus, statuses=statuses, instance=instance)
    finally:
        await statuses.stop()
        if kube is not None:
            await kube.close()
        with contextlib.suppress(Exception):
            await bus.close()


async def _serve_local(
    settings: ActuatorSettings, stop: asyncio.Event, *, bus: Bus, statuses: StatusPublisher, instance: str
) -> None:
    clock = SystemClock()
    gpu = open_gpu_memory()
    devices = tuple(d.total_bytes for d in gpu.devices())
    scaler = LocalProcessScaler.from_settings(settings, on_status=statuses.report, gpu=gpu)
    actuator = Actuator(
        bus=bus,
        scaler=scaler,
        statuses=statuses,
        instance=instance,
        clock=clock,
        drain_timeout=settings.park_grace_period.total_seconds() + 5.0,
        gpu_devices=devices,
    )

    async def readiness() -> dict[str, bool]:
        return {"bus": bus.connected, "consumer": actuator.consuming}

    app = build_app(processes=scaler.snapshot, readiness=readiness, admin_token=settings.admin_token_value())
    http = HttpServer(app, host=settings.bind_host, port=settings.actuator_port, name="actuator")
    await http.start()
    try:
        await actuator.start()
        ACTUATOR_LEADER.set(1)  # the local back-end has no standby: this actuator always acts
        log.info(
            "actuator started",
            extra={"actuator": instance, "backend": scaler.backend, "port": http.port, "pid": os.getpid()},
        )
        await stop.wait()
        log.info("stopping: signal received")
    finally:
        ACTUATOR_LEADER.set(0)
        await actuator.stop()
        await http.stop()


async def _serve_kubernetes(
    settings: ActuatorSettings,
    stop: asyncio.Event,
    *,
    bus: Bus,
    kube: KubeClient,
    statuses: StatusPublisher,
    instance: str,
) -> None:
    mode = KubernetesMode(
        settings=settings, bus=bus, client=kube, statuses=statuses, instance=instance, clock=SystemClock()
    )

    async def readiness() -> dict[str, bool]:
        return {"bus": bus.connected, "kubernetes": mode.consuming()}

    app = build_app(processes=mode.processes, readiness=readiness, admin_token=settings.admin_token_value())
    http = HttpServer(app, host=settings.bind_host, port=settings.actuator_port, name="actuator")
    await http.start()
    log.info(
        "actuator started",
        extra={
            "actuator": instance,
            "backend": "kubernetes",
            "api_server": kube.host,
            "namespaces": settings.namespaces() or "all",
            "port": http.port,
            "pid": os.getpid(),
        },
    )
    try:
        await mode.run(stop)
        log.info("stopping: signal received")
    finally:
        await mode.stop_leading()
        await http.stop()


def run() -> None:
    run_service("actuator", ActuatorSettings, serve, check=check_kubernetes_settings, logger=log)
