"""The Kubernetes API over real HTTP: an aiohttp application on 127.0.0.1 serving a `Store`.

Discovery (legacy, non-aggregated), OpenAPI v3 (enough for kubectl's field-validation check and `explain` of
custom resources), CRUD, subresources, list/watch with selectors, Tables for `kubectl get`; plus the test
controls: the request log in RBAC terms, injected errors, `unreachable()`, `compact()`, `expire_watches()`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import yaml
from aiohttp import web

from flexinfer_testbed.kube.errors import ApiError, Reason, bad_request, conflict
from flexinfer_testbed.kube.resources import ResourceType
from flexinfer_testbed.kube.selectors import parse_field_selector, parse_label_selector
from flexinfer_testbed.kube.store import EventType, FieldValidation, Obj, PatchType, Store, StoredEvent
from flexinfer_testbed.kube.tables import table_for

log = logging.getLogger("flexinfer.tests.kube")

KUBERNETES_VERSION = {
    "major": "1",
    "minor": "37",
    "gitVersion": "v1.37.0-flexinfer-emulator",
    "gitCommit": "",
    "gitTreeState": "clean",
    "buildDate": "2026-11-30T00:00:00Z",
    "goVersion": "go1.25",
    "compiler": "gc",
    "platform": "linux/amd64",
}
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
LOGGED = web.RequestKey("flexinfer-emulator-logged", bool)


@dataclass(frozen=True)
class ApiCall:
    """One request, in the attributes an RBAC rule matches (plus what a test needs to tell calls apart)."""

    verb: str
    api_group: str
    resource: str
    subresource: str
    namespace: str
    name: str
    method: str
    path: str
    status: int
    query: dict[str, str] = field(default_factory=dict, compare=False)
    content_type: str = ""
    user_agent: str = ""

    @property
    def resource_path(self) -> str:
        """`resource/subresource` (as Role rules spell it), or the path of a non-resource request."""
        if not self.resource:
            return self.path
        return f"{self.resource}/{self.subresource}" if self.subresource else self.resource


@dataclass
class InjectedError:
    remaining: int
    reason: Reason
    message: str
    verbs: frozenset[str]
    resource: str | None
    name: str | None
    namespace: str | None
    subresource: str | None
    api_group: str | None

    def matches(self, call: _Target) -> bool:
        return (
            self.remaining > 0
            and call.verb in self.verbs
            and self.resource in (None, call.rt.plural if call.rt else "")
            and self.api_group in (None, call.rt.group if call.rt else "")
            and self.name in (None, call.name)
            and self.namespace in (None, call.namespace)
            and (self.subresource is None or self.subresource == call.subresource)
        )


@dataclass
class _Target:
    verb: str
    rt: ResourceType | None
    namespace: str | None
    name: str
    subresource: str


def _encode_continue(rv: str, start: int) -> str:
    return base64.urlsafe_b64encode(json.dumps({"rv": rv, "start": start}).encode()).decode()


def _decode_continue(token: str) -> int:
    try:
        return int(json.loads(base64.urlsafe_b64decode(token.encode()))["start"])
    except (ValueError, KeyError, TypeError):
        raise bad_request("continue key is not valid") from None


class Emulator:
    """A Kubernetes API server on `url`, in the current event loop. `start()`, then `close()`."""

    def __init__(
        self,
        store: Store | None = None,
        *,
        host: str = "127.0.0.1",
        bookmark_interval: float = 1.0,
        default_watch_timeout: float = 1800.0,
    ) -> None:
        self.store = store or Store()
        self.host = host
        self.port = 0
        #: Seconds between BOOKMARK events on a watch that allows them (the real server: about a minute).
        self.bookmark_interval = bookmark_interval
        #: A watch without timeoutSeconds ends after this long (the real server: 30-60 min, randomised).
        self.default_watch_timeout = default_watch_timeout
        self.requests: list[ApiCall] = []
        self._errors: list[InjectedError] = []
        self._runner: web.AppRunner | None = None
        self._site: web.TCPSite | None = None
        self._streams: set[web.StreamResponse] = set()
        self.reachable = True
        #: Where `pods/log` reads a container's output: (namespace, pod, container or None) -> text.
        self.log_source: Callable[[str, str, str | None], str] | None = None

    # ------------------------------------------------------------------------------------------ lifecycle

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self) -> None:
        app = web.Application(client_max_size=16 * 1024 * 1024)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=0.5)
        await self._runner.setup()
        self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await self._site.start()
        self.port = self._runner.addresses[0][1]

    async def close(self) -> None:
        self.store.expire_watches()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # ------------------------------------------------------------------------------------------ controls

    def compact(self) -> None:
        """Forget the watch history (etcd compaction): resuming any open watch's position gets 410."""
        self.store.compact()

    def expire_watches(self) -> None:
        """End every open watch stream now, cleanly, as the server does when a watch times out."""
        self.store.expire_watches()

    def drop_connections(self) -> None:
        """Abort every open connection (watches included), as a crashing API server or a network cut does."""
        if self._runner is not None and self._runner.server is not None:
            for handler in list(self._runner.server.connections):
                transport = handler.transport
                if transport is not None:
                    transport.abort()

    async def set_reachable(self, reachable: bool) -> None:
        """False: stop listening (connects are refused) and drop open connections; True: listen again."""
        if reachable == self.reachable:
            return
        self.reachable = reachable
        assert self._runner is not None
        if not reachable:
            if self._site is not None:
                await self._site.stop()
                self._site = None
            self.store.expire_watches()
            self.drop_connections()
        else:
            self._site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
            await self._site.start()

    @contextlib.asynccontextmanager
    async def unreachable(self) -> AsyncIterator[None]:
        """`async with emulator.unreachable():` the API server is down inside the block, back after it."""
        await self.set_reachable(False)
        try:
            yield
        finally:
            await self.set_reachable(True)

    def inject_error(
        self,
        count: int = 1,
        *,
        reason: Reason = Reason.CONFLICT,
        message: str = "",
        verbs: tuple[str, ...] = ("update", "patch"),
        resource: str | None = None,
        name: str | None = None,
        namespace: str | None = None,
        subresource: str | None = None,
        api_group: str | None = None,
    ) -> InjectedError:
        """Answer the next `count` matching requests with an error instead of serving them."""
        rule = InjectedError(
            count, reason, message, frozenset(verbs), resource, name, namespace, subresource, api_group
        )
        self._errors.append(rule)
        return rule

    def inject_conflicts(self, count: int = 1, **match: Any) -> InjectedError:
        """The next `count` matching writes (update/patch by default) get 409 Conflict, as after a lost race."""
        return self.inject_error(count, reason=Reason.CONFLICT, **match)

    def calls(self, **match: str) -> list[ApiCall]:
        """Logged requests whose attributes equal every keyword (`calls(verb="patch", subresource="status")`)."""
        return [c for c in self.requests if all(getattr(c, k) == v for k, v in match.items())]

    # ------------------------------------------------------------------------------------------ dispatch

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        target: _Target | None = None
        try:
            parts = [p for p in request.path.split("/") if p]
            if parts[:1] == ["api"] and len(parts) >= 2:
                group, version, rest = "", parts[1], parts[2:]
            elif parts[:1] == ["apis"] and len(parts) >= 3:
                group, version, rest = parts[1], parts[2], parts[3:]
            else:
                rest = None
            if rest:
                target = self._target(request, group, version, rest)
                response = await self._serve(request, target)
            else:
                response = self._non_resource(request, parts)
        except ApiError as error:
            response = web.json_response(error.status(), status=error.code)
        except Exception as error:  # an emulator bug must show as a 500 with the reason, not a hang
            log.exception("emulator failed on %s %s", request.method, request.path_qs)
            failure = ApiError(Reason.INTERNAL_ERROR, f"emulator error: {error!r}")
            response = web.json_response(failure.status(), status=500)
        if not request.get(LOGGED):
            self._log(request, target, response.status)
        return response

    def _log(self, request: web.Request, target: _Target | None, status: int) -> None:
        request[LOGGED] = True
        self.requests.append(
            ApiCall(
                verb=target.verb if target else request.method.lower(),
                api_group=target.rt.group if target and target.rt else "",
                resource=target.rt.plural if target and target.rt else "",
                subresource=target.subresource if target else "",
                namespace=(target.namespace or "") if target else "",
                name=target.name if target else "",
                method=request.method,
                path=request.path,
                status=status,
                query=dict(request.query),
                content_type=request.headers.get("Content-Type", ""),
                user_agent=request.headers.get("User-Agent", ""),
            )
        )

    def _target(self, request: web.Request, group: str, version: str, rest: list[str]) -> _Target:
        namespace: str | None = None
        if rest[0] == "namespaces" and len(rest) >= 3 and rest[2] not in ("status", "finalize"):
            namespace, rest = rest[1], rest[2:]
        plural = rest[0]
        name = rest[1] if len(rest) > 1 else ""
        sub = rest[2] if len(rest) > 2 else ""
        if len(rest) > 3:
            raise ApiError(Reason.NOT_FOUND, "the server could not find the requested resource")
        rt = self.store.type(group, version, plural)
        if rt.namespaced is False and namespace is not None:
            raise ApiError(Reason.NOT_FOUND, "the server could not find the requested resource")
        method = request.method
        if method == "GET":
            watching = request.query.get("watch") in ("true", "1")
            verb = "get" if name else ("watch" if watching else "list")
        elif method == "POST":
            verb = "create"
        elif method == "PUT":
            verb = "update"
        elif method == "PATCH":
            verb = "patch"
        elif method == "DELETE":
            verb = "delete" if name else "deletecollection"
        else:
            raise ApiError(Reason.METHOD_NOT_ALLOWED, "the server does not allow this method on the requested resource")
        target = _Target(verb, rt, namespace, name, sub)
        if sub == "log" and rt.key == ("", "pods") and verb == "get":
            return target
        if sub and sub not in rt.subresources:
            raise ApiError(Reason.NOT_FOUND, "the server could not find the requested resource")
        if method == "POST" and name:
            raise ApiError(Reason.METHOD_NOT_ALLOWED, "the server does not allow this method on the requested resource")
        if method in ("PUT", "PATCH") and not name:
            raise ApiError(Reason.METHOD_NOT_ALLOWED, "the server does not allow this method on the requested resource")
        if sub and verb not in ("get", "update", "patch"):
            raise ApiError(Reason.METHOD_NOT_ALLOWED, "the server does not allow this method on the requested resource")
        return target

    async def _body(self, request: web.Request) -> Any:
        raw = await request.read()
        if not raw:
            return None
        content_type = request.headers.get("Content-Type", "application/json").split(";")[0].strip()
        if "protobuf" in content_type or "cbor" in content_type:
            raise ApiError(
                Reason.UNSUPPORTED_MEDIA_TYPE,
                f"the body of the request was in an unknown format - "
                f"accepted media types include: application/json, "
                f"application/yaml (the emulator does not decode "
                f"{content_type})",
            )
        try:
            if content_type == PatchType.APPLY or content_type.endswith("yaml"):
                return yaml.safe_load(raw)
            return json.loads(raw)
        except (ValueError, yaml.YAMLError) as error:
            raise bad_request(f"the body of the request could not be decoded: {error}") from None

    def _respond(
        self, request: web.Request, body: Obj, status: int = 200, warnings: list[str] | None = None
    ) -> web.Response:
        headers = {}
        if warnings:
            headers["Warning"] = ", ".join(f'299 - "{w.replace(chr(34), chr(92) + chr(34))}"' for w in warnings)
        text = json.dumps(body, indent=2 if request.query.get("pretty") == "true" else None)
        return web.Response(text=text, status=status, content_type="application/json", headers=headers)

    async def _serve(self, request: web.Request, target: _Target) -> web.StreamResponse:
        assert target.rt is not None
        for rule in self._errors:
            if rule.matches(target):
                rule.remaining -= 1
                if rule.reason == Reason.CONFLICT:
                    raise conflict(target.rt.qualified(), target.name, target.rt.group, why=rule.message)
                raise ApiError(rule.reason, rule.message or f"injected {rule.reason.value}")
        rt, store, q = target.rt, self.store, request.query
        ns, name, sub = target.namespace, target.name, target.subresource
        if rt.namespaced and ns is None and target.verb not in ("list", "watch"):
            raise ApiError(Reason.NOT_FOUND, "the server could not find the requested resource")
        dry_run = q.get("dryRun") == "All"
        validation = (
            FieldValidation(q.get("fieldValidation", "Warn"))
            if q.get("fieldValidation") in ("Ignore", "Warn", "Strict")
            else FieldValidation.WARN
        )
        warnings: list[str] = []
        match target.verb:
            case "get":
                if sub == "log":
                    return self._pod_log(request, ns or "", name)
                if sub == "scale":
                    return self._respond(request, store.get_scale(rt, ns, name))
                obj = store.get(rt, ns, name)
                if self._wants_table(request):
                    return self._respond(
                        request,
                        table_for(
                            rt,
                            [obj],
                            store.now(),
                            include=self._include(request),
                            rv=obj["metadata"]["resourceVersion"],
                        ),
                    )
                return self._respond(request, obj)
            case "list":
                return self._list(request, rt, ns)
            case "watch":
                return await self._watch(request, rt, ns)
            case "create":
                body = await self._body(request)
                created = store.create(rt, ns, body, validation=validation, warnings=warnings, dry_run=dry_run)
                return self._respond(request, created, 201, warnings)
            case "update":
                body = await self._body(request)
                if sub == "scale":
                    return self._respond(request, store.update_scale(rt, ns, name, body, dry_run=dry_run))
                updated = store.update(
                    rt,
                    ns,
                    name,
                    body,
                    subresource=sub or None,
                    validation=validation,
                    warnings=warnings,
                    dry_run=dry_run,
                )
                return self._respond(request, updated, 200, warnings)
            case "patch":
                content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
                try:
                    patch_type = PatchType(content_type)
                except ValueError:
                    raise ApiError(
                        Reason.UNSUPPORTED_MEDIA_TYPE,
                        f"the body of the request was in an unknown "
                        f"format - accepted media types include: "
                        f"{', '.join(p.value for p in PatchType)}",
                    ) from None
                body = await self._body(request)
                patched = store.patch(
                    rt,
                    ns,
                    name,
                    patch_type,
                    body,
                    subresource=sub or None,
                    validation=validation,
                    warnings=warnings,
                    field_manager=q.get("fieldManager"),
                    dry_run=dry_run,
                )
                return self._respond(request, patched, 200, warnings)
            case "delete":
                options = await self._body(request) or {}
                grace = q.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
                obj, gone_now = store.delete(
                    rt,
                    ns,
                    name,
                    grace_period=int(grace) if grace is not None else None,
                    propagation=q.get("propagationPolicy", options.get("propagationPolicy")),
                    preconditions=options.get("preconditions"),
                    dry_run=dry_run or options.get("dryRun") == ["All"],
                )
                if gone_now and rt.builtin and rt.key != ("", "pods"):
                    return self._respond(
                        request,
                        {
                            "kind": "Status",
                            "apiVersion": "v1",
                            "metadata": {},
                            "status": "Success",
                            "details": {
                                "name": name,
                                "group": rt.group,
                                "kind": rt.plural,
                                "uid": obj["metadata"]["uid"],
                            },
                        },
                    )
                return self._respond(request, obj, 200 if gone_now else 202)
            case "deletecollection":
                labels = parse_label_selector(q.get("labelSelector"))
                fields = parse_field_selector(q.get("fieldSelector"), rt.field_selectors, rt.plural)
                options = await self._body(request) or {}
                grace = q.get("gracePeriodSeconds", options.get("gracePeriodSeconds"))
                deleted = []
                for obj in list(store.iter(rt, ns, labels, fields)):
                    meta = obj["metadata"]
                    if store.find(rt, meta.get("namespace"), meta["name"]) is None:
                        continue
                    view, _ = store.delete(
                        rt,
                        meta.get("namespace"),
                        meta["name"],
                        grace_period=int(grace) if grace is not None else None,
                        propagation=q.get("propagationPolicy", options.get("propagationPolicy")),
                    )
                    deleted.append(view)
                return self._respond(
                    request,
                    {
                        "apiVersion": rt.api_version,
                        "kind": rt.list_kind,
                        "metadata": {"resourceVersion": str(store.resource_version)},
                        "items": deleted,
                    },
                )
        raise ApiError(Reason.METHOD_NOT_ALLOWED, "unsupported")

    def _pod_log(self, request: web.Request, namespace: str, name: str) -> web.Response:
        """`kubectl logs`: the container's output as the fake kubelet captured it (tailLines honoured)."""
        self.store.get(self.store.type("", "v1", "pods"), namespace, name)
        text = self.log_source(namespace, name, request.query.get("container")) if self.log_source else ""
        tail = request.query.get("tailLines")
        if tail is not None:
            lines = text.splitlines(keepends=True)
            text = "".join(lines[-int(tail) :]) if int(tail) > 0 else ""
        return web.Response(text=text, content_type="text/plain")

    @staticmethod
    def _wants_table(request: web.Request) -> bool:
        return "as=Table" in request.headers.get("Accept", "")

    @staticmethod
    def _include(request: web.Request) -> str:
        return request.query.get("includeObject", "Metadata")

    def _list(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.Response:
        q = request.query
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), rt.field_selectors, rt.plural)
        listed = self.store.list(rt, namespace, labels, fields)
        start = _decode_continue(q["continue"]) if q.get("continue") else 0
        items = listed["items"][start:]
        limit = int(q.get("limit") or 0)
        if limit and len(items) > limit:
            listed["metadata"]["continue"] = _encode_continue(listed["metadata"]["resourceVersion"], start + limit)
            listed["metadata"]["remainingItemCount"] = len(items) - limit
            items = items[:limit]
        listed["items"] = items
        if self._wants_table(request):
            table = table_for(
                rt, items, self.store.now(), include=self._include(request), rv=listed["metadata"]["resourceVersion"]
            )
            table["metadata"].update({k: v for k, v in listed["metadata"].items() if k != "resourceVersion"})
            return self._respond(request, table)
        return self._respond(request, listed)

    async def _watch(self, request: web.Request, rt: ResourceType, namespace: str | None) -> web.StreamResponse:
        q = request.query
        labels = parse_label_selector(q.get("labelSelector"))
        fields = parse_field_selector(q.get("fieldSelector"), rt.field_selectors, rt.plural)
        timeout = float(q.get("timeoutSeconds") or self.default_watch_timeout)
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        initial = q.get("sendInitialEvents") in ("true", "1")
        rv = q.get("resourceVersion")
        response = web.StreamResponse(status=200, headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        # A watch is logged when it opens (tests wait for "the client is watching"), not when it ends.
        self._log(request, _Target("watch", rt, namespace, "", ""), 200)
        table = self._wants_table(request)
        try:
            watcher = self.store.watch(rt, namespace, labels, fields, None if initial else rv)
        except ApiError as error:
            await response.write(json.dumps({"type": EventType.ERROR.value, "object": error.status()}).encode() + b"\n")
            await response.write_eof()
            return response
        self._streams.add(response)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        next_bookmark = loop.time() + self.bookmark_interval
        try:
            if initial:
                pending = watcher.queue.qsize()
                for _ in range(pending):
                    event = watcher.queue.get_nowait()
                    if event is not None:
                        await self._send(response, rt, event, table, request)
                if bookmarks:
                    await self._bookmark(response, rt, {INITIAL_EVENTS_END: "true"})
            while True:
                now = loop.time()
                if now >= deadline:
                    break
                wait = deadline - now
                if bookmarks:
                    wait = min(wait, max(0.0, next_bookmark - now))
                try:
                    event = await asyncio.wait_for(watcher.queue.get(), timeout=wait)
                except TimeoutError:
                    if bookmarks and loop.time() >= next_bookmark:
                        await self._bookmark(response, rt)
                        next_bookmark = loop.time() + self.bookmark_interval
                    continue
                if event is None:
                    break
                await self._send(response, rt, event, table, request)
            await response.write_eof()
        except (ConnectionResetError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.store.unwatch(watcher)
            self._streams.discard(response)
        return response

    async def _bookmark(
        self, response: web.StreamResponse, rt: ResourceType, annotations: dict[str, str] | None = None
    ) -> None:
        meta: Obj = {"resourceVersion": str(self.store.resource_version)}
        if annotations:
            meta["annotations"] = annotations
        event = {
            "type": EventType.BOOKMARK.value,
            "object": {"kind": rt.kind, "apiVersion": rt.api_version, "metadata": meta},
        }
        await response.write(json.dumps(event).encode() + b"\n")

    async def _send(
        self, response: web.StreamResponse, rt: ResourceType, event: StoredEvent, table: bool, request: web.Request
    ) -> None:
        obj = dict(event.obj)
        obj["apiVersion"], obj["kind"] = rt.api_version, rt.kind
        if table:
            obj = table_for(
                rt, [obj], self.store.now(), include=self._include(request), rv=obj["metadata"]["resourceVersion"]
            )
        await response.write(json.dumps({"type": event.type.value, "object": obj}).encode() + b"\n")

    # ------------------------------------------------------------------------------------------ discovery

    def _non_resource(self, request: web.Request, parts: list[str]) -> web.Response:
        if request.method != "GET":
            raise ApiError(Reason.METHOD_NOT_ALLOWED, "the server does not allow this method")
        path = "/" + "/".join(parts)
        if path == "/version":
            return self._respond(request, KUBERNETES_VERSION)
        if path in ("/healthz", "/readyz", "/livez"):
            return web.Response(text="ok")
        if path == "/api":
            return self._respond(
                request,
                {
                    "kind": "APIVersions",
                    "versions": ["v1"],
                    "serverAddressByClientCIDRs": [
                        {"clientCIDR": "0.0.0.0/0", "serverAddress": f"{self.host}:{self.port}"}
                    ],
                },
            )
        if path == "/apis":
            return self._respond(
                request,
                {"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._group(g) for g in self._groups()]},
            )
        if path == "/api/v1":
            return self._respond(request, self._resource_list("", "v1"))
        if len(parts) == 2 and parts[0] == "apis" and parts[1] in self._groups():
            return self._respond(request, {"kind": "APIGroup", "apiVersion": "v1", **self._group(parts[1])})
        if len(parts) == 3 and parts[0] == "apis" and parts[2] in self._groups().get(parts[1], []):
            return self._respond(request, self._resource_list(parts[1], parts[2]))
        if path == "/openapi/v3":
            return self._respond(
                request,
                {
                    "paths": {
                        gv: {"serverRelativeURL": f"/openapi/v3/{gv}?hash={self._openapi_hash(gv)}"}
                        for gv in self._openapi_gvs()
                    }
                },
            )
        if parts[:2] == ["openapi", "v3"] and "/".join(parts[2:]) in self._openapi_gvs():
            return self._respond(request, self._openapi_doc("/".join(parts[2:])))
        if path == "/":
            paths = ["/api", "/api/v1", "/apis", "/openapi/v3", "/version", "/healthz"]
            paths += [f"/apis/{g}" for g in self._groups()]
            paths += [f"/apis/{g}/{v}" for g, vs in self._groups().items() for v in vs]
            return self._respond(request, {"paths": sorted(paths)})
        raise ApiError(Reason.NOT_FOUND, "the server could not find the requested resource")

    def _groups(self) -> dict[str, list[str]]:
        groups: dict[str, list[str]] = {}
        for rt in self.store.types():
            if rt.group and rt.version not in groups.setdefault(rt.group, []):
                groups[rt.group].append(rt.version)
        return groups

    def _group(self, name: str) -> Obj:
        versions = self._groups()[name]
        entries = [{"groupVersion": f"{name}/{v}", "version": v} for v in versions]
        return {"name": name, "versions": entries, "preferredVersion": entries[0]}

    def _resource_list(self, group: str, version: str) -> Obj:
        resources = []
        for rt in sorted(self.store.types(), key=lambda t: t.plural):
            if rt.group != group or rt.version != version:
                continue
            entry: Obj = {
                "name": rt.plural,
                "singularName": rt.singular,
                "namespaced": rt.namespaced,
                "kind": rt.kind,
                "verbs": ["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"],
            }
            if rt.short_names:
                entry["shortNames"] = list(rt.short_names)
            if rt.categories:
                entry["categories"] = list(rt.categories)
            resources.append(entry)
            if rt.status_subresource:
                resources.append(
                    {
                        "name": f"{rt.plural}/status",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "kind": rt.kind,
                        "verbs": ["get", "patch", "update"],
                    }
                )
            if rt.scale:
                resources.append(
                    {
                        "name": f"{rt.plural}/scale",
                        "singularName": "",
                        "namespaced": rt.namespaced,
                        "group": "autoscaling",
                        "version": "v1",
                        "kind": "Scale",
                        "verbs": ["get", "patch", "update"],
                    }
                )
        return {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version,
            "resources": resources,
        }

    def _openapi_gvs(self) -> list[str]:
        gvs = {("api/v1" if not rt.group else f"apis/{rt.group}/{rt.version}") for rt in self.store.types()}
        return sorted(gvs)

    def _openapi_hash(self, gv: str) -> str:
        return hashlib.sha256(json.dumps(self._openapi_doc(gv), sort_keys=True).encode()).hexdigest()[:16].upper()

    def _openapi_doc(self, gv: str) -> Obj:
        """Paths with the `fieldValidation` parameter (so kubectl validates on the server, as with a real one)
        and, for custom resources, their structural schemas (so `kubectl explain` works)."""
        paths: Obj = {}
        schemas: Obj = {}
        for rt in self.store.types():
            if ("api/v1" if not rt.group else f"apis/{rt.group}/{rt.version}") != gv:
                continue
            gvk = [{"group": rt.group, "version": rt.version, "kind": rt.kind}]
            prefix = f"/{gv}/namespaces/{{namespace}}/{rt.plural}" if rt.namespaced else f"/{gv}/{rt.plural}"
            validation = {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": True}}
            content = {t: {"schema": {"type": "object"}} for t in (PatchType.JSON, PatchType.MERGE, PatchType.APPLY)}
            operation = {
                "x-kubernetes-group-version-kind": gvk[0],
                "x-kubernetes-action": "patch",
                "parameters": [validation],
                "requestBody": {"content": content},
                "responses": {"200": {"description": "OK"}},
            }
            create = {
                "x-kubernetes-group-version-kind": gvk[0],
                "x-kubernetes-action": "post",
                "parameters": [validation],
                "responses": {"201": {"description": "Created"}},
            }
            paths[f"{prefix}/{{name}}"] = {"patch": operation, "put": {**operation, "x-kubernetes-action": "put"}}
            paths[prefix] = {"post": create}
            if rt.schema is not None:
                reverse = ".".join(reversed(rt.group.split(".")))
                schemas[f"{reverse}.{rt.version}.{rt.kind}"] = {**rt.schema, "x-kubernetes-group-version-kind": gvk}
        return {
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": KUBERNETES_VERSION["gitVersion"]},
            "paths": paths,
            "components": {"schemas": schemas},
        }
