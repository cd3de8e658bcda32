"""Run the services in-process, on real NATS and Postgres, for integration tests.

Each service runs its own ``serve(settings, stop)`` (the same function its ``main`` runs) as a task, on free
loopback ports, with test-sized timings. The actuator starts real model processes (the fake model server).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from flexinfer_cli.embedded import free_port
from flexinfer_common.nats_auth import SERVICE_IDENTITIES
from flexinfer_testbed.servers import identity_url


@dataclass
class Service:
    name: str
    port: int
    task: asyncio.Task[None]
    stop: asyncio.Event

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@dataclass
class System:
    services: dict[str, Service] = field(default_factory=dict)
    http: aiohttp.ClientSession | None = None
    # how to start each service again (``start_service``): its kind and settings; ``common`` for a new one
    recipes: dict[str, tuple[str, dict[str, Any]]] = field(default_factory=dict)
    common: dict[str, Any] = field(default_factory=dict)
    token: str | None = None  # the admin token the services were given, if any

    def url(self, name: str) -> str:
        return self.services[name].url

    async def stop_service(self, name: str) -> None:
        service = self.services[name]
        service.stop.set()
        await asyncio.wait_for(service.task, timeout=30)

    async def start_service(self, name: str, kind: str | None = None, **overrides: Any) -> Service:
        """Start ``name`` again (after ``stop_service``), or another instance of ``kind`` under a new ``name``."""
        if name in self.recipes:
            base_kind, settings = self.recipes[name]
        else:
            base_kind, settings = kind or name, self.common
        return await _start(self, name, kind or base_kind, {**settings, **overrides})

    async def put_model(self, manifest: dict[str, Any]) -> dict[str, Any]:
        assert self.http is not None
        meta = manifest["metadata"]
        url = f"{self.url('scheduler')}/api/v1/models/{meta.get('namespace', 'default')}/{meta['name']}"
        async with self.http.put(url, json=manifest) as resp:
            body: dict[str, Any] = await resp.json()
            assert resp.status in (200, 201), body
            return body

    async def get(self, service: str, path: str) -> Any:
        assert self.http is not None
        async with self.http.get(self.url(service) + path) as resp:
            return await resp.json()

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    async def call(self, method: str, service: str, path: str, body: Any = None, **kwargs: Any) -> tuple[int, Any]:
        """One request: (status, decoded JSON body or None)."""
        assert self.http is not None
        async with self.http.request(method, self.url(service) + path, json=body, **kwargs) as resp:
            text = await resp.text()
            try:
                return resp.status, json.loads(text) if text else None
            except json.JSONDecodeError:
                return resp.status, text

    async def metrics(self, service: str) -> str:
        assert self.http is not None
        async with self.http.get(self.url(service) + "/metrics") as resp:
            return await resp.text()


TIMINGS = {
    "reconcile_interval": 0.3,
    "readiness_probe_interval": 0.05,
    "park_grace_period": 2,
    "demand_refresh_interval": 0.5,
    "activity_report_interval": 0.2,
    "command_retry": 2,
    "restart_backoff": 1,
    "load_timeout": 30,
    "queue_timeout": 60,
    "lease_refresh_interval": 1,
}


async def _ready(url: str, task: asyncio.Task[None], limit: float = 30) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    async with aiohttp.ClientSession() as http:
        while True:
            if task.done():
                task.result()
                raise RuntimeError(f"{url}: service stopped during start-up")
            with contextlib.suppress(aiohttp.ClientError):
                async with http.get(url + "/readyz") as resp:
                    if resp.status == 200:
                        return
            if asyncio.get_running_loop().time() > deadline:
                raise TimeoutError(f"{url}/readyz not ready after {limit}s")
            await asyncio.sleep(0.05)


Factory = tuple[str, Callable[..., Any], Callable[[Any, asyncio.Event], Coroutine[Any, Any, None]]]


def _factories() -> dict[str, Factory]:
    from flexinfer_actuator.main import serve as serve_actuator
    from flexinfer_actuator.settings import ActuatorSettings
    from flexinfer_lease_manager.main import serve as serve_lease_manager
    from flexinfer_lease_manager.settings import LeaseManagerSettings
    from flexinfer_proxy.main import serve as serve_proxy
    from flexinfer_proxy.settings import ProxySettings
    from flexinfer_scheduler.main import serve as serve_scheduler
    from flexinfer_scheduler.settings import SchedulerSettings

    return {
        "scheduler": ("scheduler_port", SchedulerSettings, serve_scheduler),
        "actuator": ("actuator_port", ActuatorSettings, serve_actuator),
        "proxy": ("proxy_port", ProxySettings, serve_proxy),
        "lease-manager": ("lease_manager_port", LeaseManagerSettings, serve_lease_manager),
    }


async def _start(system: System, name: str, kind: str, values: dict[str, Any]) -> Service:
    port_field, settings_cls, serve = _factories()[kind]
    port = free_port()
    fields = getattr(settings_cls, "model_fields", {})
    settings = settings_cls(**{k: v for k, v in {**values, port_field: port}.items() if k in fields})
    stop = asyncio.Event()
    task = asyncio.create_task(serve(settings, stop), name=f"service:{name}")
    system.services[name] = Service(name, port, task, stop)
    system.recipes[name] = (kind, values)
    await _ready(system.url(name), task)
    return system.services[name]


# Kubernetes mode in tests: leader election on a few seconds' lease, so a takeover is quick.
KUBERNETES_TIMINGS = {"leader_lease_duration": 3, "leader_renew_deadline": 2, "leader_retry_period": 0.3}


@contextlib.asynccontextmanager
async def running_system(
    *,
    database_url: str,
    nats_url: str,
    state_dir: Path,
    services: tuple[str, ...] = ("scheduler", "actuator", "proxy"),
    kubeconfig: Path | None = None,
    lease_manager: dict[str, Any] | None = None,
    **overrides: Any,
) -> AsyncIterator[System]:
    """The services in-process. With ``kubeconfig`` the actuator runs its ``kubernetes`` back-end against that
    cluster (the API emulator of flexinfer_testbed.kube); ``lease_manager``: settings of the lease manager only (e.g.
    its Kubernetes mode)."""
    common = {"nats_url": nats_url, "database_url": database_url, "bind_host": "127.0.0.1", **TIMINGS}
    if kubeconfig is not None:
        common.update(KUBERNETES_TIMINGS, actuator="kubernetes", kubeconfig=str(kubeconfig))
    common.update(overrides, state_dir=state_dir)
    system = System(common=common)
    try:
        for name in services:
            extra: dict[str, Any] = {}
            if name == "actuator":
                extra["instance_id"] = "actuator-test"
            if name == "proxy":
                extra["instance_id"] = "proxy-test"
            if name == "lease-manager":
                extra.update(instance_id="lease-manager-test", **(lease_manager or {}))
            if name in SERVICE_IDENTITIES:  # each service as its own bus identity, as `flexinfer up` runs it
                extra["nats_url"] = identity_url(nats_url, SERVICE_IDENTITIES[name])
            await _start(system, name, name, {**common, **extra})
        system.token = overrides.get("admin_token")
        system.http = aiohttp.ClientSession(headers=system.auth())
        yield system
    finally:
        if system.http is not None:
            await system.http.close()
        for name in reversed(list(system.services)):
            service = system.services[name]
            service.stop.set()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(service.task, timeout=30)


def service_environment(**settings: str) -> dict[str, str]:
    """The environment of a service run as its own process: this one's, on loopback, logging warnings and worse,
    and each of ``settings`` as ``FLEXINFER_<NAME>`` (``nats_url=...`` is FLEXINFER_NATS_URL)."""
    return {
        **os.environ,
        "FLEXINFER_BIND_HOST": "127.0.0.1",
        "FLEXINFER_LOG_LEVEL": "WARNING",
        **{f"FLEXINFER_{name.upper()}": value for name, value in settings.items()},
    }


def fake_model_command(
    name: str, *options: str, startup_delay: float = 0.3, program: Sequence[str] = ("flexinfer-fake-model",)
) -> list[str]:
    """The command line of the fake OpenAI-compatible model server (tools/fake-model) serving ``name`` on
    ``{port}`` (the actuator puts the port in), loaded ``startup_delay`` seconds after it starts."""
    return [*program, "--port", "{port}", "--model", name, "--startup-delay", str(startup_delay), *options]


def fake_model(
    name: str, *, priority: int = 0, group: str = "gpu", startup_delay: float = 0.3, **spec: Any
) -> dict[str, Any]:
    """A Model manifest run by the fake model server."""
    body: dict[str, Any] = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "gpu": {"shared": group, "priority": priority},
            "local": {"command": fake_model_command(name, "--token-delay", "0.005", startup_delay=startup_delay)},
            "endpoint": {"readinessPath": "/health"},
        },
    }
    for key, value in spec.items():
        body["spec"][key] = value
    return body
