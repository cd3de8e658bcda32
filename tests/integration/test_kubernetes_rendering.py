"""Kubernetes workloads from the Model spec, against the API emulator and its fake kubelet: the seed's four-line
Model gets a Deployment and a Service and serves; an edit waits until the model is parked; the flash-loader
copies the weights into the node's memory once, redoes a stale copy, and its copies are cleaned up when the Model
goes; Sleep parking keeps the Pod and wakes it warm."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from flexinfer_actuator.flash_loader import MARKER
from flexinfer_testbed.kube import KubeCluster, NodeConfig, running_cluster
from flexinfer_testbed.kube.store import PatchType
from flexinfer_testbed.kube_models import create, gpu_group, known
from flexinfer_testbed.system import System
from tests.integration.test_kubernetes_mode import chat, events_for, status_of
from tests.support.kube_fixtures import KubeSystem
from tests.support.system import SystemStarter

pytestmark = [pytest.mark.integration, pytest.mark.emulator]

# The seed's Model, word for word (its namespace is the test cluster's).
SEED_MODEL = Path(__file__).with_name("seed_model.yaml")

# No real engine runs here: the backends the tests use run the fake model server, configured as an operator
# configures backends (FLEXINFER_BACKENDS_FILE, chart values `backends`).
FAKE = {
    "image": "flexinfer-fake-model:0.1.0",
    "command": ["flexinfer-fake-model"],
    "env": {"FAKE_MODEL_PORT": "{port}"},
}
BACKENDS = {
    "mlc-llm": {**FAKE, "args": ["--model", "{name}", "--startup-delay", "0.3"], "needsSource": True},
    "fake": {
        **FAKE,
        "args": ["--model", "{name}", "--startup-delay", "0.3", "--wake-delay", "0.05"],
        "needsSource": False,
    },
    "fake-no-sleep": {**FAKE, "args": ["--model", "{name}", "--no-sleep-mode"], "needsSource": False},
    "fake-from-volume": {**FAKE, "args": ["--model", "{name}", "--startup-delay", "0.1"], "needsSource": True},
}


def rendering_options(tmp_path: Path) -> dict[str, Any]:
    backends = tmp_path / "backends.yaml"
    backends.write_text(yaml.safe_dump(BACKENDS))
    (tmp_path / "claims").mkdir(exist_ok=True)
    (tmp_path / "shm").mkdir(exist_ok=True)
    return {
        "backends_file": backends,
        # The fake kubelet mounts no volumes: the containers see this machine's files, so the claims' root and the
        # node's tmpfs root are folders of the test, and the flash-loader runs as this Python.
        "model_source_root": str(tmp_path / "claims"),
        "flash_tmpfs_root": str(tmp_path / "shm"),
        "flash_loader_command": f"{sys.executable},-m,flexinfer_actuator.flash_loader",
        "model_termination_grace": 2,
    }


def model(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "ai.flexinfer/v1alpha2", "kind": "Model", "metadata": {"name": name}, "spec": spec}


async def test_the_seeds_four_line_model_gets_a_serving_workload_deleted_with_it(
    kube: KubeCluster, tmp_path: Path, kube_system: KubeSystem
) -> None:
    (await kube.kubectl("apply", "-f", "-", input=SEED_MODEL.read_text())).check()
    async with kube_system(**rendering_options(tmp_path)) as system:
        deployment = await kube.wait_for(lambda: kube.get("deployments", "qwen3-8b"), message="a rendered Deployment")
        owner = deployment["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == (
            "Model",
            "qwen3-8b",
            kube.get("Model", "qwen3-8b")["metadata"]["uid"],
        )
        assert deployment["spec"]["strategy"] == {"type": "Recreate"}
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["resources"]["limits"] == {"nvidia.com/gpu": "1"}
        assert kube.get("services", "qwen3-8b") is not None
        await known(system, "qwen3-8b")
        status, body, _ = await chat(system, "qwen3-8b", "hi")
        assert status == 200 and body["choices"][0]["message"]["content"] == "[qwen3-8b] hi"
        await kube.wait_for(lambda: status_of(kube, "qwen3-8b").get("phase") == "Ready", message="Ready")
        assert events_for(kube, "qwen3-8b", "Rendered")

        (await kube.kubectl("delete", "model", "qwen3-8b")).check()
        await kube.wait_for(
            lambda: kube.get("deployments", "qwen3-8b") is None and kube.get("services", "qwen3-8b") is None,
            message="the Deployment and Service garbage-collected with the Model",
        )
        await kube.wait_for(lambda: not kube.pods(), message="its Pod gone")


async def test_an_edit_waits_until_the_model_is_parked_unless_forced(
    kube: KubeCluster, tmp_path: Path, kube_system: KubeSystem
) -> None:
    await create(kube, model("m", backend="fake"))
    async with kube_system(**rendering_options(tmp_path)) as system:
        await known(system, "m")
        status, _, _ = await chat(system, "m", "hi")
        assert status == 200
        (pod,) = kube.ready_pods()
        before = kube.get("deployments", "m")["metadata"]["annotations"]["ai.flexinfer/template-hash"]

        rt = kube.resource("Model")
        kube.store.patch(rt, "default", "m", PatchType.MERGE, {"spec": {"kubernetes": {"env": {"EXTRA": "1"}}}})
        await kube.wait_for(lambda: events_for(kube, "m", "RolloutHeld"), message="the change held")
        assert kube.get("deployments", "m")["metadata"]["annotations"]["ai.flexinfer/template-hash"] == before
        assert kube.ready_pods()[0]["metadata"]["uid"] == pod["metadata"]["uid"], "the active model was restarted"

        kube.store.patch(
            rt, "default", "m", PatchType.MERGE, {"metadata": {"annotations": {"ai.flexinfer/force-rollout": "1"}}}
        )
        await kube.wait_for(
            lambda: kube.get("deployments", "m")["metadata"]["annotations"]["ai.flexinfer/template-hash"] != before,
            message="the forced rollout applied",
        )
        await kube.wait_for(
            lambda: [p for p in kube.ready_pods() if p["metadata"]["uid"] != pod["metadata"]["uid"]],
            within=30,
            message="a new Pod with the new spec",
        )
        env = kube.ready_pods()[0]["spec"]["containers"][0]["env"]
        assert {"name": "EXTRA", "value": "1"} in env


async def test_the_flash_loader_copies_once_redoes_a_stale_copy_and_is_cleaned_up(
    kube: KubeCluster, tmp_path: Path, kube_system: KubeSystem
) -> None:
    options = rendering_options(tmp_path)
    weights = tmp_path / "claims" / "weights" / "qwen"
    weights.mkdir(parents=True)
    (weights / "model.safetensors").write_bytes(b"\x07" * 4096)
    copy = tmp_path / "shm" / "default" / "m"
    await create(
        kube, model("m", backend="fake-from-volume", source="pvc://weights/qwen", cache={"strategy": "Memory"})
    )
    async with kube_system(**options) as system:
        await known(system, "m")
        status, _, _ = await chat(system, "m", "hi")
        assert status == 200
        assert (copy / "model.safetensors").read_bytes() == b"\x07" * 4096
        marker = json.loads((copy / MARKER).read_text())
        assert marker["identity"] == "pvc://weights/qwen" and marker["files"] == 1

        # The seed's "Stale tmpfs": a copy from other weights is found and redone, not waited on.
        (copy / MARKER).write_text(json.dumps({"identity": "pvc://weights/old", "fingerprint": "stale"}))
        (pod,) = kube.ready_pods()
        (await kube.kubectl("delete", "pod", pod["metadata"]["name"])).check()
        await kube.wait_for(
            lambda: [p for p in kube.ready_pods() if p["metadata"]["uid"] != pod["metadata"]["uid"]],
            within=30,
            message="a new Pod",
        )
        assert json.loads((copy / MARKER).read_text())["identity"] == "pvc://weights/qwen"
        await kube.wait_for(
            lambda: (
                json.loads(
                    kube.get("deployments", "m")["metadata"]["annotations"].get("ai.flexinfer/flash-nodes", "[]")
                )
                == ["emulated-node"]
            ),
            message="the node holding a copy recorded",
        )

        (await kube.kubectl("delete", "model", "m")).check()
        job = await kube.wait_for(
            lambda: next(iter(kube.list("jobs.batch")), None), message="a cleanup Job for the node's copy"
        )
        assert job["spec"]["template"]["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "emulated-node"}
        assert job["spec"]["template"]["spec"]["tolerations"][0]["key"] == "dedicated"
        await kube.wait_for(lambda: not copy.exists(), within=30, message="the tmpfs copy removed")


async def idle_past_the_demand_window(system: System, group: str, name: str, window: float = 0.5) -> None:
    """Wait until the scheduler has recorded ``name``'s last request and its demand window has passed since then
    (rather than sleeping for a guess of both)."""
    deadline = time.monotonic() + 30
    while True:
        status, body = await system.call("GET", "scheduler", f"/api/v1/groups/{group}")
        assert status == 200, body
        member = next(m for m in body["models"] if m["name"] == name)
        last = member.get("lastActiveTime")
        if last is not None:
            since = datetime.now(UTC) - datetime.fromisoformat(last.replace("Z", "+00:00"))
            if since > timedelta(seconds=window):
                return
        assert time.monotonic() < deadline, f"{name}'s last request was never recorded: {member}"
        await asyncio.sleep(0.05)


async def test_sleep_parking_keeps_the_pod_and_wakes_it_warm(tmp_path: Path, start_system: SystemStarter) -> None:
    # Sleeping models keep their Pod (and its GPU request): on a real node that takes GPU sharing (the device
    # plugin's time-slicing); here a node with four (two groups, one sleeper each).
    async with running_cluster(tmp_path / "kube", node=NodeConfig(capacity={"nvidia.com/gpu": 4})) as kube:
        sleep = {"shared": "gpu", "priority": 10, "swapCooldown": "0s", "parkStrategy": "Sleep"}
        await create(kube, model("a", backend="fake", gpu=sleep))
        await create(kube, model("b", backend="fake", gpu=sleep))
        await create(kube, model("c", backend="fake-no-sleep", gpu={**sleep, "shared": "other"}))
        await create(kube, model("d", backend="fake", gpu={**sleep, "shared": "other"}))
        async with start_system(
            kubeconfig=kube.kubeconfig, shared_demand_window=0.5, **rendering_options(tmp_path)
        ) as system:
            await known(system, "a", "b", "c", "d")
            status, _, headers = await chat(system, "a", "first")
            assert status == 200
            (a_pod,) = kube.ready_pods("ai.flexinfer/model=a")
            await idle_past_the_demand_window(system, "gpu", "a")
            status, body, headers = await chat(system, "b", "second")
            assert status == 200 and headers.get("X-FlexInfer-Cold-Start") == "true"
            await kube.wait_for(
                lambda: status_of(kube, "a").get("sharedGroup", {}).get("state") == "Parked", message="a parked"
            )
            # a sleeps in its Pod: the Pod is still there, its server says it sleeps.
            (still,) = kube.pods("ai.flexinfer/model=a")
            assert still["metadata"]["uid"] == a_pod["metadata"]["uid"]
            assert kube.get("deployments", "a")["spec"]["replicas"] == 1
            await idle_past_the_demand_window(system, "gpu", "b")
            status, body, headers = await chat(system, "a", "third")
            assert status == 200 and body["choices"][0]["message"]["content"] == "[a] third"
            assert "X-FlexInfer-Queue-Wait-Ms" in headers
            assert "X-FlexInfer-Cold-Start" not in headers, "a woken server is not a cold start"
            (woken,) = kube.ready_pods("ai.flexinfer/model=a")
            assert woken["metadata"]["uid"] == a_pod["metadata"]["uid"]

            # A server without sleep mode: parked by scaling to zero, and the status says so.
            status, _, _ = await chat(system, "c", "x")
            assert status == 200
            await idle_past_the_demand_window(system, "other", "c")
            status, _, _ = await chat(system, "d", "y")
            assert status == 200
            await kube.wait_for(
                lambda: "sleep failed" in status_of(kube, "c").get("message", ""), message="c's status says why"
            )
            assert kube.get("deployments", "c")["spec"]["replicas"] == 0 and not kube.pods("ai.flexinfer/model=c")


async def test_co_resident_models_share_one_card_through_its_replicas(
    tmp_path: Path, start_system: SystemStarter
) -> None:
    # A one-GPU node whose device plugin shares the card (time-slicing with renameByDefault: true): it advertises
    # two replicas, nvidia.com/gpu.shared, and no whole nvidia.com/gpu. Three small models of a 24 GB group: all
    # fit in its memory, so the scheduler keeps them resident together; the card's replicas run out at the third.
    node = NodeConfig(name="gpu-box", capacity={"nvidia.com/gpu.shared": 2})
    async with running_cluster(tmp_path / "kube", node=node) as kube:
        await create(
            kube,
            gpu_group("homelab-gpu", capacity={"devices": 1, "memoryPerDevice": "24Gi"}),
        )
        on_the_box = {"nodeSelector": {"kubernetes.io/hostname": "gpu-box"}}
        for name in ("chat", "coder", "embed"):
            gpu = {"shared": "homelab-gpu", "memory": "6Gi", "swapCooldown": "0s"}
            await create(kube, model(name, backend="fake", gpu=gpu, kubernetes=on_the_box))
        # One that names no node: refused with a status saying what to set, never left to land anywhere.
        await create(kube, model("stray", backend="fake", gpu={"shared": "homelab-gpu", "memory": "1Gi"}))
        async with start_system(kubeconfig=kube.kubeconfig, **rendering_options(tmp_path)) as system:
            for name in ("chat", "coder", "embed"):
                deployment = await kube.wait_for(lambda n=name: kube.get("deployments", n), message=f"{name} rendered")
                pod = deployment["spec"]["template"]["spec"]
                assert pod["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu.shared": "1"}
                assert pod["nodeSelector"] == {"kubernetes.io/hostname": "gpu-box"}
            await kube.wait_for(
                lambda: "kubernetes.io/hostname" in str(events_for(kube, "stray", "RenderFailed")),
                message="the stray model's render refused, naming the nodeSelector",
            )
            assert kube.get("deployments", "stray") is None
            await kube.wait_for(
                lambda: "kubernetes.io/hostname" in status_of(kube, "stray").get("message", ""),
                message="the stray model's status says what to set",
            )
            kube.store.patch(
                kube.resource("Model"), "default", "stray", PatchType.MERGE, {"spec": {"kubernetes": on_the_box}}
            )
            await kube.wait_for(
                lambda: kube.get("deployments", "stray"), message="stray rendered once it names the node"
            )

            await known(system, "chat", "coder", "embed")
            status, body, _ = await chat(system, "chat", "hi")
            assert status == 200 and body["choices"][0]["message"]["content"] == "[chat] hi"
            status, body, _ = await chat(system, "coder", "hello")
            assert status == 200 and body["choices"][0]["message"]["content"] == "[coder] hello"
            # Side by side on the one card: no swap, both Pods Running on the node.
            running = kube.ready_pods()
            assert sorted(p["metadata"]["labels"]["ai.flexinfer/model"] for p in running) == ["chat", "coder"]
            assert {p["spec"]["nodeName"] for p in running} == {"gpu-box"}
            status, _, _ = await chat(system, "chat", "still there")
            assert status == 200

            # The third fits the card's memory, so it is started beside them; the card has no replica left for
            # it, so its Pod stays Pending with the scheduler's reason (the other two go on serving).
            third = asyncio.create_task(chat(system, "embed", "x"))
            (pending,) = await kube.wait_for(
                lambda: [
                    p
                    for p in kube.pods("ai.flexinfer/model=embed")
                    if any(c.get("reason") == "Unschedulable" for c in p["status"].get("conditions") or [])
                ],
                message="embed's Pod Pending",
            )
            scheduled = next(c for c in pending["status"]["conditions"] if c["type"] == "PodScheduled")
            assert "Insufficient nvidia.com/gpu.shared" in scheduled["message"]
            assert pending["status"]["phase"] == "Pending"
            status, body, _ = await chat(system, "coder", "meanwhile")
            assert status == 200 and body["choices"][0]["message"]["content"] == "[coder] meanwhile"
            third.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await third
