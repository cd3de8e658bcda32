"""The lease manager in Kubernetes mode, against the API emulator (flexinfer_testbed.kube): the seed's finetune flow
(ModelCache ``spec.finetune.gpuLease``), suspended-Job admission, owner-reference garbage collection, the legacy
ConfigMap, a GPULease written with kubectl, the mirror of a lease taken through the API, and its RBAC against the
calls it made.

Serving runs on the local actuator (fake model processes): what a lease parks is the scheduler's business, whichever
back-end runs the models; the lease manager's Kubernetes side is what is under test here."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml

from flexinfer_common.bus import Bus
from flexinfer_testbed.kube import KubeCluster
from flexinfer_testbed.kube.builders import controller_reference
from flexinfer_testbed.kube.store import StoredEvent
from flexinfer_testbed.system import KUBERNETES_TIMINGS, System, fake_model
from tests.integration.test_leases import Recorder, all_parked_by, chat, phase_is, small_and_tuned_side_by_side
from tests.integration.test_scheduler_policies import running
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for
from tests.unit.test_charts import chart_dir, render

pytestmark = [pytest.mark.integration, pytest.mark.emulator]

SERVICES = ("scheduler", "actuator", "lease-manager")
ADMITTED = "ai.flexinfer/admitted-by-gpu-lease"


def lease_manager_settings(kube: KubeCluster) -> dict[str, Any]:
    return {"actuator": "kubernetes", "kubeconfig": str(kube.kubeconfig), "leader_election": True, **KUBERNETES_TIMINGS}


@dataclass
class Watcher(Recorder):
    """The Recorder, and when each Job was started (unsuspended)."""

    started_at: dict[str, datetime] = field(default_factory=dict)

    async def watch(self, bus: Bus, kube: KubeCluster) -> None:
        await self.start(bus)

        def on_write(event: StoredEvent) -> None:
            obj = event.obj
            if obj.get("kind") == "Job" and obj.get("spec", {}).get("suspend") is False:
                self.started_at.setdefault(obj["metadata"]["name"], datetime.now(UTC))

        kube.store.listeners.append(on_write)

    @classmethod
    async def watching(cls, bus: Bus, kube: KubeCluster) -> Watcher:
        """A watcher already recording ``bus`` and ``kube``."""
        watcher = cls()
        await watcher.watch(bus, kube)
        return watcher


@contextlib.asynccontextmanager
async def lease_system(kube: KubeCluster, start_system: SystemStarter) -> AsyncIterator[System]:
    """The scheduler, the local actuator and the lease manager in Kubernetes mode against the emulator."""
    async with start_system(services=SERVICES, lease_manager=lease_manager_settings(kube)) as system:
        yield system


def job(
    name: str, *, seconds: float, suspend: bool = True, labels: dict[str, str] | None = None, owner: Any = None
) -> dict[str, Any]:
    """A Job whose one container is this Python sleeping ``seconds`` (the fake node runs it as a process)."""
    metadata: dict[str, Any] = {"name": name, "namespace": "default"}
    if labels:
        metadata["labels"] = labels
    if owner is not None:
        metadata["ownerReferences"] = [controller_reference(owner)]
    container = {
        "name": "train",
        "image": "trainer:test",
        "command": [sys.executable, "-c", f"import time; time.sleep({seconds})"],
    }
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "suspend": suspend,
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }


async def apply(kube: KubeCluster, *documents: dict[str, Any]) -> None:
    (await kube.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents))).check()


async def create(kube: KubeCluster, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, created = await kube.request("POST", path, body)
    assert status == 201, created
    return created


def gpulease(kube: KubeCluster, name: str, namespace: str = "default") -> dict[str, Any] | None:
    return kube.get("gpuleases", name, namespace)


def job_done(kube: KubeCluster, name: str) -> bool:
    obj = kube.get("jobs", name)
    return obj is not None and any(
        c.get("type") == "Complete" and c.get("status") == "True" for c in obj.get("status", {}).get("conditions", [])
    )


def events_for(kube: KubeCluster, kind: str, name: str) -> list[dict[str, Any]]:
    return [
        e
        for e in kube.list("events")
        if e["involvedObject"].get("kind") == kind and e["involvedObject"].get("name") == name
    ]


async def serving(system: System) -> bool:
    return await phase_is(system, "a", "Ready")


async def test_a_finetune_job_of_a_modelcache_starts_only_once_the_group_is_parked_and_its_end_restores_serving(
    kube: KubeCluster, bus: Bus, start_system: SystemStarter
) -> None:
    watcher = await Watcher.watching(bus, kube)
    async with lease_system(kube, start_system) as system:
        await system.put_model(fake_model("a", priority=10))
        await system.put_model(fake_model("b", priority=5))
        await wait_for(lambda: serving(system))

        await apply(
            kube,
            {
                "apiVersion": "ai.flexinfer/v1alpha1",
                "kind": "ModelCache",
                "metadata": {"name": "qwen3-1p7b-lora", "namespace": "default"},
                "spec": {
                    "source": "HF://Qwen/Qwen3-1.7B",
                    "nodeSelector": {"kubernetes.io/hostname": "emulated-node"},
                    "finetune": {"timeoutSeconds": 600, "gpuLease": {"group": "gpu"}},
                },
            },
        )
        cache = kube.get("modelcaches", "qwen3-1p7b-lora")
        assert cache is not None
        # The caching controller's part: the finetune Job, owned by the ModelCache, created suspended.
        await create(
            kube, "/apis/batch/v1/namespaces/default/jobs", job("qwen3-1p7b-lora-finetune", seconds=2.5, owner=cache)
        )

        lease = await kube.wait_for(lambda: gpulease(kube, "qwen3-1p7b-lora-gpu-lease"), message="the GPULease")
        assert lease["spec"] == {
            "group": "gpu",
            "owner": "qwen3-1p7b-lora",
            "node": "emulated-node",
            "ttlSeconds": 1200,
        }
        (reference,) = lease["metadata"]["ownerReferences"]
        assert (reference["kind"], reference["name"], reference["uid"]) == (
            "ModelCache",
            "qwen3-1p7b-lora",
            cache["metadata"]["uid"],
        )

        # The Job starts only once the group is actually parked.
        await kube.wait_for(
            lambda: "qwen3-1p7b-lora-finetune" in watcher.started_at, within=30, message="the Job to start"
        )
        assert watcher.started_at["qwen3-1p7b-lora-finetune"] >= await watcher.parked("a")
        assert await all_parked_by(system, "qwen3-1p7b-lora")
        started = kube.get("jobs", "qwen3-1p7b-lora-finetune")
        assert started is not None and started["metadata"]["annotations"][ADMITTED] == "qwen3-1p7b-lora-gpu-lease"
        status = kube.get("gpuleases", "qwen3-1p7b-lora-gpu-lease")["status"]  # type: ignore[index]
        assert status["phase"] == "Held" and status["acquiredAt"] and status["renewTime"]
        assert status["expiresAt"] > status["acquiredAt"]

        table = (await kube.kubectl("get", "gpuleases")).check().stdout.splitlines()
        assert table[0].split() == ["NAME", "GROUP", "OWNER", "NODE", "EXPIRES"]
        row = table[1].split()
        assert row[:4] == ["qwen3-1p7b-lora-gpu-lease", "gpu", "qwen3-1p7b-lora", "emulated-node"]
        assert row[4] >= status["expiresAt"]  # RFC 3339 at one precision: later or equal (renewed meanwhile)

        # While the Job runs its lease is renewed every refresh; when it completes the lease goes and serving returns.
        await kube.wait_for(lambda: job_done(kube, "qwen3-1p7b-lora-finetune"), within=30, message="the Job to finish")
        await kube.wait_for(lambda: gpulease(kube, "qwen3-1p7b-lora-gpu-lease") is None, message="the lease's end")
        await wait_for(lambda: serving(system))
        await watcher.last_kind("qwen3-1p7b-lora-gpu-lease", "lease.released")
        kinds = watcher.kinds("qwen3-1p7b-lora-gpu-lease")
        # renewals may come while it parks too: the Job wants the lease from the moment it exists
        assert [k for k in kinds if k != "lease.renewed"] == ["lease.acquired", "lease.held", "lease.released"]
        assert "lease.renewed" in kinds[kinds.index("lease.held") :]

        def reasons(kind: str, name: str) -> set[str]:
            return {e["reason"] for e in events_for(kube, kind, name)}

        await kube.wait_for(
            lambda: (
                {"WaitingForGPULease", "GPULeaseHeld"} <= reasons("Job", "qwen3-1p7b-lora-finetune")
                and "GPULeaseAcquired" in reasons("ModelCache", "qwen3-1p7b-lora")
            ),
            message="Events on the Job and the ModelCache",
        )


async def test_jobs_legacy_configmaps_and_gpuleases_are_leases_their_deletion_releases_and_rbac_matches_the_calls(
    kube: KubeCluster, bus: Bus, start_system: SystemStarter
) -> None:
    watcher = await Watcher.watching(bus, kube)
    async with lease_system(kube, start_system) as system:
        await system.put_model(fake_model("a"))
        await wait_for(lambda: serving(system))

        # Any Job labelled with a group and created suspended is admitted once the group is parked; deleting it
        # garbage-collects its GPULease (owner reference), which releases the lease.
        await create(
            kube,
            "/apis/batch/v1/namespaces/default/jobs",
            job("train", seconds=120, labels={"ai.flexinfer/gpu-lease-group": "gpu"}),
        )
        await kube.wait_for(lambda: "train" in watcher.started_at, within=30, message="the Job to start")
        assert watcher.started_at["train"] >= await watcher.parked("a")
        owners = kube.get("gpuleases", "train-gpu-lease")["metadata"]["ownerReferences"]  # type: ignore[index]
        assert [(o["kind"], o["name"]) for o in owners] == [("Job", "train")]
        (await kube.kubectl("delete", "job", "train", "--wait=false")).check()
        await kube.wait_for(lambda: gpulease(kube, "train-gpu-lease") is None, message="the GPULease's collection")
        await wait_for(lambda: serving(system))
        await watcher.last_kind("train-gpu-lease", "lease.released")

        # Deleting the ModelCache garbage-collects its lease too (and its Job).
        await apply(
            kube,
            {
                "apiVersion": "ai.flexinfer/v1alpha1",
                "kind": "ModelCache",
                "metadata": {"name": "lora", "namespace": "default"},
                "spec": {"finetune": {"gpuLease": {"group": "gpu", "ttlSeconds": 300}}},
            },
        )
        cache = kube.get("modelcaches", "lora")
        await create(kube, "/apis/batch/v1/namespaces/default/jobs", job("lora-finetune", seconds=120, owner=cache))
        await kube.wait_for(lambda: "lora-finetune" in watcher.started_at, within=30, message="the finetune to start")
        assert kube.get("gpuleases", "lora-gpu-lease")["spec"]["ttlSeconds"] == 300  # type: ignore[index]
        (await kube.kubectl("delete", "modelcache", "lora", "--wait=false")).check()
        await kube.wait_for(lambda: gpulease(kube, "lora-gpu-lease") is None, message="the GPULease's collection")
        await wait_for(lambda: serving(system))

        # A legacy ConfigMap gpu-lease-<group> labelled ai.flexinfer/gpu-lease=<group> is a lease while it exists
        # (twice: a lease taken again counts its Event again).
        legacy = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "gpu-lease-gpu", "namespace": "default", "labels": {"ai.flexinfer/gpu-lease": "gpu"}},
            "data": {"owner": "legacy-trainer"},
        }
        for _ in range(2):
            await create(kube, "/api/v1/namespaces/default/configmaps", legacy)
            await wait_for(lambda: all_parked_by(system, "legacy-trainer"), within=30)
            assert await running(system) == []
            (await kube.kubectl("delete", "configmap", "gpu-lease-gpu")).check()
            await kube.wait_for(lambda: gpulease(kube, "gpu-lease-gpu") is None, message="the legacy lease's end")
            await wait_for(lambda: serving(system))
        await kube.wait_for(
            lambda: (
                [
                    e["count"]
                    for e in events_for(kube, "ConfigMap", "gpu-lease-gpu")
                    if e["reason"] == "GPULeaseAcquired"
                ]
                == [2]
            ),
            message="one GPULeaseAcquired Event on the ConfigMap, counted twice",
        )

        # A GPULease written with kubectl is a lease; a second one for the same group waits (Pending) and is
        # acquired once the first is deleted.
        def manifest(name: str, owner: str) -> dict[str, Any]:
            return {
                "apiVersion": "ai.flexinfer/v1alpha1",
                "kind": "GPULease",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"group": "gpu", "owner": owner, "node": "emulated-node", "ttlSeconds": 600},
            }

        await apply(kube, manifest("first", "alice"))
        await wait_for(lambda: all_parked_by(system, "alice"), within=30)
        await apply(kube, manifest("second", "bob"))
        pending = await kube.wait_for(
            lambda: (
                (kube.get("gpuleases", "second") or {}).get("status", {}).get("phase") == "Pending"
                and kube.get("gpuleases", "second")
            ),
            message="the second GPULease to wait",
        )
        assert "waiting: group gpu is leased by first (owner alice" in pending["status"]["message"]
        held = await kube.wait_for(
            lambda: (
                (kube.get("gpuleases", "first") or {}).get("status", {}).get("phase") == "Held"
                and kube.get("gpuleases", "first")
            ),
            message="the first GPULease to be held",
        )
        table = (await kube.kubectl("get", "gpuleases", "-o", "wide")).check().stdout.splitlines()
        assert table[0].split() == ["NAME", "GROUP", "OWNER", "NODE", "EXPIRES", "PHASE", "MEMORY", "DEVICE"]
        assert table[1].split() == ["first", "gpu", "alice", "emulated-node", held["status"]["expiresAt"], "Held"]
        assert table[2].split() == ["second", "gpu", "bob", "emulated-node", "Pending"]
        (await kube.kubectl("delete", "gpulease", "first")).check()
        await wait_for(lambda: all_parked_by(system, "bob"), within=30)
        (await kube.kubectl("delete", "gpulease", "second")).check()
        await wait_for(lambda: serving(system))

        # A lease taken through the API gets a GPULease mirror; kubectl sees it, and deleting it releases the lease.
        status, lease = await system.call(
            "POST", "lease-manager", "/api/v1/leases?wait=30s", {"group": "gpu", "owner": "carol", "ttlSeconds": 600}
        )
        assert status == 201 and lease["phase"] == "Held", lease
        mirror = await kube.wait_for(
            lambda: (
                (kube.get("gpuleases", "carol-gpu-lease") or {}).get("status", {}).get("phase") == "Held"
                and kube.get("gpuleases", "carol-gpu-lease")
            ),
            message="the mirror GPULease",
        )
        assert mirror["spec"] == {"group": "gpu", "owner": "carol", "ttlSeconds": 600}
        status, _ = await system.call(
            "POST", "lease-manager", "/api/v1/leases/carol-gpu-lease/renew", {"owner": "carol", "ttlSeconds": 900}
        )
        assert status == 200
        await kube.wait_for(
            lambda: (kube.get("gpuleases", "carol-gpu-lease") or {}).get("spec", {}).get("ttlSeconds") == 900,
            message="the mirror's new TTL",
        )
        (await kube.kubectl("delete", "gpulease", "carol-gpu-lease")).check()
        await wait_for(lambda: serving(system))
        status, _ = await system.call("GET", "lease-manager", "/api/v1/leases/carol-gpu-lease")
        assert status == 404
        # ... and releasing it through the API deletes its mirror.
        status, _ = await system.call("POST", "lease-manager", "/api/v1/leases", {"group": "gpu", "owner": "dave"})
        assert status == 201
        await kube.wait_for(lambda: gpulease(kube, "dave-gpu-lease"), message="the mirror GPULease")
        status, _ = await system.call("DELETE", "lease-manager", "/api/v1/leases/dave-gpu-lease")
        assert status == 200
        await kube.wait_for(lambda: gpulease(kube, "dave-gpu-lease") is None, message="the mirror's deletion")

    # The lease manager's calls (its user agent), against the chart's rules: exactly equal.
    made = {
        (call.api_group, call.resource_path, call.verb)
        for call in kube.calls()
        if call.user_agent.startswith("flexinfer-lease-manager/") and call.resource
    }
    granted = set()
    for document in render(chart_dir("lease-manager")):
        if document["kind"] in ("ClusterRole", "Role"):
            for rule in document["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        granted |= {(group, resource, verb) for verb in rule["verbs"]}
    assert made == granted, f"called without a rule: {made - granted}; granted but never called: {granted - made}"


async def test_a_gpulease_with_memory_written_with_kubectl_parks_only_what_must_go_and_one_too_large_waits(
    kube: KubeCluster, start_system: SystemStarter
) -> None:
    """A group with a capacity (one 24Gi device) holds two models; a GPULease written with kubectl with
    ``memory: 8Gi`` parks only the cheaper one, shows the device in ``kubectl get gpuleases -o wide``, and one asking
    more than a device holds is never acquired (Pending, an InvalidSpec Event), as the REST API refuses it."""
    async with start_system(services=(*SERVICES, "proxy"), lease_manager=lease_manager_settings(kube)) as system:
        await small_and_tuned_side_by_side(system)

        def manifest(name: str, memory: str) -> dict[str, Any]:
            return {
                "apiVersion": "ai.flexinfer/v1alpha1",
                "kind": "GPULease",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"group": "gpu", "owner": "trainer", "node": "emulated-node", "memory": memory},
            }

        await apply(kube, manifest("big", "30Gi"))
        big = await kube.wait_for(
            lambda: (gpulease(kube, "big") or {}).get("status", {}).get("phase") == "Pending" and gpulease(kube, "big"),
            message="the oversized GPULease to wait",
        )
        assert (
            "spec.memory" in big["status"]["message"]
            and "more than one device of group gpu" in big["status"]["message"]
        )
        await kube.wait_for(
            lambda: [e["reason"] for e in events_for(kube, "GPULease", "big")] == ["InvalidSpec"],
            message="an InvalidSpec Event on the oversized GPULease",
        )
        assert await running(system) == ["small", "tuned"], "nothing parked for a lease that cannot be reserved"
        (await kube.kubectl("delete", "gpulease", "big")).check()

        await apply(kube, manifest("fit", "8Gi"))
        held = await kube.wait_for(
            lambda: (gpulease(kube, "fit") or {}).get("status", {}).get("phase") == "Held" and gpulease(kube, "fit"),
            within=30,
            message="the GPULease with memory to be held",
        )
        assert held["status"]["device"] == 0
        assert await running(system) == ["tuned"], "only the cheaper model (the lower priority) went"
        code, _ = await chat(system.url("proxy"), "tuned")
        assert code == 200, "the other keeps serving while the lease holds"
        table = (await kube.kubectl("get", "gpuleases", "-o", "wide")).check().stdout.splitlines()
        assert table[0].split() == ["NAME", "GROUP", "OWNER", "NODE", "EXPIRES", "PHASE", "MEMORY", "DEVICE"]
        assert table[1].split() == [
            "fit",
            "gpu",
            "trainer",
            "emulated-node",
            held["status"]["expiresAt"],
            "Held",
            "8Gi",
            "0",
        ]

        (await kube.kubectl("delete", "gpulease", "fit")).check()
        code, _ = await chat(system.url("proxy"), "small")
        assert code == 200, "released: the parked model loads again"
        assert await running(system) == ["small", "tuned"]
