"""Manifests -> admin API calls (``flexinfer apply`` and ``flexinfer up``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flexinfer_cli.apply_plan import ApiCall, ManifestFileError, Skipped, plan_apply, read_manifests
from flexinfer_cli.config import Service
from flexinfer_common.manifests import load_manifests

REPO = Path(__file__).resolve().parents[2]


def plan(text: str, namespace: str = "default") -> list[ApiCall | Skipped]:
    return plan_apply(load_manifests(text), default_namespace=namespace)


MODEL = """
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: qwen3-8b}
spec:
  backend: mlc-llm
  gpu: {shared: homelab-gpu, priority: 100, swapCooldown: 3m}
  local: {command: [serve, --port, "{port}"]}
"""


def test_model_is_put_to_the_scheduler_with_namespace_filled_in() -> None:
    [step] = plan(MODEL, namespace="lab")
    assert step == ApiCall(
        resource="model/lab/qwen3-8b",
        service=Service.SCHEDULER,
        method="PUT",
        path="/api/v1/models/lab/qwen3-8b",
        body={
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": "qwen3-8b", "namespace": "lab"},
            "spec": {
                "backend": "mlc-llm",
                "gpu": {"shared": "homelab-gpu", "priority": 100, "swapCooldown": "3m"},
                "local": {"command": ["serve", "--port", "{port}"]},
            },
        },
    )


def test_model_namespace_from_manifest_wins_and_status_is_not_sent() -> None:
    text = MODEL.replace("metadata: {name: qwen3-8b}", "metadata: {name: qwen3-8b, namespace: team}") + (
        "status: {phase: Ready}\n"
    )
    [step] = plan(text, namespace="lab")
    assert isinstance(step, ApiCall)
    assert step.path == "/api/v1/models/team/qwen3-8b"
    assert step.resource == "model/team/qwen3-8b"
    assert "status" not in step.body


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        pytest.param(
            """
apiVersion: ai.flexinfer/v1alpha1
kind: GPUGroup
metadata: {name: lab-gpu}
spec:
  models: [{name: a, priority: 10}, {name: b}]
  policy: {hysteresisWindowSeconds: 5}
""",
            ApiCall(
                resource="gpugroup/lab-gpu",
                service=Service.SCHEDULER,
                method="PUT",
                path="/api/v1/gpugroups/lab-gpu",
                body={
                    "apiVersion": "ai.flexinfer/v1alpha1",
                    "kind": "GPUGroup",
                    "metadata": {"name": "lab-gpu"},
                    "spec": {
                        "models": [{"name": "a", "priority": 10}, {"name": "b"}],
                        "policy": {"hysteresisWindowSeconds": 5},
                    },
                },
            ),
            id="gpugroup-put-to-scheduler",
        ),
        pytest.param(
            """
apiVersion: ai.flexinfer/v1alpha1
kind: GPULease
metadata: {name: lora-lease}
spec: {group: lab-gpu, owner: lora-job, node: box, ttlSeconds: 3600}
""",
            ApiCall(
                resource="gpulease/lora-lease",
                service=Service.LEASE_MANAGER,
                method="POST",
                path="/api/v1/leases",
                body={
                    "name": "lora-lease",
                    "namespace": "default",
                    "group": "lab-gpu",
                    "owner": "lora-job",
                    "node": "box",
                    "ttlSeconds": 3600,
                },
                done="created",
            ),
            id="gpulease-posted-to-lease-manager",
        ),
        pytest.param(
            """
apiVersion: ai.flexinfer/v1alpha1
kind: GPULease
metadata: {name: l2}
spec: {group: g, owner: o}
""",
            ApiCall(
                resource="gpulease/l2",
                service=Service.LEASE_MANAGER,
                method="POST",
                path="/api/v1/leases",
                body={"name": "l2", "namespace": "default", "group": "g", "owner": "o"},
                done="created",
            ),
            id="gpulease-optional-fields-omitted",
        ),
    ],
)
def test_other_kinds(document: str, expected: ApiCall) -> None:
    assert plan(document) == [expected]


def test_modelcache_is_skipped_with_a_reason() -> None:
    [step] = plan(
        """
