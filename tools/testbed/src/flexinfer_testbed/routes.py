"""Routes as the scheduler writes them, for the tests and benches that play the scheduler."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TypedDict

from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.enums import ModelPhase, SharedState
from flexinfer_common.messages import Route

__all__ = ["RouteFields", "make_route", "write_route"]


class RouteFields(TypedDict, total=False):
    """``make_route``'s options, for a helper that passes them on (``**fields: Unpack[RouteFields]``)."""

    endpoint: str | None
    failure: str | None
    labels: tuple[str, ...]
    namespace: str
    phase: ModelPhase | None
    state: SharedState | None


def make_route(
    name: str,
    *,
    endpoint: str | None = None,
    failure: str | None = None,
    labels: tuple[str, ...] = (),
    namespace: str = "default",
    phase: ModelPhase | None = None,
    state: SharedState | None = None,
) -> Route:
    """A route Ready at ``endpoint``; with none, parked (Idle), or Failed with ``failure``.

    ``phase`` and ``state`` replace what the endpoint implies (a Loading model is Active but not Ready yet)."""
    ready = endpoint is not None
    return Route(
        namespace=namespace,
        name=name,
        service_labels=list(labels),
        ready=ready,
        endpoint=endpoint,
        failure=failure,
        phase=phase or (ModelPhase.READY if ready else ModelPhase.FAILED if failure else ModelPhase.IDLE),
        state=state or (SharedState.ACTIVE if ready else SharedState.PARKED),
        updated_at=datetime.now(UTC),
    )


async def write_route(bus: Bus, route: Route) -> Route:
    """Put ``route`` into the routes bucket, as the scheduler does (a proxy's watch delivers it a moment later)."""
    kv = await bus.routes()
    await kv.put(subjects.route_key(route.namespace, route.name), route.to_bytes())
    return route
