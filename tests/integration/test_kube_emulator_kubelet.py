"""The fake node behind the emulator: deployment and job controllers, scheduler with GPU capacity, kubelet that
runs the fake model server as a process with its own loopback IP, probes it, crash-loops, fails pulls, and
stops pods gracefully."""

from __future__ import annotations

import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from kubernetes import client

from flexinfer_testbed.kube import KubeCluster, NodeConfig, in_thread, running_cluster
from flexinfer_testbed.kube.builders import deployment
from flexinfer_testbed.kube.store import EventType, StoredEvent
from tests.support.processes import alive

pytestmark = pytest.mark.emulator

NS = "default"


def container_status(pod: dict[str, Any]) -> dict[str, Any]:
    statuses = pod.get("status", {}).get("containerStatuses") or [{}]
    result: dict[str, Any] = statuses[0]
    return result


def condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    return next((c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_), {})


async def scale(kube: KubeCluster, name: str, replicas: int) -> None:
    apps = client.AppsV1Api(kube.api_client())
    await in_thread(apps.patch_namespaced_deployment_scale, name, NS, {"spec": {"replicas": replicas}})


async def test_scale_up_serves_http_on_the_pod_ip_and_scale_down_terminates(kube: KubeCluster) -> None:
    apps = client.AppsV1Api(kube.api_client())
    await in_thread(apps.create_namespaced_deployment, NS, deployment("chat"))
    await scale(kube, "chat", 1)
    (pod,) = await kube.wait_for(lambda: kube.ready_pods("app=chat"), message="a Ready pod")
    assert pod["status"]["podIP"].startswith("127.") and pod["status"]["podIP"] != "127.0.0.1"
    assert pod["metadata"]["labels"]["pod-template-hash"]
    assert pod["metadata"]["ownerReferences"][0]["kind"] == "Deployment"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{kube.pod_endpoint(pod)}/health") as health:
            assert health.status == 200
        async with session.post(
            f"{kube.pod_endpoint(pod)}/v1/chat/completions",
            json={"model": "chat", "messages": [{"role": "user", "content": "hi"}]},
        ) as answer:
            assert (await answer.json())["choices"][0]["message"]["content"] == "[chat] hi"

    status = await kube.wait_for(
        lambda: (d := kube.get("deployments", "chat")) and d["status"].get("readyReplicas") == 1 and d["status"]
    )
    assert (status["replicas"], status["updatedReplicas"], status["availableReplicas"]) == (1, 1, 1)
    assert status["observedGeneration"] == kube.get("deployments", "chat")["metadata"]["generation"]
    assert condition(kube.get("deployments", "chat"), "Available")["status"] == "True"

    seen: list[tuple[str, bool]] = []

    def record(event: StoredEvent) -> None:
        if event.key == ("", "pods") and event.obj["metadata"]["name"] == pod["metadata"]["name"]:
            seen.append((event.type.value, bool(event.obj["metadata"].get("deletionTimestamp"))))

    kube.store.listeners.append(record)
    pid = int(container_status(pod)["containerID"].removeprefix("fake://"))
    await scale(kube, "chat", 0)
    await kube.wait_for(lambda: not kube.pods("app=chat"), message="the pod to go")
    assert ("MODIFIED", True) in seen and seen[-1] == ("DELETED", True)  # Terminating, then gone
    assert not alive(pid)
    final = await kube.wait_for(
        lambda: (d := kube.get("deployments", "chat")) and "readyReplicas" not in d["status"] and d["status"]
    )
    assert "replicas" not in final


async def test_second_gpu_pod_waits_unschedulable_until_the_first_is_gone(kube: KubeCluster) -> None:
    apps = client.AppsV1Api(kube.api_client())
    both: list[int] = []

    def count_gpu_pods(_event: StoredEvent) -> None:
        bound = [p for p in kube.store.iter(("", "pods")) if p["spec"].get("nodeName")]
        both.append(len(bound))

    kube.store.listeners.append(count_gpu_pods)
    await in_thread(apps.create_namespaced_deployment, NS, deployment("first", replicas=1))
    await kube.wait_for(lambda: kube.ready_pods("app=first"))
    await in_thread(apps.create_namespaced_deployment, NS, deployment("second", replicas=1))
    (pending,) = await kube.wait_for(
        lambda: [p for p in kube.pods("app=second") if condition(p, "PodScheduled").get("reason") == "Unschedulable"]
    )
    scheduled = condition(pending, "PodScheduled")
    assert scheduled["status"] == "False"
    assert scheduled["message"].startswith("0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")
    assert pending["status"]["phase"] == "Pending" and "podIP" not in pending["status"]
    events = kube.list("events")
    assert any(
        e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == pending["metadata"]["name"] for e in events
    )

    await scale(kube, "first", 0)
    await kube.wait_for(lambda: kube.ready_pods("app=second"), message="the second model to load")
    assert max(both) == 1  # never two GPU pods bound at once: the GPU is held until the pod object is gone


