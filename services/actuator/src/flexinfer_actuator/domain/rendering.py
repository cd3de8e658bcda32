"""The workload of a Model that names no Deployment: a Deployment and a Service rendered from its spec, as pure
functions of the Model and the actuator's backend settings.

- ``backend`` chooses an image, command, arguments, port and readiness path (the actuator's settings, chart values;
  ``spec.kubernetes`` overrides them per Model). ``{model}`` in arguments is where the weights are (a Hugging Face
  id, or a path inside the container), ``{name}`` the Model's name, ``{port}`` the server's port.
- ``source`` says where the weights are: ``HF://org/name`` (downloaded by the server into its cache volume),
  ``pvc://claim/path`` (a PersistentVolumeClaim of the Model's namespace, mounted read-only), or an absolute path the
  server can read.
- ``cache.strategy``: ``SharedPVC`` mounts one cache claim shared by every model (Hugging Face downloads land there
  once); ``Memory`` adds the flash-loader, an init container that copies the weights from their volume into a tmpfs
  directory of the node (``<tmpfs root>/<namespace>/<name>``, kept across Pod restarts) and serves them from there,
  so a swap back skips the disk. The copy is verified by a marker written last (flexinfer_actuator.flash_loader).
- The Deployment starts at 0 replicas (FlexInfer scales it), uses ``Recreate`` (one GPU: the old Pod must be gone
  first) and carries the hash of what was rendered, so an edit that changes nothing rendered rolls nothing.
- A model of a group with a ``spec.capacity`` shares the card with the other models resident there (its ACTIVATE
  commands carry ``runtime.devices``): its Pod requests replicas of the cluster's *shared* GPU resource (time-sliced
  or MPS replicas, ``FLEXINFER_SHARED_GPU_RESOURCE``), one per device it is placed on, instead of a whole GPU, and
  must name the group's node (``kubernetes.io/hostname`` in its nodeSelector, the same for every member). See
  :func:`co_resident_placement`.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from flexinfer_common.enums import ParkStrategy
from flexinfer_common.manifests import GPUGroup, Model

MANAGED_BY = "flexinfer-actuator"
LABEL_MODEL = "ai.flexinfer/model"
ANNOTATION_HASH = "ai.flexinfer/template-hash"
ANNOTATION_FORCE = "ai.flexinfer/force-rollout"  # on the Model: a new value applies a held spec change at once
ANNOTATION_FORCED = "ai.flexinfer/forced-rollout"  # on the Deployment: the force value last applied
ANNOTATION_FLASH_NODES = "ai.flexinfer/flash-nodes"  # on the Deployment: nodes holding a tmpfs copy
CACHE_MOUNT = "/cache"


class SourceKind(StrEnum):
    HUGGING_FACE = "hf"
    PVC = "pvc"
    PATH = "path"
    NONE = "none"


@dataclass(frozen=True)
class Source:
    kind: SourceKind
    text: str = ""
    repo: str = ""  # hf: org/name
    claim: str = ""  # pvc
    path: str = ""  # pvc: inside the claim; path: absolute


class RenderError(ValueError):
    """The Model cannot be rendered; the message names the field."""


_CLAIM = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def parse_source(text: str | None) -> Source:
    """``HF://org/name``, ``pvc://claim/path/in/claim`` or ``/absolute/path``."""
    if not text:
        return Source(SourceKind.NONE)
    scheme, sep, rest = text.partition("://")
    if sep and scheme.lower() == "hf":
        if rest.count("/") != 1 or not all(rest.split("/")):
            raise RenderError(f"spec.source: {text!r}: a Hugging Face source is HF://<org>/<name>")
        return Source(SourceKind.HUGGING_FACE, text, repo=rest)
    if sep and scheme.lower() == "pvc":
        claim, _, path = rest.partition("/")
        if not _CLAIM.match(claim):
            raise RenderError(f"spec.source: {text!r}: {claim!r} is not a PersistentVolumeClaim name")
        if ".." in path.split("/"):
            raise RenderError(f"spec.source: {text!r}: the path may not leave the claim ('..')")
        return Source(SourceKind.PVC, text, claim=claim, path=path.strip("/"))
    if not sep and text.startswith("/"):
        return Source(SourceKind.PATH, text, path=text)
    raise RenderError(f"spec.source: {text!r}: expected HF://<org>/<name>, pvc://<claim>/<path> or an absolute path")


