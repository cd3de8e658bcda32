"""The lease manager's core: the lease operations the API calls (acquire, renew, release) and the reconcile loop
(observe -> decide -> apply) of the replica that acts.

Any replica serves the API: Postgres decides every race (one lease per group). One replica acts at a time (the
Kubernetes leader; the only one in local mode): it removes lapsed leases, checks whether each lease's group is parked
(Parking -> Held), keeps ``flexinfer_gpu_lease_active`` and, in Kubernetes mode, runs the GPULease sync as a step
of the same reconcile. The reconcile runs at once on a change (an API call, a scheduler status, a lease event of
another replica, a watched object) and at least every ``FLEXINFER_LEASE_REFRESH_INTERVAL``, and wakes for the
earliest expiry.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from nats.js.api import DeliverPolicy

from flexinfer_common import subjects
from flexinfer_common.bus import Bus, Consumer, Delivery, decode_json
from flexinfer_common.clock import Clock, rfc3339
from flexinfer_common.enums import LeasePhase
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import GroupStatusUpdate, LeaseEvent, LeaseRef, ModelStatusUpdate
from flexinfer_common.ports import Publisher
from flexinfer_lease_manager.adapters.store import LeaseStore
from flexinfer_lease_manager.domain.leases import (
    Lease,
    LeaseRefused,
    LeaseRequest,
    LeaseSource,
    Refusal,
    default_lease_name,
    group_leased_message,
    lease_is_expired,
    new_lease,
    park_verdict,
    renewed,
    request_problems,
    unknown_group_message,
    with_verdict,
)
from flexinfer_lease_manager.metrics import GPU_LEASE_ACQUIRED, LEASE_MANAGER_ACTING, ActiveLeases, lease_labels

log = get_logger("flexinfer.lease_manager")

ReconcileStep = Callable[[], Awaitable[None]]

MAX_WAIT = timedelta(minutes=10)
_PARKING_POLL = 1.0  # a lost status message cannot keep a lease Parking for longer than this


class ClientGone(Exception):
    """The caller of a waiting acquire disconnected before the group was free: nothing is taken for nobody."""


@dataclass(frozen=True)
class Timing:
    default_ttl: timedelta
    refresh: timedelta


def _managed_elsewhere(lease: Lease) -> str:
    where = f"{lease.namespace}/{lease.name}"
    return {
        LeaseSource.GPULEASE: f"lease {lease.name} is the GPULease {where}: delete it with "
        f"`kubectl delete gpulease -n {lease.namespace} {lease.name}`",
        LeaseSource.JOB: f"lease {lease.name} is held for the Job {lease.namespace}/{lease.owner}: it is released "
        "when the Job finishes or is deleted",
        LeaseSource.MODELCACHE: f"lease {lease.name} is held for the finetune Job of ModelCache "
        f"{lease.namespace}/{lease.owner}: it is released when the Job finishes or the ModelCache is deleted",
        LeaseSource.CONFIGMAP: f"lease {lease.name} is the legacy ConfigMap {where}: delete the ConfigMap",
    }.get(lease.source, f"lease {lease.name} is managed in Kubernetes")


class LeaseManager:
    def __init__(
        self,
        *,
        store: LeaseStore,
        bus: Publisher,
        clock: Clock,
        timing: Timing,
        lease_namespace: str,
        namespaces: list[str] | None = None,
    ) -> None:
        self.store = store
        self.bus = bus
        self.clock = clock
        self.timing = timing
        self.lease_namespace = lease_namespace
        self.namespaces = namespaces  # where leases may live (Kubernetes mode watching some namespaces); None: any
        self.acting = False
        self.steps: list[ReconcileStep] = []
        self.group_statuses: dict[str, GroupStatusUpdate] = {}
        self.active = ActiveLeases()
        self._kick = asyncio.Event()
        self._change = asyncio.Event()
        self._consumers: list[Consumer[Any]] = []
        self._parking = False
        self._next_expiry: datetime | None = None

    # ------------------------------------------------------------------ wiring

    def kick(self) -> None:
        """Reconcile now (on the acting replica)."""
        self._kick.set()

    def _notify(self) -> None:
        """Wake whoever waits for a lease to change (``acquire`` with ``wait``)."""
        self._change.set()
        self._change = asyncio.Event()

    async def _changed(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._change.wait(), seconds)

    def set_acting(self, acting: bool) -> None:
        self.acting = acting
        LEASE_MANAGER_ACTING.set(1 if acting else 0)
        if acting:
            self.kick()
        else:
            self.active.clear()

    async def start(self, bus: Bus) -> None:
        """Follow the scheduler's statuses (a member parked, the lease honoured) and other replicas' lease events."""

        def follow(stream: str, subject: str, schema: Any, handler: Any, policy: DeliverPolicy) -> Consumer[Any]:
            decode = functools.partial(decode_json, schema)
            return Consumer(
                bus,
                stream=stream,
                durable=None,
                filter_subject=subject,
                decode=decode,
                handler=handler,
                deliver_policy=policy,
            )

        statuses = subjects.MODEL_STATUS_STREAM
        self._consumers = [
            # the latest status of every group (which lease its election honours), then each new one
            follow(
                statuses,
                subjects.GROUP_STATUS_PREFIX + ".>",
                GroupStatusUpdate,
                self._on_group_status,
                DeliverPolicy.LAST_PER_SUBJECT,
            ),
            follow(
                statuses,
                subjects.MODEL_STATUS_PREFIX + ".>",
                ModelStatusUpdate,
                self._on_model_status,
                DeliverPolicy.NEW,
            ),
            follow(
                subjects.EVENTS_STREAM,
                subjects.EVENTS_PREFIX + ".lease.>",
                LeaseEvent,
                self._on_lease_event,
                DeliverPolicy.NEW,
            ),
        ]
        for consumer in self._consumers:
            await consumer.start()

    async def stop(self) -> None:
        for consumer in self._consumers:
            await consumer.stop()
        self._consumers = []

    @property
    def consuming(self) -> bool:
        return bool(self._consumers)

    async def _on_group_status(self, status: GroupStatusUpdate, _: Delivery) -> None:
        self.group_statuses[status.group] = status
        self.kick()

    async def _on_model_status(self, _: ModelStatusUpdate, __: Delivery) -> None:
        if self._parking:
            self.kick()

    async def _on_lease_event(self, _: LeaseEvent, __: Delivery) -> None:
        self._notify()
        self.kick()

    def honoured(self, group: str) -> LeaseRef | None:
        status = self.group_statuses.get(group)
        return status.lease if status is not None else None

    # ------------------------------------------------------------------ operations (any replica)

    async def leases(self) -> list[Lease]:
        return await self.store.leases()

    async def lease(self, name: str) -> Lease:
        lease = await self.store.lease(name)
        if lease is None:
            raise LeaseRefused(Refusal.NOT_FOUND, f"lease {name} not found (it was released, or it expired)")
        return lease

    async def acquire(
        self,
        request: LeaseRequest,
        *,
        wait: timedelta = timedelta(0),
        client_gone: Callable[[], Awaitable[bool]] | None = None,
    ) -> Lease:
        """Take the group (409 naming the holder when it is leased; with ``wait``, wait for it to be free), then,
        within ``wait``, wait for it to be Held."""
        per_device = await self.store.memory_per_device(request.group) if request.memory is not None else None
        problems = request_problems(request, namespaces=self.namespaces, memory_per_device=per_device)
        if problems:
            raise LeaseRefused(Refusal.INVALID, "; ".join(problems))
        known = await self.store.known_groups()
        if request.group not in known:
            raise LeaseRefused(Refusal.UNKNOWN_GROUP, unknown_group_message(request.group, known))
        name = request.name or default_lease_name(request.owner)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(wait, MAX_WAIT).total_seconds()
        while True:
            if client_gone is not None and await client_gone():
                raise ClientGone(f"the client asking for group {request.group} went away; nothing was acquired")
            now = self.clock.now()
            wanted = new_lease(
                name=name,
                namespace=request.namespace or self.lease_namespace,
                group=request.group,
                owner=request.owner,
                node=request.node,
                ttl_seconds=request.ttl_seconds or int(self.timing.default_ttl.total_seconds()),
                source=LeaseSource.API,
                now=now,
                memory=request.memory,
            )
            taken, holder, lapsed = await self.store.insert(wanted, now)
            for lease in lapsed:
                await self.ended(lease, "lease.expired", _expired_reason(lease))
            if taken is not None:
                await self.acquired(taken)
                break
            if holder is None:
                continue  # what was in the way went meanwhile: try again
            if holder.group != request.group:
                raise LeaseRefused(
                    Refusal.NAME_TAKEN,
                    f"the lease name {name} is taken by the lease of group {holder.group} (owner {holder.owner}); "
                    "give the lease another name",
                    holder,
                )
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise LeaseRefused(Refusal.GROUP_LEASED, group_leased_message(holder), holder)
            await self._changed(min(remaining, 1.0))
        lease = taken
        while lease.phase is not LeasePhase.HELD and (remaining := deadline - loop.time()) > 0:
            await self._changed(min(remaining, 0.5))
            current = await self.store.lease(name)
            if current is None or current.acquired_at != lease.acquired_at:
                break  # released or lapsed meanwhile: answer with what was acquired
            lease = current
        return lease

    async def renew(self, name: str, *, owner: str | None = None, ttl_seconds: int | None = None) -> Lease:
        if ttl_seconds is not None:
            problems = request_problems(LeaseRequest(group="-", owner=owner or "-", ttl_seconds=ttl_seconds))
            if problems:
                raise LeaseRefused(Refusal.INVALID, "; ".join(problems))
        lease = await self._live(name, owner)
        new = renewed(lease, self.clock.now(), ttl_seconds)
        if not await self.store.replace(lease, new):
            raise LeaseRefused(Refusal.NOT_FOUND, f"lease {name} not found (it was released, or it expired)")
        await self.renewed(new)
        return new

    async def release(self, name: str, *, owner: str | None = None) -> Lease:
        lease = await self._live(name, owner)
        if lease.source is not LeaseSource.API:
            raise LeaseRefused(Refusal.MANAGED_IN_KUBERNETES, _managed_elsewhere(lease) + "; nothing changed")
        if not await self.store.remove(lease):
            raise LeaseRefused(Refusal.NOT_FOUND, f"lease {name} not found (it was released, or it expired)")
        await self.ended(lease, "lease.released", "released through the API")
        return lease

    async def _live(self, name: str, owner: str | None) -> Lease:
        lease = await self.lease(name)
        if lease_is_expired(lease, self.clock.now()):
            if await self.store.remove(lease):
                await self.ended(lease, "lease.expired", _expired_reason(lease))
            raise LeaseRefused(Refusal.NOT_FOUND, f"lease {name} expired at {rfc3339(lease.expires_at)}")
        if owner is not None and owner != lease.owner:
            raise LeaseRefused(
                Refusal.OWNER_MISMATCH,
                f"lease {name} is held by owner {lease.owner}, not {owner}; nothing changed",
                lease,
            )
        return lease

    # ------------------------------------------------------------------ what every change announces

    async def acquired(self, lease: Lease) -> None:
        GPU_LEASE_ACQUIRED.labels(*lease_labels(lease)).inc()
        log.info(
            "lease acquired",
            extra={"lease": lease.name, "group": lease.group, "owner": lease.owner, "source": lease.source.value},
        )
        await self._publish("lease.acquired", lease)
        self._notify()
        self.kick()

    async def renewed(self, lease: Lease) -> None:
        log.debug("lease renewed", extra={"lease": lease.name, "expires_at": rfc3339(lease.expires_at)})
        await self._publish("lease.renewed", lease)
        self.kick()

    async def ended(self, lease: Lease, kind: str, reason: str) -> None:
        log.info(
            kind.replace(".", " "),
            extra={"lease": lease.name, "group": lease.group, "owner": lease.owner, "reason": reason},
        )
        await self._publish(kind, lease, reason)
        self._notify()
        self.kick()

    async def _publish(self, kind: str, lease: Lease, reason: str = "") -> None:
        event = LeaseEvent(
            kind=kind,
            name=lease.name,
            group=lease.group,
            owner=lease.owner,
            namespace=lease.namespace,
            node=lease.node,
            source=lease.source.value,
            acquired_at=lease.acquired_at,
            expires_at=lease.expires_at,
            reason=reason,
            time=self.clock.now(),
        )
        try:  # one attempt, so the bus gives it a message id of the one scheme
            await self.bus.publish(subjects.event_subject("lease", lease.group), event)
        except Exception as exc:  # an observer's event: the lease itself is in Postgres
            log.warning("lease event not published", extra={"kind": kind, "lease": lease.name, "error": repr(exc)})

    # ------------------------------------------------------------------ the acting replica's loop

    async def run(self, stop: asyncio.Event) -> None:
        stopping = asyncio.create_task(self._kick_once(stop))
        try:
            while not stop.is_set():
                if self.acting:
                    try:
                        await self.reconcile()
                    except Exception:
                        log.exception("reconcile failed; retrying")
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._kick.wait(), self._sleep())
                self._kick.clear()
        finally:
            stopping.cancel()

    async def _kick_once(self, event: asyncio.Event) -> None:
        await event.wait()
        self.kick()

    def _sleep(self) -> float:
        seconds = self.timing.refresh.total_seconds()
        if self._parking:
            seconds = min(seconds, _PARKING_POLL)
        if self._next_expiry is not None:
            seconds = min(seconds, max((self._next_expiry - self.clock.now()).total_seconds() + 0.01, 0.01))
        return seconds

    async def reconcile(self) -> None:
        """Observe (leases, members, the scheduler's group status) -> decide (expiry, park verdicts) -> apply."""
        now = self.clock.now()
        for lease in await self.store.expire(now):
            await self.ended(lease, "lease.expired", _expired_reason(lease))
        leases = await self.store.leases()
        members = await self.store.members(lease.group for lease in leases)
        current = []
        for lease in leases:
            checked = with_verdict(lease, park_verdict(lease, members[lease.group], self.honoured(lease.group)), now)
            if checked != lease and await self.store.replace(lease, checked):
                if checked.held_at is not None and lease.held_at is None:
                    log.info("lease held", extra={"lease": lease.name, "group": lease.group, "detail": checked.message})
                    await self._publish("lease.held", checked)
                self._notify()
                lease = checked
            current.append(lease)
        self._parking = any(lease.phase is not LeasePhase.HELD for lease in current)
        self._next_expiry = min((lease.expires_at for lease in current), default=None)
        self.active.show(current)
        for step in list(self.steps):
            await step()


def _expired_reason(lease: Lease) -> str:
    return f"not renewed since {rfc3339(lease.renew_time)}; expired at {rfc3339(lease.expires_at)}"
