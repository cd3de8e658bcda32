"""The proxy's request tally: answers and their timings gathered off the forwarding path, moved to Prometheus in one
go per flush, with the same result as one ``observe`` per request."""

from __future__ import annotations

import asyncio
from time import monotonic

from prometheus_client import REGISTRY, CollectorRegistry, Histogram, generate_latest

from flexinfer_common.keys import ModelKey
from flexinfer_proxy.metrics import REQUEST_BUCKETS
from flexinfer_proxy.tally import RequestTally, Timings

KEY = ModelKey("default", "tally-model")
SECONDS = [0.0, 0.001, 0.005, 0.0051, 0.3, 0.3, 2.5, 7.0, 599.0, 600.0, 601.0, 10_000.0]


def _histogram(registry: CollectorRegistry) -> Histogram:
    return Histogram("t_seconds", "t", ["model"], buckets=REQUEST_BUCKETS, registry=registry)


def test_bulk_timings_expose_what_one_observe_each_would() -> None:
    one_by_one, in_bulk = CollectorRegistry(), CollectorRegistry()
    observed = _histogram(one_by_one).labels(model="m")
    for seconds in SECONDS:
        observed.observe(seconds)
    timings = Timings(_histogram(in_bulk).labels(model="m"))
    for seconds in SECONDS[:5]:
        timings.add(seconds)
    timings.flush()
    for seconds in SECONDS[5:]:
        timings.add(seconds)
    timings.flush()
    timings.flush()  # nothing new: nothing added twice

    def exposition(registry: CollectorRegistry) -> list[str]:
        return [line for line in generate_latest(registry).decode().splitlines() if "_created" not in line]

    assert exposition(in_bulk) == exposition(one_by_one)


def sample(name: str) -> float | None:
    return REGISTRY.get_sample_value(name, {"namespace": KEY.namespace, "model": KEY.name})


async def test_an_answer_counts_and_times_from_the_requests_arrival() -> None:
    reached: list[ModelKey] = []
    tally = RequestTally(activity=reached.append, interval=60.0)
    count_before = sample("flexinfer_proxy_request_duration_seconds_count") or 0.0
    first_byte_before = sample("flexinfer_proxy_time_to_first_byte_seconds_count") or 0.0
    now = monotonic()
    tally.count(KEY, 200, now - 2.0, now - 1.5)  # arrived 2 s ago, its answer head came after 0.5 s
    tally.count(KEY, 504, now - 30.0)  # the proxy answered itself: no first byte from the model
    assert (sample("flexinfer_proxy_request_duration_seconds_count") or 0.0) == count_before  # not yet: batched
    tally.flush()
    assert sample("flexinfer_proxy_request_duration_seconds_count") == count_before + 2
    assert sample("flexinfer_proxy_time_to_first_byte_seconds_count") == first_byte_before + 1
    le = {"namespace": KEY.namespace, "model": KEY.name, "le": "0.5"}
    assert (REGISTRY.get_sample_value("flexinfer_proxy_time_to_first_byte_seconds_bucket", le) or 0) >= 1
    tally.stop()
    await asyncio.sleep(0)
