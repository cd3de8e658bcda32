"""The actuator's metrics; no other service registers them."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

ACTUATOR_COMMANDS = Counter("flexinfer_actuator_commands_total", "Scale commands applied", ["action", "result"])
ACTUATOR_LEADER = Gauge(
    "flexinfer_actuator_leader",
    "1 while this actuator replica acts (holds the coordination.k8s.io Lease; always with the local back-end)",
)
