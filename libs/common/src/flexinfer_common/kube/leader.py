"""One active replica: leader election on a ``coordination.k8s.io/v1`` Lease, as client-go does it.

Every ``retry_period`` each replica reads the Lease. The holder renews it; another replica takes it over only when
the record has not changed for ``lease_duration`` *by its own clock* (timestamps written by another machine are
never compared with ours, so clock skew cannot split the brain). Writes are conditional on the resourceVersion read,
so two replicas racing for an expired lease cannot both win. A leader that has not renewed within
``renew_deadline`` (shorter than ``lease_duration``) stops acting before anyone may take over. On a clean shutdown
the leader releases the Lease so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum

from flexinfer_common.kube.client import LEASES, KubeClient, KubeError, Object, kube_time
from flexinfer_common.logs import get_logger
from flexinfer_common.settings import KubernetesSettings

log = get_logger("flexinfer.kube.leader")


class LeaderAction(StrEnum):
    CREATE = "create"  # there is no Lease: create it, holding it
    RENEW = "renew"  # we hold it: renew it
    TAKE_OVER = "take-over"  # its holder let it lapse or released it: take it
    FOLLOW = "follow"  # someone else holds it and renews it


@dataclass(frozen=True)
class LeaseRecord:
    holder: str
    lease_duration: float
    transitions: int
    resource_version: str

    @classmethod
    def of(cls, lease: Object) -> LeaseRecord:
        spec = lease.get("spec") or {}
        return cls(
            holder=str(spec.get("holderIdentity") or ""),
            lease_duration=float(spec.get("leaseDurationSeconds") or 0),
            transitions=int(spec.get("leaseTransitions") or 0),
            resource_version=str((lease.get("metadata") or {}).get("resourceVersion") or ""),
        )


def decide(record: LeaseRecord | None, *, me: str, unchanged_for: float) -> LeaderAction:
    """What to do with the Lease as read now; ``unchanged_for``: seconds (our clock) since it last changed."""
    if record is None:
        return LeaderAction.CREATE
    if record.holder == me:
        return LeaderAction.RENEW
    if not record.holder or unchanged_for >= record.lease_duration:
        return LeaderAction.TAKE_OVER
    return LeaderAction.FOLLOW


class LeaderElector:
    """Runs the election until ``stop``; calls ``on_started_leading`` / ``on_stopped_leading`` as it wins and loses."""

    def __init__(
        self,
        client: KubeClient,
        *,
        namespace: str,
        name: str,
        identity: str,
        lease_duration: float,
        renew_deadline: float,
        retry_period: float,
        on_started_leading: Callable[[], Awaitable[None]],
        on_stopped_leading: Callable[[], Awaitable[None]],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if not retry_period < renew_deadline < lease_duration:
            raise ValueError("leader election needs retry period < renew deadline < lease duration")
        self.client = client
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.lease_duration = lease_duration
        self.renew_deadline = renew_deadline
        self.retry_period = retry_period
        self._started = on_started_leading
        self._stopped = on_stopped_leading
        self._monotonic = monotonic
        self.is_leader = False
        self._seen: tuple[str, str] | None = None
        self._seen_at = 0.0
        self._renewed_at = 0.0

    @property
    def where(self) -> dict[str, str]:
        return {"lease": f"{self.namespace}/{self.name}", "identity": self.identity}

    async def run(self, stop: asyncio.Event) -> None:
        try:
            while not stop.is_set():
                await self.step()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.retry_period)
        finally:
            if self.is_leader:
                await self._release()
                await self._lose("shutting down")

    async def step(self) -> None:
        """One round: read, decide, write."""
        now = self._monotonic()
        try:
            lease = await self.client.get_or_none(LEASES, self.namespace, self.name)
            record = LeaseRecord.of(lease) if lease is not None else None
            if record is not None:
                fingerprint = (record.holder, record.resource_version)
                if fingerprint != self._seen:
                    self._seen, self._seen_at = fingerprint, now
            action = decide(record, me=self.identity, unchanged_for=now - self._seen_at)
            if action is LeaderAction.FOLLOW:
                if self.is_leader:
                    await self._lose(f"the lease is held by {record.holder if record else '?'}")
                return
            await self._write(action, lease, record)
            self._renewed_at = now
            if not self.is_leader:
                self.is_leader = True
                log.info("leading", extra={**self.where, "action": action.value})
                await self._started()
        except KubeError as exc:
            if exc.conflict:
                log.info("lost a race for the lease", extra=self.where)
            else:
                log.warning("leader election: cannot reach the lease", extra={**self.where, "error": str(exc)})
        if self.is_leader and now - self._renewed_at > self.renew_deadline:
            await self._lose(f"could not renew the lease within {self.renew_deadline:g}s")

    async def _write(self, action: LeaderAction, lease: Object | None, record: LeaseRecord | None) -> None:
        now = kube_time(datetime.now(UTC), micro=True)
        spec: Object = {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "renewTime": now,
        }
        if action is LeaderAction.CREATE:
            body = {
                "apiVersion": LEASES.api_version,
                "kind": LEASES.kind,
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": {**spec, "acquireTime": now, "leaseTransitions": 0},
            }
            await self.client.create(LEASES, self.namespace, body)
            return
        assert lease is not None and record is not None
        new_spec: Object = {**(lease.get("spec") or {}), **spec}
        if action is LeaderAction.TAKE_OVER:
            new_spec["acquireTime"] = now
            new_spec["leaseTransitions"] = record.transitions + 1
        await self.client.replace(LEASES, self.namespace, self.name, {**lease, "spec": new_spec})

    async def _release(self) -> None:
        """Hand the lease back so a standby need not wait for it to lapse."""
        try:
            lease = await self.client.get_or_none(LEASES, self.namespace, self.name)
            if lease is None or LeaseRecord.of(lease).holder != self.identity:
                return
            spec = {**(lease.get("spec") or {}), "holderIdentity": None, "leaseDurationSeconds": 1}
            await self.client.replace(LEASES, self.namespace, self.name, {**lease, "spec": spec})
            log.info("released the lease", extra=self.where)
        except KubeError as exc:
            log.warning("could not release the lease", extra={**self.where, "error": str(exc)})

    async def _lose(self, why: str) -> None:
        if not self.is_leader:
            return
        self.is_leader = False
        log.warning("no longer leading", extra={**self.where, "reason": why})
        await self._stopped()


async def act_while_leading(
    client: KubeClient,
    settings: KubernetesSettings,
    *,
    lease_name: str,
    identity: str,
    namespace: str,
    start_acting: Callable[[], Awaitable[None]],
    stop_acting: Callable[[], Awaitable[None]],
    stop: asyncio.Event,
) -> None:
    """Act while this replica holds the ``lease_name`` Lease (in ``FLEXINFER_LEADER_ELECTION_NAMESPACE``, else
    ``namespace``), or at once with ``FLEXINFER_LEADER_ELECTION=false``, until ``stop``; never acting afterwards."""
    if not settings.leader_election:
        await start_acting()
        try:
            await stop.wait()
        finally:
            await stop_acting()
        return
    elector = LeaderElector(
        client,
        namespace=settings.leader_election_namespace or namespace,
        name=lease_name,
        identity=identity,
        lease_duration=settings.leader_lease_duration.total_seconds(),
        renew_deadline=settings.leader_renew_deadline.total_seconds(),
        retry_period=settings.leader_retry_period.total_seconds(),
        on_started_leading=start_acting,
        on_stopped_leading=stop_acting,
    )
    log.info("standing by for the leader lease", extra=elector.where)
    try:
        await elector.run(stop)
    finally:
        await stop_acting()
