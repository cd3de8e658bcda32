"""A thin async face on the official ``kubernetes`` client.

Every call goes through :meth:`KubeClient.request`: the client's own ``param_serialize`` + ``call_api`` (so
authentication, TLS, kubeconfig and in-cluster configuration are the library's), JSON bodies as plain dicts (no
typed models: deserialising them costs more than the call), run in a small thread pool so the event loop never
blocks. Watches read the response line by line in a thread of their own and hand events to the loop; closing the
iterator shuts the socket, so a watch never outlives its reader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import threading
from collections.abc import AsyncIterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple, TypedDict, Unpack
from urllib.parse import quote

from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes.watch.watch import iter_resp_lines

from flexinfer_common.logs import get_logger
from flexinfer_common.settings import KubernetesSettings, SettingsError

log = get_logger("flexinfer.kube")

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")

Object = dict[str, Any]


@dataclass(frozen=True)
class Resource:
    """A kind of Kubernetes object: where it lives in the API."""

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None, subresource: str | None = None) -> str:
        """The URL path of the collection (``name`` None; all namespaces when ``namespace`` is None too) or of one
        object, or of its subresource."""
        path = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            path += f"/namespaces/{quote(namespace, safe='')}"
        path += f"/{self.plural}"
        if name is not None:
            path += f"/{quote(name, safe='')}"
            if subresource:
                path += f"/{subresource}"
        return path


PODS = Resource("", "v1", "pods", "Pod")
SERVICES = Resource("", "v1", "services", "Service")
EVENTS = Resource("", "v1", "events", "Event")
CONFIGMAPS = Resource("", "v1", "configmaps", "ConfigMap")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
JOBS = Resource("batch", "v1", "jobs", "Job")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
MODELS = Resource("ai.flexinfer", "v1alpha2", "models", "Model")
GPUGROUPS = Resource("ai.flexinfer", "v1alpha1", "gpugroups", "GPUGroup")
GPULEASES = Resource("ai.flexinfer", "v1alpha1", "gpuleases", "GPULease")
MODELCACHES = Resource("ai.flexinfer", "v1alpha1", "modelcaches", "ModelCache")


class PatchType(StrEnum):
    MERGE = "application/merge-patch+json"
    STRATEGIC = "application/strategic-merge-patch+json"
    JSON = "application/json-patch+json"


class KubeError(Exception):
    """An API call failed: ``status`` is the HTTP status (0: the API server could not be reached)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}" if status else f"unreachable: {message}")
        self.status = status
        self.reason = reason
        self.message = message

    @property
    def not_found(self) -> bool:
        return self.status == 404

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def gone(self) -> bool:
        return self.status == 410

    @classmethod
    def from_status(cls, status: int, body: bytes | Mapping[str, Any]) -> KubeError:
        """From a ``Status`` body (or whatever the server answered)."""
        data: Any = body
        if isinstance(body, bytes | bytearray):
            try:
                data = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                return cls(status, "", body.decode("utf-8", "replace")[:300])
        if isinstance(data, Mapping):
            return cls(int(data.get("code") or status), str(data.get("reason", "")), str(data.get("message", "")))
        return cls(status, "", str(data)[:300])


class WatchEvent(NamedTuple):
    type: str  # ADDED, MODIFIED, DELETED, BOOKMARK
    object: Object


def kube_time(when: datetime, *, micro: bool = False) -> str:
    """``when`` as the API writes a Time (``2026-01-02T03:04:05Z``) or, ``micro``, a MicroTime
    (``2026-01-02T03:04:05.123456Z``: a Lease's acquireTime and renewTime)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def in_cluster() -> bool:
    return bool(os.environ.get("KUBERNETES_SERVICE_HOST")) and SERVICE_ACCOUNT_NAMESPACE.exists()


def own_namespace(default: str) -> str:
    """The namespace this pod runs in (its service account says), else ``default``."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or default
    except OSError:
        return default


