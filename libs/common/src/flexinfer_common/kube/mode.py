"""What the services with a Kubernetes mode (the actuator, the lease manager) check before they start."""

from __future__ import annotations

from flexinfer_common.kube.client import connect_from_settings
from flexinfer_common.settings import ActuatorKind, KubernetesSettings


def check_kubernetes_settings(settings: KubernetesSettings) -> None:
    """``run_service``'s check: in Kubernetes mode (``FLEXINFER_ACTUATOR=kubernetes``) a configuration that gives no
    API client stops the start, SettingsError naming the setting."""
    if settings.actuator is ActuatorKind.KUBERNETES:
        connect_from_settings(settings)
