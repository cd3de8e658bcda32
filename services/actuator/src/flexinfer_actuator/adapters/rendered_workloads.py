"""Rendered workloads: every Model without ``spec.deployment`` gets the Deployment and Service that
:mod:`flexinfer_actuator.domain.rendering` makes of its spec, owner-referenced to it (garbage-collected with it).

Level-triggered on the Models, the Deployments, the Services and the Pods: a missing workload is created (at zero
replicas: the scaler decides), a changed one is updated only when what is rendered changed (the hash annotation)
and only while the model is parked (no replicas, no Pods) unless the Model's ``ai.flexinfer/force-rollout``
annotation takes a new value. With ``cache.strategy: Memory`` the nodes that hold a model's tmpfs copy are recorded
on its Deployment; when the Model is deleted, a cleanup Job removes the copy on each of them.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from flexinfer_actuator.adapters.spec_sync import ResourceKey, SpecErrors
from flexinfer_actuator.domain.rendering import (
    ANNOTATION_FLASH_NODES,
    ANNOTATION_FORCE,
    LABEL_MODEL,
    MANAGED_BY,
    RenderError,
    RenderSettings,
    RolloutDecision,
    Workload,
    cleanup_job,
    co_residence_of,
    decide_rollout,
    owned_by,
    render,
    rollout_patch,
)
from flexinfer_actuator.domain.workloads import selector_matches
from flexinfer_common.kube.client import DEPLOYMENTS, JOBS, SERVICES, KubeClient, KubeError, Object
from flexinfer_common.kube.informer import DELETED, Informer, object_key
from flexinfer_common.logs import get_logger
from flexinfer_common.manifests import GPUGroup, ManifestError, Model, parse_resource
from flexinfer_common.notes import EventType, Note
from flexinfer_common.tasks import Background

R = TypeVar("R", GPUGroup, Model)

log = get_logger("flexinfer.actuator.renderer")

WORKLOAD = "Workload"  # the SpecErrors kind of rendering problems (shown on the Model)


def _flash_identity(deployment: Object) -> str | None:
    """The source a rendered Deployment's flash-loader copies (None: no flash-loader)."""
    pod = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    for container in pod.get("initContainers") or []:
        args = container.get("args") or []
        if container.get("name") == "flash-loader" and "--identity" in args:
            index = args.index("--identity")
            return str(args[index + 1]) if index + 1 < len(args) else None
    return None


def _flash_nodes(deployment: Object) -> set[str]:
    """The nodes a rendered Deployment says hold a tmpfs copy of its model."""
    annotations = (deployment.get("metadata") or {}).get("annotations") or {}
    try:
        nodes = json.loads(annotations.get(ANNOTATION_FLASH_NODES, "[]"))
    except ValueError:
        return set()
    return {str(n) for n in nodes} if isinstance(nodes, list) else set()