@dataclass(frozen=True)
class Backend:
    """How to run one serving engine (the actuator's settings; chart values ``backends``)."""

    image: str
    command: tuple[str, ...] = ()
    args: tuple[str, ...] = ()
    sleep_args: tuple[str, ...] = ()  # added for parkStrategy: Sleep (e.g. vLLM's --enable-sleep-mode)
    port: int = 8000
    readiness_path: str = "/health"
    env: Mapping[str, str] = field(default_factory=dict)
    needs_source: bool = True

    @classmethod
    def from_mapping(cls, name: str, data: Mapping[str, Any]) -> Backend:
        known = {"image", "command", "args", "sleepArgs", "port", "readinessPath", "env", "needsSource"}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"backend {name!r}: unknown keys {unknown} (known: {sorted(known)})")
        if not isinstance(data.get("image"), str) or not data["image"]:
            raise ValueError(f"backend {name!r}: image is required")
        return cls(
            image=data["image"],
            command=tuple(str(a) for a in data.get("command") or ()),
            args=tuple(str(a) for a in data.get("args") or ()),
            sleep_args=tuple(str(a) for a in data.get("sleepArgs") or ()),
            port=int(data.get("port") or 8000),
            readiness_path=str(data.get("readinessPath") or "/health"),
            env={str(k): str(v) for k, v in (data.get("env") or {}).items()},
            needs_source=bool(data.get("needsSource", True)),
        )


# The engines FlexInfer knows out of the box. Images are pinned to a tag an operator can override in the chart's
# values (`backends`); `{model}` is a Hugging Face id or a path, `{name}` the Model's name, `{port}` the port.
DEFAULT_BACKENDS: dict[str, dict[str, Any]] = {
    "vllm": {
        "image": "vllm/vllm-openai:v0.11.0",
        "args": ["--model", "{model}", "--served-model-name", "{name}", "--host", "0.0.0.0", "--port", "{port}"],
        "sleepArgs": ["--enable-sleep-mode"],
        "readinessPath": "/health",
        "env": {"HF_HOME": f"{CACHE_MOUNT}/huggingface"},
    },
    "mlc-llm": {
        "image": "ghcr.io/mlc-ai/mlc-llm:nightly",
        "command": ["mlc_llm", "serve"],
        "args": ["{model}", "--host", "0.0.0.0", "--port", "{port}"],
        "readinessPath": "/v1/models",
        "env": {"MLC_LLM_HOME": f"{CACHE_MOUNT}/mlc"},
    },
    "llama-cpp": {
        "image": "ghcr.io/ggml-org/llama.cpp:server-cuda",
        "args": ["--model", "{model}", "--alias", "{name}", "--host", "0.0.0.0", "--port", "{port}"],
        "readinessPath": "/health",
    },
    "sglang": {
        "image": "lmsysorg/sglang:v0.5.3-cu126",
        "command": ["python3", "-m", "sglang.launch_server"],
        "args": ["--model-path", "{model}", "--served-model-name", "{name}", "--host", "0.0.0.0", "--port", "{port}"],
        "readinessPath": "/health",
        "env": {"HF_HOME": f"{CACHE_MOUNT}/huggingface"},
    },
    "infinity": {
        "image": "michaelf34/infinity:0.0.77",
        "args": [
            "v2",
            "--model-id",
            "{model}",
            "--served-model-name",
            "{name}",
            "--host",
            "0.0.0.0",
            "--port",
            "{port}",
        ],
        "port": 7997,
        "readinessPath": "/health",
        "env": {"HF_HOME": f"{CACHE_MOUNT}/huggingface"},
    },
    "ollama": {
        "image": "ollama/ollama:0.12.3",
        "port": 11434,
        "readinessPath": "/api/version",
        "env": {"OLLAMA_HOST": "0.0.0.0:{port}", "OLLAMA_MODELS": f"{CACHE_MOUNT}/ollama"},
        "needsSource": False,
    },
    "fake": {
        "image": "flexinfer-fake-model:0.1.0",
        "command": ["flexinfer-fake-model"],
        "args": ["--model", "{name}"],
        "env": {"FAKE_MODEL_PORT": "{port}"},
        "needsSource": False,
    },
}


