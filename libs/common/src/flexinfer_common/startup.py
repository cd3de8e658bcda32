"""The first step of every service's ``serve``: the bus connected with its streams in place. (No Kubernetes client
here: the proxy's image has none; the Kubernetes-mode check is ``flexinfer_common.kube.mode``.)"""

from __future__ import annotations

import contextlib

from flexinfer_common.bus import Bus
from flexinfer_common.settings import CommonSettings


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
