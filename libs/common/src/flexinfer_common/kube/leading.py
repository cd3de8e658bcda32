"""What acts only while this replica leads (a ``coordination.k8s.io`` Lease, so one replica acts at a time): the
shape the actuator's and the lease manager's Kubernetes modes share. A subclass says what it builds and starts when
it begins leading (``_begin``, which sets ``term``) and how it stops it (``_end``); this class runs the election and
makes starting and stopping one at a time and once each."""

from __future__ import annotations

import asyncio
from typing import Generic, TypeVar

from flexinfer_common.kube.client import KubeClient, own_namespace
from flexinfer_common.kube.leader import act_while_leading
from flexinfer_common.settings import KubernetesSettings

T = TypeVar("T")


class Leading(Generic[T]):
    def __init__(self, client: KubeClient, settings: KubernetesSettings, *, lease_name: str, instance: str) -> None:
        self.client = client
        self.instance = instance
        self.namespaces = settings.namespaces()
        self.system_namespace = own_namespace(settings.namespace)
        self.term: T | None = None  # what runs while this replica leads; None while it stands by
        self._kube_settings = settings
        self._lease_name = lease_name
        self._lock = asyncio.Lock()

    async def run(self, stop: asyncio.Event) -> None:
        """Stand by for the Lease (``lease_name``, in the system namespace unless the settings name another), act
        while holding it, until ``stop``."""
        await act_while_leading(
            self.client,
            self._kube_settings,
            lease_name=self._lease_name,
            identity=self.instance,
            namespace=self.system_namespace,
            start_acting=self.start_leading,
            stop_acting=self.stop_leading,
            stop=stop,
        )

    async def start_leading(self) -> None:
        async with self._lock:
            if self.term is None:
                await self._begin()

    async def stop_leading(self) -> None:
        async with self._lock:
            term, self.term = self.term, None
            if term is not None:
                await self._end(term)

    async def _begin(self) -> None:
        """Build and start what runs while leading, and set ``term`` to it."""
        raise NotImplementedError

    async def _end(self, term: T) -> None:
        """Stop what ``_begin`` started (``term`` is None already)."""
        raise NotImplementedError