def backends_from(overrides: Mapping[str, Any] | None) -> dict[str, Backend]:
    """The built-in backends, each key of ``overrides`` replacing or adding one (a value of null removes it)."""
    merged: dict[str, Any] = dict(DEFAULT_BACKENDS)
    for name, data in (overrides or {}).items():
        if data is None:
            merged.pop(name, None)
        else:
            merged[name] = data
    return {name: Backend.from_mapping(name, data) for name, data in merged.items()}


@dataclass(frozen=True)
class RenderSettings:
    """What the actuator's settings say about every rendered workload."""

    backends: Mapping[str, Backend]
    gpu_resource: str = "nvidia.com/gpu"
    shared_gpu_resource: str = "nvidia.com/gpu.shared"  # a co-resident model's Pod: replicas of the card
    cache_claim: str = "flexinfer-model-cache"  # cache.strategy SharedPVC, in the Model's namespace
    tmpfs_root: str = "/dev/shm/flexinfer"  # cache.strategy Memory, on the node
    source_root: str = "/models"  # where pvc:// claims are mounted in the containers
    flash_loader_image: str = "flexinfer-actuator:0.1.0"
    flash_loader_command: tuple[str, ...] = ("flexinfer-flash-loader",)
    termination_grace_seconds: int = 30
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


HOSTNAME_LABEL = "kubernetes.io/hostname"


@dataclass(frozen=True)
class CoResidence:
    """The model is a member of a group with a ``spec.capacity``: several models are resident on its card at once,
    so its Pod shares the card with theirs instead of holding a whole GPU.

    ``devices``: how many of the group's devices the model is placed on (its ``spec.gpu.devices``: the length of the
    ``runtime.devices`` its ACTIVATE commands carry); ``group_devices``: the group's ``spec.capacity.devices``;
    ``peers``: the node each other member of the group names (``kubernetes.io/hostname`` of its nodeSelector), by
    member name, to keep the group on one node."""

    group: str
    devices: int = 1
    group_devices: int = 1
    peers: Mapping[str, str] = field(default_factory=dict)


def co_residence_of(
    model: Model, groups: Iterable[GPUGroup], members: Iterable[Model], settings: RenderSettings
) -> CoResidence | None:
    """Whether ``model`` shares a card with other resident models, from the manifests (pure): the GPUGroup without
    ``spec.models`` named by its ``spec.gpu.shared`` declares a ``spec.capacity``. The same facts the scheduler
    places from, so the Deployment, rendered before any command, requests what its ACTIVATE's ``runtime.devices``
    will say. ``members``: the other Models; those of the same group that FlexInfer renders give ``peers``."""
    shared = model.spec.gpu.shared
    group = next((g for g in groups if g.name == shared and not g.is_v1alpha1), None) if shared else None
    if group is None or group.spec.capacity is None:
        return None
    peers = {}
    for other in members:
        itself = (other.namespace, other.name) == (model.namespace, model.name)
        if itself or other.spec.gpu.shared != shared or other.spec.deployment:
            continue
        node = {**settings.node_selector, **other.spec.kubernetes.node_selector}.get(HOSTNAME_LABEL)
        if node:
            peers[f"{other.namespace}/{other.name}"] = node
    return CoResidence(
        group=group.name, devices=model.spec.gpu.devices, group_devices=group.spec.capacity.devices, peers=peers
    )