apiVersion: ai.flexinfer/v1alpha1
kind: ModelCache
metadata: {name: lora}
spec: {finetune: {gpuLease: {group: g}}}
"""
    )
    assert isinstance(step, Skipped)
    assert step.resource == "modelcache/default/lora"
    assert "Kubernetes" in step.reason


def test_plan_keeps_file_order() -> None:
    text = MODEL + "---\n" + MODEL.replace("qwen3-8b", "llama") + "---\n" + MODEL.replace("qwen3-8b", "aaa")
    resources = [step.resource for step in plan(text)]
    assert resources == ["model/default/qwen3-8b", "model/default/llama", "model/default/aaa"]


def test_plan_puts_groups_first_then_models_by_priority() -> None:
    group = "apiVersion: ai.flexinfer/v1alpha1\nkind: GPUGroup\nmetadata: {name: g}\nspec: {models: [{name: low}]}\n"
    low = MODEL.replace("qwen3-8b", "low").replace("priority: 100", "priority: 5")
    text = low + "---\n" + MODEL + "---\n" + group
    assert [step.resource for step in plan(text)] == ["gpugroup/g", "model/default/qwen3-8b", "model/default/low"]


def test_homelab_example_plans_two_models_in_one_group() -> None:
    steps = plan_apply(read_manifests([REPO / "examples" / "homelab.yaml"]), default_namespace="default")
    # the fallback leader (highest priority) first: the scheduler's first election already sees it
    assert [step.resource for step in steps] == ["model/default/chat-large", "model/default/chat-small"]
    bodies: list[dict[str, Any]] = [step.body for step in steps if isinstance(step, ApiCall)]
    assert {body["spec"]["gpu"]["shared"] for body in bodies} == {"homelab-gpu"}
    assert [body["spec"]["gpu"]["priority"] for body in bodies] == [100, 50]
    assert all(body["spec"]["gpu"]["swapCooldown"] == "20s" for body in bodies)
    assert bodies[1]["spec"]["serviceLabels"] == ["chat"]
    for body in bodies:
        command = body["spec"]["local"]["command"]
        assert command[:3] == ["flexinfer-fake-model", "--port", "{port}"]
        assert command[command.index("--model") + 1] == body["metadata"]["name"]
        assert body["spec"]["endpoint"]["readinessPath"] == "/health"


@pytest.mark.parametrize(
    ("text", "fragments"),
    [
        pytest.param(
            MODEL.replace("priority: 100", "priority: high"),
            ["bad.yaml document 1", "spec.gpu.priority"],
            id="bad-field-named",
        ),
        pytest.param(
            MODEL.replace("swapCooldown: 3m", "swapCooldown: soon"),
            ["spec.gpu.swapCooldown", "not a duration"],
            id="bad-duration-named",
        ),
        pytest.param("---\n" + MODEL + "---\nkind: Model\n", ["document 2", "apiVersion and kind"], id="no-apiversion"),
        pytest.param("a: [1, 2\n", ["bad.yaml", "not valid YAML"], id="not-yaml"),
    ],
)
def test_read_manifests_errors_name_the_field(tmp_path: Path, text: str, fragments: list[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(ManifestFileError) as info:
        read_manifests([path])
    for fragment in fragments:
        assert fragment in str(info.value)
    assert info.value.exit_code == 2


def test_read_manifests_missing_file_and_stdin(tmp_path: Path) -> None:
    with pytest.raises(ManifestFileError, match=r"cannot read .*missing\.yaml"):
        read_manifests([tmp_path / "missing.yaml"])
    [model] = read_manifests(["-"], read_stdin=lambda: MODEL)
    assert model.metadata.name == "qwen3-8b"
