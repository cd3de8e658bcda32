"""``flexinfer-proxy``: settings, logging, the bus, the proxy; stops gracefully on SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import sys

from flexinfer_common.bus import Bus
from flexinfer_common.logs import get_logger, start_logging
from flexinfer_common.runner import run_until_signalled, tune_gc
from flexinfer_common.settings import SettingsError, load_settings
from flexinfer_proxy.app import Proxy
from flexinfer_proxy.settings import ProxySettings

log = get_logger("flexinfer.proxy")


async def serve(settings: ProxySettings, stop: asyncio.Event) -> None:
    instance_id = settings.make_instance_id()
    bus = Bus(settings.nats_url, name=f"flexinfer-proxy:{instance_id}")
    await bus.connect()
    await bus.ensure_streams()
    proxy = Proxy(settings, bus, instance_id=instance_id)
    try:
        await proxy.start()
        tune_gc()
        await stop.wait()
        log.info("stopping")
    finally:
        await proxy.stop()
        await bus.close()


def run() -> None:
    try:
        settings = load_settings(ProxySettings)
    except SettingsError as exc:
        print(f"flexinfer-proxy: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    start_logging("proxy", settings)

    async def main(stop: asyncio.Event) -> None:
        await serve(settings, stop)

    run_until_signalled(main)


if __name__ == "__main__":
    run()