def co_resident_placement(node_selector: Mapping[str, str], co_residence: CoResidence) -> str:
    """The node a co-resident model's Pod must land on (its ``kubernetes.io/hostname``), or a RenderError saying
    why it cannot be placed. Pure.

    The models of a group with a capacity share one card, so one node: a nodeSelector naming the node is required
    (the Kubernetes scheduler would otherwise be free to put two members on two nodes, and FlexInfer's bound on the
    card's memory would count a card that one of them is not on), and every member must name the same one. A group
    of more than one device is refused: the device plugin, not FlexInfer, chooses the physical card a replica of
    the shared resource is on, so the per-device bound FlexInfer keeps could not hold (a one-device group per card
    keeps it)."""
    group = co_residence.group
    if co_residence.group_devices > 1:
        raise RenderError(
            f"spec.gpu.shared: group {group!r} declares spec.capacity.devices {co_residence.group_devices}; in "
            "Kubernetes mode a group with a capacity is one card (the device plugin chooses the card a shared "
            "replica is on, so FlexInfer cannot keep each device within its memory): declare one GPUGroup per card"
        )
    node = node_selector.get(HOSTNAME_LABEL)
    if not node:
        raise RenderError(
            f"spec.kubernetes.nodeSelector: group {group!r} has a spec.capacity (its models share one card), so "
            f"its Pods must land on the card's node: set {HOSTNAME_LABEL} in spec.kubernetes.nodeSelector (or in "
            "FLEXINFER_MODEL_NODE_SELECTOR) to that node, the same for every model of the group"
        )
    elsewhere = sorted(f"{peer} is on {where!r}" for peer, where in co_residence.peers.items() if where != node)
    if elsewhere:
        raise RenderError(
            f"spec.kubernetes.nodeSelector: {HOSTNAME_LABEL}={node!r}, but group {group!r} shares one card and "
            f"{', '.join(elsewhere)}: every model of a group with a capacity must name the same node"
        )
    return node


@dataclass(frozen=True)
class Workload:
    deployment: dict[str, Any]
    service: dict[str, Any]
    template_hash: str
    port: int
    flash_dir: str | None  # the node's tmpfs directory, with cache.strategy Memory


def _substitute(text: str, values: Mapping[str, str]) -> str:
    for key, value in values.items():
        text = text.replace("{" + key + "}", value)
    return text


def owner_reference(model: Mapping[str, Any]) -> dict[str, Any]:
    meta = model.get("metadata") or {}
    return {
        "apiVersion": model.get("apiVersion", "ai.flexinfer/v1alpha2"),
        "kind": "Model",
        "name": meta.get("name"),
        "uid": meta.get("uid"),
        "controller": True,
        "blockOwnerDeletion": True,
    }


