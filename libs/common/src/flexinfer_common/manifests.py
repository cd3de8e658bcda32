"""The user-facing resources of docs/reference.md section 1, one YAML format for Kubernetes and local mode.

Field names are camelCase in YAML and JSON; Python code uses snake_case attributes. A bad manifest raises
:class:`ManifestError` whose message names every bad field (``spec.gpu.priority: ...``).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    ValidationError,
    field_validator,
)

from flexinfer_common.durations import format_duration, parse_duration
from flexinfer_common.enums import LeasePhase, ParkStrategy, SchedulingPolicy
from flexinfer_common.messages import ModelStatus
from flexinfer_common.quantity import parse_memory

GROUP = "ai.flexinfer"
V1ALPHA1 = f"{GROUP}/v1alpha1"
V1ALPHA2 = f"{GROUP}/v1alpha2"

DEFAULT_SWAP_COOLDOWN = timedelta(minutes=5)

# Limits checked at the edge (the admin APIs and the spec sync), so nothing out of range reaches the database, a
# subject or a process: the longest duration a manifest may give, and the Go seed's int32 range for integers.
MAX_DURATION = timedelta(days=30)
MAX_DURATION_SECONDS = int(MAX_DURATION.total_seconds())
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1


def _bounded_duration(value: timedelta) -> timedelta:
    if value > MAX_DURATION:
        raise ValueError(f"at most {format_duration(MAX_DURATION)} ({MAX_DURATION_SECONDS} seconds)")
    return value


Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    AfterValidator(_bounded_duration),
    PlainSerializer(format_duration, return_type=str, when_used="json"),
]
Int32 = Annotated[int, Field(ge=INT32_MIN, le=INT32_MAX)]
Seconds = Annotated[int, Field(ge=0, le=MAX_DURATION_SECONDS)]

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_DNS_LABEL_RE = re.compile(rf"^{_DNS_LABEL}$")
# C0 and C1 control characters and DEL; a tab or a newline is allowed in an argument or an environment value
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def check_subdomain(value: str) -> str:
    """A Kubernetes object name (DNS-1123 subdomain): lowercase letters, digits, '-' and '.', at most 253."""
    return _check_dns(value, _DNS_SUBDOMAIN, 253, "name", "lowercase letters, digits, '-' and '.'")


def check_label(value: str) -> str:
    """A Kubernetes namespace (DNS-1123 label): lowercase letters, digits and '-', at most 63."""
    return _check_dns(value, _DNS_LABEL_RE, 63, "namespace", "lowercase letters, digits and '-'")


def _check_dns(value: str, pattern: re.Pattern[str], longest: int, what: str, allowed: str) -> str:
    if len(value) > longest:
        raise ValueError(f"at most {longest} characters (got {len(value)})")
    if not pattern.match(value):
        raise ValueError(
            f"{_shown(value)} is not a valid {what} ({allowed}, starting and ending with a letter or digit)"
        )
    return value


def check_text(value: str) -> str:
    """An argument or an environment value: no NUL nor any other control character but tab and newline."""
    match = _CONTROL.search(value)
    if match is not None:
        raise ValueError(f"control character U+{ord(match.group()):04X} at position {match.start()} is not allowed")
    return value


def _shown(value: str) -> str:
    return repr(value if len(value) <= 80 else value[:80] + "...")


KubeName = Annotated[str, AfterValidator(check_subdomain)]
Namespace = Annotated[str, AfterValidator(check_label)]
Text = Annotated[str, AfterValidator(check_text)]

Memory = Annotated[int, BeforeValidator(parse_memory)]
"""A Kubernetes quantity (``6Gi``) or bytes, held as bytes."""


class ManifestError(ValueError):
    """A manifest is malformed; the message names the fields."""


class _Spec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")


class ObjectMeta(_Spec):
    name: KubeName
    namespace: str = ""
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    generation: int | None = None
    resource_version: str | None = Field(None, alias="resourceVersion")
    uid: str | None = None
    owner_references: list[dict[str, Any]] = Field(default_factory=list, alias="ownerReferences")
    # set by the scheduler on a model being deleted (parked first); never stored from a manifest
    deletion_timestamp: datetime | None = Field(None, alias="deletionTimestamp")

    @field_validator("namespace")
    @classmethod
    def _namespace(cls, value: str) -> str:
        return check_label(value) if value else value


class GpuSpec(_Spec):
    shared: KubeName | None = None
    priority: Int32 = 0
    swap_cooldown: Duration | None = Field(None, alias="swapCooldown")
    force_promotion: bool = Field(False, alias="forcePromotion")
    max_wait: Duration | None = Field(None, alias="maxWait")
    park_strategy: ParkStrategy = Field(ParkStrategy.SCALE_TO_ZERO, alias="parkStrategy")
    # several models on one card (docs/reference.md section 1, "Memory and devices")
    memory: Memory | None = None
    devices: int = Field(1, ge=1)
    pinned: bool = False


class ServerlessSpec(_Spec):
    idle_timeout: Duration | None = Field(None, alias="idleTimeout")


class CacheSpec(_Spec):
    strategy: Literal["Memory", "SharedPVC"] | None = None


class EndpointSpec(_Spec):
    port: int | None = Field(None, ge=1, le=65535)
    # unset: /health (a rendered workload: its backend's readiness path)
    readiness_path: str | None = Field(None, alias="readinessPath")


class LocalSpec(_Spec):
    command: list[Text] = Field(default_factory=list)
    env: dict[Text, Text] = Field(default_factory=dict)


class KubernetesSpec(_Spec):
    """Kubernetes mode, for the Deployment FlexInfer renders (no ``spec.deployment``): what the backend's defaults
    (the actuator's settings, chart values) do not say, or say otherwise for this model."""

    image: str | None = None
    command: list[Text] | None = None
    args: list[Text] | None = None
    env: dict[Text, Text] = Field(default_factory=dict)
    gpus: int = Field(1, ge=0, le=1024)
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    resources: dict[str, Any] = Field(default_factory=dict)


class ModelSpec(_Spec):
    backend: str | None = None
    source: str | None = None
    gpu: GpuSpec = Field(default_factory=GpuSpec)
    serverless: ServerlessSpec = Field(default_factory=ServerlessSpec)
    service_labels: list[str] = Field(default_factory=list, alias="serviceLabels")
    cache: CacheSpec = Field(default_factory=CacheSpec)
    endpoint: EndpointSpec = Field(default_factory=EndpointSpec)
    deployment: str | None = None
    local: LocalSpec = Field(default_factory=LocalSpec)
    kubernetes: KubernetesSpec = Field(default_factory=KubernetesSpec)


class Model(_Spec):
    api_version: Literal["ai.flexinfer/v1alpha2"] = Field(V1ALPHA2, alias="apiVersion")  # type: ignore[arg-type]
    kind: Literal["Model"] = "Model"
    metadata: ObjectMeta
    spec: ModelSpec = Field(default_factory=ModelSpec)
    status: ModelStatus | None = None

    @property
    def namespace(self) -> str:
        return self.metadata.namespace or "default"

    @property
    def name(self) -> str:
        return self.metadata.name


class GroupMember(_Spec):
    name: KubeName
    namespace: Namespace | None = None
    priority: Int32 = 0


class GroupPolicySpec(_Spec):
    hysteresis_window_seconds: Seconds = Field(10, alias="hysteresisWindowSeconds")
    request_queue_threshold: int = Field(3, ge=1, le=INT32_MAX, alias="requestQueueThreshold")
    minimum_run_duration_seconds: Seconds = Field(30, alias="minimumRunDurationSeconds")
    cooldown_after_preemption_seconds: Seconds = Field(60, alias="cooldownAfterPreemptionSeconds")
    drain_timeout_seconds: Seconds = Field(60, alias="drainTimeoutSeconds")
    idle_timeout_seconds: Seconds = Field(300, alias="idleTimeoutSeconds")


class CapacitySpec(_Spec):
    """The group's card(s): how many devices, and the memory of each."""

    devices: int = Field(1, ge=1)
    memory_per_device: Memory = Field(alias="memoryPerDevice")


class GPUGroupSpec(_Spec):
    """With ``models``: a v1alpha1 group of those models under ``policy``. Without: the declaration of the v1alpha2
    shared group of the same name (the models whose ``spec.gpu.shared`` names it): its ``capacity`` and
    ``scheduling``."""

    models: list[GroupMember] | None = Field(None, min_length=1)
    policy: GroupPolicySpec = Field(default_factory=GroupPolicySpec)
    capacity: CapacitySpec | None = None
    # The election of a v1alpha2 group (None: the FLEXINFER_SCHEDULING_POLICY setting); a v1alpha1 group runs the
    # v1alpha1 election under either.
    scheduling: SchedulingPolicy | None = None


class GPUGroup(_Spec):
    api_version: Literal["ai.flexinfer/v1alpha1"] = Field(V1ALPHA1, alias="apiVersion")  # type: ignore[arg-type]
    kind: Literal["GPUGroup"] = "GPUGroup"
    metadata: ObjectMeta
    spec: GPUGroupSpec
    status: dict[str, Any] | None = None

    @property
    def name(self) -> str:
        return self.metadata.name

    @property
    def members(self) -> list[GroupMember]:
        """The models a v1alpha1 group lists (none: the GPUGroup declares a v1alpha2 shared group)."""
        return self.spec.models or []

    @property
    def is_v1alpha1(self) -> bool:
        return self.spec.models is not None


MIN_LEASE_TTL_SECONDS = 60
OWNER_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$"
"""A lease owner shows as ``gpu-lease/<owner>`` in ``preemptedBy`` and labels a metric: a name, no spaces or slashes."""


class GPULeaseSpec(_Spec):
    group: KubeName
    owner: str = Field(min_length=1, max_length=253, pattern=OWNER_PATTERN)
    node: KubeName | None = None
    ttl_seconds: int | None = Field(None, ge=MIN_LEASE_TTL_SECONDS, le=MAX_DURATION_SECONDS, alias="ttlSeconds")
    # a Kubernetes quantity: free only this much on one device of a group with a capacity (None: the whole group)
    memory: Memory | None = None


class GPULeaseStatus(_Spec):
    """Written by the lease manager only."""

    acquired_at: datetime | None = Field(None, alias="acquiredAt")
    expires_at: datetime | None = Field(None, alias="expiresAt")
    renew_time: datetime | None = Field(None, alias="renewTime")
    phase: LeasePhase | None = None
    message: str | None = None
    device: int | None = None  # a lease with memory: the device reserved for it


class GPULease(_Spec):
    api_version: Literal["ai.flexinfer/v1alpha1"] = Field(V1ALPHA1, alias="apiVersion")  # type: ignore[arg-type]
    kind: Literal["GPULease"] = "GPULease"
    metadata: ObjectMeta
    spec: GPULeaseSpec
    status: GPULeaseStatus | None = None


class GpuLeaseRequest(_Spec):
    group: KubeName
    ttl_seconds: int | None = Field(None, ge=MIN_LEASE_TTL_SECONDS, le=MAX_DURATION_SECONDS, alias="ttlSeconds")


class FinetuneSpec(_Spec):
    gpu_lease: GpuLeaseRequest | None = Field(None, alias="gpuLease")
    timeout_seconds: int | None = Field(None, ge=1, le=MAX_DURATION_SECONDS, alias="timeoutSeconds")


class ModelCacheSpec(_Spec):
    finetune: FinetuneSpec | None = None
    node_selector: dict[str, str] = Field(default_factory=dict, alias="nodeSelector")


class ModelCache(_Spec):
    api_version: Literal["ai.flexinfer/v1alpha1"] = Field(V1ALPHA1, alias="apiVersion")  # type: ignore[arg-type]
    kind: Literal["ModelCache"] = "ModelCache"
    metadata: ObjectMeta
    spec: ModelCacheSpec = Field(default_factory=ModelCacheSpec)
    status: dict[str, Any] | None = None


Resource = Model | GPUGroup | GPULease | ModelCache

_KINDS: dict[tuple[str, str], type[Model] | type[GPUGroup] | type[GPULease] | type[ModelCache]] = {
    (V1ALPHA2, "Model"): Model,
    (V1ALPHA1, "GPUGroup"): GPUGroup,
    (V1ALPHA1, "GPULease"): GPULease,
    (V1ALPHA1, "ModelCache"): ModelCache,
}


def describe_validation_error(exc: ValidationError, prefix: str = "") -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(p) for p in error["loc"]) or "(document)"
        parts.append(f"{prefix}{where}: {error['msg']}")
    return "; ".join(parts)


