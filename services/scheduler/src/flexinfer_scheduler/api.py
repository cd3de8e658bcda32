"""The scheduler's admin API (CONTRACT section 4). Handlers validate, call the store, and kick the loop;
they decide nothing themselves."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import Body, FastAPI, Query, Response

from flexinfer_common.admin_api import Group, GroupList, ModelList, Swap, SwapList
from flexinfer_common.clock import Clock, rfc3339
from flexinfer_common.db import GroupRow, ModelRow, SwapRow
from flexinfer_common.errors import ApiError, ErrorBody, ErrorCode
from flexinfer_common.local_commands import check_local_command
from flexinfer_common.manifests import GPUGroup, ManifestError, Model, parse_resource
from flexinfer_common.service import ReadinessCheck, admin_app, admin_router
from flexinfer_scheduler.adapters.store import Store
from flexinfer_scheduler.domain.election import cooldown_remaining
from flexinfer_scheduler.domain.manifests import visible_group
from flexinfer_scheduler.domain.model import GroupSnapshot, ModelKey
from flexinfer_scheduler.loop import Scheduler, model_status
from flexinfer_scheduler.ports import API_ORIGIN, StoredStatus


def model_json(row: ModelRow) -> dict[str, Any]:
    out = dict(row.manifest)
    out["metadata"] = {**out.get("metadata", {}), "namespace": row.namespace, "generation": row.spec_generation}
    out["status"] = model_status(row).model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def model_resource(row: ModelRow) -> Model:
    return Model.model_validate(model_json(row))


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
    *, store: Store, scheduler: Scheduler, clock: Clock, admin_token: str | None, readiness: ReadinessCheck
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
        return ModelList(items=[model_resource(r) for r in await store.models()])

    @api.get("/models/{namespace}/{name}", response_model=Model, response_model_by_alias=True)
    async def get_model(namespace: str, name: str) -> Model:
        row = await store.model(namespace, name)
        if row is None:
            raise ApiError(404, f"model {namespace}/{name} not found")
        return model_resource(row)

    @api.put("/models/{namespace}/{name}", response_model=Model, responses=created_or_updated)
    async def put_model(namespace: str, name: str, response: Response, body: Any = Body(...)) -> Model:
        """Create (201) or update (200) a Model from its manifest. A ``spec.local.command`` whose executable
        FLEXINFER_LOCAL_COMMANDS does not allow is refused with 422 (code ``command_not_allowed``)."""
        if isinstance(body, dict):
            metadata = body.setdefault("metadata", {}) if isinstance(body.get("metadata", {}), dict) else None
            if metadata is not None:
                metadata.setdefault("name", name)
                metadata.setdefault("namespace", namespace)
        model: Model = _manifest(body, Model)
        if model.name != name or model.namespace != namespace:
            raise ApiError(422, f"metadata names {model.namespace}/{model.name} but the path names {namespace}/{name}")
        _refuse_if_watched(await store.model(namespace, name), f"model {namespace}/{name}")
        verdict = check_local_command(
            model.spec.local.command, model.spec.local.env, allowed=scheduler.settings.local_commands
        )
        if not verdict.allowed:
            raise ApiError(422, verdict.message, ErrorCode.COMMAND_NOT_ALLOWED)
        row, created = await store.put_model(model, clock.now())
        if created:
            await scheduler.announce(row)
        scheduler.kick()
        response.status_code = 201 if created else 200
        return model_resource(row)

    @api.delete("/models/{namespace}/{name}", response_model=Model, response_model_by_alias=True)
    async def delete_model(namespace: str, name: str) -> Model:
        _refuse_if_watched(await store.model(namespace, name), f"model {namespace}/{name}")
        row = await store.delete_model(namespace, name)
        if row is None:
            raise ApiError(404, f"model {namespace}/{name} not found")
        await scheduler.forget_route(namespace, name)
        scheduler.kick()
        return model_resource(row)

    @api.post("/models/{namespace}/{name}/promote", response_model=Model, response_model_by_alias=True)
    async def promote(namespace: str, name: str) -> Model:
        """Make the model its group's leader now (``spec.gpu.forcePromotion``; a GPU lease still beats it)."""
        row = await store.set_promoted(namespace, name, clock.now())
        if row is None:
            raise ApiError(404, f"model {namespace}/{name} not found")
        scheduler.kick()
        return model_resource(row)

    @api.put(
        "/gpugroups/{name}",
        response_model=GPUGroup,
        response_model_by_alias=True,
        response_model_exclude_none=True,
        responses=created_or_updated,
    )
    async def put_gpugroup(name: str, response: Response, body: Any = Body(...)) -> GPUGroup:
        """Create (201) or update (200) a v1alpha1 GPUGroup."""
        if isinstance(body, dict) and isinstance(body.get("metadata", {}), dict):
            body.setdefault("metadata", {}).setdefault("name", name)
        group: GPUGroup = _manifest(body, GPUGroup)
        if group.name != name:
            raise ApiError(422, f"metadata.name {group.name!r} differs from the path's {name!r}")
        _refuse_if_watched(await store.group(name), f"GPUGroup {name}")
        created = await store.put_gpugroup(group, clock.now())
        scheduler.kick()
        response.status_code = 201 if created else 200
        return group

    @api.delete("/gpugroups/{name}", status_code=204, response_class=Response)
    async def delete_gpugroup(name: str) -> Response:
        _refuse_if_watched(await store.group(name), f"GPUGroup {name}")
        if not await store.delete_group(name):
            raise ApiError(404, f"GPUGroup {name} not found")
        scheduler.kick()
        return Response(status_code=204)

    async def groups_json() -> list[dict[str, Any]]:
        now = clock.now()
        world, _ = await store.load_world(now, scheduler.settings.shared_demand_window)
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
    if lease is not None:
        state = "Leased"
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
            }
        )
    return {
        "name": snapshot.name,
        "policy": snapshot.policy.value,
        "activeModel": {"namespace": snapshot.active.namespace, "name": snapshot.active.name}
        if snapshot.active
        else None,
        "state": state,
        "cooldownRemainingSeconds": round(remaining.total_seconds(), 1),
        "lease": {"name": lease.name, "owner": lease.owner, "expiresAt": rfc3339(lease.expires_at)} if lease else None,
        "models": members,
    }
