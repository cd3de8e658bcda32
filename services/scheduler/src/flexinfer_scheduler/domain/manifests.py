"""What the scheduler reads from a Model manifest, the names of the groups it elects in, and where a model is
elected when its membership changes. Pure."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, NamedTuple

from pydantic import BaseModel, ConfigDict, Field

from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GpuSpec, Model, ServerlessSpec
from flexinfer_common.messages import RuntimeSpec
from flexinfer_common.quantity import parse_memory
from flexinfer_scheduler.domain.model import Capacity

SOLO_PREFIX = "solo."


def solo_group(key: ModelKey) -> str:
    """A model outside any shared group still needs a leader election of its own (it always wins it)."""
    return f"{SOLO_PREFIX}{key.namespace}.{key.name}"


def visible_group(name: str | None) -> str | None:
    """The group a user sees: none for a model served on its own."""
    return None if name is None or name.startswith(SOLO_PREFIX) else name


def group_phrase(name: str | None) -> str:
    """A group as a sentence names it: ``group 'gpu'``, or a model's own group."""
    shown = visible_group(name)
    return f"group {shown!r}" if shown is not None else "a group of its own"


def membership(
    key: ModelKey, shared: str | None, priority: int, listed: Mapping[ModelKey, tuple[str, int]]
) -> tuple[str, int]:
    """A model's group and priority by its specs: ``spec.gpu.shared``, else the v1alpha1 GPUGroup that lists it
    (with the priority the group gives it), else a group of its own."""
    if shared is None and key in listed:
        return listed[key]
    return shared or solo_group(key), priority


class Placement(NamedTuple):
    """Where a model is elected after its membership was worked out again: ``group`` now, and ``moving_to`` the
    group it joins once it is confirmed parked (None: it is where it belongs)."""

    group: str
    moving_to: str | None = None


def place(*, current: str | None, desired: str, parked: bool) -> Placement:
    """A model goes to the group its specs give it (``desired``) at once when it is new, stays, or is confirmed off
    the GPU; one that may still hold its group's card stays there (two groups would otherwise each schedule it, or
    load a model beside it on that card) and moves once parked."""
    if current is None or current == desired or parked:
        return Placement(desired)
    return Placement(current, desired)


class GroupMove(NamedTuple):
    """A move a membership change would make of a model that may hold its group's GPU."""

    key: ModelKey
    old: str
    new: str

    def describe(self) -> str:
        old = group_phrase(self.old)
        return f"model {self.key} from {old} to {group_phrase(self.new)} while it may still hold the GPU of {old}"


class _ElectionSpec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    gpu: GpuSpec = Field(default_factory=GpuSpec)
    serverless: ServerlessSpec = Field(default_factory=ServerlessSpec)
    service_labels: list[str] = Field(default_factory=list, alias="serviceLabels")
    source: str | None = None


class _ElectionView(BaseModel):
    """The part of a Model manifest every pass reads (the same field types as :class:`Model`'s; the rest of the
    manifest is ignored here, and parsed only when needed)."""

    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    spec: _ElectionSpec = Field(default_factory=_ElectionSpec)


@dataclass(frozen=True)
class SpecFacts:
    """What the election reads from a Model's spec (parsed once per spec generation, not once per pass). The whole
    manifest (``model``) and what the actuator needs (``runtime``) are parsed from ``manifest`` on first use: a
    scheduler's first pass over 10,000 models sends a command to one model in ten, and parsing every whole manifest
    was a fifth of that pass."""

    swap_cooldown: timedelta | None
    idle_timeout: timedelta | None
    force_promotion: bool
    service_labels: tuple[str, ...]
    max_wait: timedelta | None
    manifest: dict[str, Any] | str = field(repr=False)
    memory: int | None = None
    devices: int = 1
    pinned: bool = False
    source: str | None = None  # spec.source: where the weights are (an estimate of ``memory`` may come from them)
    memory_estimated: bool = False  # ``memory`` is an estimate from the weights, not the manifest's

    @functools.cached_property
    def model(self) -> Model:
        """The whole manifest (as stored, so already validated once: when it was written)."""
        text = self.manifest
        return Model.model_validate_json(text) if isinstance(text, str) else Model.model_validate(text)

    def runtime(self, namespace: str, name: str) -> RuntimeSpec:
        """What the actuator needs to run the model (built once per spec generation)."""
        cached: RuntimeSpec | None = self.__dict__.get("_runtime")
        if cached is not None:
            return cached
        spec = self.model.spec
        runtime = RuntimeSpec.model_construct(  # from a validated Model: nothing left to check
            namespace=namespace,
            name=name,
            deployment=spec.deployment or name,
            command=spec.local.command,
            env=spec.local.env,
            port=spec.endpoint.port,
            readiness_path=spec.endpoint.readiness_path,
            backend=spec.backend,
            source=spec.source,
            park_strategy=spec.gpu.park_strategy,
            rendered=spec.deployment is None,
            drain_seconds=None,
        )
        object.__setattr__(self, "_runtime", runtime)
        return runtime


