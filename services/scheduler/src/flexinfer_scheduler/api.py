"""The scheduler's admin API (docs/reference.md section 4). Handlers validate, call the store, and kick the loop;
they decide nothing themselves."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta
from typing import Any

from fastapi import Body, FastAPI, Query, Response

from flexinfer_common.admin_api import Group, GroupList, ModelList, Swap, SwapList
from flexinfer_common.clock import Clock, rfc3339
from flexinfer_common.db import GroupRow, ModelRow, SwapRow
from flexinfer_common.enums import ModelPhase, ScaleAction
from flexinfer_common.errors import ApiError, ErrorBody, ErrorCode
from flexinfer_common.keys import ModelKey
from flexinfer_common.local_commands import CommandRule, allowed_commands, check_local_process
from flexinfer_common.manifests import GPUGroup, ManifestError, Model, parse_resource
from flexinfer_common.messages import PlacementStatus
from flexinfer_common.service import ReadinessCheck, admin_app, admin_router
from flexinfer_scheduler.adapters.rows import row_parked
from flexinfer_scheduler.domain.election import cooldown_remaining, elect, policy_of
from flexinfer_scheduler.domain.manifests import SpecFacts, visible_group
from flexinfer_scheduler.domain.model import Capacity, GroupSnapshot, Member, reserves_memory
from flexinfer_scheduler.domain.residency import device_usage, memory_of
from flexinfer_scheduler.loop import Scheduler, model_status
from flexinfer_scheduler.ports import API_ORIGIN, AdminStore, GroupChangeRefused, StoredStatus, decode_placement
from flexinfer_scheduler.publishing import memory_status
from flexinfer_scheduler.ui.view import swap_outcome


def model_json(row: ModelRow, facts: SpecFacts) -> dict[str, Any]:
    """A Model as the API shows it: its manifest, ``metadata.generation`` and ``status`` (``facts``: what its
    manifest says, ``AdminStore.facts``)."""
    out = dict(row.manifest)
    out["metadata"] = {**out.get("metadata", {}), "namespace": row.namespace, "generation": row.spec_generation}
    status = model_status(row)
    placed = decode_placement(row.placement) if not row_parked(row) else None
    status = status.model_copy(
        update={
            "memory": memory_status(facts.memory, estimated=facts.memory_estimated, measured=row.measured_memory),
            "placement": PlacementStatus(devices=list(placed)) if placed is not None else None,
        }
    )
    if row.deleting_at is not None:
        # deleted, parked first as for a swap: shown Draining with the deletion timestamp until its row goes
        out["metadata"]["deletionTimestamp"] = rfc3339(row.deleting_at)
        status = status.model_copy(update={"phase": ModelPhase.DRAINING})
    out["status"] = status.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def model_resource(row: ModelRow, facts: SpecFacts) -> Model:
    return Model.model_validate(model_json(row, facts))


def swap_json(row: SwapRow) -> dict[str, Any]:
    def ref(namespace: str | None, name: str | None) -> str | None:
        return f"{namespace}/{name}" if name else None

    return {
        "id": row.id,
        "group": row.group_name,
        "fromModel": ref(row.from_namespace, row.from_name),
        "toModel": ref(row.to_namespace, row.to_name),
        "reason": row.reason,
        "phase": row.phase,
        "startedAt": rfc3339(row.started_at),
        "finishedAt": rfc3339(row.finished_at),
        "phases": row.phases or {},
        "outcome": swap_outcome(row.phase),
        "message": row.message,
    }


def _manifest(body: Any, kind: type[Model] | type[GPUGroup]) -> Any:
    try:
        resource = parse_resource(body)
    except ManifestError as exc:
        raise ApiError(422, str(exc)) from None
    if not isinstance(resource, kind):
        raise ApiError(422, f"expected a {kind.__name__} manifest, got {resource.kind}")
    return resource


def _refuse_if_watched(row: ModelRow | GroupRow | None, what: str) -> None:
    """A resource synced from Kubernetes is changed there: an admin API write would be undone by the next sync."""
    if row is not None and row.source != API_ORIGIN.source:
        raise ApiError(
            409, f"{what} is managed in Kubernetes (source {row.source!r}): change it with kubectl, not this API"
        )


def create_app(
    *, store: AdminStore, scheduler: Scheduler, clock: Clock, admin_token: str | None, readiness: ReadinessCheck
) -> FastAPI:
    app = admin_app("FlexInfer scheduler", "0.1.0", readiness)
    api = admin_router(admin_token)
    created_or_updated: dict[int | str, dict[str, Any]] = {
        201: {"model": Model, "description": "Created"},
        409: {"model": ErrorBody, "description": "Conflict"},
    }

    @api.get("/models", response_model=ModelList, response_model_by_alias=True)
    async def list_models() -> ModelList:
        """Every Model, its manifest with ``status``."""
        return ModelList(items=[model_resource(r, store.facts(r)) for r in await store.models()])

    @api.get("/models/{namespace}/{name}", response_model=Model, response_model_by_alias=True)
    async def get_model(namespace: str, name: str) -> Model:
        row = await store.model(namespace, name)
        if row is None:
            raise ApiError(404, f"model {namespace}/{name} not found")
        return model_resource(row, store.facts(row))

    @api.put("/models/{namespace}/{name}", response_model=Model, responses=created_or_updated)
    async def put_model(namespace: str, name: str, response: Response, body: Any = Body(...)) -> Model:
        """Create (201) or update (200) a Model from its manifest. A ``spec.local.command`` whose executable
        FLEXINFER_LOCAL_COMMANDS does not allow is refused with 422 (code ``command_not_allowed``), a ``spec.local.env``
        naming a variable FLEXINFER_LOCAL_ENV does not allow with 422 (code ``env_not_allowed``)."""
        if isinstance(body, dict):
            metadata = body.setdefault("metadata", {}) if isinstance(body.get("metadata", {}), dict) else None
            if metadata is not None:
                metadata.setdefault("name", name)
                metadata.setdefault("namespace", namespace)
        model: Model = _manifest(body, Model)
        if model.name != name or model.namespace != namespace:
            raise ApiError(422, f"metadata names {model.namespace}/{model.name} but the path names {namespace}/{name}")
        _refuse_if_watched(await store.model(namespace, name), f"model {namespace}/{name}")
        verdict = check_local_process(
            model.spec.local.command,
            model.spec.local.env,
            allowed=allowed_commands(scheduler.settings.local_commands, scheduler.settings.local_engines),
            allowed_env=scheduler.settings.local_env,
        )
        if not verdict.allowed:
            env_rule = verdict.rule in (CommandRule.ENV_NOT_ALLOWED, CommandRule.ENV_CODE_LOADING)
            code = ErrorCode.ENV_NOT_ALLOWED if env_rule else ErrorCode.COMMAND_NOT_ALLOWED
            raise ApiError(422, verdict.message, code)
        try:
            row, created = await store.put_model(model, clock.now())
        except GroupChangeRefused as exc:
            raise ApiError(409, str(exc)) from None
        if created:
            await scheduler.announce(row)
        scheduler.kick()
        response.status_code = 201 if created else 200
        return model_resource(row, store.facts(row))

    @api.delete("/models/{namespace}/{name}", response_model=Model, response_model_by_alias=True)
    async def delete_model(namespace: str, name: str) -> Model:
        """Delete a Model. One that may hold the GPU is drained and parked first, as for a swap: meanwhile it is
        shown with ``metadata.deletionTimestamp`` and phase Draining, and it is gone once the actuator confirmed it
        parked (the next model of its group loads only then). A PUT meanwhile cancels the deletion."""
        _refuse_if_watched(await store.model(namespace, name), f"model {namespace}/{name}")
        deleted = await store.request_deletion(namespace, name, clock.now())
        if deleted is None:
            raise ApiError(404, f"model {namespace}/{name} not found")
        row, gone = deleted
        if gone:
            await scheduler.forget_route(namespace, name)
        scheduler.kick()
        return model_resource(row, store.facts(row))

    @api.post("/models/{namespace}/{name}/promote", response_model=Model, response_model_by_alias=True)
    async def promote(namespace: str, name: str) -> Model:
        """Make the model its group's leader now (``spec.gpu.forcePromotion``; a GPU lease still beats it)."""
        row = await store.set_promoted(namespace, name, clock.now())
        if row is None:
            raise ApiError(404, f"model {namespace}/{name} not found")
        scheduler.kick()
        return model_resource(row, store.facts(row))

    @api.put(
        "/gpugroups/{name}",
        response_model=GPUGroup,
        response_model_by_alias=True,
        response_model_exclude_none=True,
        responses=created_or_updated,
    )
    async def put_gpugroup(name: str, response: Response, body: Any = Body(...)) -> GPUGroup:
        """Create (201) or update (200) a GPUGroup: a v1alpha1 group (with ``spec.models``), or the declaration of a
        v1alpha2 group (its ``spec.scheduling`` and ``spec.capacity``). One that would move a model listed in it (or
        listed no more) to another group while the model may still hold its group's GPU is refused with 409 naming
        the model and both groups, and nothing changes: park the model first (or wait until it is parked)."""
        if isinstance(body, dict) and isinstance(body.get("metadata", {}), dict):
            body.setdefault("metadata", {}).setdefault("name", name)
        group: GPUGroup = _manifest(body, GPUGroup)
        if group.name != name:
            raise ApiError(422, f"metadata.name {group.name!r} differs from the path's {name!r}")
        _refuse_if_watched(await store.group(name), f"GPUGroup {name}")
        try:
            created = await store.put_gpugroup(group, clock.now())
        except GroupChangeRefused as exc:
            raise ApiError(409, str(exc)) from None
        scheduler.kick()
        response.status_code = 201 if created else 200
        return group

    @api.delete(
        "/gpugroups/{name}",
        status_code=204,
        response_class=Response,
        responses={409: {"model": ErrorBody, "description": "Conflict"}},
    )
    async def delete_gpugroup(name: str) -> Response:
        """Delete a v1alpha1 GPUGroup: its models go to their own groups. Refused with 409 (nothing changes) while
        one of them may still hold the group's GPU, as a PUT that would move it."""
        _refuse_if_watched(await store.group(name), f"GPUGroup {name}")
        try:
            deleted = await store.delete_group(name)
        except GroupChangeRefused as exc:
            raise ApiError(409, str(exc)) from None
        if not deleted:
            raise ApiError(404, f"GPUGroup {name} not found")
        scheduler.kick()
        return Response(status_code=204)

    async def groups_json() -> list[dict[str, Any]]:
        now = clock.now()
        world, _ = await store.load_world(now, scheduler.queued_ttl, in_flight_ttl=scheduler.in_flight_ttl)
        rows = {g.name: g for g in await store.groups()}
        out = []
        for snapshot in world.groups:
            if visible_group(snapshot.name) is None:
                continue
            out.append(group_json(snapshot, rows.get(snapshot.name), world.statuses, now, scheduler))
        return out

    @api.get("/groups", response_model=GroupList, response_model_by_alias=True)
    async def list_groups() -> GroupList:
        return GroupList(items=[Group.model_validate(item) for item in await groups_json()])

    @api.get("/groups/{group}", response_model=Group, response_model_by_alias=True)
    async def get_group(group: str) -> Group:
        for item in await groups_json():
            if item["name"] == group:
                return Group.model_validate(item)
        raise ApiError(404, f"group {group} not found")

    @api.get("/swaps", response_model=SwapList, response_model_by_alias=True)
    async def list_swaps(
        limit: int = Query(200, ge=1, le=10_000, description="At most this many, newest first"),
    ) -> SwapList:
        return SwapList(items=[Swap.model_validate(swap_json(r)) for r in await store.swaps(limit)])

    app.include_router(api)
    return app


