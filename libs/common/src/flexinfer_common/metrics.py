"""The Prometheus metrics of the contract (section 5) that more than one service needs, defined once so names and
labels cannot drift. The seed's two GPU lease metrics live in the lease manager (``flexinfer_lease_manager.metrics``):
it alone emits them, and a service exposes every metric it imports."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

SWAPS = Counter("flexinfer_swaps_total", "Swaps started", ["group", "from_model", "to_model", "reason"])
SWAP_DURATION = Histogram(
    "flexinfer_swap_duration_seconds",
    "Time spent in each swap phase",
    ["group", "phase"],
    buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
)
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
ELECTION_DURATION = Histogram(
    "flexinfer_election_duration_seconds",
    "Time for one election pass over all groups",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
GROUP_ACTIVE_MODEL = Gauge("flexinfer_group_active_model", "1 for the active model of a group", ["group", "model"])
BAD_MESSAGES = Counter("flexinfer_bad_messages_total", "Bus messages rejected as malformed", ["subject"])
LEASE_READ_ERRORS = Counter("flexinfer_lease_read_errors_total", "Lease reads that failed (election failed open)")
SCHEDULER_LEADER = Gauge("flexinfer_scheduler_leader", "1 while this scheduler replica leads (holds the lock)")
ACTUATOR_COMMANDS = Counter("flexinfer_actuator_commands_total", "Scale commands applied", ["action", "result"])
ACTUATOR_LEADER = Gauge(
    "flexinfer_actuator_leader", "1 while this actuator replica acts (holds the coordination.k8s.io Lease)"
)


def render_latest() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST
