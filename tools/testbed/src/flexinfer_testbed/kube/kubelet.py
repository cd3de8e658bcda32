"""A fake node for the emulator: deployment and job controllers, a scheduler and a kubelet, in-process.

Driven by the `Store` (level-triggered: every write marks the world dirty and one reconcile pass runs), they do
what a one-node cluster does, fast:

- **Deployment controller**: keeps `spec.replicas` Pods per Deployment (labels of the template plus
  `pod-template-hash`, owned by the Deployment directly: no ReplicaSet objects), Recreate and RollingUpdate
  (maxSurge/maxUnavailable honoured, a zero pair treated as maxSurge 1), and a true Deployment status.
- **Job controller**: one Pod at a time until `completions` succeed or `backoffLimit` failures; Complete/Failed.
- **Scheduler**: one node with GPU capacity; a Pod whose nodeSelector does not match or whose request of an
  extended resource (`nvidia.com/gpu`, the `nvidia.com/gpu.shared` replicas of a time-sliced or MPS card, any
  `<domain>/<name>`) does not fit stays Pending, PodScheduled=False/Unschedulable, with the real scheduler's
  message. A GPU is held until the Pod object is gone (Terminating Pods still hold it), as on a real node.
- **Kubelet**: each scheduled Pod gets its own loopback IP; a container whose executable is on the allow-list
  runs as a local process (env + `FAKE_MODEL_HOST`/`FAKE_MODEL_PORT`), others "run" without a process; readiness
  from the readinessProbe (httpGet/tcpSocket) every `probe_interval`; crash -> back-off -> `CrashLoopBackOff`
  with the FallbackToLogsOnError message; an image containing `pull_failure_marker` -> `ErrImagePull` /
  `ImagePullBackOff`; deletion -> SIGTERM, grace period, SIGKILL, then the Pod object is removed.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import copy
import hashlib
import itertools
import json
import logging
import os
import random
import shutil
import signal
import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from flexinfer_cli.embedded import _make_preexec
from flexinfer_testbed.kube.builders import controller_reference
from flexinfer_testbed.kube.errors import ApiError
from flexinfer_testbed.kube.resources import ResourceType
from flexinfer_testbed.kube.store import Obj, Store, StoredEvent, format_time, parse_time

log = logging.getLogger("flexinfer.tests.kube.kubelet")

TERMINATION_MESSAGE_LINES = 80
TERMINATION_MESSAGE_BYTES = 2048
WATCHED = {("apps", "deployments"), ("", "pods"), ("batch", "jobs"), ("", "nodes")}
#: Every process any fake kubelet started, killed at interpreter exit if a test forgot to close its cluster.
_LIVE_PROCESSES: set[asyncio.subprocess.Process] = set()


def _kill_leftovers() -> None:
    for proc in list(_LIVE_PROCESSES):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)


atexit.register(_kill_leftovers)


_CLUSTERS = itertools.count(random.randint(0, 255))  # one block of Pod addresses per cluster started here


@dataclass
class NodeConfig:
    name: str = "emulated-node"
    labels: dict[str, str] = field(default_factory=dict)
    #: Extended resources the node offers (`nvidia.com/gpu`: 1 by default, `amd.com/gpu`: 0; a card shared by
    #: time-slicing or MPS: `{"nvidia.com/gpu.shared": 4}`). One not listed is offered 0 times.
    capacity: dict[str, int] = field(default_factory=lambda: {"nvidia.com/gpu": 1, "amd.com/gpu": 0})

    def all_labels(self) -> dict[str, str]:
        return {
            "kubernetes.io/hostname": self.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            **self.labels,
        }


@dataclass
class KubeletConfig:
    node: NodeConfig = field(default_factory=NodeConfig)
    #: Executables a container may run: bare names are looked up on PATH (this Python's bin folder first);
    #: absolute paths must match exactly. Anything else runs no process.
    allowed_executables: tuple[str, ...] = ("flexinfer-fake-model", sys.executable)
    #: How often readiness probes run (the real kubelet's minimum periodSeconds is 1 s).
    probe_interval: float = 0.05
    #: First crash-loop back-off; doubles per restart up to `max_backoff` (real kubelet: 10 s doubling to 5 min).
    backoff: float = 0.2
    max_backoff: float = 2.0
    #: An image whose name contains this never pulls (ErrImagePull, then ImagePullBackOff).
    pull_failure_marker: str = "does-not-exist"
    #: Where container output goes (one file per container run); None: a temporary folder.
    log_dir: Path | None = None


def template_hash(template: Obj) -> str:
    digest = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()
    return digest[:10]


def _resolve_int_or_percent(value: Any, total: int, *, round_up: bool) -> int:
    if isinstance(value, int):
        return value
    text = str(value or "0")
    if text.endswith("%"):
        exact = int(text[:-1]) * total / 100
        return int(-(-exact // 1)) if round_up else int(exact)
    return int(text)


def _is_extended(name: str) -> bool:
    """An extended resource, as the API server defines it: a domain-qualified name outside ``kubernetes.io``
    (``nvidia.com/gpu``, ``nvidia.com/gpu.shared``, ``amd.com/gpu``); cpu, memory and the like are not counted
    here."""
    domain, slash, _ = name.partition("/")
    return bool(slash) and not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def _extended_requests(pod: Obj) -> dict[str, int]:
    """What a Pod asks of the node's extended resources (limits, else requests: for these the two are equal)."""
    wanted: dict[str, int] = {}
    for container in (pod.get("spec") or {}).get("containers") or []:
        resources = container.get("resources") or {}
        asked = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
        for name, amount in asked.items():
            if _is_extended(name):
                wanted[name] = wanted.get(name, 0) + int(amount)
    return wanted


