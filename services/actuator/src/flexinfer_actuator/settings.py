"""The actuator's settings: the shared ones plus where the local back-end keeps its logs."""

from __future__ import annotations

from pathlib import Path

from flexinfer_common.settings import CommonSettings


class ActuatorSettings(CommonSettings):
    """``FLEXINFER_*`` settings of the actuator (see CONTRACT section 8 for the shared ones).

    Used here: ``nats_url``, ``actuator`` (back-end), ``actuator_port`` (ops HTTP server), ``bind_host``,
    ``admin_token``, ``instance_id``, ``readiness_probe_interval``, ``park_grace_period``, ``load_timeout``,
    ``log_level``.
    """

    state_dir: Path = Path(".flexinfer")
    """``FLEXINFER_STATE_DIR``: model process logs go to ``<state_dir>/logs/<namespace>_<model>.log``."""
