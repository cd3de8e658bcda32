"""Rendering a Model's workload (Kubernetes mode, no spec.deployment): one row per backend, source kind and cache
strategy, every rendered manifest valid Kubernetes; rollout decisions; the flash-loader's copy and marker."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from flexinfer_actuator import flash_loader
from flexinfer_actuator.domain.rendering import (
    ANNOTATION_FORCED,
    ANNOTATION_HASH,
    CoResidence,
    RenderError,
    RenderSettings,
    RolloutDecision,
    SourceKind,
    backends_from,
    cleanup_job,
    co_residence_of,
    decide_rollout,
    parse_source,
    render,
    rollout_patch,
)
from flexinfer_common.manifests import GPUGroup, Model

SETTINGS = RenderSettings(backends=backends_from(None), flash_loader_image="registry.example.com/flexinfer-actuator:1")
OWNER = {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": "qwen3-8b", "uid": "u-1"}}


def model(**spec: Any) -> Model:
    return Model.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": "qwen3-8b", "namespace": "ml"},
            "spec": spec,
        }
    )


def validate(document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, "1.30.0", strict=True)


def server(workload: Any) -> dict[str, Any]:
    return workload.deployment["spec"]["template"]["spec"]["containers"][0]


# The seed's example: backend and source only.
SEED = {"backend": "mlc-llm", "source": "HF://mlc-ai/Qwen3-8B-q4f16_1-MLC", "gpu": {"shared": "homelab-gpu"}}


@pytest.mark.parametrize(
    ("spec", "image", "args", "readiness", "port"),
    [
        pytest.param(
            SEED,
            "ghcr.io/mlc-ai/mlc-llm:nightly",
            ["mlc-ai/Qwen3-8B-q4f16_1-MLC", "--host", "0.0.0.0", "--port", "8000"],
            "/v1/models",
            8000,
            id="seed-mlc-llm-hugging-face",
        ),
        pytest.param(
            {"backend": "vllm", "source": "hf://Qwen/Qwen3-8B"},
            "vllm/vllm-openai:v0.11.0",
            ["--model", "Qwen/Qwen3-8B", "--served-model-name", "qwen3-8b", "--host", "0.0.0.0", "--port", "8000"],
            "/health",
            8000,
            id="vllm-hugging-face",
        ),
        pytest.param(
            {"backend": "vllm", "source": "hf://Qwen/Qwen3-8B", "gpu": {"parkStrategy": "Sleep"}},
            "vllm/vllm-openai:v0.11.0",
            [
                "--model",
                "Qwen/Qwen3-8B",
                "--served-model-name",
                "qwen3-8b",
                "--host",
                "0.0.0.0",
                "--port",
                "8000",
                "--enable-sleep-mode",
            ],
            "/health",
            8000,
            id="vllm-sleep-park-enables-sleep-mode",
        ),
        pytest.param(
            {"backend": "llama-cpp", "source": "pvc://weights/gguf/qwen3-8b-q4.gguf", "endpoint": {"port": 9000}},
            "ghcr.io/ggml-org/llama.cpp:server-cuda",
            [
                "--model",
                "/models/weights/gguf/qwen3-8b-q4.gguf",
                "--alias",
                "qwen3-8b",
                "--host",
                "0.0.0.0",
                "--port",
                "9000",
            ],
            "/health",
            9000,
            id="llama-cpp-from-a-claim-on-its-own-port",
        ),
        pytest.param(
            {"backend": "ollama"},
            "ollama/ollama:0.12.3",
            [],
            "/api/version",
            11434,
            id="ollama-needs-no-source",
        ),
        pytest.param(
            {
                "backend": "vllm",
                "source": "/opt/weights/qwen",
                "kubernetes": {"image": "my/vllm:patched"},
                "endpoint": {"readinessPath": "/ready"},
            },
            "my/vllm:patched",
            ["--model", "/opt/weights/qwen", "--served-model-name", "qwen3-8b", "--host", "0.0.0.0", "--port", "8000"],
            "/ready",
            8000,
            id="path-source-image-and-readiness-overridden",
        ),
    ],
)
def test_render_per_backend_and_source(
    spec: dict[str, Any], image: str, args: list[str], readiness: str, port: int
) -> None:
    workload = render(model(**spec), OWNER, SETTINGS)
    container = server(workload)
    assert container["image"] == image and container["args"] == args
    assert container["readinessProbe"]["httpGet"] == {"path": readiness, "port": "http"}
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert workload.port == port
    assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    deployment = workload.deployment
    assert deployment["spec"]["replicas"] == 0 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert deployment["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "name": "qwen3-8b",
            "uid": "u-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert workload.service["metadata"]["ownerReferences"] == deployment["metadata"]["ownerReferences"]
    assert workload.service["spec"]["ports"][0]["port"] == port
    validate(deployment)
    validate(workload.service)


@pytest.mark.parametrize(
    ("strategy", "source", "volumes", "model_path", "flash"),
    [
        pytest.param(
            None, "hf://org/m", {"cache": {"emptyDir": {}}}, "org/m", False, id="no-cache-downloads-each-time"
        ),
        pytest.param(
            "SharedPVC",
            "hf://org/m",
            {"cache": {"persistentVolumeClaim": {"claimName": "flexinfer-model-cache"}}},
            "org/m",
            False,
            id="shared-pvc-downloads-once",
        ),
        pytest.param(
            "Memory",
            "pvc://weights/qwen",
            {
                "cache": {"emptyDir": {}},
                "source": {"persistentVolumeClaim": {"claimName": "weights", "readOnly": True}},
                "flash": {"hostPath": {"path": "/dev/shm/flexinfer/ml/qwen3-8b", "type": "DirectoryOrCreate"}},
            },
            "/dev/shm/flexinfer/ml/qwen3-8b",
            True,
            id="memory-copies-the-claim-into-the-nodes-tmpfs",
        ),
    ],
)
def test_render_cache_strategies(
    strategy: str | None, source: str, volumes: dict[str, Any], model_path: str, flash: bool
) -> None:
    spec: dict[str, Any] = {"backend": "vllm", "source": source}
    if strategy:
        spec["cache"] = {"strategy": strategy}
    workload = render(model(**spec), OWNER, SETTINGS)
    pod = workload.deployment["spec"]["template"]["spec"]
    assert {v["name"]: {k: x for k, x in v.items() if k != "name"} for v in pod["volumes"]} == volumes
    assert server(workload)["args"][1] == model_path
    if flash:
        (loader,) = pod["initContainers"]
        assert loader["image"] == "registry.example.com/flexinfer-actuator:1"
        assert loader["args"] == [
            "copy",
            "--source",
            "/models/weights/qwen",
            "--target",
            "/dev/shm/flexinfer/ml/qwen3-8b",
            "--identity",
            "pvc://weights/qwen",
        ]
        assert workload.flash_dir == "/dev/shm/flexinfer/ml/qwen3-8b"
    else:
        assert "initContainers" not in pod and workload.flash_dir is None
    validate(workload.deployment)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        pytest.param({}, "spec.backend", id="no-backend"),
        pytest.param({"backend": "tgi", "source": "hf://a/b"}, "unknown backend 'tgi'", id="unknown-backend"),
        pytest.param({"backend": "vllm"}, "spec.source: required", id="vllm-needs-a-source"),
        pytest.param({"backend": "vllm", "source": "s3://bucket/m"}, "spec.source", id="unknown-scheme"),
        pytest.param({"backend": "vllm", "source": "hf://just-a-name"}, "HF://<org>/<name>", id="hf-without-org"),
        pytest.param({"backend": "vllm", "source": "pvc://Bad_Claim/x"}, "PersistentVolumeClaim", id="bad-claim"),
        pytest.param({"backend": "vllm", "source": "pvc://c/../etc"}, "'..'", id="claim-escape"),
        pytest.param(
            {"backend": "vllm", "source": "hf://a/b", "cache": {"strategy": "Memory"}},
            "spec.cache.strategy",
            id="memory-needs-weights-on-a-volume",
        ),
    ],
)
def test_render_refuses_what_it_cannot_run_naming_the_field(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(RenderError, match=field.replace("(", r"\(").replace(")", r"\)")):
        render(model(**spec), OWNER, SETTINGS)


def test_render_node_placement_gpus_and_env() -> None:
    settings = RenderSettings(
        backends=backends_from(None),
        gpu_resource="amd.com/gpu",
        node_selector={"gpu": "true"},
        tolerations=({"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},),
    )
    spec = {
        "backend": "vllm",
        "source": "hf://a/b",
        "kubernetes": {
            "gpus": 2,
            "nodeSelector": {"kubernetes.io/hostname": "box"},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
            "env": {"VLLM_LOGGING_LEVEL": "DEBUG"},
            "resources": {"requests": {"memory": "24Gi"}},
        },
    }
    workload = render(model(**spec), OWNER, settings)
    pod = workload.deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"gpu": "true", "kubernetes.io/hostname": "box"}
    assert [t["key"] for t in pod["tolerations"]] == ["dedicated", "nvidia.com/gpu"]
    container = pod["containers"][0]
    assert container["resources"] == {"requests": {"memory": "24Gi"}, "limits": {"amd.com/gpu": "2"}}
    assert {"name": "VLLM_LOGGING_LEVEL", "value": "DEBUG"} in container["env"]
    assert {"name": "HF_HOME", "value": "/cache/huggingface"} in container["env"]
    validate(workload.deployment)


ON_BOX = {"nodeSelector": {"kubernetes.io/hostname": "box"}}
CARD = CoResidence(group="homelab-gpu")


@pytest.mark.parametrize(
    ("kubernetes", "co_residence", "limits", "node_selector"),
    [
        pytest.param({}, None, {"nvidia.com/gpu": "1"}, None, id="no-capacity-a-whole-gpu-as-the-seed"),
        pytest.param(
            ON_BOX, CARD, {"nvidia.com/gpu.shared": "1"}, {"kubernetes.io/hostname": "box"}, id="co-resident-a-replica"
        ),
        pytest.param(
            {**ON_BOX, "gpus": 2},
            CARD,
            {"nvidia.com/gpu.shared": "1"},
            {"kubernetes.io/hostname": "box"},
            id="co-resident-one-replica-per-device-placed-not-per-gpus",
        ),
        pytest.param(
            ON_BOX,
            CoResidence(group="homelab-gpu", peers={"ml/coder": "box", "ml/embed": "box"}),
            {"nvidia.com/gpu.shared": "1"},
            {"kubernetes.io/hostname": "box"},
            id="co-resident-beside-peers-on-the-same-node",
        ),
        pytest.param({**ON_BOX, "gpus": 0}, CARD, None, {"kubernetes.io/hostname": "box"}, id="no-gpu-asks-none"),
    ],
)
def test_render_co_resident_models_share_the_card(
    kubernetes: dict[str, Any],
    co_residence: CoResidence | None,
    limits: dict[str, str] | None,
    node_selector: dict[str, str] | None,
) -> None:
    workload = render(model(**SEED, kubernetes=kubernetes), OWNER, SETTINGS, co_residence=co_residence)
    container = server(workload)
    assert (container.get("resources") or {}).get("limits") == limits
    assert workload.deployment["spec"]["template"]["spec"].get("nodeSelector") == node_selector
    # The device plugin exposes the replica's card to the container (as its device 0): no group index is set.
    assert not {e["name"] for e in container["env"]} & {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"}
    validate(workload.deployment)


def test_the_node_may_come_from_the_actuators_selector_and_the_shared_resource_is_a_setting() -> None:
    settings = RenderSettings(
        backends=backends_from(None),
        shared_gpu_resource="nvidia.com/gpu",  # a plugin that keeps the name (renameByDefault: false)
        node_selector={"kubernetes.io/hostname": "homelab"},
    )
    workload = render(model(**SEED), OWNER, settings, co_residence=CARD)
    assert server(workload)["resources"]["limits"] == {"nvidia.com/gpu": "1"}
    assert workload.deployment["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "homelab"}
    validate(workload.deployment)


@pytest.mark.parametrize(
    ("kubernetes", "co_residence", "message"),
    [
        pytest.param(
            {"nodeSelector": {"gpu": "true"}},
            CARD,
            r"spec.kubernetes.nodeSelector: group 'homelab-gpu' has a spec.capacity .* set kubernetes.io/hostname",
            id="co-resident-without-a-node",
        ),
        pytest.param(
            ON_BOX,
            CoResidence(group="homelab-gpu", peers={"ml/coder": "box", "ml/embed": "other"}),
            r"kubernetes.io/hostname='box', but group 'homelab-gpu' shares one card and ml/embed is on 'other'",
            id="co-resident-on-another-node-than-a-peer",
        ),
        pytest.param(
            ON_BOX,
            CoResidence(group="homelab-gpu", group_devices=2),
            r"spec.gpu.shared: group 'homelab-gpu' declares spec.capacity.devices 2; .* one GPUGroup per card",
            id="co-resident-in-a-group-of-two-cards",
        ),
    ],
)
def test_render_refuses_a_co_resident_pod_it_cannot_place(
    kubernetes: dict[str, Any], co_residence: CoResidence, message: str
) -> None:
    with pytest.raises(RenderError, match=message):
        render(model(**SEED, kubernetes=kubernetes), OWNER, SETTINGS, co_residence=co_residence)


def gpugroup(name: str, spec: dict[str, Any]) -> GPUGroup:
    return GPUGroup.model_validate(
        {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup", "metadata": {"name": name}, "spec": spec}
    )


def member(name: str, **spec: Any) -> Model:
    return Model.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": spec,
        }
    )


CAPACITY = {"capacity": {"devices": 1, "memoryPerDevice": "24Gi"}}


@pytest.mark.parametrize(
    ("groups", "members", "expected"),
    [
        pytest.param([], [], None, id="no-gpugroup-one-at-a-time"),
        pytest.param([gpugroup("homelab-gpu", {"scheduling": "seed"})], [], None, id="gpugroup-without-capacity"),
        pytest.param([gpugroup("other-gpu", CAPACITY)], [], None, id="another-groups-capacity"),
        pytest.param(
            [gpugroup("homelab-gpu", {**CAPACITY, "models": [{"name": "qwen3-8b"}]})],
            [],
            None,
            id="a-v1alpha1-group-is-not-the-shared-groups-declaration",
        ),
        pytest.param(
            [gpugroup("homelab-gpu", CAPACITY)],
            [
                member("coder", gpu={"shared": "homelab-gpu"}, kubernetes=ON_BOX),
                member("embed", gpu={"shared": "homelab-gpu"}),  # no node of its own: its own render says so
                member("adopted", gpu={"shared": "homelab-gpu"}, deployment="theirs", kubernetes=ON_BOX),
                member("elsewhere", gpu={"shared": "other-gpu"}, kubernetes=ON_BOX),
            ],
            CoResidence(group="homelab-gpu", peers={"ml/coder": "box"}),
            id="capacity-declared-peers-that-flexinfer-renders",
        ),
    ],
)
def test_co_residence_comes_from_the_gpugroups_capacity(
    groups: list[GPUGroup], members: list[Model], expected: CoResidence | None
) -> None:
    assert co_residence_of(model(**SEED), groups, members, SETTINGS) == expected


def test_backends_are_configurable_and_checked() -> None:
    backends = backends_from({"vllm": {"image": "mirror.local/vllm:1"}, "ollama": None, "tgi": {"image": "tgi:2"}})
    assert backends["vllm"].image == "mirror.local/vllm:1" and "ollama" not in backends and "tgi" in backends
    with pytest.raises(ValueError, match="unknown keys"):
        backends_from({"vllm": {"image": "x", "arg": []}})
    with pytest.raises(ValueError, match="image is required"):
        backends_from({"vllm": {"args": []}})


def test_the_hash_moves_only_when_what_is_rendered_changes() -> None:
    first = render(model(**SEED), OWNER, SETTINGS)
    same = render(model(**{**SEED, "gpu": {"shared": "homelab-gpu", "priority": 100}}), OWNER, SETTINGS)
    other = render(model(**{**SEED, "source": "HF://mlc-ai/Qwen3-4B-MLC"}), OWNER, SETTINGS)
    assert first.template_hash == same.template_hash  # the election's fields are not the workload's
    assert first.template_hash != other.template_hash


@pytest.mark.parametrize(
    ("existing", "active", "force", "decision"),
    [
        pytest.param(None, False, None, RolloutDecision.CREATE, id="nothing-there-create"),
        pytest.param("same", True, None, RolloutDecision.UP_TO_DATE, id="same-hash-nothing-to-do"),
        pytest.param("changed", False, None, RolloutDecision.APPLY, id="changed-while-parked-apply"),
        pytest.param("changed", True, None, RolloutDecision.HOLD, id="changed-while-active-hold"),
        pytest.param("changed", True, "1", RolloutDecision.APPLY, id="changed-while-active-forced-apply"),
        pytest.param("changed-forced-1", True, "1", RolloutDecision.HOLD, id="a-force-applies-once"),
        pytest.param("not-ours", False, None, RolloutDecision.NOT_OURS, id="a-users-deployment-is-adopted"),
    ],
)
def test_rollout_decisions(existing: str | None, active: bool, force: str | None, decision: RolloutDecision) -> None:
    workload = render(model(**SEED), OWNER, SETTINGS)
    current: dict[str, Any] | None = None
    if existing is not None:
        current = json.loads(json.dumps(workload.deployment))
        if existing.startswith("changed"):
            current["metadata"]["annotations"][ANNOTATION_HASH] = "0123456789abcdef"
        if existing == "changed-forced-1":
            current["metadata"]["annotations"][ANNOTATION_FORCED] = "1"
        if existing == "not-ours":
            current["metadata"]["ownerReferences"] = []
    assert decide_rollout(current, workload, model_uid="u-1", active=active, force=force) is decision


def test_rollout_patch_never_touches_replicas_or_the_selector() -> None:
    workload = render(model(**SEED), OWNER, SETTINGS)
    patch = rollout_patch(workload, force="2")
    assert set(patch["spec"]) == {"strategy", "template"}
    assert patch["metadata"]["annotations"] == {ANNOTATION_HASH: workload.template_hash, ANNOTATION_FORCED: "2"}


def test_cleanup_job_runs_on_the_node_with_the_gpu_toleration() -> None:
    job = cleanup_job(
        namespace="ml",
        model="qwen3-8b",
        node="gpu-node-1",
        settings=SETTINGS,
        toleration={"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"},
    )
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-node-1"}
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]
    assert pod["containers"][0]["args"] == ["remove", "--target", "/dev/shm/flexinfer/ml/qwen3-8b"]
    validate(job)


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        pytest.param("HF://mlc-ai/Qwen3-8B-q4f16_1-MLC", SourceKind.HUGGING_FACE, id="seed-hf"),
        pytest.param("pvc://models/qwen", SourceKind.PVC, id="pvc"),
        pytest.param("/mnt/weights", SourceKind.PATH, id="path"),
        pytest.param(None, SourceKind.NONE, id="none"),
    ],
)
def test_parse_source(text: str | None, kind: SourceKind) -> None:
    assert parse_source(text).kind is kind


# ------------------------------------------------------------------------------------------ the flash-loader


def weights(root: Path) -> Path:
    source = root / "claim" / "qwen"
    (source / "shards").mkdir(parents=True)
    (source / "config.json").write_text('{"layers": 36}')
    (source / "shards" / "a.safetensors").write_bytes(b"\x01" * 1000)
    return source


def test_the_flash_loader_copies_once_and_trusts_only_its_marker(tmp_path: Path) -> None:
    source, target = weights(tmp_path), tmp_path / "shm" / "ml" / "qwen"
    assert flash_loader.copy(source, target, "pvc://claim/qwen").startswith("copied 2 files, 1014 bytes")
    assert (target / "shards" / "a.safetensors").read_bytes() == b"\x01" * 1000
    assert flash_loader.copy(source, target, "pvc://claim/qwen").startswith("current")

    # Stale: the weights on the claim changed (or the marker names other weights): the copy is made again.
    (source / "config.json").write_text('{"layers": 40}')
    os.utime(source / "config.json", ns=(1, 1))
    assert "copied" in flash_loader.copy(source, target, "pvc://claim/qwen")
    assert (target / "config.json").read_text() == '{"layers": 40}'
    assert "copied" in flash_loader.copy(source, target, "pvc://claim/other")


def test_an_interrupted_copy_is_never_served(tmp_path: Path) -> None:
    source, target = weights(tmp_path), tmp_path / "shm"
    target.mkdir()
    (target / "half-a-shard.safetensors").write_bytes(b"\x00" * 10)  # a copy that died before its marker
    result = flash_loader.copy(source, target, "pvc://claim/qwen")
    assert "copied" in result and "no complete copy" in result
    assert not (target / "half-a-shard.safetensors").exists()
    assert flash_loader.marker_of(target) is not None


def test_the_flash_loader_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, target = weights(tmp_path), tmp_path / "shm" / "ml" / "qwen"
    args = ["copy", "--source", str(source), "--target", str(target), "--identity", "pvc://claim/qwen"]
    assert flash_loader.main(args) == 0
    assert flash_loader.main(["remove", "--target", str(target)]) == 0
    assert not target.exists()
    assert (
        flash_loader.main(["copy", "--source", str(tmp_path / "missing"), "--target", str(target), "--identity", "x"])
        == 1
    )
    assert "does not exist" in capsys.readouterr().err
    assert flash_loader.main(["remove", "--target", "/"]) == 1


def test_the_charts_rendering_values_are_settings_the_actuator_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    from flexinfer_actuator.settings import ActuatorSettings
    from flexinfer_common.settings import SettingsError, load_settings
    from tests.unit.test_charts import chart_dir, render

    values = {
        "backends": {"vllm": {"image": "mirror.local/vllm:1"}, "ollama": None},
        "rendering": {
            "gpuResource": "amd.com/gpu",
            "sharedGpuResource": "nvidia.com/gpu",
            "modelNodeSelector": {"gpu": "yes"},
        },
    }
    deployment = next(d for d in render(chart_dir("actuator"), values) if d["kind"] == "Deployment")
    for entry in deployment["spec"]["template"]["spec"]["containers"][0]["env"]:
        if entry["name"].startswith("FLEXINFER_") and "value" in entry:
            monkeypatch.setenv(entry["name"], entry["value"])
    monkeypatch.setenv("FLEXINFER_BIND_HOST", "127.0.0.1")
    render_settings = load_settings(ActuatorSettings).render_settings()
    assert render_settings.gpu_resource == "amd.com/gpu"
    assert render_settings.shared_gpu_resource == "nvidia.com/gpu"
    assert render_settings.node_selector == {"gpu": "yes"}
    assert render_settings.flash_loader_image == "flexinfer-actuator:0.1.0"  # the chart's own image
    assert render_settings.backends["vllm"].image == "mirror.local/vllm:1" and "ollama" not in render_settings.backends
    assert render_settings.tolerations == ()

    monkeypatch.setenv("FLEXINFER_BACKENDS", '{"vllm": {"args": []}}')
    with pytest.raises(SettingsError, match="FLEXINFER_BACKENDS"):
        load_settings(ActuatorSettings)
