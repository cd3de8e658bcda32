"""The Kubernetes back-end's pure rules: what a Deployment and its Pods say about a model, one table per decision."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_actuator.domain.workloads import (
    RunState,
    Verdict,
    judge_park,
    judge_run,
    pod_problem,
    selector_matches,
    selector_string,
    workload_facts,
)
from flexinfer_common.enums import RuntimePhase

SELECTOR = {"matchLabels": {"app": "qwen"}}


def deployment(replicas: int | None = 1, *, selector: dict[str, Any] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selector": selector or SELECTOR}
    if replicas is not None:
        spec["replicas"] = replicas
    return {"metadata": {"namespace": "ml", "name": "qwen"}, "spec": spec}


def pod(
    name: str = "qwen-1",
    *,
    ready: bool = False,
    ip: str | None = "10.0.0.7",
    terminating: bool = False,
    phase: str = "Running",
    labels: dict[str, str] | None = None,
    namespace: str = "ml",
    waiting: dict[str, Any] | None = None,
    last_terminated: dict[str, Any] | None = None,
    restarts: int = 0,
    unschedulable: str | None = None,
    port: int | None = 8000,
    created: str = "2026-01-01T00:00:00Z",
) -> dict[str, Any]:
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "labels": {"app": "qwen"} if labels is None else labels,
        "creationTimestamp": created,
    }
    if terminating:
        meta["deletionTimestamp"] = "2026-01-01T00:01:00Z"
    conditions = [{"type": "Ready", "status": "True" if ready else "False"}]
    if unschedulable is not None:
        conditions.append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": unschedulable}
        )
    container: dict[str, Any] = {"name": "server", "restartCount": restarts, "ready": ready}
    if waiting is not None:
        container["state"] = {"waiting": waiting}
    if last_terminated is not None:
        container["lastState"] = {"terminated": last_terminated}
    status: dict[str, Any] = {"phase": phase, "conditions": conditions, "containerStatuses": [container]}
    if ip:
        status["podIP"] = ip
    containers = [{"name": "server", "ports": [{"containerPort": port}] if port else []}]
    return {"metadata": meta, "spec": {"containers": containers}, "status": status}


def run_state(**overrides: Any) -> RunState:
    values: dict[str, Any] = {
        "spec_port": None,
        "load_seconds": 1.0,
        "load_timeout": 600.0,
        "write_seen": True,
        "was_ready": False,
        "timed_out": None,
    }
    values.update(overrides)
    return RunState(**values)


CRASH = {
    "reason": "CrashLoopBackOff",
    "message": "back-off 40s restarting failed container",
}
OOM = {"exitCode": 137, "reason": "OOMKilled", "message": "CUDA out of memory. Tried to allocate 2.00 GiB"}


@pytest.mark.parametrize(
    ("dep", "pods", "state", "expected"),
    [
        pytest.param(
            None,
            [],
            run_state(),
            Verdict(RuntimePhase.FAILED, message="Deployment ml/qwen not found (spec.deployment)"),
            id="missing-adopted-deployment-fails-at-once",
        ),
        pytest.param(
            None,
            [],
            run_state(rendered=True),
            Verdict(RuntimePhase.LOADING, message="waiting for Deployment ml/qwen to be rendered"),
            id="rendered-deployment-not-there-yet-is-loading",
        ),
        pytest.param(
            None,
            [],
            run_state(rendered=True, load_seconds=601.0),
            Verdict(RuntimePhase.FAILED, message="Deployment ml/qwen was not rendered (see the Model's events)"),
            id="rendered-deployment-never-there-fails-at-the-load-timeout",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=True)],
            run_state(),
            Verdict(RuntimePhase.READY, endpoint="http://10.0.0.7:8000"),
            id="ready-pod-is-the-endpoint",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=True, port=9000)],
            run_state(spec_port=8080),
            Verdict(RuntimePhase.READY, endpoint="http://10.0.0.7:8080"),
            id="spec-endpoint-port-wins-over-container-port",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=True, port=None)],
            run_state(),
            Verdict(RuntimePhase.READY, endpoint="http://10.0.0.7:8000"),
            id="no-port-anywhere-means-8000",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=True, terminating=True)],
            run_state(),
            Verdict(RuntimePhase.LOADING, message="waiting for the old pods to stop"),
            id="a-terminating-pod-never-serves",
        ),
        pytest.param(
            deployment(1),
            [pod("old", ready=True, terminating=True, ip="10.0.0.1"), pod("new", ready=True, ip="10.0.0.2")],
            run_state(),
            Verdict(RuntimePhase.READY, endpoint="http://10.0.0.2:8000"),
            id="rollout-serves-from-the-new-pod",
        ),
        pytest.param(
            deployment(0),
            [],
            run_state(write_seen=False),
            Verdict(RuntimePhase.LOADING, message="waiting for a pod", replicas=1),
            id="activation-scales-to-one-until-the-write-is-seen",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=False)],
            run_state(),
            Verdict(RuntimePhase.LOADING, message="waiting for pod qwen-1 to become Ready"),
            id="loading-pod-names-itself",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=False, unschedulable="0/1 nodes are available: 1 Insufficient nvidia.com/gpu.")],
            run_state(),
            Verdict(
                RuntimePhase.LOADING,
                message="Unschedulable: 0/1 nodes are available: 1 Insufficient nvidia.com/gpu.",
            ),
            id="unschedulable-is-shown-while-loading",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=False, waiting={"reason": "ImagePullBackOff", "message": "pull access denied"})],
            run_state(load_seconds=601.0),
            Verdict(
                None,
                message="not ready within the load timeout (600s): ImagePullBackOff: pull access denied",
                replicas=0,
            ),
            id="load-timeout-scales-to-zero-with-the-pod-reason",
        ),
        pytest.param(
            deployment(0),
            [pod(ready=False, terminating=True)],
            run_state(timed_out="not ready within the load timeout (600s)"),
            Verdict(None),
            id="timed-out-waits-for-the-pods-to-go-before-failing",
        ),
        pytest.param(
            deployment(0),
            [],
            run_state(timed_out="not ready within the load timeout (600s)"),
            Verdict(RuntimePhase.FAILED, message="not ready within the load timeout (600s)"),
            id="timed-out-fails-once-no-pod-is-left",
        ),
        pytest.param(
            deployment(0),
            [pod(ready=True, terminating=True)],
            run_state(was_ready=True),
            Verdict(
                RuntimePhase.LOADING,
                message="Deployment ml/qwen was scaled to 0 outside FlexInfer; waiting for its pods to stop",
            ),
            id="scaled-to-zero-outside-stops-serving-at-once",
        ),
        pytest.param(
            deployment(0),
            [],
            run_state(was_ready=True),
            Verdict(
                RuntimePhase.FAILED,
                message="Deployment ml/qwen was scaled to 0 outside FlexInfer",
                outside_change="Deployment ml/qwen was scaled to 0 outside FlexInfer",
            ),
            id="scaled-to-zero-outside-is-a-crash-once-its-pods-are-gone",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=False, waiting=CRASH, last_terminated=OOM, restarts=3)],
            run_state(was_ready=True),
            Verdict(
                RuntimePhase.LOADING,
                message="CrashLoopBackOff: container server exited with code 137 (SIGKILL) (3 restarts): "
                "CUDA out of memory. Tried to allocate 2.00 GiB",
            ),
            id="crash-after-ready-shows-the-last-termination-message",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=False)],
            run_state(was_ready=True),
            Verdict(RuntimePhase.LOADING, message="restarting: no pod is Ready"),
            id="restart-after-ready-is-loading",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=False, last_terminated={"exitCode": 132, "reason": "Error"}, restarts=1)],
            run_state(was_ready=True),
            Verdict(
                RuntimePhase.LOADING, message="restarting: container server exited with code 132 (SIGILL) (1 restarts)"
            ),
            id="restart-after-a-crash-says-how-it-ended",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=True, labels={"app": "other"})],
            run_state(),
            Verdict(RuntimePhase.LOADING, message="waiting for a pod"),
            id="pods-of-another-selector-do-not-count",
        ),
        pytest.param(
            deployment(1),
            [pod(ready=True, namespace="other")],
            run_state(),
            Verdict(RuntimePhase.LOADING, message="waiting for a pod"),
            id="pods-of-another-namespace-do-not-count",
        ),
    ],
)
def test_judge_run(dep: dict[str, Any] | None, pods: list[dict[str, Any]], state: RunState, expected: Verdict) -> None:
    assert judge_run(workload_facts("ml", "qwen", dep, pods), state) == expected


@pytest.mark.parametrize(
    ("dep", "pods", "write_seen", "phase", "replicas", "outside"),
    [
        pytest.param(None, [], False, RuntimePhase.PARKED, None, False, id="no-deployment-is-parked"),
        pytest.param(deployment(0), [], True, RuntimePhase.PARKED, None, False, id="zero-and-no-pods-is-parked"),
        pytest.param(deployment(1), [pod(ready=True)], False, RuntimePhase.STOPPING, 0, False, id="park-scales-to-0"),
        pytest.param(
            deployment(0),
            [pod(ready=True, terminating=True)],
            True,
            RuntimePhase.STOPPING,
            None,
            False,
            id="terminating-is-not-parked-the-gpu-may-still-be-held",
        ),
        pytest.param(
            deployment(0),
            [pod(phase="Failed", ready=False)],
            True,
            RuntimePhase.PARKED,
            None,
            False,
            id="a-finished-pod-holds-nothing",
        ),
        pytest.param(
            deployment(2),
            [],
            True,
            RuntimePhase.PARKED,
            0,
            True,
            id="scaled-up-outside-is-scaled-back-and-reported",
        ),
        pytest.param(
            deployment(None),
            [],
            False,
            RuntimePhase.PARKED,
            0,
            False,
            id="unset-replicas-means-one-and-is-scaled-to-zero",
        ),
    ],
)
def test_judge_park(
    dep: dict[str, Any] | None,
    pods: list[dict[str, Any]],
    write_seen: bool,
    phase: RuntimePhase,
    replicas: int | None,
    outside: bool,
) -> None:
    verdict = judge_park(workload_facts("ml", "qwen", dep, pods), write_seen=write_seen)
    assert (verdict.phase, verdict.replicas, verdict.outside_change is not None) == (phase, replicas, outside)


@pytest.mark.parametrize(
    ("pod_object", "expected"),
    [
        pytest.param(pod(), None, id="nothing-wrong"),
        pytest.param(
            pod(waiting={"reason": "ErrImagePull", "message": "manifest unknown"}),
            "ErrImagePull: manifest unknown",
            id="image-pull-error",
        ),
        pytest.param(
            pod(waiting={"reason": "ContainerCreating"}),
            None,
            id="container-creating-is-progress-not-a-problem",
        ),
        pytest.param(
            pod(waiting=CRASH, last_terminated={"exitCode": 1, "reason": "Error"}, restarts=1),
            "CrashLoopBackOff: container server exited with code 1 (1 restarts): Error",
            id="crash-loop-without-message-uses-the-reason",
        ),
        pytest.param(
            pod(unschedulable="0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector."),
            "Unschedulable: 0/1 nodes are available: 1 node(s) didn't match Pod's node affinity/selector.",
            id="unschedulable",
        ),
    ],
)
def test_pod_problem(pod_object: dict[str, Any], expected: str | None) -> None:
    assert pod_problem(pod_object) == expected


@pytest.mark.parametrize(
    ("selector", "labels", "expected"),
    [
        pytest.param({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True, id="match-labels-subset"),
        pytest.param({"matchLabels": {"a": "1"}}, {"a": "2"}, False, id="match-labels-differ"),
        pytest.param({}, {"a": "1"}, False, id="empty-selector-matches-nothing"),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}]},
            {"tier": "gpu"},
            True,
            id="in",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["gpu"]}]},
            {},
            True,
            id="notin-without-the-key",
        ),
        pytest.param({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"tier": ""}, True, id="exists"),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "DoesNotExist"}]},
            {"tier": "x"},
            False,
            id="does-not-exist",
        ),
    ],
)
def test_selector_matches(selector: dict[str, Any], labels: dict[str, str], expected: bool) -> None:
    assert selector_matches(selector, labels) is expected


def test_selector_string_is_kubectl_syntax() -> None:
    selector = {
        "matchLabels": {"app": "qwen"},
        "matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu", "cpu"]}],
    }
    assert selector_string(selector) == "app=qwen,tier in (cpu,gpu)"
