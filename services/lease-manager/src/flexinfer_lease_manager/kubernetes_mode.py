"""The lease manager in Kubernetes mode. While this replica leads (a ``coordination.k8s.io`` Lease, so one replica
acts at a time) it watches GPULeases, ModelCaches, Jobs and legacy lease ConfigMaps, and each reconcile of the
manager runs :class:`KubeSync`: the watched objects and the lease rows in, :func:`plan_kubernetes`, then its calls.

Every call is one the lease manager's RBAC grants (charts/lease-manager; an integration test compares the two):
GPULeases list/watch/create/patch/delete and their status patch, Jobs list/watch/patch (admission), ModelCaches and
labelled ConfigMaps list/watch, Events create/patch, and the leader election's Lease get/create/update. A call that
fails is logged; the next reconcile plans it again.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any

from flexinfer_common.clock import Clock
from flexinfer_common.kube.client import (
    CONFIGMAPS,
    GPULEASES,
    JOBS,
    MODELCACHES,
    KubeClient,
    KubeError,
    Resource,
)
from flexinfer_common.kube.events import EventRecorder
from flexinfer_common.kube.informer import Informer
from flexinfer_common.kube.leading import Leading
from flexinfer_common.logs import get_logger
from flexinfer_common.notes import EventType, Note
from flexinfer_lease_manager.adapters.store import LeaseStore
from flexinfer_lease_manager.domain.carriers import LEGACY_LABEL
from flexinfer_lease_manager.domain.gpulease_plan import (
    KubePlan,
    KubeWorld,
    admission_patch,
    lease_status,
    pending_status,
    plan_kubernetes,
)
from flexinfer_lease_manager.domain.leases import group_leased_message
from flexinfer_lease_manager.manager import LeaseManager
from flexinfer_lease_manager.settings import LeaseManagerSettings

log = get_logger("flexinfer.lease_manager.kubernetes")

COMPONENT = "flexinfer-lease-manager"  # the source of the Events it records
_REMEMBERED_NOTES = 4096


@dataclass(kw_only=True, eq=False)
class KubeSync:
    client: KubeClient
    manager: LeaseManager
    store: LeaseStore
    gpuleases: Informer
    caches: Informer
    jobs: Informer
    configmaps: Informer
    events: EventRecorder
    clock: Clock
    _noted: dict[tuple[str, str, str, str], str] = field(default_factory=dict, init=False)
    _said: set[tuple[str, str, str, str]] = field(default_factory=set, init=False)

    @property
    def informers(self) -> list[Informer]:
        return [self.gpuleases, self.caches, self.jobs, self.configmaps]

    async def reconcile(self) -> None:
        timing = self.manager.timing
        gpuleases = self.gpuleases.objects()
        with_memory = {str(spec.get("group")) for obj in gpuleases if "memory" in (spec := obj.get("spec") or {})}
        per_device = {group: await self.store.memory_per_device(group) for group in sorted(with_memory)}
        world = KubeWorld(
            gpuleases=gpuleases,
            caches=self.caches.objects(),
            jobs=self.jobs.objects(),
            configmaps=self.configmaps.objects(),
            rows={lease.name: lease for lease in await self.store.leases()},
            known_groups=await self.store.known_groups(),
            now=self.clock.now(),
            default_ttl=int(timing.default_ttl.total_seconds()),
            refresh=timing.refresh,
            memory_per_device={group: size for group, size in per_device.items() if size is not None},
        )
        plan = plan_kubernetes(world)
        await self._apply(plan, world)

    async def _apply(self, plan: KubePlan, world: KubeWorld) -> None:
        for body in plan.create:
            meta = body["metadata"]
            await self._call("create GPULease", meta, self.client.create(GPULEASES, meta["namespace"], body))
        for namespace, name, spec in plan.patch_spec:
            where = {"namespace": namespace, "name": name}
            await self._call(
                "patch GPULease spec", where, self.client.patch(GPULEASES, namespace, name, {"spec": spec})
            )
        for namespace, name, uid in plan.delete:
            where = {"namespace": namespace, "name": name}
            await self._call("delete GPULease", where, self.client.delete(GPULEASES, namespace, name, uid=uid))
        for release in plan.release:
            if await self.store.remove(release.lease):
                await self.manager.ended(release.lease, "lease.released", release.reason)
        for update in plan.update:
            old = world.rows.get(update.lease.name)
            if old is not None and await self.store.replace(old, update.lease) and update.renewed:
                await self.manager.renewed(update.lease)
        for acquire in plan.acquire:
            lease = acquire.lease
            taken, holder, lapsed = await self.store.insert(lease, world.now)
            for gone in lapsed:
                await self.manager.ended(gone, "lease.expired", "expired")
            if taken is not None:
                await self.manager.acquired(taken)
                status = lease_status(taken)
                carrier = acquire.carrier
                if carrier is not None:
                    self._note(
                        Note(
                            carrier.namespace,
                            carrier.name,
                            EventType.NORMAL,
                            "GPULeaseAcquired",
                            f"GPULease {lease.name} holds group {lease.group}: parking its serving models",
                            kind=carrier.kind,
                        )
                    )
            else:
                status = pending_status(
                    "waiting: " + group_leased_message(holder) if holder is not None else "waiting for the group"
                )
            plan.statuses.append((lease.namespace, lease.name, status))
        for namespace, name, status in plan.statuses:
            where = {"namespace": namespace, "name": name}
            call = self.client.patch(GPULEASES, namespace, name, {"status": status}, subresource="status")
            await self._call("write GPULease status", where, call)
        for namespace, job, lease_name in plan.admit:
            where = {"namespace": namespace, "name": job}
            if await self._call(
                "start Job", where, self.client.patch(JOBS, namespace, job, admission_patch(lease_name))
            ):
                log.info("job admitted", extra={"job": f"{namespace}/{job}", "lease": lease_name})
        for note in plan.notes:
            self._note(note)
        # What this reconcile did not say any more may be said again later (then the Event's count goes up).
        for key in [key for key in self._noted if key not in self._said]:
            del self._noted[key]
        self._said = set()

    async def _call(self, what: str, where: dict[str, Any], call: Any) -> bool:
        try:
            await call
        except KubeError as exc:
            creating = what.startswith("create")
            if (exc.not_found and not creating) or (exc.conflict and creating):
                return False  # gone meanwhile / made meanwhile: the watch shows it, the next reconcile goes on
            log.warning(f"cannot {what}; retrying at the next reconcile", extra={**where, "error": str(exc)})
            return False
        return True

    def _note(self, note: Note) -> None:
        """Record an Event when it says something new about its object (a reconcile repeats its notes)."""
        key = (note.kind, note.namespace, note.name, note.reason)
        self._said.add(key)
        text = f"{note.type.value}:{note.message}"
        if self._noted.get(key) == text:
            return
        self._noted[key] = text
        if len(self._noted) > _REMEMBERED_NOTES:
            self._noted.pop(next(iter(self._noted)))
        self.events.record(note)


class KubernetesMode(Leading[KubeSync]):
    def __init__(
        self,
        *,
        settings: LeaseManagerSettings,
        manager: LeaseManager,
        store: LeaseStore,
        client: KubeClient,
        instance: str,
        clock: Clock,
    ) -> None:
        super().__init__(client, settings, lease_name=settings.leader_election_lease, instance=instance)
        self.manager = manager
        self.store = store
        self.clock = clock

    def lease_namespaces(self) -> list[str] | None:
        """Where GPULeases are watched (and may be made): the watched namespaces and the system namespace."""
        if self.namespaces is None:
            return None
        return sorted({*self.namespaces, self.system_namespace})

    def ready(self) -> bool:
        """Acting with every cache synced, or standing by."""
        return self.term is None or all(informer.synced for informer in self.term.informers)

    async def _begin(self) -> None:
        client, namespaces = self.client, self.namespaces

        def informer(resource: Resource, within: list[str] | None, selector: str | None = None) -> Informer:
            watched = Informer(client, resource, within, label_selector=selector)
            watched.on_change(lambda *_: self.manager.kick())
            return watched

        gpuleases = informer(GPULEASES, self.lease_namespaces())
        caches, jobs = informer(MODELCACHES, namespaces), informer(JOBS, namespaces)
        configmaps = informer(CONFIGMAPS, namespaces, LEGACY_LABEL)
        kinds = {"GPULease": gpuleases, "ModelCache": caches, "Job": jobs, "ConfigMap": configmaps}
        sync = KubeSync(
            client=client,
            manager=self.manager,
            store=self.store,
            gpuleases=gpuleases,
            caches=caches,
            jobs=jobs,
            configmaps=configmaps,
            events=EventRecorder(client, informers=kinds, instance=self.instance, component=COMPONENT),
            clock=self.clock,
        )
        for watched in sync.informers:
            watched.start()
        # Plans only from complete caches: a Job not listed yet would look finished, and its lease be released.
        await asyncio.gather(*(watched.wait_synced() for watched in sync.informers))
        self.term = sync
        self.manager.steps.append(sync.reconcile)
        self.manager.set_acting(True)
        log.info(
            "acting: syncing GPULeases, ModelCaches, Jobs and lease ConfigMaps",
            extra={"namespaces": namespaces or "all", "instance": self.instance},
        )

    async def _end(self, term: KubeSync) -> None:
        self.manager.set_acting(False)
        with contextlib.suppress(ValueError):
            self.manager.steps.remove(term.reconcile)
        await term.events.flush()
        for watched in term.informers:
            await watched.stop()
        log.info("stopped acting", extra={"instance": self.instance})
