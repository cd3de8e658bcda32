"""The status page's HTTP side (an adapter): ``GET /ui`` and its assets, the session cookie, the page's data as one
JSON document and as a server-sent event stream, and the operator's actions.

One builder per scheduler process, not per browser: the page's data is rebuilt when the bus says something changed
(swap, lease and model events, model and group statuses, demand; debounced) and every few seconds anyway (in-flight
counts and queue depths), and the same document is pushed to every open page. The browser never polls.

Auth: with an admin token, ``/ui?token=<token>`` trades the token for a session cookie (HttpOnly, SameSite=Strict,
an HMAC of its expiry keyed by the token: valid on every replica, void once the token changes) and redirects to
``/ui``; the page's data and actions need that cookie or ``Authorization: Bearer <token>``; without either the
page shows no model and its data endpoints answer 401.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime, timedelta
from importlib import resources
from typing import Any

import httpx
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response, StreamingResponse
from nats.js.api import DeliverPolicy
from pydantic import BaseModel, ConfigDict, ValidationError

from flexinfer_common import subjects
from flexinfer_common.auth import bearer_matches, token_matches
from flexinfer_common.bus import Bus, Delivery
from flexinfer_common.clock import Clock, rfc3339
from flexinfer_common.db import ModelRow
from flexinfer_common.errors import ApiError
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import LeaseEvent, ModelEvent
from flexinfer_common.tasks import Background
from flexinfer_scheduler.adapters.store import Store
from flexinfer_scheduler.api import group_json
from flexinfer_scheduler.loop import Scheduler
from flexinfer_scheduler.ui.view import (
    DeviceInfo,
    EventInfo,
    GroupInfo,
    LeaseInfo,
    MemberInfo,
    SwapInfo,
    build_view,
)

log = get_logger("flexinfer.scheduler.ui")

COOKIE = "flexinfer_ui_session"
SESSION_SECONDS = 12 * 3600
REFRESH_SECONDS = 5.0  # the rebuild when nothing on the bus said so (in-flight counts, queue depths, countdowns)
DEBOUNCE_SECONDS = 0.15  # a burst of bus messages (one pass publishes many) makes one rebuild
KEEPALIVE_SECONDS = 15.0
SetWanted = Callable[[str, str, datetime], Awaitable[ModelRow | None]]  # Store.set_promoted, Store.set_parked
_ASSETS = {"app.js": "text/javascript", "style.css": "text/css", "index.html": "text/html"}


def session_value(token: str, expires: int) -> str:
    mac = hmac.new(token.encode(), f"flexinfer-ui:{expires}".encode(), hashlib.sha256).hexdigest()
    return f"{expires}.{mac}"


def session_valid(token: str, value: str | None, now: float) -> bool:
    if not value or "." not in value:
        return False
    expires, _, _ = value.partition(".")
    if not expires.isdigit() or int(expires) < now:
        return False
    return token_matches(session_value(token, int(expires)), value)


class BusMessage(BaseModel):
    model_config = ConfigDict(frozen=True)
    subject: str
    data: bytes


def _raw(subject: str, data: bytes) -> BusMessage:
    return BusMessage(subject=subject, data=data)


def _member_memory(manifest: dict[str, Any] | None) -> str | None:
    gpu = ((manifest or {}).get("spec") or {}).get("gpu") or {}
    value = gpu.get("memory")
    return str(value) if value is not None else None


def _capacity(manifest: dict[str, Any] | None) -> tuple[str | None, int | None]:
    capacity = ((manifest or {}).get("spec") or {}).get("capacity") or {}
    memory = capacity.get("memoryPerDevice")
    devices = capacity.get("devices")
    return (str(memory) if memory is not None else None, int(devices) if isinstance(devices, int) else None)


def event_of(message: BusMessage) -> EventInfo | None:
    """The events line of a lease or model event from the bus (swaps come from the database); None otherwise."""
    kind = message.subject.split(".")[2] if message.subject.count(".") >= 3 else ""
    try:
        if kind == "lease":
            lease = LeaseEvent.model_validate_json(message.data)
            until = f" until {rfc3339(lease.expires_at)}" if lease.expires_at and lease.kind != "lease.released" else ""
            why = f" ({lease.reason})" if lease.reason else ""
            text = f"{lease.name} of {lease.owner}{until}{why}"
            return EventInfo(lease.time, lease.kind, lease.group, text)
        if kind == "model":
            event = ModelEvent.model_validate_json(message.data)
            text = f"{event.namespace}/{event.model}: {event.status.message or event.status.phase.value}"
            severity = "error" if event.kind == "model.crashed" else "info"
            return EventInfo(event.time, event.kind, event.group, text, severity)
    except (ValueError, ValidationError):
        return None
    return None


class StatusPage:
    """The builder and the subscribers of the status page (one per scheduler process)."""

    def __init__(
        self,
        *,
        store: Store,
        scheduler: Scheduler,
        clock: Clock,
        bus: Bus | None,
        admin_token: str | None,
        lease_manager_url: str,
        refresh_seconds: float = REFRESH_SECONDS,
    ) -> None:
        self.store = store
        self.scheduler = scheduler
        self.clock = clock
        self.bus = bus
        self.admin_token = admin_token
        self.lease_manager_url = lease_manager_url.rstrip("/")
        self.refresh_seconds = refresh_seconds
        self.events: deque[EventInfo] = deque(maxlen=200)
        self.queue_history: dict[str, deque[tuple[datetime, int]]] = {}
        self.latest: str | None = None  # the last document pushed (JSON)
        self._subscribers: set[asyncio.Queue[str]] = set()
        self._changed = asyncio.Event()
        self._closing = asyncio.Event()
        self._worker = Background("status-page", self._run)
        self._consumers: list[Any] = []

    # -- life -------------------------------------------------------------------------------------------
    async def start(self) -> None:
        if self.bus is not None:
            feeds = (
                (subjects.EVENTS_STREAM, subjects.EVENTS_PREFIX),
                (subjects.MODEL_STATUS_STREAM, subjects.STATUS_PREFIX),
                (subjects.DEMAND_STREAM, subjects.DEMAND_PREFIX),
            )
            for stream, prefix in feeds:
                try:
                    self._consumers.append(
                        await self.bus.consume(
                            stream=stream,
                            durable=None,
                            filter_subject=prefix + ".>",
                            decode=_raw,
                            handler=self._on_message,
                            deliver_policy=DeliverPolicy.NEW,
                        )
                    )
                except Exception as exc:  # the page still refreshes every few seconds
                    log.warning("status page: cannot follow the bus", extra={"stream": stream, "error": repr(exc)})
        self._worker.start()

    async def stop(self) -> None:
        self._closing.set()
        for consumer in self._consumers:
            with contextlib.suppress(Exception):
                await consumer.stop()
        await self._worker.stop()

    async def _on_message(self, message: BusMessage, _: Delivery) -> None:
        event = event_of(message)
        if event is not None:
            self.events.append(event)
        self._changed.set()

    def changed(self) -> None:
        """Rebuild soon (an action of the page, a message of the bus)."""
        self._changed.set()

    async def _run(self) -> None:
        while not self._closing.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), self.refresh_seconds)
            await asyncio.sleep(DEBOUNCE_SECONDS)
            self._changed.clear()
            if not self._subscribers:
                continue
            try:
                document = json.dumps(await self.build(), separators=(",", ":"))
            except Exception as exc:
                log.warning("status page: rebuild failed", extra={"error": repr(exc)})
                continue
            if document == self.latest:
                continue
            self.latest = document
            for queue in list(self._subscribers):
                if queue.full():
                    with contextlib.suppress(asyncio.QueueEmpty):
                        queue.get_nowait()  # a slow page skips to the newest document
                queue.put_nowait(document)

    # -- the document -----------------------------------------------------------------------------------
    async def build(self) -> dict[str, Any]:
        now = self.clock.now()
        settings = self.scheduler.settings
        world, _ = await self.store.load_world(
            now, settings.shared_demand_window, in_flight_ttl=self.scheduler.in_flight_ttl
        )
        rows = {(r.namespace, r.name): r for r in await self.store.models()}
        group_rows = {g.name: g for g in await self.store.groups()}
        groups: list[GroupInfo] = []
        members: list[MemberInfo] = []
        leases: list[LeaseInfo] = []
        for snapshot in world.groups:
            summary = group_json(snapshot, group_rows.get(snapshot.name), world.statuses, now, self.scheduler)
            memory, devices = _capacity(group_rows[snapshot.name].manifest if snapshot.name in group_rows else None)
            shown = summary["name"]
            groups.append(
                GroupInfo(
                    name=shown,
                    state=summary["state"],
                    active=str(snapshot.active) if snapshot.active else None,
                    cooldown_remaining_seconds=summary["cooldownRemainingSeconds"],
                    capacity_memory=memory,
                    capacity_devices=devices,
                    devices=tuple(
                        DeviceInfo(
                            index=d["index"],
                            used_bytes=d["usedBytes"],
                            free_bytes=d["freeBytes"],
                            models=tuple(f"{m['namespace']}/{m['name']}" for m in d["models"]),
                        )
                        for d in summary.get("devices", ())
                    ),
                )
            )
            if snapshot.lease is not None:
                lease = snapshot.lease
                leases.append(LeaseInfo(lease.name, shown, lease.owner, lease.expires_at, lease.acquired_at))
            for m in snapshot.members:
                status = world.statuses[m.key]
                row = rows.get((m.key.namespace, m.key.name))
                members.append(
                    MemberInfo(
                        namespace=m.key.namespace,
                        name=m.key.name,
                        group=shown,
                        priority=m.priority,
                        phase=status.phase,
                        state=status.shared_state,
                        queue_position=status.queue_position,
                        waiting=m.queued,
                        in_flight=m.in_flight,
                        last_active_time=m.last_active_time,
                        message=status.message,
                        preempted_by=status.preempted_by,
                        restarts=int(getattr(row, "restarts", 0) or 0),
                        memory=_member_memory(row.manifest if row is not None else None),
                    )
                )
                self._sample(str(m.key), now, m.queued)
        names = {snapshot.name: g.name for snapshot, g in zip(world.groups, groups, strict=True)}
        swaps = [
            SwapInfo(
                id=r.id,
                group=names.get(r.group_name, r.group_name),
                from_model=f"{r.from_namespace}/{r.from_name}" if r.from_name else None,
                to_model=f"{r.to_namespace}/{r.to_name}" if r.to_name else None,
                reason=r.reason,
                phase=r.phase,
                started_at=r.started_at,
                finished_at=r.finished_at,
                phases=r.phases or {},
                message=r.message or "",
            )
            for r in await self.store.swaps(500)
            if r.finished_at is None or r.finished_at >= now - timedelta(hours=1)
        ]
        return build_view(
            groups=groups,
            members=members,
            swaps=swaps,
            leases=leases,
            events=list(self.events),
            queue_history=self.queue_history,
            now=now,
        )

    def _sample(self, model: str, now: datetime, queued: int) -> None:
        """Keep a point when the depth changed (and one every 30 s), for an hour."""
        points = self.queue_history.setdefault(model, deque())
        if points and points[-1][1] == queued and (now - points[-1][0]).total_seconds() < 30:
            return
        if points and points[-1][1] != queued:
            points.append((now, points[-1][1]))  # a step, not a slope
        points.append((now, queued))
        while points and points[0][0] < now - timedelta(hours=1):
            points.popleft()

    # -- the subscribers --------------------------------------------------------------------------------
    async def stream(self, request: Request) -> AsyncIterator[str]:
        queue: asyncio.Queue[str] = asyncio.Queue(maxsize=1)
        self._subscribers.add(queue)
        try:
            yield "retry: 2000\n\n"
            document = json.dumps(await self.build(), separators=(",", ":"))
            yield f"event: state\ndata: {document}\n\n"
            while not self._closing.is_set():
                try:
                    document = await asyncio.wait_for(queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    if await request.is_disconnected():
                        return
                    yield ": keep-alive\n\n"
                    continue
                yield f"event: state\ndata: {document}\n\n"
        finally:
            self._subscribers.discard(queue)

    # -- auth -------------------------------------------------------------------------------------------
    def authorised(self, request: Request) -> bool:
        if self.admin_token is None:
            return True
        if bearer_matches(request.headers.get("authorization"), self.admin_token):
            return True
        return session_valid(self.admin_token, request.cookies.get(COOKIE), time.time())

    def require(self, request: Request) -> None:
        if not self.authorised(request):
            raise ApiError(401, "open the status page with the address `flexinfer up` printed (/ui?token=...)")


def _asset(name: str) -> str:
    return resources.files("flexinfer_scheduler.ui").joinpath("static", name).read_text(encoding="utf-8")


_REFUSED = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>FlexInfer status</title>
<link rel="stylesheet" href="/ui/static/style.css"></head><body><main class="refused"><h1>FlexInfer status</h1>
<p role="alert">{why}</p><p>Open the address <code>flexinfer up</code> printed (it ends in
<code>/ui?token=...</code>), or the token in <code>.flexinfer/admin-token</code> as <code>/ui?token=TOKEN</code>.</p>
</main></body></html>"""


