"""Entry point: ``python -m flexinfer_lease_manager``.

The service skeleton: settings, Postgres and NATS connections, the ops endpoints, graceful shutdown. GPU leases
themselves (acquire, renew, release, TTL refresh, Kubernetes GPULease resources) come with their own issue.
"""

from __future__ import annotations

import asyncio

from flexinfer_common.bus import Bus
from flexinfer_common.db import create_engine
from flexinfer_common.logs import get_logger
from flexinfer_common.service import HttpServer, admin_app, database_and_bus_readiness, run_service
from flexinfer_lease_manager.settings import LeaseManagerSettings

log = get_logger("flexinfer.lease_manager")


async def serve(settings: LeaseManagerSettings, stop: asyncio.Event) -> None:
    engine = create_engine(settings.database_url, pool_size=5)
    bus = Bus(settings.nats_url, name="flexinfer-lease-manager")
    await bus.connect()
    await bus.ensure_streams()

    readiness = database_and_bus_readiness(engine, bus)

    app = admin_app("FlexInfer lease manager", "0.1.0", readiness)
    http = HttpServer(app, host=settings.bind_host, port=settings.lease_manager_port, name="lease-manager")
    await http.start()
    log.info("lease manager listening", extra={"port": http.port})
    try:
        await stop.wait()
    finally:
        await http.stop()
        await bus.close()
        await engine.dispose()
        log.info("lease manager stopped")


def run() -> None:
    run_service("lease-manager", LeaseManagerSettings, serve)


if __name__ == "__main__":
    run()