def group_json(
    snapshot: GroupSnapshot,
    row: GroupRow | None,
    statuses: dict[ModelKey, StoredStatus],
    now: datetime,
    scheduler: Scheduler,
) -> dict[str, Any]:
    lease = snapshot.lease if snapshot.lease is not None and snapshot.lease.is_active(now) else None
    active_row = statuses.get(snapshot.active) if snapshot.active else None
    if lease is not None and not reserves_memory(lease, snapshot.capacity, now):
        state = "Leased"  # (a lease with memory holds one device's bytes, not the group: its state is its models')
    elif snapshot.swap is not None:
        state = "Swapping"
    elif active_row is not None and active_row.phase == "Ready":
        state = "Serving"
    elif snapshot.active is not None:
        state = "Loading"
    else:
        state = "Idle"
    remaining: timedelta = cooldown_remaining(snapshot, now, scheduler.params)
    members = []
    for member in sorted(snapshot.members, key=lambda m: (-m.priority, m.key.name)):
        status = statuses[member.key]
        members.append(
            {
                "namespace": member.key.namespace,
                "name": member.key.name,
                "priority": member.priority,
                "phase": status.phase,
                "state": status.shared_state,
                "queuePosition": status.queue_position,
                "lastActiveTime": rfc3339(member.last_active_time),
                "preemptedAt": rfc3339(member.preempted_at),
                "preemptedBy": status.preempted_by,
                "message": status.message or None,
                "requests": {"waiting": member.queued, "inFlight": member.in_flight},
                **(_memory_view(member, snapshot.capacity) if snapshot.capacity is not None else {}),
            }
        )
    # pure: why the leader leads, for describe (a lease with memory is a reservation, not a lease on the group:
    # the planner elects as if unleased around it)
    reserved = lease is not None and reserves_memory(lease, snapshot.capacity, now)
    election = elect(dataclasses.replace(snapshot, lease=None) if reserved else snapshot, now, scheduler.params)
    leader = election.leader
    return {
        "name": snapshot.name,
        "policy": snapshot.policy.value,
        "scheduling": policy_of(snapshot, scheduler.params).value if snapshot.v1alpha1 is None else None,
        "election": {
            "leader": {"namespace": leader.namespace, "name": leader.name} if leader else None,
            "reason": election.reason.value,
        },
        "activeModel": {"namespace": snapshot.active.namespace, "name": snapshot.active.name}
        if snapshot.active
        else None,
        "state": state,
        "cooldownRemainingSeconds": round(remaining.total_seconds(), 1),
        "lease": {
            "name": lease.name,
            "owner": lease.owner,
            "expiresAt": rfc3339(lease.expires_at),
            "memory": lease.memory,
            "device": lease.device if reserves_memory(lease, snapshot.capacity, now) else None,
        }
        if lease
        else None,
        "models": members,
        **(_capacity_view(snapshot) if snapshot.capacity is not None else {}),
    }