SHARED = "nvidia.com/gpu.shared"


async def test_a_shared_card_runs_pods_until_its_replicas_run_out(tmp_path: Path) -> None:
    # One GPU shared by the device plugin (time-slicing or MPS, renameByDefault: true): four replicas, no whole GPU.
    node = NodeConfig(name="gpu-box", capacity={SHARED: 4})
    async with running_cluster(tmp_path / "kube", node=node) as kube:
        apps = client.AppsV1Api(kube.api_client())
        assert kube.get("nodes", "gpu-box")["status"]["allocatable"][SHARED] == "4"
        for name, replicas in (("chat", 1), ("coder", 1), ("wide", 2)):
            body = deployment(name, replicas=1, gpu=replicas, gpu_resource=SHARED)
            await in_thread(apps.create_namespaced_deployment, NS, body)
        for name in ("chat", "coder", "wide"):
            await kube.wait_for(lambda n=name: kube.ready_pods(f"app={n}"), message=f"{name} Running")

        def unschedulable(app: str) -> list[dict[str, Any]]:
            return [p for p in kube.pods(f"app={app}") if condition(p, "PodScheduled").get("reason") == "Unschedulable"]

        await in_thread(apps.create_namespaced_deployment, NS, deployment("embed", replicas=1, gpu_resource=SHARED))
        (pending,) = await kube.wait_for(lambda: unschedulable("embed"), message="embed Pending")
        assert condition(pending, "PodScheduled")["message"].startswith(
            f"0/1 nodes are available: 1 Insufficient {SHARED}."
        )
        # The node offers replicas only: a Pod asking for a whole GPU does not fit at all.
        await in_thread(apps.create_namespaced_deployment, NS, deployment("whole", replicas=1))
        (whole,) = await kube.wait_for(lambda: unschedulable("whole"), message="whole Pending")
        assert "1 Insufficient nvidia.com/gpu." in condition(whole, "PodScheduled")["message"]

        await scale(kube, "chat", 0)  # a replica comes free once chat's Pod is gone
        await kube.wait_for(lambda: kube.ready_pods("app=embed"), message="embed Running in chat's replica")
        assert len(kube.ready_pods()) == 3 and unschedulable("whole")


async def test_node_selector_that_does_not_match_stays_pending(kube: KubeCluster) -> None:
    apps = client.AppsV1Api(kube.api_client())
    await in_thread(
        apps.create_namespaced_deployment,
        NS,
        deployment("elsewhere", replicas=1, gpu=0, node_selector={"kubernetes.io/hostname": "gpu-box"}),
    )
    (pod,) = await kube.wait_for(lambda: [p for p in kube.pods("app=elsewhere") if condition(p, "PodScheduled")])
    assert condition(pod, "PodScheduled")["message"].startswith(
        "0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."
    )


async def test_crash_loop_back_off_carries_the_termination_message(kube: KubeCluster) -> None:
    apps = client.AppsV1Api(kube.api_client())
    crash = [sys.executable, "-c", "print('loading weights'); print('CUDA error: out of memory'); raise SystemExit(3)"]
    await in_thread(
        apps.create_namespaced_deployment,
        NS,
        deployment("crashy", replicas=1, gpu=0, command=crash, policy="FallbackToLogsOnError"),
    )

    def crash_looping() -> dict[str, Any] | None:
        for pod in kube.pods("app=crashy"):
            status = container_status(pod)
            if (
                status.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"
                and status.get("restartCount", 0) >= 1
            ):
                return status
        return None

    status = await kube.wait_for(crash_looping, message="CrashLoopBackOff")
    terminated = status["lastState"]["terminated"]
    assert (terminated["exitCode"], terminated["reason"]) == (3, "Error")
    assert terminated["message"].splitlines()[-1] == "CUDA error: out of memory"
    assert status["ready"] is False
    # kubectl shows the state at its own read: the emulated back-off is short (0.2 s doubling to 2 s), so a run may
    # have restarted by then; each read is an observation, and once the back-off is long one finds the crash loop
    tables = []
    for _ in range(10):
        tables.append((await kube.kubectl("get", "pods", "-l", "app=crashy")).check().stdout)
        if "CrashLoopBackOff" in tables[-1]:
            break
    assert "CrashLoopBackOff" in tables[-1], tables


