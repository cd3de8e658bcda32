"""The proxy assembled: route table + watcher, queues, demand signaller, forwarder, and the HTTP server.

``Proxy.start()`` serves at once (``/readyz`` turns 200 when the route snapshot is loaded; data requests that arrive
earlier wait for it). ``Proxy.stop()`` is the graceful shutdown: stop accepting connections, answer every waiting
request 503 ``shutting_down``, let in-flight requests finish (bounded), then close the client and the watchers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from flexinfer_common.bus import Bus
from flexinfer_common.clock import Clock
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import Route
from flexinfer_proxy.adapters.demand_publisher import DemandSignaller
from flexinfer_proxy.adapters.forwarding import Forwarder
from flexinfer_proxy.adapters.http_server import HttpServer
from flexinfer_proxy.adapters.in_flight import InFlightReporter
from flexinfer_proxy.adapters.routes_watcher import RouteWatcher
from flexinfer_proxy.api import ProxyHandler
from flexinfer_proxy.domain.errors import shutting_down
from flexinfer_proxy.domain.routes import RouteTable
from flexinfer_proxy.queues import ModelQueues
from flexinfer_proxy.settings import ProxySettings
from flexinfer_proxy.tally import RequestTally

log = get_logger("flexinfer.proxy")


class Proxy:
    def __init__(
        self,
        settings: ProxySettings,
        bus: Bus,
        *,
        instance_id: str | None = None,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        route_check_interval: float = 10.0,
        reuse_port: bool = False,
    ) -> None:
        self.settings = settings
        self.bus = bus
        self.instance_id = instance_id or settings.make_instance_id()
        self.reuse_port = reuse_port
        self.routes = RouteTable()
        self.demand = DemandSignaller(
            bus,
            source=self.instance_id,
            refresh_interval=settings.demand_refresh_interval.total_seconds(),
            activity_interval=settings.activity_report_interval.total_seconds(),
            clock=clock,
            monotonic=monotonic,
        )
        self.queues = ModelQueues(
            routes=self.routes.get,
            demand=self.demand,
            queue_timeout=settings.queue_timeout.total_seconds(),
            monotonic=monotonic,
        )
        self.tally = RequestTally(
            activity=self.demand.activity, interval=min(1.0, settings.activity_report_interval.total_seconds())
        )
        self.forwarder = Forwarder(
            connections=settings.proxy_upstream_connections,
            connect_timeout=settings.proxy_connect_timeout.total_seconds(),
            on_forward=self.tally.started,
        )
        self.in_flight = InFlightReporter(
            bus,
            source=self.instance_id,
            interval=settings.activity_report_interval.total_seconds(),
            counts=self.forwarder.in_flight,
            clock=clock,
        )
        self.watcher = RouteWatcher(bus, self, check_interval=route_check_interval)
        self.handler = ProxyHandler(
            routes=self.routes,
            queues=self.queues,
            forwarder=self.forwarder,
            tally=self.tally,
            routes_loaded=self.watcher.loaded,
            readiness=self._readiness,
            default_namespace=settings.namespace,
            queue_max=settings.queue_max,
            queue_timeout=settings.queue_timeout.total_seconds(),
            retry_after=settings.proxy_retry_after,
            admin_token=settings.admin_token_value(),
            api_keys=settings.api_keys(),
            queued_bytes_max=settings.proxy_max_queued_bytes,
            suspect_for=settings.proxy_suspect_for.total_seconds(),
            stream_keepalive=settings.proxy_stream_keepalive_interval.total_seconds(),
            monotonic=monotonic,
            routes_caught_up=self.watcher.caught_up,
        )
        self.server = HttpServer(self.handler, max_body=settings.proxy_max_request_body, limits=settings.limits())
        self._started = False

    # --- RouteSink: the watcher's updates go to the table, then to the model's waiters ---

    def replace_routes(self, routes: list[Route]) -> None:
        self.routes.replace(routes)
        self.queues.routes_changed()

    def put_route(self, route: Route) -> None:
        self.queues.route_changed(self.routes.put(route))

    def remove_route(self, key: ModelKey) -> None:
        self.routes.remove(key)
        self.queues.route_changed(key)

    # --- lifecycle ---

    def _readiness(self) -> dict[str, bool]:
        return {"routes": self.watcher.loaded.is_set(), "watching": self.watcher.watching, "bus": self.bus.connected}

    async def start(self) -> None:
        self.forwarder.start()
        await self.demand.start()
        await self.in_flight.start()
        await self.watcher.start()
        await self.server.start(self.settings.bind_host, self.settings.proxy_port, reuse_port=self.reuse_port)
        self._started = True
        log.info(
            "proxy listening",
            extra={"host": self.settings.bind_host, "port": self.port, "instance": self.instance_id},
        )

    @property
    def port(self) -> int:
        return self.server.port

    async def wait_ready(self) -> None:
        """Until the route snapshot is loaded (bound it with ``asyncio.timeout``)."""
        await self.watcher.loaded.wait()

    async def stop(self) -> None:
        self.handler.shutting_down = True
        if self._started:
            self.server.stop_listening()  # no new connections
        waiting = self.queues.total()
        self.queues.fail_all(shutting_down())
        if self._started:
            log.info("draining in-flight requests", extra={"answered_shutting_down": waiting})
            await self.server.close(grace=self.settings.proxy_shutdown_timeout.total_seconds())
            self._started = False
        await self.handler.cancel_waits()
        self.tally.stop()
        await self.watcher.stop()
        await self.demand.flush(within=1.0)
        await self.demand.stop()
        await self.in_flight.stop()
        await self.forwarder.close()
        log.info("proxy stopped")