def parse_resource(document: Any, *, where: str = "") -> Resource:
    """Turn one decoded YAML/JSON document into a typed resource, or raise ManifestError naming the problem."""
    prefix = f"{where}: " if where else ""
    if not isinstance(document, dict):
        raise ManifestError(f"{prefix}a manifest must be a mapping, got {type(document).__name__}")
    api_version, kind = document.get("apiVersion"), document.get("kind")
    if not api_version or not kind:
        raise ManifestError(f"{prefix}apiVersion and kind are required")
    cls = _KINDS.get((str(api_version), str(kind)))
    if cls is None:
        known = ", ".join(f"{a} {k}" for a, k in _KINDS)
        raise ManifestError(f"{prefix}unsupported apiVersion/kind {api_version} {kind} (known: {known})")
    try:
        return cls.model_validate(document)
    except ValidationError as exc:
        raise ManifestError(f"{prefix}{kind} " + describe_validation_error(exc)) from None


def load_manifests(text: str, *, source: str = "<input>") -> list[Resource]:
    """Parse a YAML stream (documents separated by ``---``); empty documents are skipped. Needs the ``yaml`` extra
    (the CLI has it; the services take manifests as JSON and never load this)."""
    import yaml

    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as exc:
        raise ManifestError(f"{source}: not valid YAML: {exc}") from None
    resources = []
    for index, document in enumerate(documents):
        if document is None:
            continue
        resources.append(parse_resource(document, where=f"{source} document {index + 1}"))
    return resources


def dump_resource(resource: BaseModel) -> dict[str, Any]:
    """The resource as Kubernetes would return it: camelCase, no nulls."""
    return resource.model_dump(mode="json", by_alias=True, exclude_none=True)
