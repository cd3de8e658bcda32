"""The proxy's metrics (docs/reference.md section 5); no other service registers them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

PROXY_QUEUE_DEPTH = Gauge("flexinfer_proxy_queue_depth", "Requests waiting for a model", ["namespace", "model"])
PROXY_QUEUE_WAIT = Histogram(
    "flexinfer_proxy_queue_wait_seconds",
    "How long requests waited for their model",
    buckets=(0.01, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300),
)
PROXY_REQUESTS = Counter("flexinfer_proxy_requests_total", "Requests answered", ["namespace", "model", "code"])
PROXY_COLD_STARTS = Counter(
    "flexinfer_proxy_cold_starts_total", "Requests that waited for a load", ["namespace", "model"]
)

# Per model, from the request's arrival at the proxy (its wait in the queue included, as its client sees it).
REQUEST_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
PROXY_REQUEST_DURATION = Histogram(
    "flexinfer_proxy_request_duration_seconds",
    "From a request's arrival to the end of its answer, per model (queue wait and streaming included)",
    ["namespace", "model"],
    buckets=REQUEST_BUCKETS,
)
PROXY_TIME_TO_FIRST_BYTE = Histogram(
    "flexinfer_proxy_time_to_first_byte_seconds",
    "From a request's arrival to the head of the model's answer, per model (queue wait included)",
    ["namespace", "model"],
    buckets=REQUEST_BUCKETS,
)

PROXY_OPEN_CONNECTIONS = Gauge(
    "flexinfer_proxy_open_connections", "Client connections open and served (not counting those being refused)"
)
PROXY_SHED = Counter(
    "flexinfer_proxy_shed_total",
    "Client connections refused (past the caps) and requests cut (too slow), by reason",
    ["reason"],
)
