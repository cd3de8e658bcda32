"""What a model's Deployment and Pods say about its runtime, and what to do about it: pure functions of the objects
the API server returned (plain dicts) and of the model's last command. The Kubernetes back-end reports what these
functions judge, and scales the Deployment to what they ask for; nothing here talks to the API server or reads
the clock.

The rules, as the swap contract needs them:
- A model is Ready when a Pod of its Deployment is Ready, not terminating and has an IP; its endpoint is that Pod.
- A model is Parked only when no Pod of its Deployment is left (not merely Terminating: until the Pod object is gone
  the container may still hold the GPU). A Pod that finished (Succeeded/Failed, e.g. evicted) holds nothing.
- A model that is not Ready within the load timeout is scaled to zero and reported Failed once its Pods are gone,
  with the reason the Pods show (ImagePullBackOff, CrashLoopBackOff with the last termination message, Unschedulable).
- A change made by someone else is noticed (only after our own scale write has been seen, so a stale cache is not
  mistaken for it): a parked model scaled up is scaled back to zero; a running model scaled to zero is Failed once
  its Pods are gone, which the scheduler handles as a crash (restart after the back-off).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flexinfer_common.enums import RuntimePhase
from flexinfer_common.messages import WOKEN

Object = Mapping[str, Any]

DEFAULT_MODEL_PORT = 8000

# Waiting reasons that mean the image cannot be had (or the container cannot be created from it).
IMAGE_PROBLEMS = frozenset(
    {"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "CreateContainerConfigError"}
)


# ------------------------------------------------------------------------------------------ selectors


def _expression_matches(expression: Object, labels: Mapping[str, str]) -> bool:
    key, operator = expression.get("key", ""), expression.get("operator", "")
    values = set(expression.get("values") or [])
    if operator == "In":
        return key in labels and labels[key] in values
    if operator == "NotIn":
        return key not in labels or labels[key] not in values
    if operator == "Exists":
        return key in labels
    if operator == "DoesNotExist":
        return key not in labels
    return False


def selector_matches(selector: Object | None, labels: Mapping[str, str] | None) -> bool:
    """A ``LabelSelector`` (matchLabels and matchExpressions) against a label set. An empty selector matches
    nothing here: a Deployment always has a non-empty one, and matching every Pod would be wrong."""
    if not selector:
        return False
    labels = labels or {}
    match_labels = selector.get("matchLabels") or {}
    expressions = selector.get("matchExpressions") or []
    if not match_labels and not expressions:
        return False
    if any(labels.get(key) != value for key, value in match_labels.items()):
        return False
    return all(_expression_matches(expression, labels) for expression in expressions)


def selector_string(selector: Object | None) -> str:
    """The ``labelSelector`` query form of a LabelSelector (for ``kubectl get pods -l ...`` in messages)."""
    if not selector:
        return ""
    parts = [f"{key}={value}" for key, value in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression.get("key", ""), expression.get("operator", "")
        values = ",".join(sorted(expression.get("values") or []))
        parts.append(
            {"In": f"{key} in ({values})", "NotIn": f"{key} notin ({values})", "Exists": key}.get(operator, f"!{key}")
        )
    return ",".join(parts)


# ------------------------------------------------------------------------------------------ facts


@dataclass(frozen=True)
class PodFacts:
    name: str
    ip: str | None
    ready: bool
    terminating: bool
    finished: bool
    problem: str | None
    port: int | None
    last_exit: str | None = None  # how its container ended before its last restart

    @property
    def holds_resources(self) -> bool:
        """Whether the Pod may still hold its GPU: it exists and has not finished."""
        return not self.finished


def _condition(obj: Object, kind: str) -> Object | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(condition, Mapping) and condition.get("type") == kind:
            return condition
    return None


def _first_container_port(pod: Object) -> int | None:
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if isinstance(port.get("containerPort"), int):
                return int(port["containerPort"])
    return None


def pod_problem(pod: Object) -> str | None:
    """Why a Pod is not running its containers, in the words Kubernetes uses (None: nothing is wrong yet)."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == "Unschedulable":
        return _join("Unschedulable", scheduled.get("message"))
    status = pod.get("status") or {}
    for container in [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]:
        waiting = (container.get("state") or {}).get("waiting") or {}
        reason = waiting.get("reason")
        if reason in IMAGE_PROBLEMS:
            return _join(reason, waiting.get("message"))
        if reason == "CrashLoopBackOff":
            last = (container.get("lastState") or {}).get("terminated") or {}
            detail = last.get("message") or last.get("reason") or ""
            summary = f"CrashLoopBackOff: container {container.get('name', '?')}"
            if last.get("exitCode") is not None:
                summary += " " + describe_termination(last)
            if container.get("restartCount"):
                summary += f" ({container['restartCount']} restarts)"
            return _join(summary, detail.strip())
    if status.get("phase") == "Failed":
        return _join(f"Pod {status.get('reason') or 'failed'}", status.get("message"))
    return None


