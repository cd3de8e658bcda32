"""What a manifest may hold, checked at the edge (issue 22, "bad input reaches deep"): Kubernetes names for models,
namespaces and groups, integers in the Go seed's int32 range, durations finite and at most 30 days, no control
character in arguments, environment values or names. Each refusal names the field."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_common.durations import parse_duration
from flexinfer_common.manifests import ManifestError, parse_resource


def model(**spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": spec.pop("name", "a"), "namespace": spec.pop("namespace", "default")},
        "spec": {"gpu": {"shared": "gpu"}, **spec},
    }


def group(**policy: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"models": policy.pop("models", [{"name": "a"}]), "policy": policy}
    if "scheduling" in policy:
        spec["scheduling"] = policy.pop("scheduling")
    if spec["models"] is None:
        del spec["models"]
    return {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPUGroup",
        "metadata": {"name": policy.pop("name", "g")},
        "spec": spec,
    }


REFUSED = [
    pytest.param(model(gpu={"shared": "a\r\nb"}), "spec.gpu.shared", id="group-crlf"),
    pytest.param(model(gpu={"shared": "../x"}), "spec.gpu.shared", id="group-path"),
    pytest.param(model(gpu={"shared": "gpu\u202e"}), "spec.gpu.shared", id="group-bidi"),
    pytest.param(model(gpu={"shared": "g" * 10_000}), "spec.gpu.shared", id="group-10000-chars"),
    pytest.param(model(gpu={"shared": "a..b"}), "spec.gpu.shared", id="group-empty-label"),
    pytest.param(model(gpu={"shared": "GPU"}), "spec.gpu.shared", id="group-uppercase"),
    pytest.param(model(gpu={"priority": 2**31}), "spec.gpu.priority", id="priority-above-int32"),
    pytest.param(model(gpu={"priority": -(2**31) - 1}), "spec.gpu.priority", id="priority-below-int32"),
    pytest.param(model(gpu={"swapCooldown": "1e400"}), "spec.gpu.swapCooldown", id="duration-1e400"),
    pytest.param(model(gpu={"swapCooldown": "inf"}), "spec.gpu.swapCooldown", id="duration-inf"),
    pytest.param(model(gpu={"swapCooldown": "nan"}), "spec.gpu.swapCooldown", id="duration-nan"),
    pytest.param(model(gpu={"swapCooldown": "999999999999s"}), "spec.gpu.swapCooldown", id="duration-999999999999s"),
    pytest.param(model(gpu={"maxWait": "31d"}), "spec.gpu.maxWait", id="duration-unknown-unit"),
    pytest.param(model(gpu={"maxWait": "721h"}), "spec.gpu.maxWait", id="duration-over-30-days"),
    pytest.param(model(gpu={"maxWait": -1}), "spec.gpu.maxWait", id="duration-negative"),
    pytest.param(model(serverless={"idleTimeout": 1e400}), "spec.serverless.idleTimeout", id="duration-float-inf"),
    pytest.param(model(local={"env": {"A": "x\x00y"}}), "spec.local.env.A", id="env-nul"),
    pytest.param(model(local={"env": {"A\x00": "x"}}), "spec.local.env", id="env-name-nul"),
    pytest.param(model(local={"env": {"A": "x\x1by"}}), "spec.local.env.A", id="env-escape"),
    pytest.param(model(local={"command": ["serve", "a\x00b"]}), "spec.local.command.1", id="arg-nul"),
    pytest.param(model(kubernetes={"args": ["a\x00"]}), "spec.kubernetes.args.0", id="kube-arg-nul"),
    pytest.param(model(kubernetes={"env": {"A": "\x7f"}}), "spec.kubernetes.env.A", id="kube-env-del"),
    pytest.param(model(endpoint={"port": 65536}), "spec.endpoint.port", id="port-above-65535"),
    pytest.param(model(endpoint={"port": 0}), "spec.endpoint.port", id="port-zero"),
    pytest.param(model(name="a\x00b"), "metadata.name", id="name-nul"),
    pytest.param(model(name="m" * 254), "metadata.name", id="name-254-chars"),
    pytest.param(model(name="-a"), "metadata.name", id="name-leading-dash"),
    pytest.param(model(namespace="a.b"), "metadata.namespace", id="namespace-dot"),
    pytest.param(model(namespace="n" * 64), "metadata.namespace", id="namespace-64-chars"),
    pytest.param(group(models=[{"name": "a", "priority": 2**31}]), "spec.models.0.priority", id="member-priority"),
    pytest.param(group(models=[{"name": "A b"}]), "spec.models.0.name", id="member-name"),
    pytest.param(group(name="g\r\n"), "metadata.name", id="gpugroup-name"),
    pytest.param(group(drainTimeoutSeconds=2**40), "spec.policy.drainTimeoutSeconds", id="policy-seconds"),
    pytest.param(group(scheduling="fifo"), "spec.scheduling", id="scheduling-unknown"),
    pytest.param(group(models=None, scheduling="Seed"), "spec.scheduling", id="scheduling-case"),
    pytest.param(group(models=[]), "spec.models", id="gpugroup-empty-models"),
]


@pytest.mark.parametrize(("document", "field"), REFUSED)
def test_a_manifest_out_of_range_is_refused_naming_the_field(document: dict[str, Any], field: str) -> None:
    with pytest.raises(ManifestError) as refused:
        parse_resource(document)
    assert f" {field}" in str(refused.value) or str(refused.value).startswith(field), str(refused.value)


ACCEPTED = [
    pytest.param(model(gpu={"shared": "gpu-0.node-a", "priority": 2**31 - 1}), id="subdomain-group-int32-max"),
    pytest.param(model(gpu={"swapCooldown": "720h", "maxWait": "0s"}), id="duration-30-days"),
    pytest.param(model(local={"env": {"PEM": "line1\nline2\tx"}, "command": ["s", "é"]}), id="tab-newline-unicode"),
    pytest.param(model(name="m" * 253, namespace="n" * 63), id="longest-names"),
    pytest.param(group(models=[{"name": "a", "namespace": "team-a", "priority": -5}]), id="gpugroup"),
    pytest.param(group(models=None, scheduling="seed"), id="gpugroup-declares-a-v1alpha2-group"),
    pytest.param(group(scheduling="flexinfer"), id="gpugroup-v1alpha1-scheduling"),
]


@pytest.mark.parametrize("document", ACCEPTED)
def test_a_manifest_within_the_limits_is_accepted(document: dict[str, Any]) -> None:
    parse_resource(document)


@pytest.mark.parametrize(
    "text", [pytest.param("inf", id="inf"), pytest.param("1e400", id="1e400"), pytest.param("9" * 30 + "h", id="huge")]
)
def test_parse_duration_refuses_what_is_not_a_finite_duration(text: str) -> None:
    with pytest.raises(ValueError):
        parse_duration(text)
