"""Entry point: ``python -m flexinfer_actuator`` / ``flexinfer-actuator``.

Builds the settings, connects the bus, starts the back-end, the command consumer and the ops HTTP server, and on
SIGTERM/SIGINT stops consuming, stops every model process and exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import socket
import sys

from flexinfer_actuator.adapters.local import LocalProcessScaler
from flexinfer_actuator.api import build_app
from flexinfer_actuator.loop import Actuator, StatusPublisher
from flexinfer_actuator.ports import Scaler, StatusSink
from flexinfer_actuator.settings import ActuatorSettings
from flexinfer_common.bus import Bus
from flexinfer_common.clock import SystemClock
from flexinfer_common.logs import configure_logging, get_logger
from flexinfer_common.runner import run_until_signalled
from flexinfer_common.service import HttpServer
from flexinfer_common.settings import ActuatorKind, SettingsError, load_settings

log = get_logger("flexinfer.actuator")


def instance_id(settings: ActuatorSettings) -> str:
    return settings.instance_id or f"{socket.gethostname()}-{os.getpid()}"


def check_backend(settings: ActuatorSettings) -> None:
    if settings.actuator is not ActuatorKind.LOCAL:
        raise SettingsError(
            f"FLEXINFER_ACTUATOR: the {settings.actuator.value!r} back-end is not available in this build (use 'local')"
        )


def build_scaler(settings: ActuatorSettings, *, on_status: StatusSink) -> Scaler:
    check_backend(settings)
    return LocalProcessScaler.from_settings(settings, on_status=on_status)


async def serve(settings: ActuatorSettings, stop: asyncio.Event) -> None:
    instance = instance_id(settings)
    clock = SystemClock()
    bus = Bus(settings.nats_url, name=f"flexinfer-actuator:{instance}")
    await bus.connect()
    try:
        await bus.ensure_streams()
        statuses = StatusPublisher(bus=bus, actuator=instance, clock=clock)
        scaler = build_scaler(settings, on_status=statuses.report)
        actuator = Actuator(
            bus=bus,
            scaler=scaler,
            statuses=statuses,
            instance=instance,
            clock=clock,
            drain_timeout=settings.park_grace_period.total_seconds() + 5.0,
        )

        async def readiness() -> dict[str, bool]:
            return {"bus": bus.connected, "consumer": actuator.consuming}

        app = build_app(processes=scaler.snapshot, readiness=readiness, admin_token=settings.admin_token_value())
        http = HttpServer(app, host=settings.bind_host, port=settings.actuator_port, name="actuator")
        await http.start()
        try:
            await actuator.start()
            log.info(
                "actuator started",
                extra={"actuator": instance, "backend": scaler.backend, "port": http.port, "pid": os.getpid()},
            )
            await stop.wait()
            log.info("stopping: signal received")
        finally:
            await actuator.stop()
            await http.stop()
    finally:
        with contextlib.suppress(Exception):
            await bus.close()


def run() -> None:
    try:
        settings = load_settings(ActuatorSettings)
        check_backend(settings)
    except SettingsError as exc:
        sys.stderr.write(f"flexinfer-actuator: {exc}\n")
        raise SystemExit(2) from None
    configure_logging("actuator", settings.log_level)
    try:
        run_until_signalled(functools.partial(serve, settings))
    except ConnectionError as exc:
        log.error("cannot start", extra={"error": str(exc)})
        raise SystemExit(1) from None