def ui_router(page: StatusPage) -> APIRouter:
    router = APIRouter(include_in_schema=False)

    @router.get("/ui")
    async def index(request: Request, token: str | None = None) -> Response:
        if token is not None and page.admin_token is not None:
            if not token_matches(token, page.admin_token):
                return HTMLResponse(_REFUSED.format(why="That token is not this system's admin token."), 401)
            expires = int(time.time()) + SESSION_SECONDS
            response = RedirectResponse("/ui", status_code=303)
            response.set_cookie(
                COOKIE,
                session_value(page.admin_token, expires),
                max_age=SESSION_SECONDS,
                path="/ui",
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
            return response
        if token is not None:
            return RedirectResponse("/ui", status_code=303)  # no token configured: drop it from the address
        if not page.authorised(request):
            return HTMLResponse(_REFUSED.format(why="Not signed in: this page needs the admin token."), 401)
        return HTMLResponse(_asset("index.html"), headers={"Cache-Control": "no-store"})

    @router.get("/ui/static/{name}")
    async def asset(name: str) -> Response:
        if name not in _ASSETS or name == "index.html":
            raise ApiError(404, f"no asset {name!r}")
        return Response(_asset(name), media_type=_ASSETS[name], headers={"Cache-Control": "no-cache"})

    @router.get("/ui/api/state")
    async def state(request: Request) -> JSONResponse:
        page.require(request)
        return JSONResponse(await page.build())

    @router.get("/ui/api/events")
    async def events(request: Request) -> StreamingResponse:
        page.require(request)
        return StreamingResponse(
            page.stream(request),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def set_wanted(request: Request, namespace: str, name: str, set_: SetWanted, message: str) -> JSONResponse:
        """Promote or park a model as its operator asked, then elect again at once."""
        page.require(request)
        if await set_(namespace, name, page.clock.now()) is None:
            raise ApiError(404, f"model {namespace}/{name} not found")
        page.scheduler.kick()
        page.changed()
        return JSONResponse({"message": message})

    @router.post("/ui/api/models/{namespace}/{name}/promote")
    async def promote(request: Request, namespace: str, name: str) -> JSONResponse:
        message = f"promoted {namespace}/{name}: it takes the GPU (a lease still wins)"
        return await set_wanted(request, namespace, name, page.store.set_promoted, message)

    @router.post("/ui/api/models/{namespace}/{name}/park")
    async def park(request: Request, namespace: str, name: str) -> JSONResponse:
        message = f"parking {namespace}/{name} (as for its idle timeout; a request wakes it)"
        return await set_wanted(request, namespace, name, page.store.set_parked, message)

    @router.post("/ui/api/leases/{name}/release")
    async def release(request: Request, name: str) -> JSONResponse:
        page.require(request)
        headers = {"Authorization": f"Bearer {page.admin_token}"} if page.admin_token else {}
        url = f"{page.lease_manager_url}/api/v1/leases/{name}"
        try:
            async with httpx.AsyncClient(timeout=10.0) as client:
                answer = await client.delete(url, headers=headers)
        except httpx.HTTPError as exc:
            raise ApiError(502, f"the lease manager at {page.lease_manager_url} did not answer: {exc}") from None
        if answer.status_code >= 400:
            try:
                message = answer.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = answer.text[:200]
            raise ApiError(answer.status_code if answer.status_code < 500 else 502, f"lease manager: {message}")
        page.changed()
        return JSONResponse({"message": f"released lease {name}"})

    return router


def mount_ui(app: FastAPI, page: StatusPage) -> None:
    """Serve the status page from ``app`` (the scheduler's admin API)."""
    app.include_router(ui_router(page))
