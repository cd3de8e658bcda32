"""What the scheduler reads from a Model manifest, and the names of the groups it elects in. Pure."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from flexinfer_common.manifests import GpuSpec, Model, ServerlessSpec
from flexinfer_common.messages import RuntimeSpec
from flexinfer_scheduler.domain.model import ModelKey

SOLO_PREFIX = "solo."


def solo_group(key: ModelKey) -> str:
    """A model outside any shared group still needs a leader election of its own (it always wins it)."""
    return f"{SOLO_PREFIX}{key.namespace}.{key.name}"


def visible_group(name: str | None) -> str | None:
    """The group a user sees: none for a model served on its own."""
    return None if name is None or name.startswith(SOLO_PREFIX) else name


class _ElectionSpec(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="ignore")

    gpu: GpuSpec = Field(default_factory=GpuSpec)
    serverless: ServerlessSpec = Field(default_factory=ServerlessSpec)
    service_labels: list[str] = Field(default_factory=list, alias="serviceLabels")


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
            readiness_path=spec.endpoint.readiness_path or "/health",
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
    )
