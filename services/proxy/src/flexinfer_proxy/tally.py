"""Per-request bookkeeping kept off the forwarding path: answers counted in a plain dict, moved in batches.

Counting an answer costs one dictionary update, and its two timings (from the request's arrival to the model's
answer head, and to the end of the answer) a bisection each into per-model bucket counts (:class:`Timings`).
``flush`` (on a timer, and before every ``/metrics`` scrape, so a scrape always sees every answer) adds the counts
to ``flexinfer_proxy_requests_total`` and the bucket counts to ``flexinfer_proxy_request_duration_seconds`` and
``flexinfer_proxy_time_to_first_byte_seconds``: one increment per bucket that changed, not one ``observe`` per
request. The first request forwarded
to a model in each flush window (``started``) tells the demand signaller at once that the model is in use (it
rate-limits and publishes in the background): the scheduler must learn without delay that a model serves traffic,
or it may take the GPU from it for a model whose demand arrived in the same second.
"""

from __future__ import annotations

import asyncio
import os
from bisect import bisect_left
from collections.abc import Callable
from time import monotonic

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import multiprocess as prometheus_multiprocess

from flexinfer_common.keys import ModelKey
from flexinfer_common.metrics import render_latest
from flexinfer_proxy.metrics import PROXY_REQUEST_DURATION, PROXY_REQUESTS, PROXY_TIME_TO_FIRST_BYTE


class Timings:
    """Observations of one histogram child gathered as bucket counts and a sum, added to it in one go by ``flush``.

    prometheus_client has no public way to add many observations at once; a child keeps one (non-cumulative) value
    per bucket and one sum, which ``observe`` increments, so ``flush`` increments those directly. That works the
    same in multiprocess mode (the values are the workers' shared files). tests/unit/test_proxy_tally.py checks that
    the exposition equals the one ``observe`` gives.
    """

    __slots__ = ("_bounds", "_child", "counts", "total")

    def __init__(self, child: Histogram) -> None:
        self._child = child
        self._bounds: list[float] = child._upper_bounds
        self.counts = [0] * len(self._bounds)
        self.total = 0.0

    def add(self, seconds: float) -> None:
        self.counts[bisect_left(self._bounds, seconds)] += 1
        self.total += seconds

    def flush(self) -> None:
        buckets = self._child._buckets
        for index, count in enumerate(self.counts):
            if count:
                buckets[index].inc(count)
                self.counts[index] = 0
        if self.total:
            self._child._sum.inc(self.total)
            self.total = 0.0


class RequestTally:
    def __init__(self, *, activity: Callable[[ModelKey], None], interval: float) -> None:
        self._activity = activity
        self._interval = interval
        self._counts: dict[tuple[ModelKey, int], int] = {}
        self._reached: set[ModelKey] = set()  # models whose activity was reported in this window
        self._counters: dict[tuple[ModelKey, int], Counter] = {}
        self._timings: dict[ModelKey, tuple[Timings, Timings]] = {}  # duration, time to first byte
        self._timer: asyncio.TimerHandle | None = None
        #: A flush is due (answers added now are moved with it). A plain attribute, not a property: the forwarding
        #: path reads it once per request.
        self.armed = False
        #: Answers not flushed yet: (model, status, arrived, first byte or 0, ended), monotonic seconds.
        self.answers: list[tuple[ModelKey, int, float, float, float]] = []

    def started(self, key: ModelKey) -> None:
        """A request is being forwarded to ``key``."""
        if key not in self._reached:
            self._reached.add(key)
            self._activity(key)
            self._arm()

    def count(self, key: ModelKey, status: int, arrived: float, first_byte: float = 0.0) -> None:
        """One answer (``status``) for a request to ``key`` that arrived at ``arrived`` (monotonic seconds), ending
        now; ``first_byte``: when the model's answer head came (0: the proxy answered itself).

        The forwarding path does the same without the call: ``tally.answers.append(...)``, then ``tally.arm()``
        unless ``tally.armed``."""
        self.answers.append((key, status, arrived, first_byte, monotonic()))
        if not self.armed:
            self._arm()

    def arm(self) -> None:
        self._arm()

    def _add_answers(self) -> None:
        """Move the answers gathered since the last flush into per-series counts and bucket counts."""
        answers, self.answers = self.answers, []
        counts = self._counts
        all_timings = self._timings
        for key, status, arrived, first_byte, ended in answers:
            pair = (key, status)
            counts[pair] = counts.get(pair, 0) + 1
            timings = all_timings.get(key)
            if timings is None:
                timings = all_timings[key] = self._timings_of(key)
            # ``Timings.add`` for both, inlined: a method call costs more than the bisection here.
            duration, to_first_byte = timings
            seconds = ended - arrived
            duration.counts[bisect_left(duration._bounds, seconds)] += 1
            duration.total += seconds
            if first_byte:
                seconds = first_byte - arrived
                to_first_byte.counts[bisect_left(to_first_byte._bounds, seconds)] += 1
                to_first_byte.total += seconds

    @staticmethod
    def _timings_of(key: ModelKey) -> tuple[Timings, Timings]:
        labels = {"namespace": key.namespace, "model": key.name}
        return Timings(PROXY_REQUEST_DURATION.labels(**labels)), Timings(PROXY_TIME_TO_FIRST_BYTE.labels(**labels))

    def _arm(self) -> None:
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._interval, self._tick)
            self.armed = True

    def _tick(self) -> None:
        self._timer = None
        self.armed = False
        self.flush()

    def flush(self) -> None:
        if self.answers:
            self._add_answers()
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
        for duration, first_byte in self._timings.values():
            duration.flush()
            first_byte.flush()

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self.armed = False
        self.flush()


def render_metrics() -> tuple[bytes, str]:
    """The ``/metrics`` body: this process's metrics, or, with several workers (Prometheus multiprocess mode,
    ``PROMETHEUS_MULTIPROC_DIR`` set by the supervisor), every worker's, summed."""
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        registry = CollectorRegistry()
        prometheus_multiprocess.MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return generate_latest(registry), CONTENT_TYPE_LATEST
    return render_latest()
