"""Kubernetes mode on real NATS and Postgres against the API emulator: the actuator's ``kubernetes`` back-end
watches Models, scales their Deployments, and writes status back; requests go through the real proxy to the fake
model servers the fake kubelet runs on their own Pod IPs."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from flexinfer_testbed.kube import KubeCluster, Reason
from flexinfer_testbed.kube.builders import service
from flexinfer_testbed.kube.store import PatchType
from flexinfer_testbed.kube_models import add_model, create, gpu_group, known, model_deployment, model_resource
from flexinfer_testbed.system import System
from tests.integration.test_swap import chat
from tests.support.kube_fixtures import KubeSystem, pair_on_one_gpu
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.emulator]


def status_of(kube: KubeCluster, name: str) -> dict[str, Any]:
    obj = kube.get("Model", name)
    return (obj or {}).get("status") or {}


def condition(kube: KubeCluster, name: str, kind: str) -> str | None:
    for c in status_of(kube, name).get("conditions", []):
        if c["type"] == kind:
            return str(c["status"])
    return None


async def test_a_request_for_the_parked_model_swaps_the_deployments(kube: KubeCluster, kube_system: KubeSystem) -> None:
    async with pair_on_one_gpu(kube, kube_system, shared_demand_window=1.5) as (system, recorder):
        await known(system, "a", "b")
        # peers: nothing is loaded until the first request, for a: its Deployment is scaled up.
        status, body, _ = await chat(system, "a", "hello")
        assert status == 200 and body["choices"][0]["message"]["content"] == "[a] hello"
        await kube.wait_for(lambda: kube.ready_pods("app=a"), message="a's pod Ready")
        await kube.wait_for(lambda: condition(kube, "a", "Active") == "True", message="a Active")

        results = await asyncio.gather(*(chat(system, "b", f"req-{i}") for i in range(3)))
        for i, (status, body, headers) in enumerate(results):
            assert status == 200, body
            assert body["choices"][0]["message"]["content"] == f"[b] req-{i}"
            assert headers.get("X-FlexInfer-Cold-Start") == "true"

        # a was quiet: FlexInfer's policy parks it as idle (no preemption) for b
        await kube.wait_for(lambda: status_of(kube, "a").get("phase") == "Idle", message="a Idle")
        # b answered through the proxy once its route was Ready; its Model status is written back on its own
        # path (scheduler -> actuator -> API server), which may trail under load: wait for it, not for a sleep.
        await kube.wait_for(lambda: status_of(kube, "b").get("phase") == "Ready", message="b Ready in its status")
        a, b = status_of(kube, "a"), status_of(kube, "b")
        assert b["phase"] == "Ready" and b["sharedGroup"]["state"] == "Active"
        assert a.get("preemptedBy") is None and a["sharedGroup"]["state"] == "Parked"
        assert condition(kube, "b", "Ready") == "True" and condition(kube, "a", "Active") == "False"
        assert kube.get("deployments", "a")["spec"]["replicas"] == 0
        assert kube.get("deployments", "b")["spec"]["replicas"] == 1
    assert recorder.seen[-1] == frozenset({"b"})
    # The only writes to Deployments went through the scale subresource.
    ours = [c for c in kube.calls(resource="deployments") if c.user_agent.startswith("flexinfer-actuator")]
    writes = [c for c in ours if c.verb in ("patch", "update", "create", "delete")]
    assert writes and all(c.subresource == "scale" and c.verb == "patch" for c in writes)


async def scheduler_models(system: System) -> set[str]:
    return {m["metadata"]["name"] for m in (await system.get("scheduler", "/api/v1/models"))["items"]}


def events_for(kube: KubeCluster, name: str, reason: str | None = None) -> list[dict[str, Any]]:
    return [
        e
        for e in kube.list("events")
        if e.get("involvedObject", {}).get("name") == name
        and e.get("involvedObject", {}).get("kind") == "Model"
        and (reason is None or e.get("reason") == reason)
    ]


async def test_status_conflicts_are_retried_with_a_fresh_read(kube: KubeCluster, kube_system: KubeSystem) -> None:
    await add_model(kube, "a")
    conflicts = kube.inject_conflicts(3, resource="models", subresource="status")
    async with kube_system():
        await kube.wait_for(lambda: status_of(kube, "a").get("phase") == "Ready", message="a Ready in its status")
    assert conflicts.remaining == 0
    rereads = kube.calls(verb="get", resource="models", name="a")
    assert rereads, "a 409 must be followed by a fresh read"
    status = status_of(kube, "a")
    assert status["observedGeneration"] == kube.get("Model", "a")["metadata"]["generation"]
    assert {c["type"] for c in status["conditions"]} == {"Ready", "Active"}


async def test_spec_changes_made_while_the_api_server_was_away_are_not_lost(
    kube: KubeCluster, kube_system: KubeSystem
) -> None:
    await add_model(kube, "a")
    await add_model(kube, "b")
    async with kube_system() as system:
        await wait_for(lambda: _has(system, {"a", "b"}), what="a and b reach the scheduler")
        async with kube.unreachable():
            # Changes nobody can watch: c created, b deleted, a's priority changed; the history is compacted, so a
            # watch resuming from its last resourceVersion gets 410 Gone and must list again.
            rt = kube.resource("Model")
            kube.store.create(rt, "default", model_resource("c", priority=3))
            kube.store.delete(rt, "default", "b")
            kube.store.patch(rt, "default", "a", PatchType.MERGE, {"spec": {"gpu": {"priority": 42}}})
            kube.compact()
        await wait_for(lambda: _has(system, {"a", "c"}), what="c added and b removed after the resync")
        a = await system.get("scheduler", "/api/v1/models/default/a")
        assert a["spec"]["gpu"]["priority"] == 42
        # and a watch that simply expires resumes without a relist
        kube.expire_watches()
        await create(kube, model_deployment("d"))
        await create(kube, model_resource("d"))
        await wait_for(lambda: _has(system, {"a", "c", "d"}), what="d reaches the scheduler after the expiry")


async def _has(system: System, names: set[str]) -> bool:
    return await scheduler_models(system) == names


async def test_an_invalid_model_gets_a_message_and_an_event_and_the_others_go_on(
    kube: KubeCluster, kube_system: KubeSystem
) -> None:
    # An older CRD that does not validate the spec (as after a partial upgrade): the actuator must judge it itself.
    crd = kube.get("customresourcedefinitions.apiextensions.k8s.io", "models.ai.flexinfer")
    assert crd is not None
    version = crd["spec"]["versions"][0]
    version["schema"]["openAPIV3Schema"]["properties"]["spec"] = {
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": True,
    }
    status, body = await kube.request(
        "PUT", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/models.ai.flexinfer", crd
    )
    assert status == 200, body
    await add_model(kube, "good")
    bad = model_resource("bad")
    bad["spec"]["gpu"]["priority"] = "very high"
    await create(kube, bad)
    async with kube_system() as system:
        await kube.wait_for(lambda: status_of(kube, "good").get("phase") == "Ready", message="good is served")
        await kube.wait_for(lambda: status_of(kube, "bad").get("message"), message="bad gets a message")
        bad_status = status_of(kube, "bad")
        assert "spec.gpu.priority" in bad_status["message"]
        assert condition(kube, "bad", "Ready") == "False"
        ready = next(c for c in bad_status["conditions"] if c["type"] == "Ready")
        assert ready["reason"] == "InvalidSpec"
        await kube.wait_for(lambda: events_for(kube, "bad", "InvalidSpec"), message="an InvalidSpec event")
        (event,) = events_for(kube, "bad", "InvalidSpec")
        assert event["type"] == "Warning" and "spec.gpu.priority" in event["message"]
        assert await scheduler_models(system) == {"good"}

        # Fixed: it is handed on and served, and the message goes.
        rt = kube.resource("Model")
        kube.store.patch(rt, "default", "bad", PatchType.MERGE, {"spec": {"gpu": {"priority": 1}}})
        await wait_for(lambda: _has(system, {"good", "bad"}), what="the fixed model reaches the scheduler")
        await kube.wait_for(lambda: "spec.gpu" not in status_of(kube, "bad").get("message", ""), message="cleared")


async def test_active_services_annotation_follows_the_active_model(kube: KubeCluster, kube_system: KubeSystem) -> None:
    for name in ("a", "b"):
        await create(kube, service(name))
    await add_model(kube, "a", priority=10, serviceLabels=["chat", "assistant"])
    await add_model(kube, "b", priority=10, serviceLabels=["chat"])

    def annotation(name: str) -> str | None:
        found = kube.get("services", name) or {}
        value = found.get("metadata", {}).get("annotations", {}).get("ai.flexinfer/active-services")
        return None if value is None else str(value)

    async with kube_system(shared_demand_window=1.0) as system:
        await known(system, "a", "b")
        status, _, _ = await chat(system, "a", "warm up")  # peers: nothing is loaded until a first request
        assert status == 200
        await kube.wait_for(
            lambda: (annotation("a"), annotation("b")) == ("chat,assistant", ""), message="a's labels, b empty"
        )
        status, _, _ = await chat(system, "b", "hi")
        assert status == 200
        await kube.wait_for(lambda: (annotation("a"), annotation("b")) == ("", "chat"), message="swapped")
        # Someone removes it: it is put back.
        rt = kube.resource("services")
        kube.store.patch(
            rt, "default", "b", PatchType.MERGE, {"metadata": {"annotations": {"ai.flexinfer/active-services": None}}}
        )
        await kube.wait_for(lambda: annotation("b") == "chat", message="restored")


async def test_gpugroup_status_names_the_active_model_and_the_queue(kube: KubeCluster, kube_system: KubeSystem) -> None:
    for name in ("x", "y"):
        await create(kube, model_deployment(name, startup_delay=0.2))
        await create(kube, model_resource(name, group=None))
    await create(
        kube,
        gpu_group(
            "pair",
            models=[{"name": "x", "priority": 10}, {"name": "y", "priority": 20}],
            # y may take the GPU only after x ran 30 s: meanwhile y waits in the queue.
            policy={"hysteresisWindowSeconds": 0, "requestQueueThreshold": 1, "minimumRunDurationSeconds": 30},
        ),
    )
    async with kube_system() as system:
        group = lambda: (kube.get("GPUGroup", "pair") or {}).get("status") or {}  # noqa: E731
        await known(system, "x", "y")
        status, _, _ = await chat(system, "x", "first")
        assert status == 200
        await kube.wait_for(lambda: group().get("activeModel") == "x", message="x holds the GPU")
        waiting = asyncio.create_task(chat(system, "y", "second"))
        try:
            await kube.wait_for(lambda: group().get("queue") == ["y"], message="y queued behind x")
            assert group()["activeModel"] == "x" and group()["observedGeneration"] == 1
            members = (await system.get("scheduler", "/api/v1/groups/pair"))["models"]
            assert {(m["namespace"], m["name"]) for m in members} == {("default", "x"), ("default", "y")}
            printed = (await kube.kubectl("get", "gpugroups")).check().stdout.splitlines()
            assert printed[0].split()[:2] == ["NAME", "ACTIVE"] and printed[1].split()[:2] == ["pair", "x"]
        finally:
            waiting.cancel()


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        # ErrImagePull and ImagePullBackOff alternate, as on a node
        pytest.param({"image": "registry.example.com/does-not-exist:1"}, "ImagePull", id="image-pull"),
        pytest.param(
            {"command": [sys.executable, "-c", "import sys; print('CUDA out of memory'); sys.exit(3)"]},
            "CrashLoopBackOff: container server exited with code 3",
            id="crash-loop-with-termination-message",
        ),
        pytest.param(
            {"command": [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGILL)"]},
            "CrashLoopBackOff: container server exited with code 132 (SIGILL)",
            id="crash-loop-names-the-signal",
        ),
        pytest.param({"node_selector": {"gpu-type": "h100"}}, "Unschedulable", id="unschedulable"),
    ],
)
async def test_a_deployment_that_never_gets_ready_fails_with_the_pods_reason(
    kube: KubeCluster, options: dict[str, Any], reason: str, kube_system: KubeSystem
) -> None:
    await create(kube, model_deployment("broken", **options))
    await create(kube, model_resource("broken"))
    # (the load timeout leaves the pod time to start and crash on a busy machine: its reason is read at the timeout)
    async with kube_system(load_timeout=5) as system:
        await kube.wait_for(lambda: status_of(kube, "broken").get("phase") == "Failed", within=30, message="Failed")
        message = status_of(kube, "broken")["message"]
        assert "load timeout" in message and reason in message, message
        if "code 3" in reason:
            assert "CUDA out of memory" in message
        assert kube.get("deployments", "broken")["spec"]["replicas"] == 0
        assert not kube.pods("app=broken"), "Failed is reported only once the pods are gone"
        await kube.wait_for(lambda: events_for(kube, "broken", "RuntimeFailed"), message="a RuntimeFailed event")
        # A request for it tries the load again, and fails with the reason instead of waiting out its queue timeout.
        status, body, _ = await chat(system, "broken", "hi")
        assert status == 503 and reason.split(":")[0] in body["error"]["message"]


async def test_changes_made_by_others_are_judged_like_a_crash(kube: KubeCluster, kube_system: KubeSystem) -> None:
    async with pair_on_one_gpu(kube, kube_system, priorities=(10, 5)) as (system, _):
        await kube.wait_for(lambda: kube.ready_pods("app=a"), message="a serves")
        first = kube.ready_pods("app=a")[0]["metadata"]["name"]

        # The seed's "rollout restart deadlock": the active model's pod is replaced; FlexInfer follows it.
        (await kube.kubectl("rollout", "restart", "deployment/a")).check()
        await kube.wait_for(
            lambda: [p for p in kube.ready_pods("app=a") if p["metadata"]["name"] != first],
            within=30,
            message="a new pod of a Ready",
        )
        await kube.wait_for(lambda: status_of(kube, "a").get("phase") == "Ready", message="a Ready again")
        status, body, _ = await chat(system, "a", "after the restart")
        assert status == 200 and body["choices"][0]["message"]["content"] == "[a] after the restart"

        # Someone scales the parked b up: it is scaled back (a holds the GPU), with a Warning event.
        (await kube.kubectl("scale", "deployment/b", "--replicas=1")).check()
        await kube.wait_for(
            lambda: events_for(kube, "b", "ScaledOutsideFlexInfer"), message="the scale-back event on b"
        )
        await kube.wait_for(
            lambda: kube.get("deployments", "b")["spec"]["replicas"] == 0 and not kube.pods("app=b"),
            message="b parked again",
        )

        # Someone scales the active a to zero: like a crash, it is restarted.
        (await kube.kubectl("scale", "deployment/a", "--replicas=0")).check()
        await kube.wait_for(lambda: not kube.pods("app=a"), message="a's pods gone")
        await kube.wait_for(lambda: kube.ready_pods("app=a"), within=30, message="a restarted by FlexInfer")
        status, _, _ = await chat(system, "a", "after the scale-down")
        assert status == 200


async def test_an_actuator_killed_between_parking_and_activating_completes_the_swap(
    kube: KubeCluster, kube_system: KubeSystem
) -> None:
    async with pair_on_one_gpu(kube, kube_system, shared_demand_window=1.0) as (system, _):
        await known(system, "a", "b")
        status, _, _ = await chat(system, "a", "warm up")  # peers: nothing is loaded until a first request
        assert status == 200
        await kube.wait_for(lambda: kube.ready_pods("app=a"), message="a serves")
        # b's Deployment cannot be scaled for now: the swap stops between "a parked" and "b activated".
        blocked = kube.inject_error(
            10_000, reason=Reason.SERVICE_UNAVAILABLE, resource="deployments", name="b", subresource="scale"
        )
        waiting = asyncio.create_task(chat(system, "b", "patience"))
        await kube.wait_for(lambda: not kube.pods("app=a"), within=30, message="a parked")
        await kube.wait_for(lambda: blocked.remaining < 10_000, message="b's activation attempted")
        await system.stop_service("actuator")  # killed mid-swap
        blocked.remaining = 0
        assert not kube.pods("app=b")
        await system.start_service("actuator")
        status, body, _ = await asyncio.wait_for(waiting, timeout=60)
        assert status == 200 and body["choices"][0]["message"]["content"] == "[b] patience"
        await kube.wait_for(lambda: status_of(kube, "b").get("phase") == "Ready", message="b Ready")


def acting_agents(kube: KubeCluster, since: int = 0) -> set[str]:
    """The actuators (by user agent) that wrote anything but their Lease after request number ``since``."""
    return {
        c.user_agent
        for c in kube.emulator.requests[since:]
        if c.user_agent.startswith("flexinfer-actuator")
        and c.verb in ("create", "update", "patch", "delete")
        and c.resource != "leases"
    }


async def test_two_actuator_replicas_one_acts_and_the_other_takes_over(
    kube: KubeCluster, kube_system: KubeSystem
) -> None:
    await add_model(kube, "a", priority=10, gpu={"swapCooldown": "1s"})  # swaps back and forth at once
    await add_model(kube, "b", priority=10, gpu={"swapCooldown": "1s"})
    async with kube_system(shared_demand_window=1.0) as system:
        await known(system, "a", "b")
        status, _, _ = await chat(system, "a", "warm up")  # peers: nothing is loaded until a first request
        assert status == 200
        await kube.wait_for(lambda: kube.ready_pods("app=a"), message="a serves")
        await system.start_service("actuator-2", "actuator", instance_id="actuator-two")
        lease = lambda: (kube.get("leases", "flexinfer-actuator") or {}).get("spec", {})  # noqa: E731
        assert lease()["holderIdentity"] == "actuator-test"
        mark = len(kube.emulator.requests)
        status, _, _ = await chat(system, "b", "one")
        assert status == 200
        assert acting_agents(kube, mark) == {"flexinfer-actuator/0.1.0 (actuator-test)"}

        # The leader dies (stopped; it hands the Lease back): the standby acts.
        await system.stop_service("actuator")
        await kube.wait_for(lambda: lease().get("holderIdentity") == "actuator-two", message="the standby leads")
        mark = len(kube.emulator.requests)
        status, body, _ = await chat(system, "a", "two")
        assert status == 200 and body["choices"][0]["message"]["content"] == "[a] two"
        assert acting_agents(kube, mark) == {"flexinfer-actuator/0.1.0 (actuator-two)"}
        assert lease()["leaseTransitions"] >= 1


async def test_a_killed_leader_is_replaced_once_its_lease_lapses_and_serving_goes_on(
    kube: KubeCluster, clean_nats: str, tmp_path: Path, kube_system: KubeSystem
) -> None:
    """SIGKILL of the acting replica (a separate process: it cannot hand its Lease back). The standby takes over
    once the Lease has not moved for its duration, and adopts the running model without restarting it."""
    await add_model(kube, "a")
    async with kube_system(services=("scheduler", "proxy")) as system:
        env = {
            **os.environ,
            "FLEXINFER_NATS_URL": clean_nats,
            "FLEXINFER_ACTUATOR": "kubernetes",
            "FLEXINFER_KUBECONFIG": str(kube.kubeconfig),
            "FLEXINFER_ACTUATOR_PORT": "0",
            "FLEXINFER_BIND_HOST": "127.0.0.1",
            "FLEXINFER_INSTANCE_ID": "actuator-one",
            "FLEXINFER_LEADER_LEASE_DURATION": "3s",
            "FLEXINFER_LEADER_RENEW_DEADLINE": "2s",
            "FLEXINFER_LEADER_RETRY_PERIOD": "300ms",
        }
        log_path = tmp_path / "actuator-one.log"
        with log_path.open("wb") as log_file:
            first = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "flexinfer_actuator", env=env, stdout=log_file, stderr=log_file
            )
        try:
            lease = lambda: (kube.get("leases", "flexinfer-actuator") or {}).get("spec", {})  # noqa: E731
            await kube.wait_for(lambda: lease().get("holderIdentity") == "actuator-one", message="the first leads")
            await kube.wait_for(lambda: kube.ready_pods("app=a"), within=30, message="a serves")
            (serving,) = kube.ready_pods("app=a")
            await system.start_service("actuator", "actuator", instance_id="actuator-two")
            first.kill()
            await first.wait()
            killed_at = asyncio.get_running_loop().time()
            await kube.wait_for(lambda: lease().get("holderIdentity") == "actuator-two", within=20, message="takeover")
            took = asyncio.get_running_loop().time() - killed_at
            assert took >= 2.0, f"took over after {took:.1f}s, before the lease (3 s) could have lapsed"
            status, body, _ = await chat(system, "a", "still here")
            assert status == 200 and body["choices"][0]["message"]["content"] == "[a] still here"
            (still,) = kube.ready_pods("app=a")
            assert still["metadata"]["uid"] == serving["metadata"]["uid"], "the takeover restarted the model"
        finally:
            if first.returncode is None:
                first.kill()
                await first.wait()


async def test_the_seeds_kubectl_columns_move_as_requests_arrive(kube: KubeCluster, kube_system: KubeSystem) -> None:
    """The seed's Operations Guide, against the manifests a user applies: examples/kubernetes/homelab.yaml, under the
    seed's policy (``FLEXINFER_SCHEDULING_POLICY=seed``), whose walk-through it is: a lower priority waits for the
    fallback leader's idle timeout. (FlexInfer's default lets a fallback nobody asked for yield at once: the table
    row ``a-fallback-nobody-ever-asked-for-yields-at-once-though-just-loaded``.)"""
    (await kube.kubectl("apply", "-f", "examples/kubernetes/homelab.yaml")).check()
    columns = (
        "custom-columns=NAME:.metadata.name,SHARED:.spec.gpu.shared,PRIORITY:.spec.gpu.priority,"
        "PHASE:.status.phase,STATE:.status.sharedGroup.state,QUEUE:.status.sharedGroup.queuePosition,"
        "LAST_ACTIVE:.status.lastActiveTime"
    )

    async def table() -> dict[str, list[str]]:
        printed = (await kube.kubectl("get", "models", "-o", columns)).check().stdout.splitlines()
        assert printed[0].split() == ["NAME", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "LAST_ACTIVE"]
        return {line.split()[0]: line.split()[1:] for line in printed[1:]}

    before = await table()
    assert before == {
        "chat-large": ["homelab-gpu", "100", "<none>", "<none>", "<none>", "<none>"],
        "chat-small": ["homelab-gpu", "50", "<none>", "<none>", "<none>", "<none>"],
    }
    async with kube_system(shared_demand_window=2.0, scheduling_policy="seed") as system:
        await known(system, "chat-small", "chat-large")
        # Nobody asked yet: the highest priority is loaded as the fallback leader.
        (await kube.kubectl("wait", "--for=condition=Active", "model/chat-large", "--timeout=30s")).check()
        (await kube.kubectl("wait", "--for=condition=Ready", "model/chat-large", "--timeout=30s")).check()
        rows = await table()
        assert rows["chat-large"][2:4] == ["Ready", "Active"] and rows["chat-large"][5] == "<none>"
        assert rows["chat-small"][3] == "Parked"

        # chat-small (50) cannot preempt chat-large (100): its request waits, QUEUE 1, LAST_ACTIVE set.
        waiting = asyncio.create_task(chat(system, "chat-small", "hi"))
        await kube.wait_for(
            lambda: status_of(kube, "chat-small").get("sharedGroup", {}).get("queuePosition") == 1,
            message="chat-small queued",
        )
        rows = await table()
        assert rows["chat-small"][3:5] == ["Queued", "1"] and rows["chat-small"][5] != "<none>"
        # chat-large would be parked after its 30 s idleTimeout; an operator skips the wait with forcePromotion.
        promote = '{"spec": {"gpu": {"forcePromotion": true}}}'
        (await kube.kubectl("patch", "model/chat-small", "--type=merge", "-p", promote)).check()
        status, body, _ = await asyncio.wait_for(waiting, timeout=60)
        assert status == 200 and body["choices"][0]["message"]["content"] == "[chat-small] hi"
        (await kube.kubectl("wait", "--for=condition=Active", "model/chat-small", "--timeout=30s")).check()
        rows = await table()
        assert rows["chat-small"][2:4] == ["Ready", "Active"]
        assert rows["chat-large"][2:4] == ["Preempted", "Parked"]
        described = (await kube.kubectl("describe", "model", "chat-small")).check().stdout
        assert "SwapStarted" in described and "Activated" in described
        described = (await kube.kubectl("describe", "model", "chat-large")).check().stdout
        assert "Preempted" in described


async def test_a_gpugroup_without_models_sets_its_v1alpha2_groups_scheduling(
    kube: KubeCluster, kube_system: KubeSystem
) -> None:
    await create(kube, model_deployment("a", startup_delay=0.2))
    await create(kube, model_resource("a", priority=10))
    await create(kube, gpu_group("gpu", scheduling="seed"))
    async with kube_system() as system:
        await known(system, "a")

        async def scheduling() -> str | None:
            answer: str | None = (await system.get("scheduler", "/api/v1/groups/gpu"))["scheduling"]
            return answer

        await wait_for(lambda: _is(scheduling, "seed"))
        kube.store.patch(
            kube.resource("GPUGroup"), "default", "gpu", PatchType.MERGE, {"spec": {"scheduling": "flexinfer"}}
        )
        await wait_for(lambda: _is(scheduling, "flexinfer"))
        # the API server refuses what the CRD does not allow, naming the field
        status, body = await kube.request(
            "POST",
            "/apis/ai.flexinfer/v1alpha1/namespaces/default/gpugroups",
            gpu_group("other", scheduling="fastest"),
        )
        assert status == 422 and "spec.scheduling" in str(body), (status, body)


async def _is(read: Any, expected: str) -> bool:
    return bool(await read() == expected)