async def test_missing_image_shows_image_pull_back_off_and_never_starts(kube: KubeCluster) -> None:
    apps = client.AppsV1Api(kube.api_client())
    await in_thread(
        apps.create_namespaced_deployment,
        NS,
        deployment("ghost", replicas=1, gpu=0, image="registry.example/does-not-exist:1"),
    )
    reasons: set[str] = set()

    def waiting() -> bool:
        for pod in kube.pods("app=ghost"):
            reason = container_status(pod).get("state", {}).get("waiting", {}).get("reason")
            if reason:
                reasons.add(reason)
        return {"ErrImagePull", "ImagePullBackOff"} <= reasons

    await kube.wait_for(waiting, message="ErrImagePull then ImagePullBackOff")
    (pod,) = kube.pods("app=ghost")
    assert pod["status"]["phase"] == "Pending"
    assert "containerID" not in container_status(pod)


async def test_rollout_restart_replaces_the_pod(kube: KubeCluster) -> None:
    apps = client.AppsV1Api(kube.api_client())
    await in_thread(apps.create_namespaced_deployment, NS, deployment("chat", replicas=1))
    (old,) = await kube.wait_for(lambda: kube.ready_pods("app=chat"))
    (await kube.kubectl("rollout", "restart", "deployment/chat")).check()
    (new,) = await kube.wait_for(
        lambda: [p for p in kube.ready_pods("app=chat") if p["metadata"]["name"] != old["metadata"]["name"]] or None,
        message="a new Ready pod",
    )
    assert new["metadata"]["labels"]["pod-template-hash"] != old["metadata"]["labels"]["pod-template-hash"]
    assert kube.get("pods", old["metadata"]["name"]) is None  # Recreate: the old one went first (one GPU)
    (await kube.kubectl("rollout", "status", "deployment/chat", "--timeout=20s")).check()


async def test_rolling_update_starts_the_new_pod_before_stopping_the_old(kube: KubeCluster) -> None:
    apps = client.AppsV1Api(kube.api_client())
    body = deployment("web", replicas=1, gpu=0, strategy="RollingUpdate")
    body["spec"]["strategy"]["rollingUpdate"] = {"maxSurge": 1, "maxUnavailable": 0}
    await in_thread(apps.create_namespaced_deployment, NS, body)
    (old,) = await kube.wait_for(lambda: kube.ready_pods("app=web"))
    order: list[str] = []

    def record(event: StoredEvent) -> None:
        if event.key != ("", "pods"):
            return
        meta = event.obj["metadata"]
        if meta["name"] == old["metadata"]["name"] and meta.get("deletionTimestamp") and "old-terminating" not in order:
            order.append("old-terminating")
        ready = condition(event.obj, "Ready").get("status") == "True"
        if meta["name"] != old["metadata"]["name"] and ready and "new-ready" not in order:
            order.append("new-ready")

    kube.store.listeners.append(record)
    (await kube.kubectl("rollout", "restart", "deployment/web")).check()
    await kube.wait_for(
        lambda: (
            [p for p in kube.pods("app=web")]
            and all(p["metadata"]["name"] != old["metadata"]["name"] for p in kube.pods("app=web"))
        )
    )
    assert order == ["new-ready", "old-terminating"]


STUBBORN = [
    sys.executable,
    "-c",
    "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)",
]


async def start_stubborn_pod(kube: KubeCluster, grace: int) -> int:
    """A pod whose process ignores SIGTERM; returns its pid once it is known to ignore it."""
    core = client.CoreV1Api(kube.api_client())
    pod = {
        "metadata": {"name": "stubborn"},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "containers": [{"name": "c", "image": "python:3", "command": STUBBORN}],
        },
    }
    await in_thread(core.create_namespaced_pod, NS, pod)
    running = await kube.wait_for(
        lambda: (p := kube.get("pods", "stubborn")) and container_status(p).get("state", {}).get("running") and p
    )
    await kube.wait_for(lambda: "up" in kube.container_log("stubborn"), message="SIGTERM to be ignored")
    return int(container_status(running)["containerID"].removeprefix("fake://"))


async def test_graceful_deletion_sigterm_grace_then_sigkill(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    pid = await start_stubborn_pod(kube, grace=1)
    loop = asyncio.get_running_loop()
    started = loop.time()
    deleted = await in_thread(core.delete_namespaced_pod, "stubborn", NS)
    assert deleted.metadata.deletion_timestamp is not None and deleted.metadata.deletion_grace_period_seconds == 1
    terminating = kube.get("pods", "stubborn")
    assert terminating is not None and terminating["metadata"]["deletionTimestamp"]
    assert alive(pid)
    await kube.wait_for(lambda: kube.get("pods", "stubborn") is None, message="the pod to go")
    assert loop.time() - started >= 0.9  # it ignored SIGTERM: only the SIGKILL after the grace period ended it
    assert not alive(pid)
    assert any(e.type == EventType.DELETED for e in kube.store.history if e.obj["metadata"]["name"] == "stubborn")


async def test_kubectl_shows_terminating_and_force_deletes(kube: KubeCluster) -> None:
    pid = await start_stubborn_pod(kube, grace=300)
    (await kube.kubectl("delete", "pod", "stubborn", "--wait=false")).check()
    table = (await kube.kubectl("get", "pod", "stubborn")).check().stdout
    assert re.search(r"stubborn\s+1/1\s+Terminating", table)
    (await kube.kubectl("delete", "pod", "stubborn", "--grace-period=0", "--force")).check()
    assert kube.get("pods", "stubborn") is None  # removed at once, whatever the process does
    await kube.wait_for(lambda: not alive(pid), message="the process to be killed")


async def test_grace_period_zero_removes_the_pod_at_once(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    await in_thread(
        core.create_namespaced_pod,
        NS,
        {
            "metadata": {"name": "p"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "image": "python:3",
                        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
                    }
                ]
            },
        },
    )
    await kube.wait_for(lambda: (p := kube.get("pods", "p")) and container_status(p).get("state", {}).get("running"))
    await in_thread(core.delete_namespaced_pod, "p", NS, grace_period_seconds=0)
    assert kube.get("pods", "p") is None


