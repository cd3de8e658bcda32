"""FlexInfer's models in the emulated cluster: a Model resource and the Deployment it names, created through the
API as a user would, and a recorder of the invariant "never two Pods of one group alive"."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from flexinfer_testbed.kube import KubeCluster
from flexinfer_testbed.kube.builders import deployment
from flexinfer_testbed.kube.store import StoredEvent
from flexinfer_testbed.system import System


def model_resource(
    name: str,
    *,
    group: str | None = "gpu",
    priority: int = 0,
    deployment_name: str | None = None,
    namespace: str = "default",
    **spec: Any,
) -> dict[str, Any]:
    """A v1alpha2 Model that names its Deployment (``spec.deployment``)."""
    body: dict[str, Any] = {
        "apiVersion": "ai.flexinfer/v1alpha2",
        "kind": "Model",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"backend": "fake", "source": f"fake://{name}", "deployment": deployment_name or name, **spec},
    }
    if group is not None:
        body["spec"].setdefault("gpu", {}).update({"shared": group, "priority": priority})
    return body


def gpu_group(name: str, **spec: Any) -> dict[str, Any]:
    """A v1alpha1 GPUGroup (``models``, ``policy``, ``capacity``, ``scheduling``: as the CRD spells them)."""
    return {"apiVersion": "ai.flexinfer/v1alpha1", "kind": "GPUGroup", "metadata": {"name": name}, "spec": spec}


def model_deployment(name: str, *, startup_delay: float = 0.3, grace: int = 2, **options: Any) -> dict[str, Any]:
    """The Deployment of a fake model: parked (0 replicas), one GPU, ready at /health after ``startup_delay``."""
    command = options.pop(
        "command",
        ["flexinfer-fake-model", "--model", name, "--startup-delay", str(startup_delay), "--token-delay", "0.005"],
    )
    return deployment(name, replicas=0, command=command, grace=grace, policy="FallbackToLogsOnError", **options)


async def create(kube: KubeCluster, obj: dict[str, Any]) -> dict[str, Any]:
    """POST the object as ``kubectl create`` would; fail the test on anything but 201."""
    resource = kube.resource(obj["kind"])
    namespace = obj["metadata"].get("namespace") or kube.namespace
    group = f"/apis/{resource.group}/{resource.version}" if resource.group else f"/api/{resource.version}"
    status, body = await kube.request("POST", f"{group}/namespaces/{namespace}/{resource.plural}", obj)
    assert status == 201, (status, body)
    return body


async def add_model(kube: KubeCluster, name: str, **options: Any) -> None:
    """A Deployment and the Model naming it, as a user would create them."""
    startup_delay = options.pop("startup_delay", 0.3)
    await create(kube, model_deployment(name, startup_delay=startup_delay))
    await create(kube, model_resource(name, **options))


@dataclass
class PodsRecorder:
    """After every write to the cluster: which of ``models`` have a Pod on the node (Terminating ones count: until the
    Pod object is gone its container may hold the GPU; a Pod the scheduler could not place holds nothing)."""

    kube: KubeCluster
    models: set[str]
    seen: list[frozenset[str]] = field(default_factory=list)

    def alive(self) -> frozenset[str]:
        return frozenset(
            pod["metadata"]["labels"]["app"]
            for pod in self.kube.pods()
            if pod["metadata"].get("labels", {}).get("app") in self.models
            and pod.get("spec", {}).get("nodeName")
            and pod.get("status", {}).get("phase") not in ("Succeeded", "Failed")
        )

    def _record(self, _: StoredEvent) -> None:
        now = self.alive()
        if not self.seen or self.seen[-1] != now:
            self.seen.append(now)

    @contextlib.contextmanager
    def watching(self) -> Iterator[PodsRecorder]:
        self.kube.store.listeners.append(self._record)
        try:
            yield self
        finally:
            self.kube.store.listeners.remove(self._record)

    def assert_never_two(self) -> None:
        crowded = [s for s in self.seen if len(s) > 1]
        assert not crowded, f"two models of one group had Pods at once: {crowded} (all: {self.seen})"


async def known(system: System, *names: str, within: float = 30.0) -> None:
    """Wait until the scheduler has the Models (the actuator's watch hands them on a moment after the API server
    has them; a request sent before that gets 404, as it would for any unknown model)."""
    async with asyncio.timeout(within):
        while True:
            items = (await system.get("scheduler", "/api/v1/models"))["items"]
            if set(names) <= {m["metadata"]["name"] for m in items}:
                return
            await asyncio.sleep(0.05)
