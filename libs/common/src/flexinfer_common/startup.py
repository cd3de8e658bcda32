"""The first steps of every service's ``serve``: the bus connected with its streams in place, and (for the services
with a Kubernetes mode) the check that stops a start whose Kubernetes configuration cannot work."""

from __future__ import annotations

import contextlib

from flexinfer_common.bus import Bus
from flexinfer_common.kube.client import connect_from_settings
from flexinfer_common.settings import ActuatorKind, CommonSettings, KubernetesSettings


async def connect_bus(settings: CommonSettings, client_name: str, *, owner: bool = False) -> Bus:
    """NATS, connected as ``client_name``, with the streams in place: created and updated by their ``owner`` (the
    scheduler), only checked by the other services. Closed again when the streams are not there."""
    bus = Bus(settings.nats_url, name=client_name, auth=settings.nats_auth())
    await bus.connect()
    try:
        await bus.ensure_streams(owner=owner)
    except BaseException:
        with contextlib.suppress(Exception):
            await bus.close()
        raise
    return bus


def check_kubernetes_settings(settings: KubernetesSettings) -> None:
    """``run_service``'s check: in Kubernetes mode (``FLEXINFER_ACTUATOR=kubernetes``) a configuration that gives no
    API client stops the start, SettingsError naming the setting."""
    if settings.actuator is ActuatorKind.KUBERNETES:
        connect_from_settings(settings)
