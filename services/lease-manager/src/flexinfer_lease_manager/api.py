"""The lease manager's REST API (docs/reference.md section 4): ``/api/v1/leases``. Handlers validate and call the
manager; they decide nothing themselves. A refusal changes nothing and answers 4xx in the one error shape, its
``code`` the refusal (``group_leased``, ``unknown_group``, ``owner_mismatch``, ...), its message naming the problem."""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated, Any

from fastapi import Body, FastAPI, Query, Request

from flexinfer_common.admin_api import Lease as LeaseBody
from flexinfer_common.admin_api import LeaseAcquire, LeaseList, LeaseRenewal
from flexinfer_common.durations import format_duration, parse_duration
from flexinfer_common.errors import ApiError, ErrorBody
from flexinfer_common.logs import get_logger
from flexinfer_common.service import ReadinessCheck, admin_app, admin_router
from flexinfer_lease_manager import __version__
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
CONFLICT: dict[int | str, dict[str, Any]] = {409: {"model": ErrorBody, "description": "Refused; the message says why"}}


def lease_body(lease: Lease) -> LeaseBody:
    """The API's view of a lease: its fields by name (``source`` as its string; not its resource's uid)."""
    return LeaseBody.model_validate(lease, from_attributes=True)


def refused(exc: LeaseRefused) -> ApiError:
    return ApiError(STATUS[exc.refusal], exc.message, exc.refusal.value)


def _wait(value: str | None) -> timedelta:
    if value is None or value == "":
        return timedelta(0)
    try:
        wait = parse_duration(value)
    except ValueError as exc:
        raise ApiError(422, f"wait: {exc}") from None
    if wait > MAX_WAIT:
        raise ApiError(422, f"wait: at most {format_duration(MAX_WAIT)} (got {value!r}); ask again to wait longer")
    return wait


def create_app(*, manager: LeaseManager, admin_token: str | None, readiness: ReadinessCheck) -> FastAPI:
    app = admin_app("FlexInfer lease manager", __version__, readiness)
    api = admin_router(admin_token)

    @api.get("/leases", response_model=LeaseList, response_model_by_alias=True)
    async def list_leases() -> LeaseList:
        """Every lease that holds a group."""
        return LeaseList(items=[lease_body(lease) for lease in await manager.leases()])

    @api.post("/leases", status_code=201, response_model=LeaseBody, response_model_by_alias=True, responses=CONFLICT)
    async def acquire(
        request: Request,
        body: LeaseAcquire,
        wait: Annotated[
            str | None,
            Query(
                description="Wait up to this long (Go-style duration or seconds, at most 10m) for the group to be "
                "free, then for the lease to be Held; without it a leased group answers 409 at once",
            ),
        ] = None,
    ) -> LeaseBody:
        """Take the group: its serving models park (``phase`` Parking, then Held). 409 naming the holder when the
        group is leased already."""
        lease_request = LeaseRequest(**body.model_dump())  # the body's fields, by the same names
        try:
            lease = await manager.acquire(lease_request, wait=_wait(wait), client_gone=request.is_disconnected)
        except LeaseRefused as exc:
            raise refused(exc) from None
        except ClientGone as exc:
            log.info("acquire abandoned", extra={"reason": str(exc)})
            raise ApiError(499, str(exc)) from None
        return lease_body(lease)

    @api.get("/leases/{name}", response_model=LeaseBody, response_model_by_alias=True)
    async def get_lease(name: str) -> LeaseBody:
        try:
            return lease_body(await manager.lease(name))
        except LeaseRefused as exc:
            raise refused(exc) from None

    @api.post("/leases/{name}/renew", response_model=LeaseBody, response_model_by_alias=True, responses=CONFLICT)
    async def renew(name: str, body: Annotated[LeaseRenewal | None, Body()] = None) -> LeaseBody:
        """``expiresAt`` moves to now + the TTL (a new TTL when given)."""
        body = body or LeaseRenewal()
        try:
            return lease_body(await manager.renew(name, owner=body.owner, ttl_seconds=body.ttl_seconds))
        except LeaseRefused as exc:
            raise refused(exc) from None

    @api.delete("/leases/{name}", response_model=LeaseBody, response_model_by_alias=True, responses=CONFLICT)
    async def release(
        name: str,
        owner: Annotated[str | None, Query(description="When given, the lease must be this owner's")] = None,
    ) -> LeaseBody:
        """End the lease: the group's serving models may run again."""
        try:
            return lease_body(await manager.release(name, owner=owner))
        except LeaseRefused as exc:
            raise refused(exc) from None

    app.include_router(api)
    return app
