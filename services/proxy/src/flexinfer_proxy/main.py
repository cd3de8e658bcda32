"""``flexinfer-proxy``: settings, logging, the bus, the proxy; stops gracefully on SIGTERM/SIGINT.

With ``FLEXINFER_PROXY_WORKERS=N`` (N > 1) this process only supervises: it starts N worker processes
(``python -m flexinfer_proxy --worker I``) that each bind the port with ``SO_REUSEPORT`` (the kernel spreads new
connections over them) and each run a whole proxy: its own queues, and its own demand source
(``FLEXINFER_INSTANCE_ID`` + ``-wI``; the scheduler sums demand over sources). Metrics are shared through Prometheus'
multiprocess mode, so ``/metrics`` on any worker shows every worker's counts. SIGTERM/SIGINT go to every worker,
each shutting down gracefully. A worker that dies stops the others and the supervisor exits with its status: the
proxy's own supervisor (Kubernetes, ``flexinfer up``) restarts it whole. A worker whose supervisor died stops too.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
from types import FrameType

from flexinfer_common.logs import get_logger, start_logging
from flexinfer_common.runner import run_until_signalled, tune_gc
from flexinfer_common.settings import SettingsError, load_settings
from flexinfer_common.startup import connect_bus
from flexinfer_proxy.app import Proxy
from flexinfer_proxy.settings import ProxySettings

log = get_logger("flexinfer.proxy")

#: How often a worker checks that its supervisor is still there.
PARENT_CHECK_INTERVAL = 1.0


async def serve(settings: ProxySettings, stop: asyncio.Event, *, worker: bool = False) -> None:
    instance_id = settings.make_instance_id()
    bus = await connect_bus(settings, f"flexinfer-proxy:{instance_id}")
    proxy = Proxy(settings, bus, instance_id=instance_id, reuse_port=worker)
    watch = _OrphanWatch(stop) if worker else None
    try:
        await proxy.start()
        tune_gc()
        await stop.wait()
        log.info("stopping")
    finally:
        if watch is not None:
            watch.cancel()
        await proxy.stop()
        await bus.close()


class _OrphanWatch:
    """Sets ``stop`` once the supervisor that started this worker is gone (checked every PARENT_CHECK_INTERVAL)."""

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop
        self._parent = os.getppid()
        self._handle: asyncio.TimerHandle | None = None
        self._check_later()

    def _check_later(self) -> None:
        self._handle = asyncio.get_running_loop().call_later(PARENT_CHECK_INTERVAL, self._check)

    def _check(self) -> None:
        if os.getppid() != self._parent:
            log.warning("the proxy's supervisor is gone: stopping")
            self._stop.set()
        else:
            self._check_later()

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()


def supervise(settings: ProxySettings) -> int:
    """Run ``settings.proxy_workers`` worker processes until a signal or until one of them exits."""
    base_id = settings.make_instance_id()
    metrics_dir = tempfile.mkdtemp(prefix="flexinfer-proxy-metrics-")
    workers: dict[int, subprocess.Popen[bytes]] = {}
    stopping = False

    def stop_all(*_: object) -> None:
        nonlocal stopping
        stopping = True
        for proc in workers.values():
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("stopping the workers", extra={"signal": signal.Signals(signum).name})
        stop_all()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        for index in range(settings.proxy_workers):
            env = {
                **os.environ,
                "FLEXINFER_INSTANCE_ID": f"{base_id}-w{index}",
                "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
            }
            # Its own session: a Ctrl-C in a terminal reaches the supervisor only, which stops the workers once.
            proc = subprocess.Popen(
                [sys.executable, "-m", "flexinfer_proxy", "--worker", str(index)], env=env, start_new_session=True
            )
            workers[proc.pid] = proc
        log.info("proxy workers started", extra={"workers": len(workers), "port": settings.proxy_port})
        status = 0
        alive = set(workers)
        while alive:
            pid, wait_status = os.wait()
            if pid not in alive:
                continue
            alive.discard(pid)
            code = os.waitstatus_to_exitcode(wait_status)
            workers[pid].returncode = code
            if not stopping:
                log.error("a proxy worker exited: stopping the others", extra={"pid": pid, "exit_code": code})
                status = code if code > 0 else 1
                stop_all()
        return status
    finally:
        stop_all()
        shutil.rmtree(metrics_dir, ignore_errors=True)


def ensure_descriptors(needed: int) -> None:
    """Raise the open-files limit (RLIMIT_NOFILE) to what the connection caps need, up to the hard limit; a hard
    limit below it is a SettingsError (the caps could never be reached: the proxy would run out of descriptors
    first and answer nobody)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SettingsError(
            f"bad setting: FLEXINFER_PROXY_MAX_CONNECTIONS: the open-files limit ({hard}, ulimit -Hn) is below the "
            f"{needed} descriptors the caps need (FLEXINFER_PROXY_MAX_CONNECTIONS + "
            "FLEXINFER_PROXY_UPSTREAM_CONNECTIONS + 256): lower them or raise the limit"
        )
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))


def run() -> None:
    parser = argparse.ArgumentParser(prog="flexinfer-proxy", description="FlexInfer proxy (settings: FLEXINFER_*)")
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        settings = load_settings(ProxySettings)
        ensure_descriptors(settings.descriptors_needed())
    except SettingsError as exc:
        print(f"flexinfer-proxy: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    start_logging("proxy", settings)
    worker = args.worker is not None
    if settings.proxy_workers > 1 and not worker:
        if settings.proxy_port == 0:
            print(
                "flexinfer-proxy: FLEXINFER_PROXY_WORKERS above 1 needs a fixed FLEXINFER_PROXY_PORT",
                file=sys.stderr,
            )
            raise SystemExit(2)
        raise SystemExit(supervise(settings))

    async def main(stop: asyncio.Event) -> None:
        await serve(settings, stop, worker=worker)

    run_until_signalled(main)


if __name__ == "__main__":
    run()