def describe_target(kubeconfig: str, context: str) -> str:
    """Which configuration :meth:`KubeClient.connect` would use, for logs and errors."""
    if kubeconfig:
        return f"kubeconfig {kubeconfig}" + (f" (context {context})" if context else "")
    if in_cluster():
        return "in-cluster service account"
    return f"kubeconfig {os.environ.get('KUBECONFIG', '~/.kube/config')}" + (f" (context {context})" if context else "")


def connect_from_settings(settings: KubernetesSettings, *, user_agent: str = "") -> KubeClient:
    """The client a service's settings ask for, or SettingsError naming what is wrong with the configuration.
    ``user_agent`` names the caller in the API server's audit log."""
    try:
        return KubeClient.connect(kubeconfig=settings.kubeconfig, context=settings.kube_context, user_agent=user_agent)
    except Exception as exc:
        where = describe_target(settings.kubeconfig, settings.kube_context)
        raise SettingsError(
            f"FLEXINFER_ACTUATOR=kubernetes: no usable Kubernetes configuration ({where}): {exc}. "
            "Set FLEXINFER_KUBECONFIG (and FLEXINFER_KUBE_CONTEXT), or run in a pod with a service account."
        ) from None


class RequestOptions(TypedDict, total=False):
    """What one API call may carry besides its method and path."""

    query: Mapping[str, str] | None
    body: Any
    content_type: str | None  # of ``body``; default application/json


