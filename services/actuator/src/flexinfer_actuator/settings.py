"""The actuator's settings: the shared ones, the Kubernetes ones, where the local back-end keeps its logs, and how
the Kubernetes back-end renders the workload of a Model that names no Deployment."""

from __future__ import annotations

import pwd
from datetime import timedelta
from pathlib import Path
from typing import Any

import yaml
from pydantic import field_validator

from flexinfer_actuator.domain.presets import LOCAL_BACKENDS
from flexinfer_actuator.domain.rendering import Backend, RenderSettings, backends_from
from flexinfer_common.settings import CommaList, Duration, KubernetesSettings

DEFAULT_CLEANUP_TOLERATION = {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}


class ActuatorSettings(KubernetesSettings):
    """``FLEXINFER_*`` settings of the actuator (see docs/reference.md section 8 for the shared ones).

    Used here: ``nats_url``, ``actuator`` (back-end), ``actuator_port`` (ops HTTP server), ``bind_host``,
    ``admin_token``, ``instance_id``, ``readiness_probe_interval``, ``park_grace_period``, ``load_timeout``,
    ``log_level``; with the ``kubernetes`` back-end also ``kubeconfig``, ``kube_context``, ``watch_namespaces``, the
    ``leader_*`` settings and the rendering settings below.
    """

    state_dir: Path = Path(".flexinfer")
    """``FLEXINFER_STATE_DIR``: model process logs go to ``<state_dir>/logs/<namespace>_<model>.log``."""
    local_run_as: str = "nobody"
    """``FLEXINFER_LOCAL_RUN_AS``: the user (name or uid) model processes run as when the actuator runs as root;
    ``root`` only when set so. Ignored when the actuator is not root (the processes run as its own user)."""
    leader_election_lease: str = "flexinfer-actuator"
    """``FLEXINFER_LEADER_ELECTION_LEASE``: the name of the coordination.k8s.io Lease the replicas share."""

    # ---- rendering (kubernetes back-end, Models without spec.deployment)
    backends: dict[str, Any] = {}
    """``FLEXINFER_BACKENDS`` (JSON): backend name -> image, command, args, sleepArgs, port, readinessPath, env,
    needsSource; each entry replaces or adds to the built-in ones (null removes one). The chart's ``backends``."""
    backends_file: Path | None = None
    """``FLEXINFER_BACKENDS_FILE``: the same as a YAML file (applied after ``FLEXINFER_BACKENDS``)."""
    gpu_resource: str = "nvidia.com/gpu"
    """``FLEXINFER_GPU_RESOURCE``: the extended resource a rendered Pod requests (``amd.com/gpu`` on AMD nodes)."""
    shared_gpu_resource: str = "nvidia.com/gpu.shared"
    """``FLEXINFER_SHARED_GPU_RESOURCE``: what the Pod of a model in a group with a ``spec.capacity`` requests
    instead, one per device it is placed on: the time-sliced or MPS replicas of the card the NVIDIA device plugin
    advertises with ``renameByDefault: true`` (``nvidia.com/gpu`` when the plugin keeps the name)."""
    model_cache_claim: str = "flexinfer-model-cache"
    """``FLEXINFER_MODEL_CACHE_CLAIM``: the PersistentVolumeClaim ``cache.strategy: SharedPVC`` mounts."""
    model_source_root: str = "/models"
    """``FLEXINFER_MODEL_SOURCE_ROOT``: where a ``pvc://claim/...`` source is mounted (``<root>/<claim>``)."""
    flash_tmpfs_root: str = "/dev/shm/flexinfer"
    """``FLEXINFER_FLASH_TMPFS_ROOT``: the node's tmpfs directory of ``cache.strategy: Memory`` copies."""
    flash_loader_image: str = "flexinfer-actuator:0.1.0"
    """``FLEXINFER_FLASH_LOADER_IMAGE``: the image with ``flexinfer-flash-loader`` (the actuator's own)."""
    flash_loader_command: CommaList = ("flexinfer-flash-loader",)
    """``FLEXINFER_FLASH_LOADER_COMMAND``: its command, comma-separated."""
    gpu_memory_interval: Duration = timedelta(seconds=30)
    """``FLEXINFER_GPU_MEMORY_INTERVAL``: local mode on a machine with a GPU (NVML or amdsmi): how often the GPU
    memory of each Ready model's processes is measured again (a changed figure is reported to the scheduler)."""
    model_termination_grace: Duration = timedelta(seconds=30)
    """``FLEXINFER_MODEL_TERMINATION_GRACE``: a rendered Pod's terminationGracePeriodSeconds."""
    model_node_selector: dict[str, str] = {}
    """``FLEXINFER_MODEL_NODE_SELECTOR`` (JSON): the nodeSelector of every rendered Pod (a Model adds to it)."""
    model_tolerations: list[dict[str, Any]] = []
    """``FLEXINFER_MODEL_TOLERATIONS`` (JSON): tolerations of every rendered Pod (a Model adds to them)."""
    cleanup_toleration: dict[str, Any] | None = DEFAULT_CLEANUP_TOLERATION
    """``FLEXINFER_CLEANUP_TOLERATION`` (JSON, or null): the toleration of the Jobs that remove tmpfs copies (the
    seed's cleanup Jobs need ``dedicated=gpu`` to reach tainted GPU nodes)."""

    @field_validator("local_run_as")
    @classmethod
    def _user_exists(cls, value: str) -> str:
        try:
            pwd.getpwuid(int(value)) if value.isdigit() else pwd.getpwnam(value)
        except KeyError:
            raise ValueError(f"no such user {value!r} on this machine") from None
        return value

    @field_validator("local_engines")
    @classmethod
    def _engines_known(cls, value: dict[str, str]) -> dict[str, str]:
        unknown = sorted(set(value) - set(LOCAL_BACKENDS))
        if unknown:
            raise ValueError(f"no local preset for {', '.join(unknown)} (local presets: {', '.join(LOCAL_BACKENDS)})")
        return value

    @field_validator("backends_file")
    @classmethod
    def _backends_readable(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_backends(value)  # a bad file stops the start, naming the variable
        return value

    @field_validator("backends")
    @classmethod
    def _backends_valid(cls, value: dict[str, Any]) -> dict[str, Any]:
        backends_from(value)  # a bad entry stops the start, naming the variable
        return value

    def backend_table(self) -> dict[str, Backend]:
        overrides = {**self.backends, **(read_backends(self.backends_file) if self.backends_file else {})}
        return backends_from(overrides)

    def render_settings(self) -> RenderSettings:
        return RenderSettings(
            backends=self.backend_table(),
            gpu_resource=self.gpu_resource,
            shared_gpu_resource=self.shared_gpu_resource,
            cache_claim=self.model_cache_claim,
            tmpfs_root=self.flash_tmpfs_root.rstrip("/"),
            source_root=self.model_source_root.rstrip("/"),
            flash_loader_image=self.flash_loader_image,
            flash_loader_command=tuple(self.flash_loader_command),
            termination_grace_seconds=int(self.model_termination_grace.total_seconds()),
            node_selector=dict(self.model_node_selector),
            tolerations=tuple(self.model_tolerations),
        )


def read_backends(path: Path) -> dict[str, Any]:
    """The backends file, checked: every entry must make a Backend."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"cannot read {path}: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of backend names")
    backends_from(data)
    return data
