"""Kubernetes Events on the resources a service acts on, so ``kubectl describe`` tells what FlexInfer did and why.

As client-go's recorder does, an Event identical to one recorded in the last ten minutes is not created again:
its ``count`` and ``lastTimestamp`` move instead. Recording never blocks the caller and never raises: an Event that
cannot be written is logged and dropped (it is a report, not state).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from datetime import UTC, datetime

from flexinfer_common.kube.client import EVENTS, KubeClient, KubeError, kube_time
from flexinfer_common.kube.informer import Informer
from flexinfer_common.logs import get_logger
from flexinfer_common.notes import Note

log = get_logger("flexinfer.kube.events")

_SERIES_WINDOW = 600.0
_REMEMBERED = 1024
_MAX_MESSAGE = 1024

NoteKey = tuple[str, str, str, str, str, str]


class EventRecorder:
    def __init__(
        self,
        client: KubeClient,
        *,
        informers: dict[str, Informer],
        instance: str,
        component: str,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.client = client
        self.informers = informers  # by kind: where an involved object's uid (and apiVersion) is found
        self.instance = instance
        self.component = component
        self._monotonic = monotonic
        self._recent: OrderedDict[NoteKey, tuple[str, int, float]] = OrderedDict()
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock = asyncio.Lock()

    def record(self, note: Note) -> None:
        """Write the Event in the background."""
        task = asyncio.create_task(self._write(note), name=f"event:{note.namespace}/{note.name}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def flush(self) -> None:
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def _write(self, note: Note) -> None:
        key: NoteKey = (note.kind, note.namespace, note.name, note.type.value, note.reason, note.message)
        now = datetime.now(UTC)
        async with self._lock:  # one writer, so two identical notes make one Event with count 2
            try:
                seen = self._recent.get(key)
                if seen is not None and self._monotonic() - seen[2] < _SERIES_WINDOW:
                    name, count, first = seen
                    await self.client.patch(
                        EVENTS, note.namespace, name, {"count": count + 1, "lastTimestamp": kube_time(now)}
                    )
                    self._remember(key, (name, count + 1, first))
                    return
                informer = self.informers.get(note.kind)
                if informer is None:
                    log.error("no informer for the kind of an event; dropped", extra={"kind": note.kind})
                    return
                obj = informer.get(note.namespace, note.name) or {}
                involved = {
                    "apiVersion": informer.resource.api_version,
                    "kind": note.kind,
                    "namespace": note.namespace,
                    "name": note.name,
                }
                uid = (obj.get("metadata") or {}).get("uid")
                if uid:
                    involved["uid"] = uid
                name = f"{note.name}.{uuid.uuid4().hex[:16]}"
                await self.client.create(
                    EVENTS,
                    note.namespace,
                    {
                        "apiVersion": "v1",
                        "kind": "Event",
                        "metadata": {"name": name, "namespace": note.namespace},
                        "involvedObject": involved,
                        "type": note.type.value,
                        "reason": note.reason,
                        "message": note.message[:_MAX_MESSAGE],
                        "firstTimestamp": kube_time(now),
                        "lastTimestamp": kube_time(now),
                        "count": 1,
                        "source": {"component": self.component},
                        "reportingComponent": self.component,
                        "reportingInstance": self.instance,
                    },
                )
                self._remember(key, (name, 1, self._monotonic()))
            except KubeError as exc:
                self._recent.pop(key, None)
                log.warning(
                    "could not record an event",
                    extra={
                        "object": f"{note.kind} {note.namespace}/{note.name}",
                        "reason": note.reason,
                        "error": str(exc),
                    },
                )

    def _remember(self, key: NoteKey, value: tuple[str, int, float]) -> None:
        self._recent[key] = value
        self._recent.move_to_end(key)
        while len(self._recent) > _REMEMBERED:
            self._recent.popitem(last=False)