def spec_facts(manifest: dict[str, Any] | str) -> SpecFacts:
    """The facts of a manifest (a dict, or its JSON text: parsing the text directly is three times faster)."""
    view = (
        _ElectionView.model_validate_json(manifest)
        if isinstance(manifest, str)
        else _ElectionView.model_validate(manifest)
    )
    spec = view.spec
    return SpecFacts(
        spec.gpu.swap_cooldown,
        spec.serverless.idle_timeout,
        spec.gpu.force_promotion,
        tuple(spec.service_labels),
        spec.gpu.max_wait,
        manifest,
        spec.gpu.memory,
        spec.gpu.devices,
        spec.gpu.pinned,
        spec.source,
    )


#: what a loaded model holds beyond its weights, when it declares no ``memory``: runtime buffers and a KV cache of
#: a typical context, as a share of the weights plus a floor (a rough figure: declare ``memory`` for long contexts)
ESTIMATE_FACTOR = 1.2
ESTIMATE_FLOOR = 512 << 20


def estimate_memory(weights_bytes: int) -> int:
    """A model's GPU memory from the size of its weights: ``ESTIMATE_FACTOR`` x the weights + ``ESTIMATE_FLOOR``."""
    return int(weights_bytes * ESTIMATE_FACTOR) + ESTIMATE_FLOOR


def with_estimate(facts: SpecFacts, weights_bytes: int | None) -> SpecFacts:
    """``facts`` with an estimated ``memory`` when the manifest declares none and the weights' size is known."""
    if facts.memory is not None or weights_bytes is None:
        return facts
    return dataclasses.replace(facts, memory=estimate_memory(weights_bytes), memory_estimated=True)


@functools.lru_cache(maxsize=4096)
def _capacity(devices: object, memory: object) -> Capacity | None:
    try:
        count = int(devices) if devices is not None else 1  # type: ignore[call-overload]
        return Capacity(devices=count, memory_per_device=parse_memory(memory)) if count >= 1 else None
    except (TypeError, ValueError):
        return None  # validated when stored: a manifest from an older version without it reads as no capacity


def discovered_capacity(device_memory: Sequence[int]) -> Capacity | None:
    """The capacity of this machine's GPUs as the local actuator found them (each device's total memory): as many
    devices, each counted with the smallest one's memory (a model placed on any of them must fit). None: no GPU."""
    sizes = [b for b in device_memory if b > 0]
    return Capacity(devices=len(sizes), memory_per_device=min(sizes)) if sizes else None


def machine_capacity(discovered: Capacity | None, groups: int) -> Capacity | None:
    """The discovered capacity a group that declares none gets: only when it is the machine's one group. Several
    groups would each count every device of the machine and together load more than it holds: they hold one model
    at a time each (as without a GPU) until each declares its ``spec.capacity``."""
    return discovered if groups == 1 else None


def declared_capacity(manifest: dict[str, Any] | None) -> Capacity | None:
    """A GPUGroup's ``spec.capacity`` (validated when it was stored), read without parsing the whole manifest:
    every pass reads it for every group. None: one model at a time, as the seed."""
    capacity = ((manifest or {}).get("spec") or {}).get("capacity")
    if not isinstance(capacity, dict) or "memoryPerDevice" not in capacity:
        return None
    return _capacity(capacity.get("devices"), capacity["memoryPerDevice"])