def template_hash(template: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(template, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def render(
    model: Model,
    owner: Mapping[str, Any],
    settings: RenderSettings,
    *,
    co_residence: CoResidence | None = None,
) -> Workload:
    """The Deployment and Service for ``model`` (``owner``: the Model object as the API server returned it, for
    its uid; ``co_residence``: set when its group has a capacity). Raises RenderError naming the field when the
    spec cannot be rendered."""
    spec, kube = model.spec, model.spec.kubernetes
    if not spec.backend:
        raise RenderError("spec.backend: required when spec.deployment is not set (FlexInfer renders the workload)")
    backend = settings.backends.get(spec.backend)
    if backend is None:
        known = ", ".join(sorted(settings.backends))
        raise RenderError(f"spec.backend: unknown backend {spec.backend!r} (known: {known})")
    source = parse_source(spec.source)
    if source.kind is SourceKind.NONE and backend.needs_source:
        raise RenderError(f"spec.source: required by backend {spec.backend!r}")
    strategy = spec.cache.strategy
    if strategy == "Memory" and source.kind is SourceKind.HUGGING_FACE:
        raise RenderError(
            "spec.cache.strategy: Memory copies weights from a volume into the node's memory; with an HF:// source "
            "use SharedPVC (downloaded once to the shared cache), or put the weights on a claim (pvc://)"
        )
    port = spec.endpoint.port or backend.port
    readiness = spec.endpoint.readiness_path or backend.readiness_path

    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    init: list[dict[str, Any]] = []
    model_location = ""
    if strategy == "SharedPVC":
        volumes.append({"name": "cache", "persistentVolumeClaim": {"claimName": settings.cache_claim}})
    else:
        volumes.append({"name": "cache", "emptyDir": {}})
    mounts.append({"name": "cache", "mountPath": CACHE_MOUNT})
    source_path = ""
    if source.kind is SourceKind.HUGGING_FACE:
        model_location = source.repo
    elif source.kind is SourceKind.PVC:
        source_mount = f"{settings.source_root}/{source.claim}"
        volumes.append({"name": "source", "persistentVolumeClaim": {"claimName": source.claim, "readOnly": True}})
        mounts.append({"name": "source", "mountPath": source_mount, "readOnly": True})
        source_path = f"{source_mount}/{source.path}".rstrip("/")
        model_location = source_path
    elif source.kind is SourceKind.PATH:
        source_path = model_location = source.path
    flash_dir = None
    if strategy == "Memory":
        # The node's directory is mounted at the same path inside the containers: what the flash-loader writes and
        # what the server reads are the same path everywhere (logs, markers, the cleanup Job).
        flash_dir = f"{settings.tmpfs_root}/{model.namespace}/{model.name}"
        volumes.append({"name": "flash", "hostPath": {"path": flash_dir, "type": "DirectoryOrCreate"}})
        init.append(
            {
                "name": "flash-loader",
                "image": settings.flash_loader_image,
                "command": list(settings.flash_loader_command),
                "args": ["copy", "--source", source_path, "--target", flash_dir, "--identity", source.text],
                "volumeMounts": [m for m in mounts if m["name"] == "source"]
                + [{"name": "flash", "mountPath": flash_dir}],
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        )
        mounts.append({"name": "flash", "mountPath": flash_dir, "readOnly": True})
        model_location = flash_dir

    values = {"model": model_location, "name": model.name, "port": str(port)}
    args = list(kube.args) if kube.args is not None else list(backend.args)
    if spec.gpu.park_strategy is ParkStrategy.SLEEP and kube.args is None:
        args += list(backend.sleep_args)
    env = {**backend.env, **kube.env}
    container: dict[str, Any] = {
        "name": "server",
        "image": kube.image or backend.image,
        "args": [_substitute(a, values) for a in args],
        "env": [{"name": k, "value": _substitute(v, values)} for k, v in sorted(env.items())],
        "ports": [{"name": "http", "containerPort": port, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": readiness, "port": "http"},
            "periodSeconds": 1,
            "failureThreshold": 3,
        },
        "volumeMounts": mounts,
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    command = kube.command if kube.command is not None else list(backend.command)
    if command:
        container["command"] = [_substitute(c, values) for c in command]
    resources: dict[str, Any] = {k: dict(v) if isinstance(v, Mapping) else v for k, v in kube.resources.items()}
    node_selector = {**settings.node_selector, **kube.node_selector}
    if kube.gpus and co_residence is not None:
        co_resident_placement(node_selector, co_residence)
        # A replica of the card per device it is placed on, beside the other resident models. No visible-devices
        # variable: the device plugin exposes the card the replica is on to the container (as its device 0), so a
        # group index set here could only hide it.
        resources.setdefault("limits", {})[settings.shared_gpu_resource] = str(co_residence.devices)
    elif kube.gpus:
        resources.setdefault("limits", {})[settings.gpu_resource] = str(kube.gpus)
    if resources:
        container["resources"] = resources
    labels = {LABEL_MODEL: model.name, "app.kubernetes.io/name": model.name, "app.kubernetes.io/managed-by": MANAGED_BY}
    pod_spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": settings.termination_grace_seconds,
        "containers": [container],
        "volumes": volumes,
    }
    if init:
        pod_spec["initContainers"] = init
    if node_selector:
        pod_spec["nodeSelector"] = node_selector
    tolerations = [dict(t) for t in settings.tolerations] + [dict(t) for t in kube.tolerations]
    if tolerations:
        pod_spec["tolerations"] = tolerations
    template = {"metadata": {"labels": labels}, "spec": pod_spec}
    digest = template_hash(template)
    meta = {
        "name": model.name,
        "namespace": model.namespace,
        "labels": labels,
        "ownerReferences": [owner_reference(owner)],
    }
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {**meta, "annotations": {ANNOTATION_HASH: digest}},
        "spec": {
            "replicas": 0,
            "strategy": {"type": "Recreate"},
            "selector": {"matchLabels": {LABEL_MODEL: model.name}},
            "template": template,
        },
    }
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": meta,
        "spec": {
            "selector": {LABEL_MODEL: model.name},
            "ports": [{"name": "http", "port": port, "targetPort": "http", "protocol": "TCP"}],
        },
    }
    return Workload(deployment, service, digest, port, flash_dir)


class RolloutDecision(StrEnum):
    CREATE = "create"  # no Deployment yet
    UP_TO_DATE = "up-to-date"
    APPLY = "apply"  # the rendered template changed: apply it
    HOLD = "hold"  # changed, but the model holds the GPU: wait until it is parked (or forced)
    NOT_OURS = "not-ours"  # a Deployment of that name exists that FlexInfer did not render: adopt it as is


def owned_by(obj: Mapping[str, Any], model_uid: str | None) -> bool:
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return any(r.get("kind") == "Model" and (model_uid is None or r.get("uid") == model_uid) for r in refs)


def decide_rollout(
    existing: Mapping[str, Any] | None,
    workload: Workload,
    *,
    model_uid: str | None,
    active: bool,
    force: str | None,
) -> RolloutDecision:
    """What to do with the Deployment that is there. ``active``: the model is loaded or loading (its Pods would
    restart); ``force``: the Model's ``ai.flexinfer/force-rollout`` annotation."""
    if existing is None:
        return RolloutDecision.CREATE
    if not owned_by(existing, model_uid):
        return RolloutDecision.NOT_OURS
    annotations = (existing.get("metadata") or {}).get("annotations") or {}
    if annotations.get(ANNOTATION_HASH) == workload.template_hash:
        return RolloutDecision.UP_TO_DATE
    forced = force is not None and annotations.get(ANNOTATION_FORCED) != force
    if active and not forced:
        return RolloutDecision.HOLD
    return RolloutDecision.APPLY


def rollout_patch(workload: Workload, *, force: str | None) -> dict[str, Any]:
    """A merge patch that brings an existing rendered Deployment to ``workload`` (replicas untouched)."""
    annotations = {ANNOTATION_HASH: workload.template_hash}
    if force is not None:
        annotations[ANNOTATION_FORCED] = force
    deployment = workload.deployment
    return {
        "metadata": {"labels": deployment["metadata"]["labels"], "annotations": annotations},
        "spec": {"strategy": deployment["spec"]["strategy"], "template": deployment["spec"]["template"]},
    }


def cleanup_job(
    *, namespace: str, model: str, node: str, settings: RenderSettings, toleration: Mapping[str, Any] | None
) -> dict[str, Any]:
    """A Job that removes a model's tmpfs copy from one node (the Model is gone, or its source changed)."""
    parent = f"{settings.tmpfs_root}/{namespace}"
    name = f"flexinfer-flash-cleanup-{hashlib.sha256(f'{namespace}/{model}/{node}'.encode()).hexdigest()[:10]}"
    pod_spec: dict[str, Any] = {
        "restartPolicy": "OnFailure",
        "nodeSelector": {"kubernetes.io/hostname": node},
        "containers": [
            {
                "name": "cleanup",
                "image": settings.flash_loader_image,
                "command": list(settings.flash_loader_command),
                "args": ["remove", "--target", f"{parent}/{model}"],
                "volumeMounts": [{"name": "flash", "mountPath": parent}],
            }
        ],
        "volumes": [{"name": "flash", "hostPath": {"path": parent, "type": "DirectoryOrCreate"}}],
    }
    if toleration:
        pod_spec["tolerations"] = [dict(toleration)]
    labels = {"app.kubernetes.io/managed-by": MANAGED_BY, LABEL_MODEL: model, "ai.flexinfer/job": "flash-cleanup"}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": namespace, "labels": labels},
        "spec": {
            "backoffLimit": 3,
            "ttlSecondsAfterFinished": 600,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