def _ours(obj: Object) -> str | None:
    """The Model a rendered object belongs to (its label), if FlexInfer rendered it."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    if labels.get("app.kubernetes.io/managed-by") != MANAGED_BY:
        return None
    model = labels.get(LABEL_MODEL)
    return str(model) if model else None


class WorkloadRenderer:
    def __init__(
        self,
        *,
        client: KubeClient,
        models: Informer,
        groups: Informer,
        deployments: Informer,
        services: Informer,
        pods: Informer,
        settings: RenderSettings,
        errors: SpecErrors,
        note: Callable[[Note], None],
        cleanup_toleration: Mapping[str, Any] | None,
    ) -> None:
        self.client = client
        self.models = models
        self.groups = groups
        self.deployments = deployments
        self.services = services
        self.pods = pods
        self.settings = settings
        self.errors = errors
        self._note = note
        self.cleanup_toleration = cleanup_toleration
        self._dirty: set[tuple[str, str]] = set()
        self._wake = asyncio.Event()
        self._worker = Background("renderer", self._run)
        self._noted: dict[tuple[str, str], str] = {}  # what was last said about a model (one Event per news)
        self._flash_nodes: dict[tuple[str, str], set[str]] = {}  # nodes holding a model's tmpfs copy
        self._group_of: dict[tuple[str, str], str | None] = {}  # the shared group a model was last seen in
        models.on_change(self._model_changed)
        groups.on_change(self._group_changed)
        deployments.on_change(self._workload_changed)
        services.on_change(self._workload_changed)
        pods.on_change(self._pod_changed)

    def start(self) -> None:
        self._worker.start()

    async def stop(self) -> None:
        await self._worker.stop()

    # ------------------------------------------------------------------ watching

    def _mark(self, key: tuple[str, str]) -> None:
        self._dirty.add(key)
        self._wake.set()

    def _model_changed(self, event: str, obj: Object) -> None:
        key = object_key(obj)
        # A member's node is judged against the others': a change of one re-judges its group, and the group it left.
        group = ((obj.get("spec") or {}).get("gpu") or {}).get("shared")
        left = self._group_of.pop(key, None)
        if event == DELETED:
            self._noted.pop(key, None)
            self.errors.clear((WORKLOAD, *key))
            self._clean_up_after(key)
        else:
            self._group_of[key] = group
            self._mark(key)
        self._mark_group(group)
        if left != group:
            self._mark_group(left)

    def _group_changed(self, _: str, obj: Object) -> None:
        self._mark_group((obj.get("metadata") or {}).get("name"))

    def _mark_group(self, group: object) -> None:
        """Re-render every Model of a shared group (a capacity declared or removed, a member's node changed)."""
        if not group:
            return
        for key, other in self.models.cache.items():
            if ((other.get("spec") or {}).get("gpu") or {}).get("shared") == group:
                self._mark(key)

    def _workload_changed(self, _: str, obj: Object) -> None:
        model = _ours(obj)
        if model is not None:
            key = (object_key(obj)[0], model)
            if "template" in (obj.get("spec") or {}):  # a Deployment (list items carry no kind)
                # Remembered here, not read at cleanup time: the Model's and the Deployment's deletions come on two
                # watches, in either order.
                self._flash_nodes.setdefault(key, set()).update(_flash_nodes(obj))
            self._mark(key)

    def _pod_changed(self, _: str, obj: Object) -> None:
        model = _ours(obj)
        if model is not None:
            self._mark((object_key(obj)[0], model))

    async def _run(self) -> None:
        # A Model is rendered against its group's capacity and its peers' nodes: not before those are known (a
        # Deployment rendered for a whole GPU would otherwise be created, then rolled a moment later).
        await self.groups.wait_synced()
        await self.models.wait_synced()
        while True:
            await self._wake.wait()
            self._wake.clear()
            dirty, self._dirty = self._dirty, set()
            for key in sorted(dirty):
                try:
                    await self._reconcile(key)
                except KubeError as exc:
                    log.warning("rendering failed; retrying", extra={"model": "/".join(key), "error": str(exc)})
                    self._dirty.add(key)
                except Exception:
                    log.exception("rendering failed", extra={"model": "/".join(key)})
            if self._dirty:
                await asyncio.sleep(1.0)
                self._wake.set()

    # ------------------------------------------------------------------ one model

    async def _reconcile(self, key: tuple[str, str]) -> None:
        namespace, name = key
        obj = self.models.get(namespace, name)
        if obj is None:
            return
        try:
            parsed = parse_resource({**obj, "status": None})
        except ManifestError:
            return  # spec sync reports it
        assert isinstance(parsed, Model)
        if parsed.spec.deployment:
            self.errors.clear((WORKLOAD, namespace, name))
            return  # adopted: its Deployment is the user's
        try:
            shared = parsed.spec.gpu.shared
            co_residence = (
                co_residence_of(parsed, self._gpugroups(shared), self._members(shared, key), self.settings)
                if shared
                else None
            )
            workload = render(parsed, obj, self.settings, co_residence=co_residence)
        except RenderError as exc:
            self._fail(key, str(exc), (obj.get("metadata") or {}).get("generation"))
            return
        self.errors.clear((WORKLOAD, namespace, name))
        uid = (obj.get("metadata") or {}).get("uid")
        existing = self.deployments.get(namespace, name)
        force = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION_FORCE)
        decision = decide_rollout(existing, workload, model_uid=uid, active=self._running(existing), force=force)
        if decision is RolloutDecision.CREATE:
            await self._create(DEPLOYMENTS, namespace, workload.deployment)
            self._say(
                key, EventType.NORMAL, "Rendered", f"Deployment {name} rendered from backend {parsed.spec.backend}"
            )
        elif decision is RolloutDecision.APPLY:
            assert existing is not None
            copied_from = _flash_identity(existing)
            await self.client.patch(DEPLOYMENTS, namespace, name, rollout_patch(workload, force=force))
            self._say(key, EventType.NORMAL, "Rendered", f"Deployment {name} updated ({workload.template_hash})")
            if copied_from is not None and copied_from != _flash_identity(workload.deployment):
                self._clean_up_after(key, existing)  # copies of the old weights: removed (the next start copies)
        elif decision is RolloutDecision.HOLD:
            self._say(
                key,
                EventType.NORMAL,
                "RolloutHeld",
                f"the changed spec is applied once {name} is parked (annotate {ANNOTATION_FORCE}=<new value> to "
                "apply it now and restart the model)",
            )
        elif decision is RolloutDecision.NOT_OURS:
            self._say(
                key,
                EventType.NORMAL,
                "Adopted",
                f"a Deployment {name} exists that FlexInfer did not render: it is scaled as it is "
                "(set spec.deployment to say so, or delete it to have one rendered)",
            )
            return
        await self._ensure_service(namespace, name, workload, uid)
        await self._record_flash_nodes(namespace, name, workload)

    def _gpugroups(self, name: str) -> list[GPUGroup]:
        """The GPUGroups of that name that parse (spec sync reports the others)."""
        named = (obj for obj in self.groups.cache.values() if (obj.get("metadata") or {}).get("name") == name)
        return _parsed(named, GPUGroup)

    def _members(self, shared: str, key: tuple[str, str]) -> list[Model]:
        """The other Models of the shared group, parsed."""
        members = (
            obj
            for other_key, obj in self.models.cache.items()
            if other_key != key and ((obj.get("spec") or {}).get("gpu") or {}).get("shared") == shared
        )
        return _parsed(members, Model)

    def _running(self, deployment: Object | None) -> bool:
        """The model holds (or is about to hold) its GPU: replicas asked for, or a Pod still there."""
        if deployment is None:
            return False
        spec = deployment.get("spec") or {}
        if spec.get("replicas", 1):
            return True
        selector = spec.get("selector")
        namespace = object_key(deployment)[0]
        return any(
            ns == namespace and selector_matches(selector, (pod.get("metadata") or {}).get("labels"))
            for (ns, _), pod in self.pods.cache.items()
        )

    async def _create(self, resource: Any, namespace: str, body: Object) -> None:
        try:
            await self.client.create(resource, namespace, body)
        except KubeError as exc:
            if exc.status != 409:  # made meanwhile (a watch event is on its way): judged again then
                raise

    async def _ensure_service(self, namespace: str, name: str, workload: Workload, uid: str | None) -> None:
        service = self.services.get(namespace, name)
        if service is None:
            await self._create(SERVICES, namespace, workload.service)
            return
        if not owned_by(service, uid):
            return  # the user's Service (its annotation is kept by the status writer all the same)
        wanted = workload.service["spec"]["ports"]
        if (service.get("spec") or {}).get("ports") != wanted:
            await self.client.patch(SERVICES, namespace, name, {"spec": {"ports": wanted}})

    async def _record_flash_nodes(self, namespace: str, name: str, workload: Workload) -> None:
        """The nodes a Memory model's Pods ran on hold a copy: remember them on the Deployment for the cleanup."""
        if workload.flash_dir is None:
            return
        deployment = self.deployments.get(namespace, name)
        if deployment is None:
            return
        known = _flash_nodes(deployment)
        nodes = known | self._flash_nodes.get((namespace, name), set())
        for (ns, _), pod in self.pods.cache.items():
            if ns == namespace and _ours(pod) == name and (pod.get("spec") or {}).get("nodeName"):
                nodes.add(str(pod["spec"]["nodeName"]))
        if nodes != known:
            patch = {"metadata": {"annotations": {ANNOTATION_FLASH_NODES: json.dumps(sorted(nodes))}}}
            await self.client.patch(DEPLOYMENTS, namespace, name, patch)

    def _clean_up_after(self, key: tuple[str, str], deployment: Object | None = None) -> None:
        """The Model is gone (its Deployment and Service follow by garbage collection), or its source changed:
        remove its tmpfs copies from the nodes it ran on."""
        nodes = self._flash_nodes.pop(key, set()) | (_flash_nodes(deployment) if deployment else set())
        for node in sorted(nodes):
            job = cleanup_job(
                namespace=key[0],
                model=key[1],
                node=node,
                settings=self.settings,
                toleration=self.cleanup_toleration,
            )
            task = asyncio.create_task(self._create_job(job), name=f"cleanup:{key}")
            task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _create_job(self, job: Object) -> None:
        namespace = job["metadata"]["namespace"]
        try:
            await self._create(JOBS, namespace, job)
            log.info("tmpfs cleanup Job created", extra={"job": f"{namespace}/{job['metadata']['name']}"})
        except KubeError as exc:
            log.warning(
                "could not create a tmpfs cleanup Job", extra={"job": job["metadata"]["name"], "error": str(exc)}
            )

    def _fail(self, key: tuple[str, str], error: str, generation: int | None) -> None:
        resource: ResourceKey = (WORKLOAD, *key)
        if self.errors.set(resource, error, generation):
            log.warning("cannot render", extra={"model": "/".join(key), "error": error})
            self._note(Note(key[0], key[1], EventType.WARNING, "RenderFailed", error))

    def _say(self, key: tuple[str, str], kind: EventType, reason: str, message: str) -> None:
        if self._noted.get(key) != message:
            self._noted[key] = message
            self._note(Note(key[0], key[1], kind, reason, message))


def _parsed(objects: Iterable[Object], kind: type[R]) -> list[R]:
    """The objects that parse as ``kind`` (their status aside); one that does not parse is passed over."""
    found = []
    for obj in objects:
        try:
            parsed = parse_resource({**obj, "status": None})
        except ManifestError:
            continue
        if isinstance(parsed, kind):
            found.append(parsed)
    return found
