"""An in-process proxy on real NATS, and model servers on loopback, for the tests that play the scheduler."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from flexinfer_common.bus import Bus
from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Route
from flexinfer_fake_model.server import FakeModelConfig, build_app
from flexinfer_proxy.app import Proxy
from flexinfer_proxy.settings import ProxySettings
from flexinfer_testbed.routes import make_route, write_route
from tests.support.waiting import wait_for


@contextlib.asynccontextmanager
async def serving(app: web.Application, port: int = 0) -> AsyncIterator[str]:
    """``app`` served on loopback (``port``, or any free one): its base URL."""
    runner = web.AppRunner(app, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    host, bound = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{bound}"
    finally:
        await runner.cleanup()


def fake_model_server(name: str = "m1", port: int = 0) -> contextlib.AbstractAsyncContextManager[str]:
    """The fake OpenAI-compatible model ``name`` served on loopback, answering fast: its base URL."""
    return serving(build_app(FakeModelConfig(model=name, token_delay=0.001)), port)


@contextlib.asynccontextmanager
async def started_proxy(
    nats_url: str, *, instance_id: str, route_check_interval: float = 0.5, **overrides: Any
) -> AsyncIterator[Proxy]:
    """A started proxy on its own NATS connection (``proxy.bus``), ready; ``overrides`` are ProxySettings fields."""
    settings = ProxySettings(nats_url=nats_url, bind_host="127.0.0.1", proxy_port=0, **overrides)
    bus = Bus(nats_url, name="proxy-under-test")
    await bus.connect()
    await bus.ensure_streams()
    proxy = Proxy(settings, bus, instance_id=instance_id, route_check_interval=route_check_interval)
    await proxy.start()
    try:
        async with asyncio.timeout(5):
            await proxy.wait_ready()
        yield proxy
    finally:
        await proxy.stop()
        await bus.close()


async def until_routed(proxy: Proxy, route: Route, *, within: float = 20.0) -> Route:
    """Until ``proxy``'s table holds ``route`` itself. The routes bucket outlives a test: an entry for the same model
    may be an earlier test's (its model server long stopped), so wait for this one, not any."""
    key = ModelKey(route.namespace, route.name)
    await wait_for(lambda: proxy.routes.get(key) == route, within=within, what=f"the proxy to hold {route!r}")
    return route


async def publish_route(proxy: Proxy, route: Route, *, bus: Bus | None = None, within: float = 20.0) -> Route:
    """Write ``route`` (on ``bus``, else the proxy's own connection) and wait until the proxy's table holds it."""
    await write_route(bus or proxy.bus, route)
    return await until_routed(proxy, route, within=within)


@contextlib.asynccontextmanager
async def proxy_to_model(
    nats_url: str, endpoint: str, *, instance_id: str, labels: tuple[str, ...] = (), **overrides: Any
) -> AsyncIterator[Proxy]:
    """A started proxy whose model ``m1`` (with service ``labels``) is Ready at ``endpoint``."""
    async with started_proxy(nats_url, instance_id=instance_id, **overrides) as proxy:
        await publish_route(proxy, make_route("m1", endpoint=endpoint, labels=labels))
        yield proxy
