"""Entry point: ``python -m flexinfer_lease_manager`` / ``flexinfer-lease-manager``.

Builds the settings, connects Postgres and NATS, serves the lease API and the ops endpoints, and runs the
reconcile: always in local mode; in Kubernetes mode (``FLEXINFER_ACTUATOR=kubernetes``) while this replica holds
the lease manager's coordination.k8s.io Lease, with the GPULease sync as one of its steps. On SIGTERM/SIGINT it
stops and exits 0: the leases stay in Postgres, and one nobody renews lapses at its TTL.
"""

from __future__ import annotations

import asyncio
import contextlib

from flexinfer_common.clock import Clock, SystemClock
from flexinfer_common.db import create_engine, session_factory
from flexinfer_common.kube.client import KubeClient, connect_from_settings, own_namespace
from flexinfer_common.kube.mode import check_kubernetes_settings
from flexinfer_common.logs import get_logger
from flexinfer_common.service import HttpServer, database_and_bus_readiness, run_service
from flexinfer_common.settings import ActuatorKind
from flexinfer_common.startup import connect_bus
from flexinfer_lease_manager import __version__
from flexinfer_lease_manager.adapters.store import LeaseStore
from flexinfer_lease_manager.api import create_app
from flexinfer_lease_manager.kubernetes_mode import KubernetesMode
from flexinfer_lease_manager.manager import LeaseManager, Timing
from flexinfer_lease_manager.settings import LeaseManagerSettings

log = get_logger("flexinfer.lease_manager")


async def serve(settings: LeaseManagerSettings, stop: asyncio.Event, *, clock: Clock | None = None) -> None:
    clock = clock or SystemClock()
    instance = settings.make_instance_id()
    kube: KubeClient | None = None
    if settings.actuator is ActuatorKind.KUBERNETES:
        kube = connect_from_settings(settings, user_agent=f"flexinfer-lease-manager/{__version__} ({instance})")
    engine = create_engine(settings.database_url, pool_size=5)
    store = LeaseStore(session_factory(engine))
    bus = await connect_bus(settings, f"flexinfer-lease-manager:{instance}")
    system_namespace = own_namespace(settings.namespace)
    mode: KubernetesMode | None = None
    manager = LeaseManager(
        store=store,
        bus=bus,
        clock=clock,
        timing=Timing(default_ttl=settings.lease_default_ttl, refresh=settings.lease_refresh_interval),
        lease_namespace=system_namespace,
    )
    if kube is not None:
        mode = KubernetesMode(
            settings=settings, manager=manager, store=store, client=kube, instance=instance, clock=clock
        )
        manager.namespaces = mode.lease_namespaces()
    database_and_bus = database_and_bus_readiness(engine, bus)

    async def readiness() -> dict[str, bool]:
        checks = await database_and_bus()
        checks["consumers"] = manager.consuming
        if mode is not None:
            checks["kubernetes"] = mode.ready()
        return checks

    app = create_app(manager=manager, admin_token=settings.admin_token_value(), readiness=readiness)
    http = HttpServer(app, host=settings.bind_host, port=settings.lease_manager_port, name="lease-manager")
    await manager.start(bus)
    await http.start()
    log.info(
        "lease manager listening",
        extra={"port": http.port, "instance": instance, "kubernetes": kube.host if kube else None},
    )
    try:
        if mode is None:
            manager.set_acting(True)
            await manager.run(stop)
        else:
            await asyncio.gather(manager.run(stop), mode.run(stop))
    finally:
        manager.set_acting(False)
        await http.stop()
        await manager.stop()
        with contextlib.suppress(Exception):
            await bus.close()
        await engine.dispose()
        if kube is not None:
            await kube.close()
        log.info("lease manager stopped")


def run() -> None:
    run_service("lease-manager", LeaseManagerSettings, serve, check=check_kubernetes_settings)


if __name__ == "__main__":
    run()
