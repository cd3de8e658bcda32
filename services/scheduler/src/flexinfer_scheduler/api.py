"""The scheduler's admin API (CONTRACT section 4). Handlers validate, call the store, and kick the loop;
they decide nothing themselves."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Response
from fastapi.responses import JSONResponse

from flexinfer_common.clock import Clock, rfc3339
from flexinfer_common.db import GroupRow, ModelRow, SwapRow
from flexinfer_common.manifests import GPUGroup, ManifestError, Model, parse_resource
from flexinfer_common.service import ReadinessCheck, add_ops_routes, admin_token_dependency, install_error_handlers
from flexinfer_scheduler.adapters.store import API_ORIGIN, Store, visible_group
from flexinfer_scheduler.domain.election import cooldown_remaining
from flexinfer_scheduler.domain.model import GroupSnapshot, ModelKey
from flexinfer_scheduler.loop import Scheduler, model_status


def model_json(row: ModelRow) -> dict[str, Any]:
    out = dict(row.manifest)
    out["metadata"] = {**out.get("metadata", {}), "namespace": row.namespace, "generation": row.spec_generation}
    out["status"] = model_status(row).model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


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
        raise HTTPException(status_code=422, detail=str(exc)) from None
    if not isinstance(resource, kind):
        raise HTTPException(status_code=422, detail=f"expected a {kind.__name__} manifest, got {resource.kind}")
    return resource


def _refuse_if_watched(row: ModelRow | GroupRow | None, what: str) -> None:
    """A resource synced from Kubernetes is changed there: an admin API write would be undone by the next sync."""
    if row is not None and row.source != API_ORIGIN.source:
        raise HTTPException(
            status_code=409,
            detail=f"{what} is managed in Kubernetes (source {row.source!r}): change it with kubectl, not this API",
        )


def create_app(
    *, store: Store, scheduler: Scheduler, clock: Clock, admin_token: str | None, readiness: ReadinessCheck
) -> FastAPI:
    app = FastAPI(title="FlexInfer scheduler", version="0.1.0")
    install_error_handlers(app)
    add_ops_routes(app, readiness)
    api = APIRouter(prefix="/api/v1", dependencies=[Depends(admin_token_dependency(admin_token))])

    @api.get("/models")
    async def list_models() -> dict[str, Any]:
        return {"items": [model_json(r) for r in await store.models()]}

    @api.get("/models/{namespace}/{name}")
    async def get_model(namespace: str, name: str) -> dict[str, Any]:
        row = await store.model(namespace, name)
        if row is None:
            raise HTTPException(status_code=404, detail=f"model {namespace}/{name} not found")
        return model_json(row)

    @api.put("/models/{namespace}/{name}")
    async def put_model(namespace: str, name: str, body: Any = Body(...)) -> JSONResponse:
        if isinstance(body, dict):
            metadata = body.setdefault("metadata", {}) if isinstance(body.get("metadata", {}), dict) else None
            if metadata is not None:
                metadata.setdefault("name", name)
                metadata.setdefault("namespace", namespace)
        model: Model = _manifest(body, Model)
        if model.name != name or model.namespace != namespace:
            raise HTTPException(
                status_code=422,
                detail=f"metadata names {model.namespace}/{model.name} but the path names {namespace}/{name}",
            )
        _refuse_if_watched(await store.model(namespace, name), f"model {namespace}/{name}")
        row, created = await store.put_model(model, clock.now())
        if created:
            await scheduler.announce(row)
        scheduler.kick()
        return JSONResponse(model_json(row), status_code=201 if created else 200)

    @api.delete("/models/{namespace}/{name}")
    async def delete_model(namespace: str, name: str) -> dict[str, Any]:
        _refuse_if_watched(await store.model(namespace, name), f"model {namespace}/{name}")
        row = await store.delete_model(namespace, name)
        if row is None:
            raise HTTPException(status_code=404, detail=f"model {namespace}/{name} not found")
        await scheduler.forget_route(namespace, name)
        scheduler.kick()
        return model_json(row)

    @api.post("/models/{namespace}/{name}/promote")
    async def promote(namespace: str, name: str) -> dict[str, Any]:
        row = await store.set_promoted(namespace, name, clock.now())
        if row is None:
            raise HTTPException(status_code=404, detail=f"model {namespace}/{name} not found")
        scheduler.kick()
        return model_json(row)

    @api.put("/gpugroups/{name}")
    async def put_gpugroup(name: str, body: Any = Body(...)) -> JSONResponse:
        if isinstance(body, dict) and isinstance(body.get("metadata", {}), dict):
            body.setdefault("metadata", {}).setdefault("name", name)
        group: GPUGroup = _manifest(body, GPUGroup)
        if group.name != name:
            raise HTTPException(
                status_code=422, detail=f"metadata.name {group.name!r} differs from the path's {name!r}"
            )
        _refuse_if_watched(await store.group(name), f"GPUGroup {name}")
        created = await store.put_gpugroup(group, clock.now())
        scheduler.kick()
        return JSONResponse(
            group.model_dump(mode="json", by_alias=True, exclude_none=True), status_code=201 if created else 200
        )

    @api.delete("/gpugroups/{name}")
    async def delete_gpugroup(name: str) -> Response:
        _refuse_if_watched(await store.group(name), f"GPUGroup {name}")
        if not await store.delete_group(name):
            raise HTTPException(status_code=404, detail=f"GPUGroup {name} not found")
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
            out.append(group_json(snapshot, rows.get(snapshot.name), world.models, now, scheduler))
        return out

    @api.get("/groups")
    async def list_groups() -> dict[str, Any]:
        return {"items": await groups_json()}

    @api.get("/groups/{group}")
    async def get_group(group: str) -> dict[str, Any]:
        for item in await groups_json():
            if item["name"] == group:
                return item
        raise HTTPException(status_code=404, detail=f"group {group} not found")

    @api.get("/swaps")
    async def list_swaps(limit: int = 200) -> dict[str, Any]:
        return {"items": [swap_json(r) for r in await store.swaps(limit)]}

    app.include_router(api)
    return app


def group_json(
    snapshot: GroupSnapshot, row: GroupRow | None, models: dict[ModelKey, ModelRow], now: datetime, scheduler: Scheduler
) -> dict[str, Any]:
    lease = snapshot.lease if snapshot.lease is not None and snapshot.lease.is_active(now) else None
    active_row = models.get(snapshot.active) if snapshot.active else None
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
        r = models[member.key]
        members.append(
            {
                "namespace": r.namespace,
                "name": r.name,
                "priority": r.priority,
                "phase": r.phase,
                "state": r.shared_state,
                "queuePosition": r.queue_position,
                "lastActiveTime": rfc3339(r.last_active_time),
                "preemptedAt": rfc3339(r.preempted_at),
                "preemptedBy": r.preempted_by,
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