def _condition(
    conditions: list[Obj], type_: str, status: str, now: str, reason: str = "", message: str = ""
) -> list[Obj]:
    """Set one condition, keeping lastTransitionTime when its status does not change."""
    result = [c for c in conditions if c.get("type") != type_]
    old = next((c for c in conditions if c.get("type") == type_), None)
    entry: Obj = {
        "type": type_,
        "status": status,
        "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else now,
    }
    if old and "lastProbeTime" in old:
        entry["lastProbeTime"] = None
    if reason:
        entry["reason"] = reason
    if message:
        entry["message"] = message
    result.append(entry)
    order = ["PodReadyToStartContainers", "Initialized", "Ready", "ContainersReady", "PodScheduled"]
    result.sort(key=lambda c: order.index(c["type"]) if c["type"] in order else len(order))
    return result


@dataclass
class ContainerRun:
    """What the kubelet knows about one container of one Pod."""

    name: str
    spec: Obj
    init: bool = False
    process: asyncio.subprocess.Process | None = None
    output: deque[str] = field(default_factory=lambda: deque(maxlen=TERMINATION_MESSAGE_LINES))
    log_path: Path | None = None
    restarts: int = 0
    ready: bool = False
    started_at: str | None = None
    state: Obj = field(default_factory=lambda: {"waiting": {"reason": "ContainerCreating"}})
    last_state: Obj = field(default_factory=dict)
    probe_failures: int = 0
    image_id: str = ""


