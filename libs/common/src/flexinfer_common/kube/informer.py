"""A watched cache of one kind of Kubernetes object: list, then watch from the list's resourceVersion.

Nothing is lost when a watch ends: a stream that times out is resumed from the last resourceVersion seen (bookmarks
included); a resume the server refuses with 410 Gone, and an API server that could not be reached, end in a fresh
list whose difference from the cache is handed on as ADDED / MODIFIED / DELETED, exactly as if the watch had seen
it. Handlers are plain functions called in order on the event loop; they must not block (they queue work).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from flexinfer_common.kube.client import KubeClient, KubeError, Object, Resource
from flexinfer_common.logs import get_logger

log = get_logger("flexinfer.kube.informer")

ADDED, MODIFIED, DELETED = "ADDED", "MODIFIED", "DELETED"

ObjectKey = tuple[str, str]
ChangeHandler = Callable[[str, Object], None]
"""``(event type, object)``; for DELETED the last state known."""
SyncHandler = Callable[[str | None, list[Object]], None]
"""``(namespace or None for all, every object listed)`` after each successful (re)list."""


def object_key(obj: Object) -> ObjectKey:
    meta = obj.get("metadata") or {}
    return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))


def resource_version(obj: Object) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or "")


def diff(cache: dict[ObjectKey, Object], listed: Iterable[Object]) -> list[tuple[str, Object]]:
    """The changes that turn ``cache`` into ``listed`` (pure): new objects ADDED, changed resourceVersions MODIFIED,
    missing ones DELETED (with their last known state)."""
    fresh = {object_key(obj): obj for obj in listed}
    changes: list[tuple[str, Object]] = []
    for key, obj in fresh.items():
        old = cache.get(key)
        if old is None:
            changes.append((ADDED, obj))
        elif resource_version(old) != resource_version(obj):
            changes.append((MODIFIED, obj))
    changes.extend((DELETED, old) for key, old in cache.items() if key not in fresh)
    return changes


@dataclass
class _Scope:
    namespace: str | None
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    keys: set[ObjectKey] = field(default_factory=set)


class Informer:
    """Keeps ``cache`` equal to the API server's objects of ``resource`` in ``namespaces`` (None: all namespaces)."""

    def __init__(
        self,
        client: KubeClient,
        resource: Resource,
        namespaces: list[str] | None = None,
        *,
        label_selector: str | None = None,
        watch_timeout: int = 300,
        retry_initial: float = 0.5,
        retry_max: float = 15.0,
    ) -> None:
        self.client = client
        self.resource = resource
        self.label_selector = label_selector
        self.watch_timeout = watch_timeout
        self.retry_initial = retry_initial
        self.retry_max = retry_max
        self.cache: dict[ObjectKey, Object] = {}
        self._scopes = [_Scope(ns) for ns in namespaces] if namespaces else [_Scope(None)]
        self._on_change: list[ChangeHandler] = []
        self._on_sync: list[SyncHandler] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.relists = 0

    def on_change(self, handler: ChangeHandler) -> None:
        self._on_change.append(handler)

    def on_sync(self, handler: SyncHandler) -> None:
        self._on_sync.append(handler)

    def get(self, namespace: str, name: str) -> Object | None:
        return self.cache.get((namespace, name))

    def objects(self) -> list[Object]:
        return list(self.cache.values())

    @property
    def synced(self) -> bool:
        return all(scope.synced.is_set() for scope in self._scopes)

    async def wait_synced(self) -> None:
        for scope in self._scopes:
            await scope.synced.wait()

    def start(self) -> None:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._run(scope), name=f"informer:{self.resource.plural}:{scope.namespace or '*'}")
                for scope in self._scopes
            ]

    async def stop(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ------------------------------------------------------------------ list + watch

    async def _run(self, scope: _Scope) -> None:
        version: str | None = None
        delay = self.retry_initial
        where = {"resource": self.resource.plural, "namespace": scope.namespace or "(all)"}
        while True:
            try:
                if version is None:
                    listed, version = await self.client.list(
                        self.resource, scope.namespace, label_selector=self.label_selector
                    )
                    self._relisted(scope, listed)
                    delay = self.retry_initial
                async for event in self.client.watch(
                    self.resource,
                    scope.namespace,
                    resource_version=version,
                    timeout_seconds=self.watch_timeout,
                    label_selector=self.label_selector,
                ):
                    version = resource_version(event.object) or version
                    if event.type in (ADDED, MODIFIED, DELETED):
                        self._apply(scope, event.type, event.object)
                    delay = self.retry_initial
            except asyncio.CancelledError:
                raise
            except KubeError as exc:
                if exc.gone:
                    log.info("watch expired (410 Gone); listing again", extra=where)
                    version = None
                    continue
                log.warning("watch failed; retrying", extra={**where, "error": str(exc), "retry_in": round(delay, 2)})
                if exc.status != 0:
                    version = None  # an unexpected answer: start over from a list
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max)
            except Exception:
                log.exception("informer failed; listing again", extra=where)
                version = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.retry_max)

    def _relisted(self, scope: _Scope, listed: list[Object]) -> None:
        self.relists += 1
        mine = {key: self.cache[key] for key in scope.keys if key in self.cache}
        for kind, obj in diff(mine, listed):
            self._apply(scope, kind, obj)
        scope.synced.set()
        for handler in self._on_sync:
            self._call(handler, scope.namespace, listed)

    def _apply(self, scope: _Scope, kind: str, obj: Object) -> None:
        key = object_key(obj)
        if kind == DELETED:
            self.cache.pop(key, None)
            scope.keys.discard(key)
        else:
            self.cache[key] = obj
            scope.keys.add(key)
        for handler in self._on_change:
            self._call(handler, kind, obj)

    def _call(self, handler: Callable[..., None], *args: object) -> None:
        try:
            handler(*args)
        except Exception:
            log.exception("informer handler failed", extra={"resource": self.resource.plural})