class KubeClient:
    """The Kubernetes API with dict bodies; every method is a coroutine that runs the call in a thread."""

    def __init__(self, api: k8s.ApiClient, *, threads: int = 16, timeout: float = 30.0) -> None:
        self._api = api
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="kube")
        self._timeout = timeout

    @classmethod
    def connect(cls, *, kubeconfig: str = "", context: str = "", threads: int = 16, user_agent: str = "") -> KubeClient:
        """In-cluster configuration when running in a pod with no kubeconfig given; else the kubeconfig (``kubeconfig``,
        else ``$KUBECONFIG``, else ``~/.kube/config``), its current context unless ``context`` names another."""
        configuration = k8s.Configuration()
        if kubeconfig or context or not in_cluster():
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig or None,
                context=context or None,
                client_configuration=configuration,
                persist_config=False,
            )
        else:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        # One connection per request thread and per watch.
        configuration.connection_pool_maxsize = threads + 16
        api = k8s.ApiClient(configuration)
        if user_agent:  # who made a call, in the API server's audit log
            api.user_agent = user_agent
        return cls(api, threads=threads)

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    # ------------------------------------------------------------------ one request

    def _send(
        self,
        method: str,
        path: str,
        *,
        timeout: float | tuple[float, float] | None = None,
        **options: Unpack[RequestOptions],
    ) -> Any:
        query, body, content_type = options.get("query"), options.get("body"), options.get("content_type")
        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = content_type or "application/json"
        request = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(query.items()) if query else None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            return self._api.call_api(*request, _request_timeout=timeout or self._timeout)
        except k8s.ApiException as exc:
            raise KubeError(exc.status or 0, exc.reason or "", str(exc.body or exc)) from None
        except Exception as exc:  # urllib3: refused, reset, timed out
            raise KubeError(0, "Unreachable", repr(exc)) from None

    def _request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> Object:
        response = self._send(method, path, **options)
        try:
            data = response.read()
        except Exception as exc:
            raise KubeError(0, "Unreachable", repr(exc)) from None
        if not 200 <= response.status < 300:
            raise KubeError.from_status(response.status, data)
        if not data:
            return {}
        parsed: Object = json.loads(data)
        return parsed

    async def request(self, method: str, path: str, **options: Unpack[RequestOptions]) -> Object:
        """One API call; raises :class:`KubeError` (status 0 when the server cannot be reached)."""
        loop = asyncio.get_running_loop()
        call = partial(self._request, method, path, **options)
        return await loop.run_in_executor(self._pool, call)

    # ------------------------------------------------------------------ verbs

    async def get(
        self, resource: Resource, namespace: str | None, name: str, *, subresource: str | None = None
    ) -> Object:
        return await self.request("GET", resource.path(namespace, name, subresource))

    async def get_or_none(self, resource: Resource, namespace: str | None, name: str) -> Object | None:
        try:
            return await self.get(resource, namespace, name)
        except KubeError as exc:
            if exc.not_found:
                return None
            raise

    async def list(
        self,
        resource: Resource,
        namespace: str | None = None,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[Object], str]:
        """The objects (all namespaces when ``namespace`` is None) and the list's resourceVersion."""
        query = {}
        if label_selector:
            query["labelSelector"] = label_selector
        if field_selector:
            query["fieldSelector"] = field_selector
        body = await self.request("GET", resource.path(namespace), query=query or None)
        return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")

    async def create(self, resource: Resource, namespace: str | None, body: Object) -> Object:
        return await self.request("POST", resource.path(namespace), body=body)

    async def replace(
        self, resource: Resource, namespace: str | None, name: str, body: Object, *, subresource: str | None = None
    ) -> Object:
        """PUT; a ``metadata.resourceVersion`` in ``body`` makes it conditional (409 when stale)."""
        return await self.request("PUT", resource.path(namespace, name, subresource), body=body)

    async def patch(
        self,
        resource: Resource,
        namespace: str | None,
        name: str,
        body: Any,
        *,
        subresource: str | None = None,
        patch_type: PatchType = PatchType.MERGE,
    ) -> Object:
        return await self.request(
            "PATCH", resource.path(namespace, name, subresource), body=body, content_type=patch_type.value
        )

    async def delete(self, resource: Resource, namespace: str | None, name: str, *, uid: str | None = None) -> Object:
        """DELETE; with ``uid``, only that very object (409 when the name now belongs to another)."""
        body = {"preconditions": {"uid": uid}} if uid else None
        return await self.request("DELETE", resource.path(namespace, name), body=body)

    # ------------------------------------------------------------------ watch

    async def watch(
        self,
        resource: Resource,
        namespace: str | None,
        *,
        resource_version: str,
        timeout_seconds: int,
        label_selector: str | None = None,
    ) -> AsyncIterator[WatchEvent]:
        """Events after ``resource_version`` until the server ends the stream (``timeout_seconds``).

        An ``ERROR`` event from the server (410 Gone above all) raises :class:`KubeError`; so does a broken
        connection.
        """
        query = {
            "watch": "true",
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if label_selector:
            query["labelSelector"] = label_selector
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[WatchEvent | BaseException | None] = asyncio.Queue()
        opened: list[Any] = []
        stopped = threading.Event()

        def put(item: WatchEvent | BaseException | None) -> None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is listening any more
                loop.call_soon_threadsafe(queue.put_nowait, item)

        def read() -> None:
            try:
                response = self._send(
                    "GET",
                    resource.path(namespace),
                    query=query,
                    # No total timeout: the server ends the stream; a dead connection is noticed by the read timeout.
                    timeout=(10.0, timeout_seconds + 30.0),
                )
                opened.append(response)
                if stopped.is_set():
                    return
                if not 200 <= response.status < 300:
                    put(KubeError.from_status(response.status, response.read()))
                    return
                for line in iter_resp_lines(response.response):  # type: ignore[no-untyped-call]
                    if stopped.is_set():
                        return
                    if not line:
                        continue
                    event = json.loads(line)
                    kind, obj = event.get("type"), event.get("object") or {}
                    if kind == "ERROR":
                        put(KubeError.from_status(int(obj.get("code") or 500), obj))
                        return
                    put(WatchEvent(str(kind), obj))
                put(None)
            except BaseException as exc:
                if not stopped.is_set():
                    put(exc if isinstance(exc, KubeError) else KubeError(0, "Unreachable", repr(exc)))
            finally:
                for response in opened:
                    with contextlib.suppress(Exception):
                        response.response.release_conn()

        thread = threading.Thread(target=read, name=f"watch:{resource.plural}", daemon=True)
        thread.start()
        try:
            while True:
                item = await queue.get()
                if item is None:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stopped.set()
            for response in opened:
                with contextlib.suppress(Exception):
                    response.response.shutdown()

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        with contextlib.suppress(Exception):
            await asyncio.get_running_loop().run_in_executor(None, self._api.close)
