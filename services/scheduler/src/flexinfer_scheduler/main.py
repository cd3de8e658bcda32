"""Entry point: ``python -m flexinfer_scheduler``."""

from __future__ import annotations

import asyncio

from flexinfer_common.clock import SystemClock
from flexinfer_common.db import create_engine, session_factory
from flexinfer_common.logs import get_logger
from flexinfer_common.runner import tune_gc
from flexinfer_common.service import HttpServer, database_and_bus_readiness, run_service
from flexinfer_common.startup import connect_bus
from flexinfer_scheduler.adapters.bus import AdvisoryLock, NatsSchedulerBus
from flexinfer_scheduler.adapters.store import Store
from flexinfer_scheduler.api import create_app
from flexinfer_scheduler.loop import Scheduler
from flexinfer_scheduler.settings import SchedulerSettings
from flexinfer_scheduler.ui.routes import StatusPage, mount_ui

log = get_logger("flexinfer.scheduler")


async def serve(settings: SchedulerSettings, stop: asyncio.Event) -> None:
    engine = create_engine(settings.database_url, pool_size=10)
    store = Store(session_factory(engine))
    bus = await connect_bus(settings, "flexinfer-scheduler", owner=True)
    clock = SystemClock()
    scheduler = Scheduler(
        store=store,
        bus=NatsSchedulerBus(bus),
        lock=AdvisoryLock(settings.database_url, settings.leader_lock_id),
        settings=settings,
        clock=clock,
        spec_store=store,
    )

    readiness = database_and_bus_readiness(engine, bus)

    app = create_app(
        store=store, scheduler=scheduler, clock=clock, admin_token=settings.admin_token_value(), readiness=readiness
    )
    page = StatusPage(
        store=store,
        scheduler=scheduler,
        clock=clock,
        bus=bus,
        admin_token=settings.admin_token_value(),
        lease_manager_url=settings.lease_manager_base_url(),
    )
    mount_ui(app, page)
    await page.start()
    http = HttpServer(app, host=settings.bind_host, port=settings.scheduler_port, name="scheduler")
    await http.start()
    tune_gc()
    log.info("scheduler listening", extra={"port": http.port})
    try:
        await scheduler.run(stop)
    finally:
        await page.stop()
        await http.stop()
        await bus.close()
        await engine.dispose()
        log.info("scheduler stopped")


def run() -> None:
    run_service("scheduler", SchedulerSettings, serve)


if __name__ == "__main__":
    run()
