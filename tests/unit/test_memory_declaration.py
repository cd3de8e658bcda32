"""Declaring memory: spec.gpu.memory/devices/pinned on a Model, spec.capacity on a GPUGroup (docs/reference.md
section 1)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from flexinfer_common.manifests import GPUGroup, ManifestError, Model, parse_resource
from flexinfer_common.quantity import parse_memory
from flexinfer_scheduler.domain.manifests import spec_facts

GI = 1024**3


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("6Gi", 6 * GI, id="binary-gi"),
        pytest.param("512Mi", 512 * 1024**2, id="binary-mi"),
        pytest.param("1.5Gi", int(1.5 * GI), id="fraction"),
        pytest.param("2G", 2 * 1000**3, id="decimal-g"),
        pytest.param(4096, 4096, id="plain-bytes"),
        pytest.param("4096", 4096, id="bytes-string"),
    ],
)
def test_memory_quantities_parse_to_bytes(value: object, expected: int) -> None:
    assert parse_memory(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        pytest.param("6GB", id="unknown-suffix"),
        pytest.param("-1Gi", id="negative"),
        pytest.param("0", id="zero"),
        pytest.param("lots", id="words"),
        pytest.param(True, id="bool"),
        pytest.param(1.5, id="float"),
    ],
)
def test_bad_memory_quantities_are_refused(value: object) -> None:
    with pytest.raises(ValueError, match=r"memory|bytes|amount"):
        parse_memory(value)


def _model(gpu: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "chat"}, "spec": {"gpu": gpu}}


def test_a_model_declares_memory_devices_and_pinned() -> None:
    model = parse_resource(_model({"memory": "6Gi", "devices": 2, "pinned": True}))
    assert isinstance(model, Model)
    assert (model.spec.gpu.memory, model.spec.gpu.devices, model.spec.gpu.pinned) == (6 * GI, 2, True)
    facts = spec_facts(model.model_dump(mode="json", by_alias=True))
    assert (facts.memory, facts.devices, facts.pinned) == (6 * GI, 2, True)


def test_a_model_without_memory_keeps_todays_defaults() -> None:
    facts = spec_facts(_model({}))
    assert (facts.memory, facts.devices, facts.pinned) == (None, 1, False)


@pytest.mark.parametrize(
    ("gpu", "field"),
    [
        pytest.param({"memory": "6GB"}, "spec.gpu.memory", id="bad-memory"),
        pytest.param({"devices": 0}, "spec.gpu.devices", id="zero-devices"),
        pytest.param({"pinned": "sometimes"}, "spec.gpu.pinned", id="bad-pinned"),
    ],
)
def test_bad_gpu_fields_name_the_field(gpu: dict[str, Any], field: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(field)):
        parse_resource(_model(gpu))


def _group(capacity: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"models": [{"name": "chat"}]}
    if capacity is not None:
        spec["capacity"] = capacity
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup", "metadata": {"name": "card"}, "spec": spec}


def test_a_group_declares_its_capacity() -> None:
    group = parse_resource(_group({"devices": 2, "memoryPerDevice": "24Gi"}))
    assert isinstance(group, GPUGroup)
    assert group.spec.capacity is not None
    assert (group.spec.capacity.devices, group.spec.capacity.memory_per_device) == (2, 24 * GI)


def test_a_group_without_capacity_has_none() -> None:
    group = parse_resource(_group(None))
    assert isinstance(group, GPUGroup)
    assert group.spec.capacity is None


@pytest.mark.parametrize(
    ("capacity", "field"),
    [
        pytest.param({"devices": 1}, "spec.capacity.memoryPerDevice", id="missing-memory"),
        pytest.param({"devices": 0, "memoryPerDevice": "24Gi"}, "spec.capacity.devices", id="zero-devices"),
        pytest.param({"memoryPerDevice": "big"}, "spec.capacity.memoryPerDevice", id="bad-memory"),
    ],
)
def test_bad_capacity_names_the_field(capacity: dict[str, Any], field: str) -> None:
    with pytest.raises(ManifestError, match=re.escape(field)):
        parse_resource(_group(capacity))
