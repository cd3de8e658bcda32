"""The proxy's ports: what its adapters need from the rest of the service and from the bus (each service that has
ports keeps them in ``ports.py``; the ones every service shares are in :mod:`flexinfer_common.ports`)."""

from __future__ import annotations

from typing import Protocol

from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Route
from flexinfer_common.ports import Publisher


class DemandPublisher(Publisher, Protocol):
    """What the demand signaller needs from the bus (``flexinfer_common.bus.Bus`` fits): publishing, and whether the
    bus is connected now."""

    @property
    def connected(self) -> bool: ...


class RouteSink(Protocol):
    """Where route updates go (the proxy's route table plus its queues)."""

    def replace_routes(self, routes: list[Route]) -> None: ...

    def put_route(self, route: Route) -> None: ...

    def remove_route(self, key: ModelKey) -> None: ...
