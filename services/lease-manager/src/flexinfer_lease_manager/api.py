"""The lease manager's REST API (CONTRACT section 4): ``/api/v1/leases``. Handlers validate and call the manager;
they decide nothing themselves. A refusal changes nothing and answers 4xx with a message naming the problem."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated

from fastapi import APIRouter, Body, Depends, FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from flexinfer_common.durations import format_duration, parse_duration
from flexinfer_common.enums import LeasePhase
from flexinfer_common.logs import get_logger
from flexinfer_common.service import ReadinessCheck, add_ops_routes, admin_token_dependency, install_error_handlers
from flexinfer_lease_manager.domain.leases import Lease, LeaseRefused, LeaseRequest, Refusal
from flexinfer_lease_manager.manager import MAX_WAIT, ClientGone, LeaseManager

log = get_logger("flexinfer.lease_manager.api")

STATUS = {
    Refusal.INVALID: 422,
    Refusal.UNKNOWN_GROUP: 422,
    Refusal.GROUP_LEASED: 409,
    Refusal.NAME_TAKEN: 409,
    Refusal.NOT_FOUND: 404,
    Refusal.OWNER_MISMATCH: 409,
    Refusal.MANAGED_IN_KUBERNETES: 409,
}


class _Body(BaseModel):
    model_config = ConfigDict(populate_by_name=True, extra="forbid")


class AcquireBody(_Body):
    group: str = Field(description="The shared GPU group to hold (a Model's spec.gpu.shared, or a GPUGroup)")
    owner: str = Field(description="Who holds it; the group's models show preemptedBy gpu-lease/<owner>")
    node: str | None = Field(None, description="The node the work runs on (shown, not enforced)")
    ttl_seconds: int | None = Field(
        None, alias="ttlSeconds", description="Seconds the lease holds without a renewal (min 60); default 1h"
    )
    name: str | None = Field(None, description="The lease's name; default <owner>-gpu-lease")
    namespace: str | None = Field(None, description="Where its GPULease lives in Kubernetes mode")


class RenewBody(_Body):
    owner: str | None = Field(None, description="When given, the lease must be this owner's")
    ttl_seconds: int | None = Field(None, alias="ttlSeconds", description="A new TTL (min 60), from now on")


class LeaseOut(BaseModel):
    model_config = ConfigDict(populate_by_name=True)

    name: str
    namespace: str
    group: str
    owner: str
    node: str | None
    ttl_seconds: int = Field(alias="ttlSeconds")
    acquired_at: datetime = Field(alias="acquiredAt")
    expires_at: datetime = Field(alias="expiresAt")
    renew_time: datetime = Field(alias="renewTime")
    phase: LeasePhase = Field(description="Parking until every serving member of the group is parked, then Held")
    message: str
    held_at: datetime | None = Field(None, alias="heldAt")
    source: str = Field(description="api, gpulease, modelcache, job or configmap")

    @classmethod
    def of(cls, lease: Lease) -> LeaseOut:
        return cls(
            name=lease.name,
            namespace=lease.namespace,
            group=lease.group,
            owner=lease.owner,
            node=lease.node,
            ttl_seconds=lease.ttl_seconds,
            acquired_at=lease.acquired_at,
            expires_at=lease.expires_at,
            renew_time=lease.renew_time,
            phase=lease.phase,
            message=lease.message,
            held_at=lease.held_at,
            source=lease.source.value,
        )

    def json_body(self) -> dict[str, object]:
        """camelCase, times as RFC 3339 UTC (``...Z``)."""
        body: dict[str, object] = self.model_dump(mode="json", by_alias=True)
        return body


class LeaseList(BaseModel):
    items: list[LeaseOut]


def _refused(exc: LeaseRefused) -> HTTPException:
    return HTTPException(status_code=STATUS[exc.refusal], detail=exc.message)


def _wait(value: str | None) -> timedelta:
    if value is None or value == "":
        return timedelta(0)
    try:
        wait = parse_duration(value)
    except ValueError as exc:
        raise HTTPException(status_code=422, detail=f"wait: {exc}") from None
    if wait > MAX_WAIT:
        raise HTTPException(
            status_code=422,
            detail=f"wait: at most {format_duration(MAX_WAIT)} (got {value!r}); ask again to wait longer",
        )
    return wait


def create_app(*, manager: LeaseManager, admin_token: str | None, readiness: ReadinessCheck) -> FastAPI:
    app = FastAPI(title="FlexInfer lease manager", version="0.1.0")
    install_error_handlers(app)
    add_ops_routes(app, readiness)
    api = APIRouter(prefix="/api/v1", dependencies=[Depends(admin_token_dependency(admin_token))])

    @api.get("/leases", response_model=LeaseList)
    async def list_leases() -> JSONResponse:
        return JSONResponse({"items": [LeaseOut.of(lease).json_body() for lease in await manager.leases()]})

    @api.post("/leases", status_code=201, response_model=LeaseOut)
    async def acquire(
        request: Request,
        body: AcquireBody,
        wait: Annotated[
            str | None,
            Query(
                description="Wait up to this long (Go-style duration or seconds, at most 10m) for the group to be "
                "free, then for the lease to be Held; without it a leased group answers 409 at once",
            ),
        ] = None,
    ) -> JSONResponse:
        lease_request = LeaseRequest(
            group=body.group,
            owner=body.owner,
            node=body.node,
            ttl_seconds=body.ttl_seconds,
            name=body.name,
            namespace=body.namespace,
        )
        try:
            lease = await manager.acquire(lease_request, wait=_wait(wait), client_gone=request.is_disconnected)
        except LeaseRefused as exc:
            raise _refused(exc) from None
        except ClientGone as exc:
            log.info("acquire abandoned", extra={"reason": str(exc)})
            raise HTTPException(status_code=499, detail=str(exc)) from None
        return JSONResponse(LeaseOut.of(lease).json_body(), status_code=201)

    @api.get("/leases/{name}", response_model=LeaseOut)
    async def get_lease(name: str) -> JSONResponse:
        try:
            lease = await manager.lease(name)
        except LeaseRefused as exc:
            raise _refused(exc) from None
        return JSONResponse(LeaseOut.of(lease).json_body())

    @api.post("/leases/{name}/renew", response_model=LeaseOut)
    async def renew(name: str, body: Annotated[RenewBody | None, Body()] = None) -> JSONResponse:
        body = body or RenewBody()
        try:
            lease = await manager.renew(name, owner=body.owner, ttl_seconds=body.ttl_seconds)
        except LeaseRefused as exc:
            raise _refused(exc) from None
        return JSONResponse(LeaseOut.of(lease).json_body())

    @api.delete("/leases/{name}", response_model=LeaseOut)
    async def release(
        name: str,
        owner: Annotated[str | None, Query(description="When given, the lease must be this owner's")] = None,
    ) -> JSONResponse:
        try:
            lease = await manager.release(name, owner=owner)
        except LeaseRefused as exc:
            raise _refused(exc) from None
        return JSONResponse(LeaseOut.of(lease).json_body())

    app.include_router(api)
    return app
