"""The actuator's settings: the shared ones, the Kubernetes ones, and where the local back-end keeps its logs."""

from __future__ import annotations

from pathlib import Path

from flexinfer_common.settings import KubernetesSettings


class ActuatorSettings(KubernetesSettings):
    """``FLEXINFER_*`` settings of the actuator (see CONTRACT section 8 for the shared ones).

    Used here: ``nats_url``, ``actuator`` (back-end), ``actuator_port`` (ops HTTP server), ``bind_host``,
    ``admin_token``, ``instance_id``, ``readiness_probe_interval``, ``park_grace_period``, ``load_timeout``,
    ``log_level``; with the ``kubernetes`` back-end also ``kubeconfig``, ``kube_context``, ``watch_namespaces`` and
    the ``leader_*`` settings.
    """

    state_dir: Path = Path(".flexinfer")
    """``FLEXINFER_STATE_DIR``: model process logs go to ``<state_dir>/logs/<namespace>_<model>.log``."""
    leader_election_lease: str = "flexinfer-actuator"
    """``FLEXINFER_LEADER_ELECTION_LEASE``: the name of the coordination.k8s.io Lease the replicas share."""
