"""The actuator chart's RBAC is exactly the calls the code makes: a scenario that exercises every path of the
Kubernetes back-end (spec sync, scaling, readiness, status and its conflicts, GPUGroup status, the active-services
annotation, Events and their repeats, leader election) runs against the API emulator, and the set of
(API group, resource, verb) the actuator called is compared with the rules the chart renders, both ways."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from flexinfer_testbed.kube import KubeCluster, NodeConfig, running_cluster
from flexinfer_testbed.kube.builders import service
from flexinfer_testbed.kube_models import add_model, create, gpu_group, known, model_deployment, model_resource
from tests.integration.test_kubernetes_mode import chat, events_for, status_of
from tests.integration.test_kubernetes_rendering import model as rendering_model
from tests.integration.test_kubernetes_rendering import rendering_options
from tests.support.system import SystemStarter
from tests.unit.test_charts import chart_dir, render

pytestmark = [pytest.mark.integration, pytest.mark.emulator]

Permission = tuple[str, str, str]  # API group, resource[/subresource], verb


def chart_permissions() -> set[Permission]:
    granted: set[Permission] = set()
    for document in render(chart_dir("actuator")):
        if document["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in document["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        granted.add((group, resource, verb))
    return granted


async def test_the_chart_grants_exactly_what_the_actuator_calls(tmp_path: Path, start_system: SystemStarter) -> None:
    # Several models at once (two groups and a rendered solo model): a node with enough GPUs for all.
    async with running_cluster(tmp_path / "kube", node=NodeConfig(capacity={"nvidia.com/gpu": 4})) as kube:
        await exercise_everything(kube, start_system, tmp_path)
        called = {
            (c.api_group, c.resource_path, c.verb)
            for c in kube.calls()
            if c.user_agent.startswith("flexinfer-actuator") and c.resource
        }
    granted = chart_permissions()
    assert called - granted == set(), f"calls the chart does not allow: {sorted(called - granted)}"
    assert granted - called == set(), f"rules the code never needs: {sorted(granted - called)}"


async def exercise_everything(kube: KubeCluster, start_system: SystemStarter, tmp_path: Path) -> None:
    for name in ("a", "b"):
        await create(kube, service(name))
    await add_model(kube, "a", priority=10, serviceLabels=["chat"])
    await add_model(kube, "b", priority=5)
    for name in ("x", "y"):
        await create(kube, model_deployment(name, startup_delay=0.1))
        await create(kube, model_resource(name, group=None))
    await create(
        kube,
        gpu_group("pair", models=[{"name": "x"}, {"name": "y"}]),
    )
    # A rendered model with the flash-loader: its Deployment and Service are created, changed while parked, and its
    # tmpfs copy is cleaned up by a Job when it is deleted.
    options = rendering_options(tmp_path)
    weights = tmp_path / "claims" / "weights" / "r"
    weights.mkdir(parents=True)
    (weights / "w.bin").write_bytes(b"w")
    rendered = {"backend": "fake-from-volume", "source": "pvc://weights/r", "cache": {"strategy": "Memory"}}
    await create(kube, {**rendering_model("r", **rendered)})
    kube.inject_conflicts(1, resource="models", subresource="status")
    kube.inject_conflicts(1, resource="gpugroups", subresource="status")
    async with start_system(kubeconfig=kube.kubeconfig, **options) as system:
        await kube.wait_for(lambda: kube.get("deployments", "r"), message="r rendered")
        await known(system, "r")
        status, _, _ = await chat(system, "r", "hi")
        assert status == 200
        await kube.wait_for(
            lambda: "ai.flexinfer/flash-nodes" in kube.get("deployments", "r")["metadata"]["annotations"],
            message="r's node recorded",
        )
        (
            await kube.kubectl("patch", "model/r", "--type=merge", "-p", '{"spec":{"kubernetes":{"env":{"X":"1"}}}}')
        ).check()
        (await kube.kubectl("delete", "model", "r")).check()
        await kube.wait_for(lambda: kube.list("jobs.batch"), message="the cleanup Job")
        await kube.wait_for(lambda: status_of(kube, "a").get("phase") == "Ready", message="a Ready")
        status, _, _ = await chat(system, "a", "hi")
        assert status == 200
        await kube.wait_for(lambda: (kube.get("GPUGroup", "pair") or {}).get("status"), message="group status")
        # Scaled up by hand twice: the same Warning twice, which is one Event counted twice.
        for _ in range(2):
            (await kube.kubectl("scale", "deployment/b", "--replicas=1")).check()
            await kube.wait_for(lambda: kube.get("deployments", "b")["spec"]["replicas"] == 0, message="scaled back")
        await kube.wait_for(
            lambda: [e for e in events_for(kube, "b", "ScaledOutsideFlexInfer") if e.get("count", 1) >= 2],
            message="the repeated event counted",
        )
        await asyncio.sleep(0.5)  # a last renewal of the Lease, status writes in flight