def describe_termination(terminated: Object) -> str:
    """``exited with code 1``, ``exited with code 132 (SIGILL)``: a container killed by signal N exits 128 + N."""
    code = terminated.get("exitCode")
    text = f"exited with code {code}"
    if isinstance(code, int) and 128 < code < 128 + 65:
        with contextlib.suppress(ValueError):
            text += f" ({signal.Signals(code - 128).name})"
    return text


def last_exit(pod: Object) -> str | None:
    """How a container of the Pod ended last time, when it has been restarted: ``container server exited with code
    132 (SIGILL) (1 restarts): <its termination message>`` (None: no restart)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        last = (container.get("lastState") or {}).get("terminated") or {}
        if last.get("exitCode") is not None:
            summary = f"container {container.get('name', '?')} {describe_termination(last)}"
            if container.get("restartCount"):
                summary += f" ({container['restartCount']} restarts)"
            return _join(summary, str(last.get("message") or "").strip())
    return None


def _join(summary: str, detail: Any) -> str:
    detail = str(detail or "").strip()
    return f"{summary}: {detail}" if detail else summary


def pod_facts(pod: Object) -> PodFacts:
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    ready = _condition(pod, "Ready")
    return PodFacts(
        name=str(meta.get("name") or ""),
        ip=status.get("podIP") or None,
        ready=ready is not None and ready.get("status") == "True",
        terminating=bool(meta.get("deletionTimestamp")),
        finished=status.get("phase") in ("Succeeded", "Failed"),
        problem=pod_problem(pod),
        port=_first_container_port(pod),
        last_exit=last_exit(pod),
    )


@dataclass(frozen=True)
class WorkloadFacts:
    """A model's Deployment (None: it does not exist) and the Pods its selector matches."""

    namespace: str
    deployment: str
    exists: bool
    replicas: int
    pods: tuple[PodFacts, ...]

    @property
    def alive(self) -> tuple[PodFacts, ...]:
        return tuple(p for p in self.pods if p.holds_resources)

    @property
    def serving(self) -> tuple[PodFacts, ...]:
        return tuple(p for p in self.pods if p.ready and p.ip and not p.terminating and not p.finished)


def workload_facts(namespace: str, name: str, deployment: Object | None, pods: Iterable[Object]) -> WorkloadFacts:
    if deployment is None:
        return WorkloadFacts(namespace, name, exists=False, replicas=0, pods=())
    spec = deployment.get("spec") or {}
    selector = spec.get("selector")
    mine = [
        pod
        for pod in pods
        if (pod.get("metadata") or {}).get("namespace") == namespace
        and selector_matches(selector, (pod.get("metadata") or {}).get("labels"))
    ]
    mine.sort(key=lambda pod: str((pod.get("metadata") or {}).get("creationTimestamp") or ""))
    replicas = spec.get("replicas")
    return WorkloadFacts(
        namespace,
        name,
        exists=True,
        replicas=1 if replicas is None else int(replicas),  # the API server defaults an unset replicas to 1
        pods=tuple(pod_facts(pod) for pod in mine),
    )


def endpoint(pod: PodFacts, spec_port: int | None) -> str:
    """``http://<pod IP>:<port>``: the model's ``spec.endpoint.port``, else the Pod's first container port, else
    8000. The proxy forwards to the Pod itself, so a swap is visible the moment the Pod is Ready (a Service's
    endpoints and kube-proxy would lag behind)."""
    port = spec_port or pod.port or DEFAULT_MODEL_PORT
    host = f"[{pod.ip}]" if pod.ip and ":" in pod.ip else pod.ip
    return f"http://{host}:{port}"


# ------------------------------------------------------------------------------------------ verdicts


class Want(StrEnum):
    """What the model's last applied command asked for."""

    RUN = "run"
    PARK = "park"


@dataclass(frozen=True)
class Verdict:
    """What to report (``phase`` None: nothing new to say) and what to scale the Deployment to (None: leave it)."""

    phase: RuntimePhase | None
    endpoint: str | None = None
    message: str = ""
    replicas: int | None = None
    outside_change: str | None = None  # someone else changed the replicas: say so (an Event)


