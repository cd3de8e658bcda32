"""The emulator's state: objects of every ResourceType, one global resourceVersion, the watch history.

Every write goes through `Store` (the HTTP handlers and the in-process fake kubelet alike), so each write
bumps the resourceVersion once, emits exactly one watch event, and obeys the same rules: generation, status
subresource, preconditions, finalizers, graceful pod deletion, owner-reference garbage collection. Writes are
plain synchronous methods: on the event loop they are atomic, which is what the real server's etcd
transactions give.
"""

from __future__ import annotations

import asyncio
import copy
import random
import re
import uuid
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from flexinfer_testbed.kube import patching, schema
from flexinfer_testbed.kube.errors import ApiError, Reason, bad_request, conflict, gone, invalid, not_found
from flexinfer_testbed.kube.resources import ResourceType, builtin_types, types_from_crd
from flexinfer_testbed.kube.selectors import (
    FieldSelector,
    LabelSelector,
    format_label_selector,
    selector_from_label_selector,
)

Obj = dict[str, Any]
NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"  # what the API server's generateName draws from
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
SYSTEM_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
CRDS = ("apiextensions.k8s.io", "customresourcedefinitions")


class EventType(StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"
    BOOKMARK = "BOOKMARK"
    ERROR = "ERROR"


class PatchType(StrEnum):
    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    JSON = "application/json-patch+json"
    APPLY = "application/apply-patch+yaml"


class FieldValidation(StrEnum):
    IGNORE = "Ignore"
    WARN = "Warn"
    STRICT = "Strict"


@dataclass(frozen=True)
class StoredEvent:
    rv: int
    type: EventType
    key: tuple[str, str]
    obj: Obj
    old: Obj | None


def format_time(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def jsonpath_get(obj: Any, path: str) -> Any:
    """A simple JSONPath `.a.b.c` (what printer columns and scale paths use); None when absent."""
    node = obj
    for part in [p for p in path.strip().lstrip("$").split(".") if p]:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def jsonpath_set(obj: Obj, path: str, value: Any) -> None:
    parts = [p for p in path.strip().lstrip("$").split(".") if p]
    node = obj
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def _content(obj: Obj) -> Obj:
    """What `metadata.generation` tracks: everything but metadata, status, apiVersion and kind."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status", "apiVersion", "kind")}


def _check_object(body: Any) -> None:
    """A create's or an update's body must be a JSON object, as the API server decodes it."""
    if not isinstance(body, dict):
        raise bad_request("the body of the request was in an unknown format")


@dataclass(eq=False)
class Watcher:
    """One open watch: a queue of events that match its resource, namespace and selectors."""

    key: tuple[str, str]
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector
    queue: asyncio.Queue[StoredEvent | None] = field(default_factory=asyncio.Queue)

    def _matches(self, obj: Obj | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)

    def translate(self, event: StoredEvent) -> StoredEvent | None:
        """The event this watcher sees: a MODIFIED that leaves (enters) the selection is DELETED (ADDED)."""
        if event.key != self.key:
            return None
        now_in = self._matches(event.obj)
        if event.type != EventType.MODIFIED:
            return event if now_in else None
        was_in = self._matches(event.old)
        if now_in and was_in:
            return event
        if now_in:
            return StoredEvent(event.rv, EventType.ADDED, event.key, event.obj, event.old)
        if was_in:
            return StoredEvent(event.rv, EventType.DELETED, event.key, event.obj, event.old)
        return None

    def offer(self, event: StoredEvent) -> None:
        seen = self.translate(event)
        if seen is not None:
            self.queue.put_nowait(seen)

    def close(self) -> None:
        self.queue.put_nowait(None)


class Store:
    def __init__(self, *, history_limit: int = 1000, clock: Callable[[], datetime] | None = None) -> None:
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._objects: dict[tuple[str, str], dict[tuple[str, str], Obj]] = {}
        self.resource_version = 0
        self.history: deque[StoredEvent] = deque()
        self.history_limit = history_limit
        #: A watch may resume from rv N only when N >= this (events up to it are gone).
        self.oldest_resumable = 0
        self.watchers: set[Watcher] = set()
        #: Called after every write with the event (the fake kubelet and controllers use this).
        self.listeners: list[Callable[[StoredEvent], None]] = []
        self.clock = clock or (lambda: datetime.now(UTC))
        self._sweeping: set[str] = set()
        for rt in builtin_types():
            self.register(rt)
        for ns in SYSTEM_NAMESPACES:
            self.create(self.type("", "v1", "namespaces"), None, {"metadata": {"name": ns}})

    # ------------------------------------------------------------------------------------------- types

    def register(self, rt: ResourceType) -> None:
        self._types[(rt.group, rt.version, rt.plural)] = rt
        self._objects.setdefault(rt.key, {})

    def types(self) -> list[ResourceType]:
        return list(self._types.values())

    def type(self, group: str, version: str, plural: str) -> ResourceType:
        try:
            return self._types[(group, version, plural)]
        except KeyError:
            raise ApiError(Reason.NOT_FOUND, "the server could not find the requested resource") from None

    def type_for_kind(self, api_version: str, kind: str) -> ResourceType:
        group, _, version = api_version.rpartition("/")
        for rt in self._types.values():
            if rt.group == group and rt.version == version and rt.kind == kind:
                return rt
        raise ApiError(Reason.NOT_FOUND, f"no kind {kind} is registered for version {api_version}")

    def _sync_crd(self, crd: Obj | None, old: Obj | None) -> None:
        """A CRD's served versions become (or stop being) ResourceTypes, as the apiextensions server does."""
        if old is not None:
            for rt in types_from_crd(old):
                self._types.pop((rt.group, rt.version, rt.plural), None)
        if crd is not None and crd["metadata"].get("deletionTimestamp") is None:
            for rt in types_from_crd(crd):
                self.register(rt)
        elif old is not None:
            group, plural = old["spec"]["group"], old["spec"]["names"]["plural"]
            if not any(rt.key == (group, plural) for rt in self._types.values()):
                for obj in list(self._objects.get((group, plural), {}).values()):
                    self._remove((group, plural), obj)

    # ------------------------------------------------------------------------------------------- reads

    def now(self) -> datetime:
        return self.clock()

    def _bucket(self, rt: ResourceType | tuple[str, str]) -> dict[tuple[str, str], Obj]:
        key = rt.key if isinstance(rt, ResourceType) else rt
        return self._objects.setdefault(key, {})

    def find(self, rt: ResourceType, namespace: str | None, name: str) -> Obj | None:
        """The stored object (not a copy: for in-process readers that do not mutate it), or None."""
        return self._bucket(rt).get((namespace or "" if rt.namespaced else "", name))

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.find(rt, namespace, name)
        if obj is None:
            raise not_found(rt.plural, name, rt.group)
        return self._view(rt, obj)

    def _view(self, rt: ResourceType, obj: Obj) -> Obj:
        view = copy.deepcopy(obj)
        view["apiVersion"], view["kind"] = rt.api_version, rt.kind
        return view

    def iter(
        self,
        rt: ResourceType | tuple[str, str],
        namespace: str | None = None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
    ) -> Iterator[Obj]:
        """Stored objects (not copies), sorted by namespace and name."""
        bucket = self._bucket(rt)
        for (ns, _name), obj in sorted(bucket.items()):
            if namespace is not None and ns != namespace:
                continue
            if labels is not None and not labels.matches(obj["metadata"].get("labels")):
                continue
            if fields is not None and not fields.matches(obj):
                continue
            yield obj

    def list(
        self,
        rt: ResourceType,
        namespace: str | None = None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
    ) -> Obj:
        items = [self._view(rt, o) for o in self.iter(rt, namespace, labels, fields)]
        return {
            "apiVersion": rt.api_version,
            "kind": rt.list_kind,
            "metadata": {"resourceVersion": str(self.resource_version)},
            "items": items,
        }

    def uid_exists(self, uid: str) -> bool:
        return any(o["metadata"].get("uid") == uid for b in self._objects.values() for o in b.values())

    # ------------------------------------------------------------------------------------------- events

    def _emit(self, type_: EventType, key: tuple[str, str], obj: Obj, old: Obj | None) -> None:
        event = StoredEvent(self.resource_version, type_, key, copy.deepcopy(obj), old)
        self.history.append(event)
        while len(self.history) > self.history_limit:
            dropped = self.history.popleft()
            self.oldest_resumable = dropped.rv
        for watcher in list(self.watchers):
            watcher.offer(event)
        for listener in list(self.listeners):
            listener(event)

    def _bump(self) -> str:
        self.resource_version += 1
        return str(self.resource_version)

    def compact(self) -> None:
        """Forget the watch history: a watch resuming from any earlier resourceVersion gets 410 Expired."""
        self.history.clear()
        self.oldest_resumable = self.resource_version

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        resource_version: str | None,
    ) -> Watcher:
        """Open a watch; its queue first holds the synthetic ADDED (no/zero rv) or the replayed history."""
        watcher = Watcher(rt.key, namespace, labels, fields)
        if resource_version in (None, "", "0"):
            for obj in self.iter(rt, namespace, labels, fields):
                watcher.queue.put_nowait(StoredEvent(self.resource_version, EventType.ADDED, rt.key, obj, None))
        else:
            try:
                since = int(resource_version)
            except ValueError:
                raise bad_request(f'invalid resource version "{resource_version}"') from None
            if since < self.oldest_resumable:
                raise gone(f"too old resource version: {since} ({self.oldest_resumable + 1})")
            for event in self.history:
                if event.rv > since:
                    watcher.offer(event)
        self.watchers.add(watcher)
        return watcher

    def unwatch(self, watcher: Watcher) -> None:
        self.watchers.discard(watcher)

    def expire_watches(self) -> None:
        for watcher in list(self.watchers):
            watcher.close()
        self.watchers.clear()

    # ------------------------------------------------------------------------------------------- writes

    def _check_namespace(self, rt: ResourceType, namespace: str | None) -> None:
        if not rt.namespaced:
            return
        ns = self.find(self.type("", "v1", "namespaces"), None, namespace or "")
        if ns is None:
            raise not_found("namespaces", namespace or "")
        if ns["metadata"].get("deletionTimestamp"):
            raise ApiError(
                Reason.FORBIDDEN,
                f"{rt.plural} is forbidden: unable to create new content in namespace {namespace} "
                "because it is being terminated",
            )

    def _schema_pass(self, rt: ResourceType, obj: Obj, validation: FieldValidation, warnings: list[str] | None) -> Obj:
        """Prune, default and validate a custom resource against its structural schema."""
        if rt.schema is None:
            return obj
        pruned, unknown = schema.prune(obj, rt.schema)
        if unknown and validation == FieldValidation.STRICT:
            listed = ", ".join(f'unknown field "{u}"' for u in unknown)
            raise bad_request(
                f'{rt.kind} in version "{rt.version}" cannot be handled as a {rt.kind}: strict decoding error: {listed}'
            )
        if unknown and validation == FieldValidation.WARN and warnings is not None:
            warnings.extend(f'unknown field "{u}"' for u in unknown)
        schema.apply_defaults(pruned, rt.schema)
        errors = schema.validate({k: v for k, v in pruned.items() if k not in ("metadata",)}, rt.schema)
        if errors:
            raise invalid(rt.kind, pruned["metadata"].get("name", ""), errors, rt.group)
        return pruned

    def _validate(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        name = meta.get("name", "")
        pattern = DNS_LABEL if rt.plural in ("namespaces", "services") else DNS_SUBDOMAIN
        causes: list[tuple[str, str]] = []
        if not pattern.match(name) or len(name) > 253:
            causes.append(
                (
                    "metadata.name",
                    f'Invalid value: "{name}": a lowercase RFC 1123 '
                    f"{'label' if pattern is DNS_LABEL else 'subdomain'} must consist of "
                    "lower case alphanumeric characters, '-' or '.'",
                )
            )
        for value in (meta.get("labels") or {}).values():
            if not isinstance(value, str) or len(value) > 63:
                causes.append(("metadata.labels", f'Invalid value: "{value}": must be no more than 63 characters'))
        spec = obj.get("spec") or {}
        if rt.key == ("apps", "deployments"):
            selector = spec.get("selector")
            template_labels = ((spec.get("template") or {}).get("metadata") or {}).get("labels") or {}
            if not selector:
                causes.append(("spec.selector", "Required value"))
            elif not selector_from_label_selector(selector).matches(template_labels):
                causes.append(
                    (
                        "spec.template.metadata.labels",
                        f"Invalid value: {template_labels}: `selector` does not match template `labels`",
                    )
                )
            causes.extend(self._pod_spec_causes((spec.get("template") or {}).get("spec"), "spec.template.spec"))
        elif rt.key == ("batch", "jobs"):
            template_spec = (spec.get("template") or {}).get("spec") or {}
            causes.extend(self._pod_spec_causes(template_spec, "spec.template.spec"))
            if template_spec.get("restartPolicy") not in ("OnFailure", "Never"):
                causes.append(
                    (
                        "spec.template.spec.restartPolicy",
                        f"Unsupported value: "
                        f'"{template_spec.get("restartPolicy")}": '
                        'supported values: "OnFailure", "Never"',
                    )
                )
        elif rt.key == ("", "pods"):
            causes.extend(self._pod_spec_causes(spec, "spec"))
        if causes:
            raise invalid(rt.kind, name, causes, rt.group)

    @staticmethod
    def _pod_spec_causes(spec: Obj | None, path: str) -> list[tuple[str, str]]:
        containers = (spec or {}).get("containers") or []
        if not containers:
            return [(f"{path}.containers", "Required value")]
        causes = []
        for i, container in enumerate(containers):
            if not container.get("name"):
                causes.append((f"{path}.containers[{i}].name", "Required value"))
            if not container.get("image"):
                causes.append((f"{path}.containers[{i}].image", "Required value"))
        return causes

    def _default(self, rt: ResourceType, obj: Obj) -> None:
        """The built-in defaults controllers and the fake kubelet rely on (a small part of the real ones)."""
        spec = obj.get("spec")
        if rt.key == ("", "pods") and isinstance(spec, dict):
            _default_pod_spec(spec)
        elif rt.key in (("apps", "deployments"), ("batch", "jobs")) and isinstance(spec, dict):
            template = spec.setdefault("template", {})
            _default_pod_spec(template.setdefault("spec", {}))
            if rt.key == ("apps", "deployments"):
                spec.setdefault("replicas", 1)
                spec.setdefault("revisionHistoryLimit", 10)
                spec.setdefault("progressDeadlineSeconds", 600)
                strategy = spec.setdefault("strategy", {"type": "RollingUpdate"})
                if strategy.get("type", "RollingUpdate") == "RollingUpdate":
                    strategy.setdefault("type", "RollingUpdate")
                    strategy.setdefault("rollingUpdate", {"maxSurge": "25%", "maxUnavailable": "25%"})
            else:
                spec.setdefault("backoffLimit", 6)
                spec.setdefault("completions", 1)
                spec.setdefault("parallelism", 1)
        elif rt.key == ("", "namespaces"):
            obj.setdefault("spec", {"finalizers": ["kubernetes"]})
            obj["status"] = obj.get("status") or {"phase": "Active"}
        elif rt.key == ("", "services") and isinstance(spec, dict):
            spec.setdefault("type", "ClusterIP")
            spec.setdefault("sessionAffinity", "None")
            for port in spec.get("ports") or []:
                port.setdefault("protocol", "TCP")
                port.setdefault("targetPort", port.get("port"))

    def create(
        self,
        rt: ResourceType,
        namespace: str | None,
        body: Obj,
        *,
        validation: FieldValidation = FieldValidation.WARN,
        warnings: list[str] | None = None,
        dry_run: bool = False,
    ) -> Obj:
        _check_object(body)
        obj = copy.deepcopy(body)
        self._check_kind(rt, obj)
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise bad_request("metadata must be an object")
        if rt.namespaced:
            body_ns = meta.get("namespace")
            if body_ns and namespace and body_ns != namespace:
                raise bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            namespace = namespace or body_ns
            if not namespace:
                raise bad_request("the server could not find the requested resource (namespace required)")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
            namespace = None
        if not meta.get("name"):
            if meta.get("generateName"):
                for _ in range(100):
                    name = meta["generateName"] + "".join(random.choices(NAME_CHARS, k=5))
                    if self.find(rt, namespace, name) is None:
                        break
                meta["name"] = name
            else:
                raise invalid(
                    rt.kind, "", [("metadata.name", "Required value: name or generateName is required")], rt.group
                )
        name = meta["name"]
        self._check_namespace(rt, namespace)
        if self.find(rt, namespace, name) is not None:
            raise ApiError(
                Reason.ALREADY_EXISTS,
                f'{rt.qualified()} "{name}" already exists',
                group=rt.group,
                kind=rt.plural,
                name=name,
            )
        if rt.reset_status_on_create:
            obj.pop("status", None)
            if rt.key == ("", "pods"):
                obj["status"] = {"phase": "Pending", "qosClass": _qos_class(obj.get("spec") or {})}
            elif rt.builtin:
                obj["status"] = {}
        for volatile in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
            meta.pop(volatile, None)
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=format_time(self.now()), generation=1)
        obj = self._schema_pass(rt, obj, validation, warnings)
        self._default(rt, obj)
        self._validate(rt, obj)
        if rt.key == CRDS:
            self._validate_crd(obj)
        if dry_run:
            return self._view(rt, obj)
        obj["metadata"]["resourceVersion"] = self._bump()
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        self._bucket(rt)[(namespace or "", name)] = obj
        if rt.key == CRDS:
            self._accept_crd(obj)
        self._emit(EventType.ADDED, rt.key, obj, None)
        self._collect_garbage_of(obj)
        return self._view(rt, obj)

    def _check_kind(self, rt: ResourceType, obj: Obj) -> None:
        kind, api_version = obj.get("kind"), obj.get("apiVersion")
        if kind and kind != rt.kind:
            raise bad_request(f"the kind of the provided object ({kind}) does not match the URL's ({rt.kind})")
        if api_version and api_version != rt.api_version:
            raise bad_request(
                f"the API version in the data ({api_version}) does not match the expected API "
                f"version ({rt.api_version})"
            )

    def _validate_crd(self, crd: Obj) -> None:
        spec = crd.get("spec") or {}
        names = spec.get("names") or {}
        causes = []
        for key in ("group",):
            if not spec.get(key):
                causes.append((f"spec.{key}", "Required value"))
        for key in ("plural", "kind"):
            if not names.get(key):
                causes.append((f"spec.names.{key}", "Required value"))
        if not spec.get("versions"):
            causes.append(("spec.versions", "Required value"))
        expected = f"{names.get('plural')}.{spec.get('group')}"
        if crd["metadata"]["name"] != expected:
            causes.append(
                (
                    "metadata.name",
                    f'Invalid value: "{crd["metadata"]["name"]}": must be spec.names.plural+"."+spec.group',
                )
            )
        if causes:
            raise invalid("CustomResourceDefinition", crd["metadata"]["name"], causes, "apiextensions.k8s.io")

    def _accept_crd(self, crd: Obj) -> None:
        """The apiextensions controller's answer: Established and NamesAccepted (at once, here)."""
        now = format_time(self.now())
        names = dict(crd["spec"]["names"])
        names.setdefault("singular", names["kind"].lower())
        names.setdefault("listKind", f"{names['kind']}List")
        crd["status"] = {
            "acceptedNames": names,
            "storedVersions": [v["name"] for v in crd["spec"]["versions"] if v.get("storage")],
            "conditions": [
                {
                    "type": "NamesAccepted",
                    "status": "True",
                    "reason": "NoConflicts",
                    "message": "no conflicts found",
                    "lastTransitionTime": now,
                },
                {
                    "type": "Established",
                    "status": "True",
                    "reason": "InitialNamesAccepted",
                    "message": "the initial names have been accepted",
                    "lastTransitionTime": now,
                },
            ],
        }
        self._sync_crd(crd, None)

    def _current(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        obj = self.find(rt, namespace, name)
        if obj is None:
            raise not_found(rt.plural, name, rt.group)
        return obj

    @staticmethod
    def _check_preconditions(rt: ResourceType, current: Obj, meta: Obj, name: str) -> None:
        rv = meta.get("resourceVersion")
        if rv and rv != current["metadata"]["resourceVersion"]:
            raise conflict(rt.qualified(), name)
        uid = meta.get("uid")
        if uid and uid != current["metadata"]["uid"]:
            raise conflict(
                rt.qualified(),
                name,
                why=f"Precondition failed: UID in precondition: {uid}, UID in "
                f"object meta: {current['metadata']['uid']}",
            )

    def update(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        body: Obj,
        *,
        subresource: str | None = None,
        validation: FieldValidation = FieldValidation.WARN,
        warnings: list[str] | None = None,
        dry_run: bool = False,
    ) -> Obj:
        """PUT of the object or of its `status` subresource (scale: see `update_scale`)."""
        _check_object(body)
        current = self._current(rt, namespace, name)
        self._check_kind(rt, body)
        meta = body.get("metadata") or {}
        if meta.get("name") and meta["name"] != name:
            raise bad_request(f"the name of the object ({meta['name']}) does not match the name on the URL ({name})")
        if rt.namespaced and meta.get("namespace") and meta["namespace"] != (namespace or ""):
            raise bad_request("the namespace of the provided object does not match the namespace sent on the request")
        self._check_preconditions(rt, current, meta, name)
        if subresource == "status":
            new = copy.deepcopy(current)
            if "status" in body:
                new["status"] = copy.deepcopy(body["status"])
            else:
                new.pop("status", None)
        else:
            new = copy.deepcopy(body)
            new_meta = new.setdefault("metadata", {})
            for keep in (
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "namespace",
                "name",
                "generateName",
            ):
                if keep in current["metadata"]:
                    new_meta[keep] = current["metadata"][keep]
                else:
                    new_meta.pop(keep, None)
            if rt.status_subresource:
                if "status" in current:
                    new["status"] = copy.deepcopy(current["status"])
                else:
                    new.pop("status", None)
        return self._commit(rt, current, new, validation=validation, warnings=warnings, dry_run=dry_run)

    def _commit(
        self,
        rt: ResourceType,
        current: Obj,
        new: Obj,
        *,
        validation: FieldValidation = FieldValidation.WARN,
        warnings: list[str] | None = None,
        dry_run: bool = False,
        keep_generation: bool = False,
    ) -> Obj:
        new["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        new = self._schema_pass(rt, new, validation, warnings)
        self._default(rt, new)
        self._validate(rt, new)
        if rt.key == CRDS:
            self._validate_crd(new)
        if _content(new) != _content(current) and not keep_generation:
            new["metadata"]["generation"] = int(current["metadata"].get("generation") or 0) + 1
        if rt.key == CRDS and new.get("spec") != current.get("spec"):
            self._accept_crd(new) if not dry_run else None
            if not dry_run:
                self._sync_crd(new, current)
        if new == current or dry_run:
            return self._view(rt, new)
        meta = new["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers") and not self._awaits_kubelet(rt, new):
            meta["resourceVersion"] = self._bump()
            self._store(rt, new)
            return self._remove(rt.key, new)
        meta["resourceVersion"] = self._bump()
        self._store(rt, new)
        self._emit(EventType.MODIFIED, rt.key, new, current)
        self._collect_garbage_of(new)
        return self._view(rt, new)

    def bind(self, rt: ResourceType, obj: Obj) -> Obj:
        """Write a controller's change to the whole object (the scheduler's binding) without a generation bump."""
        meta = obj["metadata"]
        current = self._current(rt, meta.get("namespace"), meta["name"])
        return self._commit(rt, current, copy.deepcopy(obj), keep_generation=True)

    def _store(self, rt: ResourceType, obj: Obj) -> None:
        meta = obj["metadata"]
        self._bucket(rt)[(meta.get("namespace", "") if rt.namespaced else "", meta["name"])] = obj

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        patch_type: PatchType,
        patch: Any,
        *,
        subresource: str | None = None,
        validation: FieldValidation = FieldValidation.WARN,
        warnings: list[str] | None = None,
        field_manager: str | None = None,
        dry_run: bool = False,
    ) -> Obj:
        if patch_type == PatchType.STRATEGIC and not rt.builtin:
            raise ApiError(
                Reason.UNSUPPORTED_MEDIA_TYPE,
                "the body of the request was in an unknown format - accepted media types include: "
                "application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            )
        if patch_type == PatchType.APPLY:
            if not field_manager:
                raise bad_request(
                    'PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch'
                )
            if self.find(rt, namespace, name) is None and subresource is None:
                body = copy.deepcopy(patch)
                body.setdefault("metadata", {})["name"] = name
                return self.create(rt, namespace, body, validation=validation, warnings=warnings, dry_run=dry_run)
        current = self._current(rt, namespace, name)
        source = self.scale_of(rt, current) if subresource == "scale" else self._view(rt, current)
        if patch_type == PatchType.JSON:
            result = patching.json_patch(source, patch)
        elif patch_type == PatchType.MERGE:
            if not isinstance(patch, dict):
                raise bad_request("merge patch must be a JSON object")
            result = patching.merge_patch(source, patch)
        else:
            if not isinstance(patch, dict):
                raise bad_request("patch must be a JSON object")
            result = (patching.strategic_merge_patch if rt.builtin else patching.merge_patch)(source, patch)
        patched_rv = (result.get("metadata") or {}).get("resourceVersion")
        if patched_rv and patched_rv != (source.get("metadata") or {}).get("resourceVersion"):
            raise conflict(rt.qualified(), name)
        if subresource == "scale":
            return self.update_scale(rt, namespace, name, result, dry_run=dry_run)
        result.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.update(
            rt,
            namespace,
            name,
            result,
            subresource=subresource,
            validation=validation,
            warnings=warnings,
            dry_run=dry_run,
        )

    # ------------------------------------------------------------------------------------------- scale

    def scale_of(self, rt: ResourceType, obj: Obj) -> Obj:
        """The autoscaling/v1 Scale view of an object."""
        if rt.scale is None:
            raise not_found(f"{rt.plural}/scale", obj["metadata"]["name"], rt.group)
        meta = obj["metadata"]
        if rt.scale.label_selector:
            selector = jsonpath_get(obj, rt.scale.label_selector) or ""
        else:
            selector = format_label_selector((obj.get("spec") or {}).get("selector"))
        status: Obj = {"replicas": int(jsonpath_get(obj, rt.scale.status_replicas) or 0)}
        if selector:
            status["selector"] = selector
        return {
            "kind": "Scale",
            "apiVersion": "autoscaling/v1",
            "metadata": {
                k: meta[k] for k in ("name", "namespace", "uid", "resourceVersion", "creationTimestamp") if k in meta
            },
            "spec": {"replicas": int(jsonpath_get(obj, rt.scale.spec_replicas) or 0)},
            "status": status,
        }

    def get_scale(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        return self.scale_of(rt, self._current(rt, namespace, name))

    def update_scale(
        self, rt: ResourceType, namespace: str | None, name: str, body: Obj, *, dry_run: bool = False
    ) -> Obj:
        current = self._current(rt, namespace, name)
        if rt.scale is None:
            raise not_found(f"{rt.plural}/scale", name, rt.group)
        meta = body.get("metadata") or {}
        self._check_preconditions(rt, current, meta, name)
        replicas = (body.get("spec") or {}).get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 0:
            raise invalid(
                "Scale",
                name,
                [("spec.replicas", f"Invalid value: {replicas}: must be greater than or equal to 0")],
                "autoscaling",
            )
        new = copy.deepcopy(current)
        jsonpath_set(new, rt.scale.spec_replicas, replicas)
        committed = self._commit(rt, current, new, dry_run=dry_run)
        return self.scale_of(rt, committed)

    # ------------------------------------------------------------------------------------------- delete

    def _awaits_kubelet(self, rt: ResourceType, obj: Obj) -> bool:
        """A pod bound to a node stays (Terminating) until the kubelet has stopped it; a namespace stays until
        the namespace sweep has emptied it (its `spec.finalizers: [kubernetes]`)."""
        if rt.key == ("", "namespaces"):
            return True
        return (
            rt.key == ("", "pods")
            and bool((obj.get("spec") or {}).get("nodeName"))
            and int(obj["metadata"].get("deletionGracePeriodSeconds") or 0) > 0
        )

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        grace_period: int | None = None,
        propagation: str | None = None,
        preconditions: Obj | None = None,
        dry_run: bool = False,
    ) -> tuple[Obj, bool]:
        """Delete; returns (the object as it now is, whether it is gone). Finalizers and running pods delay it."""
        current = self._current(rt, namespace, name)
        self._check_preconditions(rt, current, preconditions or {}, name)
        if dry_run:
            return self._view(rt, current), False
        if propagation == "Orphan":
            self._orphan_dependents(current["metadata"]["uid"])
        elif propagation == "Foreground":
            self._delete_dependents(current["metadata"]["uid"])
        new = copy.deepcopy(current)
        meta = new["metadata"]
        if rt.key == ("", "pods") and (new.get("spec") or {}).get("nodeName"):
            default_grace = int((new.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            grace = default_grace if grace_period is None else max(0, int(grace_period))
            existing = meta.get("deletionGracePeriodSeconds")
            if existing is not None and grace >= int(existing) and grace != 0:
                return self._view(rt, current), False
            meta["deletionGracePeriodSeconds"] = grace
            meta["deletionTimestamp"] = format_time(self.now() + timedelta(seconds=grace))
            if grace == 0 and not meta.get("finalizers"):
                return self._remove(rt.key, new), True
            return self._commit(rt, current, new), False
        if meta.get("finalizers"):
            if not meta.get("deletionTimestamp"):
                meta["deletionTimestamp"] = format_time(self.now())
                meta["deletionGracePeriodSeconds"] = 0
                if rt.key == ("", "namespaces"):
                    new.setdefault("status", {})["phase"] = "Terminating"
                return self._commit(rt, current, new), False
            return self._view(rt, current), False
        if rt.key == ("", "namespaces"):
            return self._delete_namespace(rt, current)
        return self._remove(rt.key, current), True

    def _delete_namespace(self, rt: ResourceType, current: Obj) -> tuple[Obj, bool]:
        name = current["metadata"]["name"]
        new = copy.deepcopy(current)
        new["metadata"]["deletionTimestamp"] = format_time(self.now())
        new["status"] = {"phase": "Terminating"}
        self._commit(rt, current, new)
        self._namespace_sweep(name)
        ns = self.find(rt, None, name)
        return (self._view(rt, ns), False) if ns is not None else (self._view(rt, new), True)

    def _namespace_sweep(self, namespace: str) -> None:
        """The namespace controller: delete what is in a Terminating namespace, then the namespace itself."""
        ns_type = self.type("", "v1", "namespaces")
        ns = self.find(ns_type, None, namespace)
        if ns is None or not ns["metadata"].get("deletionTimestamp") or namespace in self._sweeping:
            return
        self._sweeping.add(namespace)
        try:
            namespaced = {t.key: t for t in self._types.values() if t.namespaced}.values()
            for rt in namespaced:
                for obj in list(self.iter(rt, namespace)):
                    name = obj["metadata"]["name"]
                    if self.find(rt, namespace, name) is not None and not obj["metadata"].get("deletionTimestamp"):
                        self.delete(rt, namespace, name)
            if not any(True for rt in namespaced for _ in self.iter(rt, namespace)):
                self._remove(ns_type.key, ns)
        finally:
            self._sweeping.discard(namespace)

    def _remove(self, key: tuple[str, str], obj: Obj) -> Obj:
        """Take the object out for good: the DELETED event, then garbage collection of its dependents."""
        meta = obj["metadata"]
        bucket = self._bucket(key)
        stored_key = (meta.get("namespace", ""), meta["name"])
        if stored_key not in bucket:
            stored_key = ("", meta["name"])
        if bucket.pop(stored_key, None) is None:
            return obj
        gone_obj = copy.deepcopy(obj)
        gone_obj["metadata"]["resourceVersion"] = self._bump()
        self._emit(EventType.DELETED, key, gone_obj, None)
        if key == CRDS:
            self._sync_crd(None, obj)
        self._collect_garbage(meta["uid"])
        if meta.get("namespace"):
            self._namespace_sweep(meta["namespace"])
        return copy.deepcopy(gone_obj)

    def remove(self, rt: ResourceType, namespace: str | None, name: str) -> Obj:
        """Remove at once, whatever finalizers or grace periods say (the kubelet's last word on a pod)."""
        return self._remove(rt.key, self._current(rt, namespace, name))

    def _dependents(self, uid: str) -> list[tuple[tuple[str, str], Obj]]:
        found = []
        for key, bucket in self._objects.items():
            for obj in bucket.values():
                if any(ref.get("uid") == uid for ref in obj["metadata"].get("ownerReferences") or []):
                    found.append((key, obj))
        return found

    def _type_by_key(self, key: tuple[str, str]) -> ResourceType:
        return next(t for t in self._types.values() if t.key == key)

    def _orphan_dependents(self, uid: str) -> None:
        for key, obj in self._dependents(uid):
            new = copy.deepcopy(obj)
            new["metadata"]["ownerReferences"] = [r for r in obj["metadata"]["ownerReferences"] if r.get("uid") != uid]
            if not new["metadata"]["ownerReferences"]:
                del new["metadata"]["ownerReferences"]
            self._commit(self._type_by_key(key), obj, new)

    def _delete_dependents(self, uid: str) -> None:
        for key, obj in self._dependents(uid):
            meta = obj["metadata"]
            rt = self._type_by_key(key)
            if not meta.get("deletionTimestamp") and self.find(rt, meta.get("namespace"), meta["name"]) is not None:
                self.delete(rt, meta.get("namespace"), meta["name"], propagation="Foreground")

    def _collect_garbage(self, uid: str) -> None:
        """Background cascade: a dependent whose owners are all gone is deleted; a dead owner's ref is dropped."""
        for key, stale in self._dependents(uid):
            rt = self._type_by_key(key)
            found = self.find(rt, stale["metadata"].get("namespace"), stale["metadata"]["name"])
            if found is None or found["metadata"].get("deletionTimestamp"):
                continue
            obj, meta = found, found["metadata"]
            live = [r for r in meta.get("ownerReferences") or [] if self.uid_exists(r.get("uid", ""))]
            if live:
                new = copy.deepcopy(obj)
                new["metadata"]["ownerReferences"] = live
                self._commit(rt, obj, new)
            else:
                self.delete(rt, meta.get("namespace"), meta["name"])

    def _collect_garbage_of(self, obj: Obj) -> None:
        """An object created or updated with owners that no longer exist is collected, as the GC would."""
        refs = obj["metadata"].get("ownerReferences") or []
        if refs and not any(self.uid_exists(r.get("uid", "")) for r in refs):
            rt = self._type_by_key((obj["apiVersion"].rpartition("/")[0], self._plural_of(obj)))
            if not obj["metadata"].get("deletionTimestamp"):
                self.delete(rt, obj["metadata"].get("namespace"), obj["metadata"]["name"])

    def _plural_of(self, obj: Obj) -> str:
        group = obj["apiVersion"].rpartition("/")[0]
        return next(t.plural for t in self._types.values() if t.group == group and t.kind == obj["kind"])


def _default_pod_spec(spec: Obj) -> None:
    spec.setdefault("restartPolicy", "Always")
    spec.setdefault("terminationGracePeriodSeconds", 30)
    spec.setdefault("dnsPolicy", "ClusterFirst")
    spec.setdefault("schedulerName", "default-scheduler")
    for container in (spec.get("containers") or []) + (spec.get("initContainers") or []):
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        container.setdefault("terminationMessagePolicy", "File")
        image = str(container.get("image") or "")
        latest = ":" not in image.rsplit("/", 1)[-1] or image.endswith(":latest")
        container.setdefault("imagePullPolicy", "Always" if latest else "IfNotPresent")
        for port in container.get("ports") or []:
            port.setdefault("protocol", "TCP")
        for kind in ("readinessProbe", "livenessProbe", "startupProbe"):
            probe = container.get(kind)
            if isinstance(probe, dict):
                probe.setdefault("timeoutSeconds", 1)
                probe.setdefault("periodSeconds", 10)
                probe.setdefault("successThreshold", 1)
                probe.setdefault("failureThreshold", 3)
                if isinstance(probe.get("httpGet"), dict):
                    probe["httpGet"].setdefault("scheme", "HTTP")


def _qos_class(spec: Obj) -> str:
    containers = spec.get("containers") or []
    resources = [c.get("resources") or {} for c in containers]
    if not any(r.get("requests") or r.get("limits") for r in resources):
        return "BestEffort"
    guaranteed = all(
        r.get("limits")
        and all(r.get("limits", {}).get(k) == v for k, v in (r.get("requests") or {}).items())
        and {"cpu", "memory"} <= set(r.get("limits", {}))
        for r in resources
    )
    return "Guaranteed" if guaranteed else "Burstable"
