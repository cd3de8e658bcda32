"""Prometheus metrics every service shares, and rendering ``/metrics``.

A metric is registered by the module that defines it, and a process exposes every metric it imports. So each
service defines its own metrics in its own package (``flexinfer_<service>.metrics``) and this module holds only
what every process that reads the bus emits: a proxy never exports a scheduler gauge (docs/reference.md section 5
lists the metrics; ``tests/unit/test_metrics.py`` checks which process exports which).
"""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, generate_latest

BAD_MESSAGES = Counter("flexinfer_bad_messages_total", "Bus messages rejected as malformed", ["subject"])
UNPUBLISHABLE = Counter(
    "flexinfer_unpublishable_messages_total", "Messages not published because their subject is invalid"
)


def render_latest() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST
