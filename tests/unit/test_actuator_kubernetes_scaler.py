"""The Kubernetes back-end between its watches and its writes: changes to a Deployment arrive in bursts and are judged
together, and someone else's scale must still be told apart from ours (a cluster-free test: the watches are fakes)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from flexinfer_actuator.adapters.kubernetes import KubernetesScaler
from flexinfer_actuator.domain.processes import Observation
from flexinfer_common.enums import RuntimePhase
from flexinfer_common.messages import RuntimeSpec
from flexinfer_common.notes import Note


class Watched:
    """An informer's cache and its change handlers, changed by the test instead of a watch."""

    def __init__(self, *objects: dict[str, Any]) -> None:
        self.cache = {(o["metadata"]["namespace"], o["metadata"]["name"]): o for o in objects}
        self._handlers: list[Callable[[str, dict[str, Any]], None]] = []

    def on_change(self, handler: Callable[[str, dict[str, Any]], None]) -> None:
        self._handlers.append(handler)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.cache.get((namespace, name))

    async def wait_synced(self) -> None:
        return None

    def change(self, obj: dict[str, Any]) -> None:
        obj = copy.deepcopy(obj)
        self.cache[(obj["metadata"]["namespace"], obj["metadata"]["name"])] = obj
        for handler in self._handlers:
            handler("MODIFIED", obj)


class ApiServer:
    """Takes the scale writes: each is applied to the watched Deployment only when the test says it is delivered."""

    def __init__(self) -> None:
        self.writes: asyncio.Queue[int] = asyncio.Queue()

    async def patch(self, _: object, namespace: str, name: str, body: dict[str, Any], **__: object) -> None:
        await self.writes.put(body["spec"]["replicas"])


class Recorder:
    def __init__(self) -> None:
        self.notes: asyncio.Queue[Note] = asyncio.Queue()

    def record(self, note: Note) -> None:
        self.notes.put_nowait(note)


def deployment(replicas: int) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": "b"},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": "b"}}},
    }


async def test_a_hand_scale_right_after_our_scale_back_is_caught_again() -> None:
    deployments, server, recorder = Watched(deployment(0)), ApiServer(), Recorder()
    statuses: list[Observation] = []

    async def on_status(observation: Observation) -> None:
        statuses.append(observation)

    scaler = KubernetesScaler(
        client=server,  # type: ignore[arg-type]
        deployments=deployments,  # type: ignore[arg-type]
        pods=Watched(),  # type: ignore[arg-type]
        on_status=on_status,
        load_timeout=timedelta(minutes=5),
        events=recorder,  # type: ignore[arg-type]
    )
    try:
        await scaler.park(RuntimeSpec(namespace="ml", name="b"), generation=1)
        assert statuses[-1].phase is RuntimePhase.PARKED

        deployments.change(deployment(1))  # scaled up by hand
        note = await asyncio.wait_for(recorder.notes.get(), 5)
        assert note.reason == "ScaledOutsideFlexInfer" and "scaled to 1 outside FlexInfer" in note.message
        assert await asyncio.wait_for(server.writes.get(), 5) == 0

        # Our scale-back lands and is followed at once by a second hand scale: both changes arrive before the
        # back-end looks again, so it sees only the second, and must still take it for someone else's.
        deployments.change(deployment(0))
        deployments.change(deployment(1))
        note = await asyncio.wait_for(recorder.notes.get(), 5)
        assert note.reason == "ScaledOutsideFlexInfer"
        assert await asyncio.wait_for(server.writes.get(), 5) == 0
    finally:
        await scaler.close()