@dataclass(frozen=True)
class RunState:
    """What the back-end remembers of one activation (besides the facts it observes)."""

    spec_port: int | None
    load_seconds: float  # since the activation (or since it stopped being Ready)
    load_timeout: float
    write_seen: bool  # our replicas=1 has been seen in the watched Deployment
    was_ready: bool
    timed_out: str | None = None  # the load timed out: this is the failure to report once the Pods are gone
    rendered: bool = False  # FlexInfer renders the Deployment: it may not exist yet
    woken_pod: str | None = None  # the Pod whose sleeping server answered POST /wake_up: it serves already
    restarting: str | None = None  # waking failed: the Pods go and a fresh one starts (this says why)


def judge_run(facts: WorkloadFacts, state: RunState) -> Verdict:
    """The model should run."""
    where = f"Deployment {facts.namespace}/{facts.deployment}"
    if not facts.exists:
        if state.rendered and state.load_seconds < state.load_timeout:
            return Verdict(RuntimePhase.LOADING, message=f"waiting for {where} to be rendered")
        if state.rendered:
            return Verdict(RuntimePhase.FAILED, message=f"{where} was not rendered (see the Model's events)")
        return Verdict(RuntimePhase.FAILED, message=f"{where} not found (spec.deployment)")
    if state.timed_out is not None:
        if facts.alive:
            return Verdict(None, replicas=0 if facts.replicas else None)
        return Verdict(RuntimePhase.FAILED, message=state.timed_out)
    if state.restarting is not None:
        if facts.alive:
            return Verdict(RuntimePhase.LOADING, message=state.restarting, replicas=0 if facts.replicas else None)
        return Verdict(RuntimePhase.LOADING, message=state.restarting, replicas=1)
    woken = next((p for p in facts.alive if p.name == state.woken_pod and p.ip and not p.terminating), None)
    if woken is not None:  # wake_up's answer is its readiness signal: no waiting for the next probe
        return Verdict(RuntimePhase.READY, endpoint=endpoint(woken, state.spec_port), message=WOKEN)
    serving = facts.serving
    if serving:
        return Verdict(RuntimePhase.READY, endpoint=endpoint(serving[-1], state.spec_port))
    if facts.replicas == 0 and state.write_seen:
        change = f"{where} was scaled to 0 outside FlexInfer"
        if facts.alive:
            return Verdict(RuntimePhase.LOADING, message=f"{change}; waiting for its pods to stop")
        return Verdict(RuntimePhase.FAILED, message=change, outside_change=change)
    problem = next((p.problem for p in reversed(facts.alive) if p.problem), None)
    if state.load_seconds >= state.load_timeout:
        summary = f"not ready within the load timeout ({state.load_timeout:g}s)"
        return Verdict(None, message=f"{summary}: {problem}" if problem else summary, replicas=0)
    replicas = 1 if facts.replicas != 1 and not state.write_seen else None  # ours not seen yet: (re)write it
    if problem:
        return Verdict(RuntimePhase.LOADING, message=problem, replicas=replicas)
    waiting = [p for p in facts.alive if not p.terminating]
    crashed = next((p.last_exit for p in reversed(waiting) if p.last_exit), None)
    if state.was_ready and crashed:
        message = f"restarting: {crashed}"
    elif state.was_ready:
        message = "restarting: no pod is Ready"
    elif waiting:
        message = f"waiting for pod {waiting[-1].name} to become Ready"
    elif facts.alive:
        message = "waiting for the old pods to stop"
    else:
        message = "waiting for a pod"
    return Verdict(RuntimePhase.LOADING, message=message, replicas=replicas)


def judge_park(
    facts: WorkloadFacts, *, write_seen: bool, sleeping_pod: str | None = None, fallback: str = ""
) -> Verdict:
    """The model should be parked: asleep in ``sleeping_pod`` (parkStrategy Sleep: the Pod stays), or scaled to zero
    (``fallback`` says why, when sleeping was asked for and failed)."""
    if sleeping_pod is not None and any(p.name == sleeping_pod and not p.terminating for p in facts.alive):
        return Verdict(RuntimePhase.PARKED, message="sleeping")
    if not facts.exists:
        return Verdict(RuntimePhase.PARKED, message=fallback)
    outside = None
    if facts.replicas != 0 and write_seen:
        outside = (
            f"Deployment {facts.namespace}/{facts.deployment} was scaled to {facts.replicas} outside FlexInfer; "
            "scaled back to 0 (another model may hold the GPU: use `flexinfer promote` to run this one)"
        )
    replicas = 0 if facts.replicas != 0 else None
    alive = facts.alive
    if alive:
        names = ", ".join(p.name for p in alive)
        waiting = f"waiting for pods to stop: {names}"
        return Verdict(
            RuntimePhase.STOPPING,
            message=f"{fallback}; {waiting}" if fallback else waiting,
            replicas=replicas,
            outside_change=outside,
        )
    return Verdict(RuntimePhase.PARKED, message=fallback, replicas=replicas, outside_change=outside)