async def test_job_runs_its_pod_to_completion(kube: KubeCluster) -> None:
    batch = client.BatchV1Api(kube.api_client())
    await in_thread(
        batch.create_namespaced_job,
        NS,
        {
            "metadata": {"name": "finetune", "labels": {"kind": "train"}},
            "spec": {
                "template": {
                    "spec": {
                        "restartPolicy": "Never",
                        "containers": [
                            {
                                "name": "train",
                                "image": "python:3",
                                "command": [sys.executable, "-c", "print('trained')"],
                            }
                        ],
                    }
                }
            },
        },
    )
    job = await kube.wait_for(
        lambda: (j := kube.get("jobs", "finetune")) and condition(j, "Complete").get("status") == "True" and j
    )
    assert job["status"]["succeeded"] == 1 and "active" not in job["status"]
    (pod,) = kube.pods("job-name=finetune")
    assert pod["status"]["phase"] == "Succeeded"
    assert kube.container_log(pod["metadata"]["name"]).strip() == "trained"
    logs = (await kube.kubectl("logs", pod["metadata"]["name"])).check()
    assert logs.stdout == "trained\n"


async def test_closing_the_cluster_kills_every_container_process(tmp_path: Path) -> None:
    async with running_cluster(tmp_path / "kube") as kube:
        apps = client.AppsV1Api(kube.api_client())
        await in_thread(apps.create_namespaced_deployment, NS, deployment("chat", replicas=1))
        (pod,) = await kube.wait_for(lambda: kube.ready_pods("app=chat"))
        pid = int(container_status(pod)["containerID"].removeprefix("fake://"))
        assert alive(pid)
    assert not alive(pid)


async def test_init_containers_env_and_variable_expansion(kube: KubeCluster) -> None:
    core = client.CoreV1Api(kube.api_client())
    await in_thread(core.create_namespaced_config_map, NS, {"metadata": {"name": "settings"}, "data": {"mode": "fast"}})
    show = "import os, sys; print(sys.argv[1], os.environ['MODE'], os.environ['POD'], os.environ['FAKE_MODEL_HOST'])"
    pod = {
        "metadata": {"name": "envy"},
        "spec": {
            "restartPolicy": "Never",
            "initContainers": [
                {"name": "prepare", "image": "python:3", "command": [sys.executable, "-c", "print('init')"]}
            ],
            "containers": [
                {
                    "name": "main",
                    "image": "python:3",
                    "command": [sys.executable, "-c", show],
                    "args": ["$(MODE)-arg"],
                    "env": [
                        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
                        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    ],
                }
            ],
        },
    }
    await in_thread(core.create_namespaced_pod, NS, pod)
    done = await kube.wait_for(
        lambda: (p := kube.get("pods", "envy")) and p["status"].get("phase") == "Succeeded" and p
    )
    assert done["status"]["initContainerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
    ip = done["status"]["podIP"]
    assert kube.container_log("envy").split() == ["fast-arg", "fast", "envy", ip]
    assert kube.container_log("envy", "prepare") == "init\n"


async def test_deleting_a_namespace_stops_and_removes_everything_in_it(kube: KubeCluster) -> None:
    core, apps = client.CoreV1Api(kube.api_client()), client.AppsV1Api(kube.api_client())
    await in_thread(core.create_namespace, {"metadata": {"name": "team"}})
    await in_thread(apps.create_namespaced_deployment, "team", deployment("chat", replicas=1))
    (pod,) = await kube.wait_for(lambda: kube.ready_pods("app=chat", namespace="team"))
    pid = int(container_status(pod)["containerID"].removeprefix("fake://"))
    await in_thread(core.delete_namespace, "team")
    await kube.wait_for(lambda: kube.get("namespaces", "team") is None, message="the namespace to go")
    assert kube.list("deployments", namespace="team") == [] and kube.pods(namespace="team") == []
    assert not alive(pid)