class FakeKubelet:
    """Controllers, scheduler and kubelet of a one-node cluster; `start()` in the loop, `close()` at the end."""

    def __init__(self, store: Store, config: KubeletConfig | None = None) -> None:
        self.store = store
        self.config = config or KubeletConfig()
        self.node = self.config.node
        self._dirty = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._workers: dict[str, asyncio.Task[None]] = {}  # pod uid -> worker
        self._runs: dict[str, list[ContainerRun]] = {}  # pod uid -> containers
        self._ips: dict[str, str] = {}  # pod uid -> IP
        self._wakeups: dict[str, asyncio.Event] = {}  # pod uid -> "your pod changed"
        # 127.<this process>.<this cluster>.N: no two clusters of one test session share an address, and concurrent
        # sessions on one machine differ in the second octet (the process id) unless their ids clash mod 234.
        self._ip_base = (16 + os.getpid() % 234, next(_CLUSTERS) % 256)
        self._next_ip = 2
        #: Exceptions raised inside the controllers or workers (a fixture fails the test if any).
        self.errors: list[BaseException] = []
        self._session: aiohttp.ClientSession | None = None
        self._log_dir = self.config.log_dir
        self._tmp: Any = None
        self._scheduling_messages: dict[str, str] = {}
        self._closing = False

    # --------------------------------------------------------------------------------------- lifecycle

    async def start(self) -> None:
        if self._log_dir is None:
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix="flexinfer-kubelet-")
            self._log_dir = Path(self._tmp.name)
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1.0))
        nodes = self.store.type("", "v1", "nodes")
        if self.store.find(nodes, None, self.node.name) is None:
            self.store.create(nodes, None, self._node_object())
        self.store.listeners.append(self._on_event)
        self._task = asyncio.create_task(self._loop(), name="fake-kubelet")
        self._dirty.set()

    async def close(self) -> None:
        self._closing = True
        with contextlib.suppress(ValueError):
            self.store.listeners.remove(self._on_event)
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for task in list(self._workers.values()):
            task.cancel()
        for task in list(self._workers.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for runs in self._runs.values():
            for run in runs:
                await self._kill(run, grace=0)
        if self._session is not None:
            await self._session.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def _node_object(self) -> Obj:
        capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", **{k: str(v) for k, v in self.node.capacity.items()}}
        now = format_time(self.store.now())
        return {
            "metadata": {"name": self.node.name, "labels": self.node.all_labels()},
            "spec": {},
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "addresses": [
                    {"type": "InternalIP", "address": "127.0.0.1"},
                    {"type": "Hostname", "address": self.node.name},
                ],
                "conditions": [
                    {
                        "type": "Ready",
                        "status": "True",
                        "reason": "KubeletReady",
                        "message": "kubelet is posting ready status",
                        "lastHeartbeatTime": now,
                        "lastTransitionTime": now,
                    }
                ],
                "nodeInfo": {"kubeletVersion": "v1.37.0-fake", "operatingSystem": "linux", "architecture": "amd64"},
            },
        }

    def _on_event(self, event: StoredEvent) -> None:
        if event.key in WATCHED:
            self._dirty.set()
            if event.key == ("", "pods"):
                wake = self._wakeups.get(event.obj["metadata"].get("uid", ""))
                if wake is not None:
                    wake.set()

    async def _loop(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                self.reconcile()
            except Exception as error:  # keep the node alive; the fixture reports it
                log.exception("fake kubelet reconcile failed")
                self.errors.append(error)
            await asyncio.sleep(0)

    def wake(self) -> None:
        """Run a reconcile pass soon (for tests that changed something the store does not see)."""
        self._dirty.set()

    # --------------------------------------------------------------------------------------- one pass

    def _t(self, group: str, version: str, plural: str) -> ResourceType:
        return self.store.type(group, version, plural)

    def reconcile(self) -> None:
        """One pass of every controller. An API refusal (say, creating in a terminating namespace) is what a
        real controller logs and retries on its next pass; anything else is a bug and lands in `errors`."""
        for deployment in list(self.store.iter(("apps", "deployments"))):
            self._refusable(self._sync_deployment, deployment)
        for job in list(self.store.iter(("batch", "jobs"))):
            self._refusable(self._sync_job, job)
        self._refusable(self._schedule)
        self._sync_pods()

    @staticmethod
    def _refusable(step: Callable[..., None], *args: Any) -> None:
        try:
            step(*args)
        except ApiError as refused:
            log.info("fake node: the API refused a write (%s); retrying on the next pass", refused.message)

    def record_event(self, obj: Obj, type_: str, reason: str, message: str, component: str) -> None:
        """An Event about `obj` (what `kubectl describe` lists); repeated ones bump `count`."""
        with contextlib.suppress(ApiError):  # e.g. the namespace is terminating: the event is dropped
            self._record_event(obj, type_, reason, message, component)

    def _record_event(self, obj: Obj, type_: str, reason: str, message: str, component: str) -> None:
        meta = obj["metadata"]
        namespace = meta.get("namespace") or "default"
        events = self._t("", "v1", "events")
        now = format_time(self.store.now())
        for existing in self.store.iter(events, namespace):
            involved = existing.get("involvedObject") or {}
            if (
                involved.get("uid") == meta.get("uid")
                and existing.get("reason") == reason
                and existing.get("message") == message
            ):
                updated = copy.deepcopy(existing)
                updated["count"] = int(existing.get("count") or 1) + 1
                updated["lastTimestamp"] = now
                self.store.update(events, namespace, existing["metadata"]["name"], updated)
                return
        self.store.create(
            events,
            namespace,
            {
                "metadata": {"generateName": f"{meta['name']}.", "namespace": namespace},
                "involvedObject": {
                    "kind": obj.get("kind"),
                    "apiVersion": obj.get("apiVersion"),
                    "name": meta["name"],
                    "namespace": meta.get("namespace"),
                    "uid": meta.get("uid"),
                    "resourceVersion": meta.get("resourceVersion"),
                },
                "type": type_,
                "reason": reason,
                "message": message,
                "count": 1,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "source": {"component": component, **({"host": self.node.name} if component == "kubelet" else {})},
                "reportingComponent": component,
                "reportingInstance": self.node.name if component == "kubelet" else "",
            },
        )

    # --------------------------------------------------------------------------------------- deployments

    def _owned_pods(self, owner: Obj) -> list[Obj]:
        uid = owner["metadata"]["uid"]
        return [
            p
            for p in self.store.iter(("", "pods"), owner["metadata"]["namespace"])
            if any(r.get("uid") == uid for r in p["metadata"].get("ownerReferences") or [])
        ]

    def _new_pod(self, owner: Obj, template: Obj, labels: dict[str, str], name_prefix: str) -> None:
        pod_meta = copy.deepcopy(template.get("metadata") or {})
        pod_meta["labels"] = {**(pod_meta.get("labels") or {}), **labels}
        pod_meta["generateName"] = name_prefix
        pod_meta["namespace"] = owner["metadata"]["namespace"]
        pod_meta["ownerReferences"] = [controller_reference(owner, block_owner_deletion=True)]
        self.store.create(
            self._t("", "v1", "pods"),
            owner["metadata"]["namespace"],
            {"metadata": pod_meta, "spec": copy.deepcopy(template.get("spec") or {})},
        )

    def _delete_pod(self, pod: Obj) -> None:
        with contextlib.suppress(ApiError):
            self.store.delete(self._t("", "v1", "pods"), pod["metadata"]["namespace"], pod["metadata"]["name"])

    @staticmethod
    def _pod_ready(pod: Obj) -> bool:
        return any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (pod.get("status") or {}).get("conditions") or []
        )

    def _sync_deployment(self, deployment: Obj) -> None:
        meta, spec = deployment["metadata"], deployment.get("spec") or {}
        if meta.get("deletionTimestamp"):
            return
        desired = int(spec.get("replicas", 1))
        template = spec.get("template") or {}
        current_hash = template_hash(template)
        pods = self._owned_pods(deployment)
        active = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        new = [p for p in active if p["metadata"].get("labels", {}).get("pod-template-hash") == current_hash]
        old = [p for p in active if p not in new]
        old_any = [p for p in pods if p["metadata"].get("labels", {}).get("pod-template-hash") != current_hash]
        prefix = f"{meta['name']}-{current_hash}-"
        labels = {"pod-template-hash": current_hash}
        strategy = spec.get("strategy") or {}
        paused = bool(spec.get("paused"))
        if not paused:
            if strategy.get("type") == "Recreate":
                for pod in old:
                    self._delete_pod(pod)
                if not old_any:
                    self._scale_pods(deployment, new, desired, template, labels, prefix)
            else:
                rolling = strategy.get("rollingUpdate") or {}
                surge = _resolve_int_or_percent(rolling.get("maxSurge", "25%"), desired, round_up=True)
                unavailable = _resolve_int_or_percent(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
                if surge == 0 and unavailable == 0:
                    surge = 1
                if not old:
                    self._scale_pods(deployment, new, desired, template, labels, prefix)
                else:
                    room = desired + surge - len(active)
                    for _ in range(max(0, min(room, desired - len(new)))):
                        self._new_pod(deployment, template, labels, prefix)
                    ready = sum(1 for p in active if self._pod_ready(p))
                    removable = ready - (desired - unavailable)
                    for pod in sorted(old, key=self._pod_ready):
                        if removable <= 0 and self._pod_ready(pod):
                            break
                        if self._pod_ready(pod):
                            removable -= 1
                        self._delete_pod(pod)
        self._deployment_status(deployment, current_hash, desired)

    def _scale_pods(
        self, owner: Obj, pods: list[Obj], desired: int, template: Obj, labels: dict[str, str], prefix: str
    ) -> None:
        for _ in range(desired - len(pods)):
            self._new_pod(owner, template, labels, prefix)
        if len(pods) > desired:
            # The real ReplicaSet controller deletes unscheduled, then not-ready, then the newest pods first.
            ranked = sorted(
                pods,
                key=lambda p: (
                    bool((p.get("spec") or {}).get("nodeName")),
                    self._pod_ready(p),
                    -parse_time(p["metadata"]["creationTimestamp"]).timestamp(),
                ),
            )
            for pod in ranked[: len(pods) - desired]:
                self._delete_pod(pod)

    def _deployment_status(self, deployment: Obj, current_hash: str, desired: int) -> None:
        current = self.store.find(
            self._t("apps", "v1", "deployments"), deployment["metadata"]["namespace"], deployment["metadata"]["name"]
        )
        if current is None:
            return
        pods = self._owned_pods(current)
        active = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        terminating = len(pods) - len(active)
        updated = sum(1 for p in active if p["metadata"].get("labels", {}).get("pod-template-hash") == current_hash)
        ready = sum(1 for p in active if self._pod_ready(p))
        now = format_time(self.store.now())
        spec = current.get("spec") or {}
        rolling = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        max_unavailable = (
            0
            if (spec.get("strategy") or {}).get("type") == "Recreate"
            else _resolve_int_or_percent(rolling.get("maxUnavailable", "25%"), desired, round_up=False)
        )
        available_ok = ready >= desired - max_unavailable
        complete = updated == desired and len(active) == desired and ready == desired and terminating == 0
        old_status = current.get("status") or {}
        conditions = old_status.get("conditions") or []
        conditions = _deployment_condition(
            conditions,
            "Available",
            "True" if available_ok else "False",
            "MinimumReplicasAvailable" if available_ok else "MinimumReplicasUnavailable",
            "Deployment has minimum availability."
            if available_ok
            else "Deployment does not have minimum availability.",
            now,
        )
        conditions = _deployment_condition(
            conditions,
            "Progressing",
            "True",
            "NewReplicaSetAvailable" if complete else "ReplicaSetUpdated",
            f'ReplicaSet "{current["metadata"]["name"]}-{current_hash}" '
            + ("has successfully progressed." if complete else "is progressing."),
            now,
        )
        status: Obj = {"observedGeneration": current["metadata"].get("generation", 1)}
        if active:
            status["replicas"] = len(active)
        if updated:
            status["updatedReplicas"] = updated
        if ready:
            status["readyReplicas"] = ready
            status["availableReplicas"] = ready
        if len(active) - ready > 0 or desired - ready > 0:
            status["unavailableReplicas"] = max(len(active), desired) - ready
        if terminating:
            status["terminatingReplicas"] = terminating
        status["conditions"] = conditions
        if status != old_status:
            body = copy.deepcopy(current)
            body["status"] = status
            body["metadata"].pop("resourceVersion", None)
            self.store.update(
                self._t("apps", "v1", "deployments"),
                current["metadata"]["namespace"],
                current["metadata"]["name"],
                body,
                subresource="status",
            )

    # --------------------------------------------------------------------------------------- jobs

    def _sync_job(self, job: Obj) -> None:
        meta, spec = job["metadata"], job.get("spec") or {}
        if meta.get("deletionTimestamp"):
            return
        status = copy.deepcopy(job.get("status") or {})
        done = any(
            c.get("type") in ("Complete", "Failed") and c.get("status") == "True"
            for c in status.get("conditions") or []
        )
        pods = self._owned_pods(job)
        succeeded = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Succeeded")
        failed = sum(1 for p in pods if (p.get("status") or {}).get("phase") == "Failed")
        active = [
            p
            for p in pods
            if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
            and not p["metadata"].get("deletionTimestamp")
        ]
        now = format_time(self.store.now())
        completions = int(spec.get("completions") or 1)
        backoff_limit = int(spec.get("backoffLimit", 6))
        if not done and not bool(spec.get("suspend")):
            if succeeded >= completions:
                status["conditions"] = [
                    {
                        "type": "SuccessCriteriaMet",
                        "status": "True",
                        "reason": "CompletionsReached",
                        "message": "Reached expected number of succeeded pods",
                        "lastProbeTime": now,
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "Complete",
                        "status": "True",
                        "reason": "CompletionsReached",
                        "message": "Reached expected number of succeeded pods",
                        "lastProbeTime": now,
                        "lastTransitionTime": now,
                    },
                ]
                status["completionTime"] = now
            elif failed > backoff_limit:
                status["conditions"] = [
                    {
                        "type": "FailureTarget",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                        "lastProbeTime": now,
                        "lastTransitionTime": now,
                    },
                    {
                        "type": "Failed",
                        "status": "True",
                        "reason": "BackoffLimitExceeded",
                        "message": "Job has reached the specified backoff limit",
                        "lastProbeTime": now,
                        "lastTransitionTime": now,
                    },
                ]
                for pod in active:
                    self._delete_pod(pod)
            elif not active:
                template = spec.get("template") or {}
                labels = {
                    "batch.kubernetes.io/job-name": meta["name"],
                    "job-name": meta["name"],
                    "batch.kubernetes.io/controller-uid": meta["uid"],
                    "controller-uid": meta["uid"],
                }
                self._new_pod(job, template, labels, f"{meta['name']}-")
                active = [None]  # type: ignore[list-item]
        status.setdefault("startTime", now)
        status["active"] = (
            len(active)
            if not any(c.get("type") in ("Complete", "Failed") for c in status.get("conditions") or [])
            else 0
        )
        if succeeded:
            status["succeeded"] = succeeded
        if failed:
            status["failed"] = failed
        if not status["active"]:
            status.pop("active")
        if status != (job.get("status") or {}):
            body = copy.deepcopy(job)
            body["status"] = status
            body["metadata"].pop("resourceVersion", None)
            self.store.update(
                self._t("batch", "v1", "jobs"), meta["namespace"], meta["name"], body, subresource="status"
            )

    # --------------------------------------------------------------------------------------- scheduler

    def _schedule(self) -> None:
        pods = self._t("", "v1", "pods")
        all_pods = list(self.store.iter(pods))
        used: dict[str, int] = {}
        for pod in all_pods:
            if (pod.get("spec") or {}).get("nodeName") == self.node.name and (pod.get("status") or {}).get(
                "phase"
            ) not in ("Succeeded", "Failed"):
                for name, amount in _extended_requests(pod).items():
                    used[name] = used.get(name, 0) + amount
        pending = [
            p
            for p in all_pods
            if not (p.get("spec") or {}).get("nodeName") and not p["metadata"].get("deletionTimestamp")
        ]
        pending.sort(key=lambda p: (p["metadata"]["creationTimestamp"], int(p["metadata"]["resourceVersion"])))
        labels = self.node.all_labels()
        for pod in pending:
            spec = pod.get("spec") or {}
            reasons = []
            selector = spec.get("nodeSelector") or {}
            if any(labels.get(k) != v for k, v in selector.items()):
                reasons.append("1 node(s) didn't match Pod's node affinity/selector")
            wanted = _extended_requests(pod)
            for name, amount in sorted(wanted.items()):
                if used.get(name, 0) + amount > self.node.capacity.get(name, 0):
                    reasons.append(f"1 Insufficient {name}")
            uid = pod["metadata"]["uid"]
            if reasons:
                helpful = any("Insufficient" in r for r in reasons)
                message = f"0/1 nodes are available: {', '.join(reasons)}. preemption: 0/1 nodes are available: " + (
                    "1 No preemption victims found for incoming pod."
                    if helpful
                    else "1 Preemption is not helpful for scheduling."
                )
                self._set_pod_status(
                    pod,
                    lambda s, m=message: s.update(
                        conditions=_condition(
                            s.get("conditions") or [],
                            "PodScheduled",
                            "False",
                            format_time(self.store.now()),
                            "Unschedulable",
                            m,
                        )
                    ),
                )
                if self._scheduling_messages.get(uid) != message:
                    self._scheduling_messages[uid] = message
                    self.record_event(pod, "Warning", "FailedScheduling", message, "default-scheduler")
                continue
            for name, amount in wanted.items():
                used[name] = used.get(name, 0) + amount
            self._scheduling_messages.pop(uid, None)
            bound = copy.deepcopy(pod)
            bound["spec"]["nodeName"] = self.node.name
            bound["status"]["conditions"] = _condition(
                bound["status"].get("conditions") or [], "PodScheduled", "True", format_time(self.store.now())
            )
            self.store.bind(pods, bound)
            self.record_event(
                pod,
                "Normal",
                "Scheduled",
                f"Successfully assigned {pod['metadata']['namespace']}/{pod['metadata']['name']} to {self.node.name}",
                "default-scheduler",
            )

    def _set_pod_status(self, pod: Obj, mutate: Callable[[Obj], Any]) -> None:
        pods = self._t("", "v1", "pods")
        current = self.store.find(pods, pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is None or current["metadata"]["uid"] != pod["metadata"]["uid"]:
            return
        body = copy.deepcopy(current)
        body["status"] = copy.deepcopy(current.get("status") or {})
        mutate(body["status"])
        if body["status"] != (current.get("status") or {}):
            body["metadata"].pop("resourceVersion", None)
            self.store.update(
                pods, current["metadata"]["namespace"], current["metadata"]["name"], body, subresource="status"
            )

    # --------------------------------------------------------------------------------------- kubelet

    def _sync_pods(self) -> None:
        live = set()
        for pod in self.store.iter(("", "pods")):
            if (pod.get("spec") or {}).get("nodeName") != self.node.name:
                continue
            uid = pod["metadata"]["uid"]
            live.add(uid)
            if uid not in self._workers and not self._closing:
                self._wakeups[uid] = asyncio.Event()
                self._workers[uid] = asyncio.create_task(
                    self._pod_worker(copy.deepcopy(pod)), name=f"pod-{pod['metadata']['name']}"
                )
        for uid, wake in list(self._wakeups.items()):
            if uid not in live:
                wake.set()  # the pod object is gone: its worker kills what is left

    def pod_ip(self, uid: str) -> str | None:
        return self._ips.get(uid)

    def container_log(self, namespace: str, name: str, container: str | None = None) -> str:
        """Everything a container printed (its current or last run): what `kubectl logs` shows."""
        pod = self.store.find(self._t("", "v1", "pods"), namespace, name)
        if pod is None:
            raise KeyError(f"{namespace}/{name}")
        runs = self._runs.get(pod["metadata"]["uid"], [])
        if container is None:
            run = next((r for r in runs if not r.init), None)
        else:
            run = next((r for r in runs if r.name == container), None)
        if run is None or run.log_path is None or not run.log_path.exists():
            return ""
        return run.log_path.read_text(errors="replace")

    def _allocate_ip(self, uid: str) -> str:
        a, b = self._ip_base
        n = self._next_ip
        self._next_ip += 1
        if n > 254:
            raise RuntimeError("the fake node has handed out all of its 253 Pod addresses")
        ip = f"127.{a}.{b}.{n}"
        self._ips[uid] = ip
        return ip

    def _current(self, uid: str, namespace: str, name: str) -> Obj | None:
        pod = self.store.find(self._t("", "v1", "pods"), namespace, name)
        return pod if pod is not None and pod["metadata"]["uid"] == uid else None

    async def _pod_worker(self, pod: Obj) -> None:
        uid, namespace, name = pod["metadata"]["uid"], pod["metadata"]["namespace"], pod["metadata"]["name"]
        wake = self._wakeups[uid]
        spec = pod.get("spec") or {}
        runs = [ContainerRun(c["name"], c, init=True) for c in spec.get("initContainers") or []]
        runs += [ContainerRun(c["name"], c) for c in spec.get("containers") or []]
        self._runs[uid] = runs
        ip = self._allocate_ip(uid)
        try:
            self._publish(pod, runs, ip, phase="Pending")
            await self._run_pod(pod, runs, ip, wake)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            log.exception("pod worker %s/%s failed", namespace, name)
            self.errors.append(error)
        finally:
            for run in runs:
                if run.process is not None and run.process.returncode is None:
                    await self._kill(run, grace=0)
            self._workers.pop(uid, None)
            self._wakeups.pop(uid, None)

    async def _run_pod(self, pod: Obj, runs: list[ContainerRun], ip: str, wake: asyncio.Event) -> None:
        uid, namespace, name = pod["metadata"]["uid"], pod["metadata"]["namespace"], pod["metadata"]["name"]
        restart_policy = (pod.get("spec") or {}).get("restartPolicy", "Always")
        init_done = not any(r.init for r in runs)
        next_try: dict[str, float] = {}
        loop = asyncio.get_running_loop()
        next_probe = 0.0
        while True:
            current = self._current(uid, namespace, name)
            if current is None:
                return
            if current["metadata"].get("deletionTimestamp"):
                await self._terminate(current, runs)
                return
            now = loop.time()
            phase = "Pending"
            if not init_done:
                run = next(r for r in runs if r.init and r.state.get("terminated", {}).get("exitCode") != 0)
                await self._step_container(
                    current,
                    run,
                    ip,
                    next_try,
                    restart_policy="OnFailure" if restart_policy == "Always" else restart_policy,
                )
                init_done = all(r.state.get("terminated", {}).get("exitCode") == 0 for r in runs if r.init)
            else:
                for run in (r for r in runs if not r.init):
                    await self._step_container(current, run, ip, next_try, restart_policy=restart_policy)
                if now >= next_probe:
                    next_probe = now + self.config.probe_interval
                    for run in (r for r in runs if not r.init):
                        await self._probe(run, ip)
                main = [r for r in runs if not r.init]
                finished = [r for r in main if r.state.get("terminated")]
                if restart_policy != "Always" and len(finished) == len(main):
                    phase = (
                        "Succeeded" if all(r.state["terminated"].get("exitCode") == 0 for r in finished) else "Failed"
                    )
                elif any(r.state.get("running") for r in main) or (finished and restart_policy == "Always"):
                    phase = "Running"
            self._publish(current, runs, ip, phase=phase)
            if phase in ("Succeeded", "Failed"):
                await wake.wait()
                wake.clear()
                continue
            wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), timeout=self.config.probe_interval)

    def _executable(self, argv: list[str]) -> str | None:
        """The absolute path to run, when argv[0] is on the allow-list; None otherwise."""
        if not argv:
            return None
        program = argv[0]
        search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        for allowed in self.config.allowed_executables:
            if os.path.isabs(allowed):
                if program == allowed:
                    return allowed
            elif program == allowed:
                return shutil.which(allowed, path=search)
        return None

    def _env(self, pod: Obj, container: Obj, ip: str) -> dict[str, str]:
        env: dict[str, str] = {}
        for entry in container.get("env") or []:
            if "value" in entry:
                env[entry["name"]] = _expand(str(entry["value"]), env)
            elif "valueFrom" in entry:
                value = self._value_from(pod, entry["valueFrom"], ip)
                if value is not None:
                    env[entry["name"]] = value
        ports = [p for p in container.get("ports") or [] if p.get("containerPort")]
        # The Pod's own address always: a container's 0.0.0.0 means its network namespace on a node, but every
        # "Pod" here shares the host's, and a wildcard bind would answer for every other Pod's IP on that port.
        env["FAKE_MODEL_HOST"] = ip
        if ports:
            env.setdefault("FAKE_MODEL_PORT", str(ports[0]["containerPort"]))
        return env

    def _value_from(self, pod: Obj, source: Obj, ip: str) -> str | None:
        if "fieldRef" in source:
            path = source["fieldRef"].get("fieldPath", "")
            values = {
                "metadata.name": pod["metadata"]["name"],
                "metadata.namespace": pod["metadata"]["namespace"],
                "metadata.uid": pod["metadata"]["uid"],
                "status.podIP": ip,
                "status.hostIP": "127.0.0.1",
                "spec.nodeName": self.node.name,
                "spec.serviceAccountName": (pod.get("spec") or {}).get("serviceAccountName", "default"),
            }
            return values.get(path)
        for key, plural in (("configMapKeyRef", "configmaps"), ("secretKeyRef", "secrets")):
            if key in source:
                ref = source[key]
                obj = self.store.find(self._t("", "v1", plural), pod["metadata"]["namespace"], ref.get("name", ""))
                data = (obj or {}).get("data") or {}
                if ref.get("key") in data:
                    value = str(data[ref["key"]])
                    if plural == "secrets":
                        import base64

                        value = base64.b64decode(value).decode(errors="replace")
                    return value
        return None

    async def _step_container(
        self, pod: Obj, run: ContainerRun, ip: str, next_try: dict[str, float], *, restart_policy: str
    ) -> None:
        """Advance one container: pull, start, notice an exit, wait out a back-off, restart."""
        loop = asyncio.get_running_loop()
        image = str(run.spec.get("image", ""))
        if self.config.pull_failure_marker and self.config.pull_failure_marker in image:
            if loop.time() < next_try.get(run.name, 0):
                return
            pulling_failed = run.state.get("waiting", {}).get("reason") == "ErrImagePull"
            if pulling_failed:
                run.state = {"waiting": {"reason": "ImagePullBackOff", "message": f'Back-off pulling image "{image}"'}}
                self.record_event(pod, "Normal", "BackOff", f'Back-off pulling image "{image}"', "kubelet")
            else:
                message = (
                    f'failed to pull and unpack image "{image}": failed to resolve reference "{image}": '
                    f"{image}: not found"
                )
                run.state = {"waiting": {"reason": "ErrImagePull", "message": message}}
                self.record_event(pod, "Warning", "Failed", f'Failed to pull image "{image}": {message}', "kubelet")
            next_try[run.name] = loop.time() + self.config.backoff
            return
        if run.state.get("running"):
            if run.process is not None and run.process.returncode is not None:
                await self._collect_exit(pod, run)
                if restart_policy == "Never" or (
                    restart_policy == "OnFailure" and run.state["terminated"]["exitCode"] == 0
                ):
                    return
                delay = min(self.config.max_backoff, self.config.backoff * (2**run.restarts))
                next_try[run.name] = loop.time() + delay
                self.record_event(
                    pod,
                    "Warning",
                    "BackOff",
                    f"Back-off restarting failed container {run.name} in pod {pod['metadata']['name']}",
                    "kubelet",
                )
            return
        if (
            run.state.get("terminated")
            and restart_policy != "Always"
            and (restart_policy == "Never" or run.state["terminated"]["exitCode"] == 0)
        ):
            return
        if run.state.get("terminated"):
            # Between an exit and the next start: CrashLoopBackOff, with the last run in lastState.
            run.last_state = {"terminated": run.state["terminated"]}
            delay = min(self.config.max_backoff, self.config.backoff * (2**run.restarts))
            run.state = {
                "waiting": {
                    "reason": "CrashLoopBackOff",
                    "message": f"back-off {_seconds(delay)} restarting failed container="
                    f"{run.name} pod={pod['metadata']['name']}_"
                    f"{pod['metadata']['namespace']}({pod['metadata']['uid']})",
                }
            }
        if loop.time() < next_try.get(run.name, 0):
            return
        if run.state.get("waiting", {}).get("reason") == "CrashLoopBackOff":
            run.restarts += 1
        await self._start(pod, run, ip)

    async def _start(self, pod: Obj, run: ContainerRun, ip: str) -> None:
        env = self._env(pod, run.spec, ip)
        argv = [_expand(a, env) for a in (run.spec.get("command") or []) + (run.spec.get("args") or [])]
        executable = self._executable(argv)
        run.started_at = format_time(self.store.now())
        run.image_id = (
            f"{run.spec.get('image', '')}@sha256:{hashlib.sha256(str(run.spec.get('image')).encode()).hexdigest()}"
        )
        run.ready = False
        run.probe_failures = 0
        if executable is None:
            # Not ours to run (a real image): the container "runs" with no process behind it.
            run.process = None
            run.state = {"running": {"startedAt": run.started_at}}
            if run.init:
                run.state = {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": run.started_at,
                        "finishedAt": run.started_at,
                    }
                }
            return
        assert self._log_dir is not None
        run.log_path = self._log_dir / f"{pod['metadata']['uid']}-{run.name}-{run.restarts}.log"
        base_env = dict(os.environ)
        base_env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), base_env.get("PATH", "")])
        log_file = run.log_path.open("wb")
        try:
            run.process = await asyncio.create_subprocess_exec(
                executable,
                *argv[1:],
                env={**base_env, **env},
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=asyncio.subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_make_preexec(signal.SIGKILL),
                cwd=run.spec.get("workingDir") or None,
            )
        finally:
            log_file.close()
        _LIVE_PROCESSES.add(run.process)
        run.state = {"running": {"startedAt": run.started_at}}
        self.record_event(pod, "Normal", "Started", f"Started container {run.name}", "kubelet")

    async def _collect_exit(self, pod: Obj, run: ContainerRun) -> None:
        assert run.process is not None
        code = run.process.returncode or 0
        _LIVE_PROCESSES.discard(run.process)
        terminated: Obj = {
            "exitCode": code if code >= 0 else 128 - code,
            "reason": "Completed" if code == 0 else "Error",
            "startedAt": run.started_at,
            "finishedAt": format_time(self.store.now()),
            "containerID": f"fake://{run.process.pid}",
        }
        if code < 0:
            terminated["signal"] = -code
        if code != 0 and run.spec.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            terminated["message"] = self._tail(run)
        run.state = {"terminated": terminated}
        run.ready = False

    def _tail(self, run: ContainerRun) -> str:
        if run.log_path is None or not run.log_path.exists():
            return ""
        data = run.log_path.read_bytes()
        lines = data.decode(errors="replace").splitlines()[-TERMINATION_MESSAGE_LINES:]
        text = "\n".join(lines)
        return text.encode()[-TERMINATION_MESSAGE_BYTES:].decode(errors="replace")

    async def _probe(self, run: ContainerRun, ip: str) -> None:
        if not run.state.get("running"):
            run.ready = False
            return
        probe = run.spec.get("readinessProbe")
        if not probe:
            run.ready = True
            return
        ok = await self._check(probe, run.spec, ip)
        threshold = int(probe.get("failureThreshold", 3))
        if ok:
            run.probe_failures = 0
            run.ready = True
        else:
            run.probe_failures += 1
            if not run.ready or run.probe_failures >= threshold:
                run.ready = False

    @staticmethod
    def _port(port: Any, container: Obj) -> int | None:
        if isinstance(port, int):
            return port
        for entry in container.get("ports") or []:
            if entry.get("name") == port:
                return int(entry["containerPort"])
        return int(port) if str(port).isdigit() else None

    async def _check(self, probe: Obj, container: Obj, ip: str) -> bool:
        if "httpGet" in probe:
            get = probe["httpGet"]
            port = self._port(get.get("port"), container)
            if port is None:
                return False
            host = get.get("host") or ip
            path = get.get("path") or "/"
            assert self._session is not None
            try:
                timeout = aiohttp.ClientTimeout(total=float(probe.get("timeoutSeconds", 1)))
                async with self._session.get(
                    f"{get.get('scheme', 'HTTP').lower()}://{host}:{port}{path}", timeout=timeout, allow_redirects=False
                ) as response:
                    return 200 <= response.status < 400
            except (aiohttp.ClientError, OSError, TimeoutError):
                return False
        if "tcpSocket" in probe:
            port = self._port(probe["tcpSocket"].get("port"), container)
            if port is None:
                return False
            try:
                _reader, writer = await asyncio.wait_for(asyncio.open_connection(ip, port), timeout=1.0)
            except (OSError, TimeoutError):
                return False
            writer.close()
            return True
        return True  # exec and grpc probes are not run: taken as passing

    def _publish(self, pod: Obj, runs: list[ContainerRun], ip: str, *, phase: str) -> None:
        main = [r for r in runs if not r.init]
        init_done = all(r.state.get("terminated", {}).get("exitCode") == 0 for r in runs if r.init)
        ready = phase == "Running" and all(r.ready for r in main)
        now = format_time(self.store.now())

        def status_of(run: ContainerRun) -> Obj:
            entry: Obj = {
                "name": run.name,
                "image": run.spec.get("image", ""),
                "imageID": run.image_id,
                "ready": run.ready,
                "restartCount": run.restarts,
                "state": copy.deepcopy(run.state),
                "lastState": copy.deepcopy(run.last_state),
                "started": bool(run.state.get("running")),
            }
            if run.process is not None:
                entry["containerID"] = f"fake://{run.process.pid}"
            return entry

        def mutate(status: Obj) -> None:
            conditions = status.get("conditions") or []
            conditions = _condition(conditions, "PodReadyToStartContainers", "True", now)
            conditions = _condition(
                conditions,
                "Initialized",
                "True" if init_done else "False",
                now,
                "" if init_done else "ContainersNotInitialized",
                "" if init_done else f"containers with incomplete status: [{' '.join(r.name for r in runs if r.init)}]",
            )
            not_ready = [r.name for r in main if not r.ready]
            why = f"containers with unready status: [{' '.join(not_ready)}]" if not_ready else ""
            conditions = _condition(
                conditions,
                "ContainersReady",
                "True" if ready else "False",
                now,
                "" if ready else "ContainersNotReady",
                why,
            )
            conditions = _condition(
                conditions, "Ready", "True" if ready else "False", now, "" if ready else "ContainersNotReady", why
            )
            conditions = _condition(conditions, "PodScheduled", "True", now)
            status.update(
                phase=phase,
                conditions=conditions,
                hostIP="127.0.0.1",
                hostIPs=[{"ip": "127.0.0.1"}],
                podIP=ip,
                podIPs=[{"ip": ip}],
            )
            status.setdefault("startTime", now)
            status["containerStatuses"] = [status_of(r) for r in main]
            if any(r.init for r in runs):
                status["initContainerStatuses"] = [status_of(r) for r in runs if r.init]

        self._set_pod_status(pod, mutate)

    async def _terminate(self, pod: Obj, runs: list[ContainerRun]) -> None:
        """SIGTERM, wait out the grace period, SIGKILL; then the Pod object goes (its DELETED event)."""
        uid, namespace, name = pod["metadata"]["uid"], pod["metadata"]["namespace"], pod["metadata"]["name"]
        grace = int(pod["metadata"].get("deletionGracePeriodSeconds") or 0)
        loop = asyncio.get_running_loop()
        began = loop.time()

        def remaining() -> float:
            # A second delete may shorten the grace period; a forced delete (the object is gone) ends it.
            current = self._current(uid, namespace, name)
            if current is None:
                return 0.0
            return began + int(current["metadata"].get("deletionGracePeriodSeconds") or 0) - loop.time()

        running = [r for r in runs if r.process is not None and r.process.returncode is None]
        for run in running:
            self.record_event(pod, "Normal", "Killing", f"Stopping container {run.name}", "kubelet")
        wake = self._wakeups.get(uid)
        await asyncio.gather(*(self._kill(run, grace=grace, remaining=remaining, wake=wake) for run in running))
        for run in running:
            await self._collect_exit(pod, run)
        now = format_time(self.store.now())

        def mutate(status: Obj) -> None:
            for entry in status.get("containerStatuses") or []:
                entry["ready"] = False
                entry["started"] = False
                run = next((r for r in runs if r.name == entry["name"]), None)
                entry["state"] = (
                    copy.deepcopy(run.state)
                    if run and run.state.get("terminated")
                    else {"terminated": {"exitCode": 0, "reason": "Completed", "finishedAt": now}}
                )
            status["conditions"] = _condition(status.get("conditions") or [], "Ready", "False", now, "PodCompleted")
            status["conditions"] = _condition(status["conditions"], "ContainersReady", "False", now, "PodCompleted")

        self._set_pod_status(pod, mutate)
        current = self._current(pod["metadata"]["uid"], pod["metadata"]["namespace"], pod["metadata"]["name"])
        if current is not None and not current["metadata"].get("finalizers"):
            self.store.remove(self._t("", "v1", "pods"), pod["metadata"]["namespace"], pod["metadata"]["name"])

    async def _kill(
        self,
        run: ContainerRun,
        *,
        grace: float,
        remaining: Callable[[], float] | None = None,
        wake: asyncio.Event | None = None,
    ) -> None:
        """SIGTERM, then SIGKILL once `remaining()` (default: the grace period) runs out, re-checked on `wake`."""
        proc = run.process
        if proc is None or proc.returncode is not None:
            if proc is not None:
                _LIVE_PROCESSES.discard(proc)
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + grace
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGTERM if grace > 0 else signal.SIGKILL)
        while grace > 0 and proc.returncode is None:
            left = remaining() if remaining is not None else deadline - loop.time()
            if left <= 0:
                break
            waiters: list[asyncio.Future[Any]] = [asyncio.ensure_future(proc.wait())]
            if wake is not None:
                wake.clear()
                waiters.append(asyncio.ensure_future(wake.wait()))
            _done, pending = await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for future in pending:
                future.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)  # whatever the container left behind in its group
        _LIVE_PROCESSES.discard(proc)


def _deployment_condition(
    conditions: list[Obj], type_: str, status: str, reason: str, message: str, now: str
) -> list[Obj]:
    old = next((c for c in conditions if c.get("type") == type_), None)
    if old and old.get("status") == status and old.get("reason") == reason and old.get("message") == message:
        return conditions
    entry = {
        "type": type_,
        "status": status,
        "lastUpdateTime": now,
        "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == status else now,
        "reason": reason,
        "message": message,
    }
    result = [c for c in conditions if c.get("type") != type_] + [entry]
    return sorted(
        result,
        key=lambda c: (
            ["Available", "Progressing", "ReplicaFailure"].index(c["type"])
            if c["type"] in ("Available", "Progressing", "ReplicaFailure")
            else 3
        ),
    )


def _expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion in command, args and env values (`$$` escapes)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            out.append("$")
            i += 2
        elif text.startswith("$(", i) and (end := text.find(")", i)) != -1:
            name = text[i + 2 : end]
            out.append(env.get(name, text[i : end + 1]))
            i = end + 1
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def _seconds(delay: float) -> str:
    return f"{delay:g}s"
