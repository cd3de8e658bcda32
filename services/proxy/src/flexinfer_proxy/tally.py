"""Per-request bookkeeping kept off the forwarding path: answers counted in a plain dict, moved in batches.

Counting an answer costs one dictionary update. ``flush`` (on a timer, and before every ``/metrics`` scrape, so a
scrape always sees every answer) adds the counts to ``flexinfer_proxy_requests_total``. The first request forwarded
to a model in each flush window (``started``) tells the demand signaller at once that the model is in use (it
rate-limits and publishes in the background): the scheduler must learn without delay that a model serves traffic,
or it may take the GPU from it for a model whose demand arrived in the same second.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess

from flexinfer_common.metrics import render_latest
from flexinfer_proxy.domain.routes import ModelKey
from flexinfer_proxy.metrics import PROXY_REQUESTS


class RequestTally:
    def __init__(self, *, activity: Callable[[ModelKey], None], interval: float) -> None:
        self._activity = activity
        self._interval = interval
        self._counts: dict[tuple[ModelKey, int], int] = {}
        self._reached: set[ModelKey] = set()  # models whose activity was reported in this window
        self._counters: dict[tuple[ModelKey, int], Counter] = {}
        self._timer: asyncio.TimerHandle | None = None

    def started(self, key: ModelKey) -> None:
        """A request is being forwarded to ``key``."""
        if key not in self._reached:
            self._reached.add(key)
            self._activity(key)
            self._arm()

    def count(self, key: ModelKey, status: int) -> None:
        """One answer (``status``) for a request to ``key``."""
        counts = self._counts
        pair = (key, status)
        counts[pair] = counts.get(pair, 0) + 1
        if self._timer is None:
            self._arm()

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        self.flush()

    def flush(self) -> None:
        counts, self._counts = self._counts, {}
        self._reached.clear()
        for pair, count in counts.items():
            counter = self._counters.get(pair)
            if counter is None:
                key, status = pair
                counter = self._counters[pair] = PROXY_REQUESTS.labels(
                    namespace=key.namespace, model=key.name, code=str(status)
                )
            counter.inc(count)

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush()


def render_metrics() -> tuple[bytes, str]:
    """The ``/metrics`` body: this process's metrics, or, with several workers (Prometheus multiprocess mode,
    ``PROMETHEUS_MULTIPROC_DIR`` set by the supervisor), every worker's, summed."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return render_latest()