def _memory_view(member: Member, capacity: Capacity) -> dict[str, Any]:
    """A member's memory in a group with a capacity: what it holds when loaded, and where it is placed."""
    if member.memory is None:
        source = "whole-device"
    elif member.memory_measured is not None and member.memory == member.memory_measured:
        source = "measured"  # it was measured to hold more than it declares (or than its estimate)
    else:
        source = "estimated" if member.memory_estimated else "declared"
    placed = member.placement is not None and not (member.parked and member.evicting_since is None)
    return {
        "memory": {"bytes": memory_of(member, capacity), "source": source},
        "placement": {"devices": list(member.placement or ())} if placed else None,
    }


def _capacity_view(snapshot: GroupSnapshot) -> dict[str, Any]:
    """A group's card(s): the capacity, and per device what its resident models hold and what is free."""
    assert snapshot.capacity is not None
    return {
        "capacity": {"devices": snapshot.capacity.devices, "memoryPerDevice": snapshot.capacity.memory_per_device},
        "devices": [
            {
                "index": d.index,
                "usedBytes": d.used,
                "freeBytes": d.free,
                "models": [{"namespace": k.namespace, "name": k.name} for k in d.models],
            }
            for d in device_usage(snapshot.capacity, snapshot.members)
        ],
        "residentModels": [
            {"namespace": m.key.namespace, "name": m.key.name}
            for m in snapshot.members
            if m.desired_action is ScaleAction.ACTIVATE and m.evicting_since is None
        ],
    }
