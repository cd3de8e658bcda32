"""Small builders of the manifests tests send to the emulator."""

from __future__ import annotations

from typing import Any

FAKE_IMAGE = "ghcr.io/flexinfer/fake-model:test"


def controller_reference(owner: dict[str, Any], *, block_owner_deletion: bool = False) -> dict[str, Any]:
    """The ``ownerReferences`` entry that makes ``owner`` (a stored object) the controller of what carries it."""
    reference = {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
    }
    if block_owner_deletion:
        reference["blockOwnerDeletion"] = True
    return reference


def service(name: str, *, port: int = 8000) -> dict[str, Any]:
    """A Service in front of the Pods labelled ``app: <name>``."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name},
        "spec": {"selector": {"app": name}, "ports": [{"port": port}]},
    }


def deployment(
    name: str,
    *,
    replicas: int = 0,
    gpu: int = 1,
    gpu_resource: str = "nvidia.com/gpu",
    command: list[str] | None = None,
    image: str = FAKE_IMAGE,
    readiness_path: str | None = "/health",
    strategy: str = "Recreate",
    grace: int = 5,
    node_selector: dict[str, str] | None = None,
    policy: str = "File",
) -> dict[str, Any]:
    """A Deployment of one container labelled `app=<name>`: by default the fake model server (`--model <name>`)
    on port 8000 (`http`), probed at /health, holding one `nvidia.com/gpu` (`gpu` of `gpu_resource`). `command=[]`
    runs no process."""
    container: dict[str, Any] = {
        "name": "server",
        "image": image,
        "terminationMessagePolicy": policy,
        "ports": [{"name": "http", "containerPort": 8000}],
    }
    argv = ["flexinfer-fake-model", "--model", name] if command is None else command
    if argv:
        container["command"] = argv
    if readiness_path:
        container["readinessProbe"] = {"httpGet": {"path": readiness_path, "port": "http"}}
    if gpu:
        container["resources"] = {"limits": {gpu_resource: str(gpu)}}
    spec: dict[str, Any] = {"terminationGracePeriodSeconds": grace, "containers": [container]}
    if node_selector:
        spec["nodeSelector"] = node_selector
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "strategy": {"type": strategy},
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }


def crd(
    kind: str,
    group: str,
    schema: dict[str, Any],
    *,
    version: str = "v1",
    short_names: tuple[str, ...] = (),
    status_subresource: bool = True,
) -> dict[str, Any]:
    """A namespaced CustomResourceDefinition of one served, stored version (plural: lower-case kind + "s")."""
    plural = f"{kind.lower()}s"
    names: dict[str, Any] = {"plural": plural, "singular": kind.lower(), "kind": kind}
    if short_names:
        names["shortNames"] = list(short_names)
    served: dict[str, Any] = {"name": version, "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
    if status_subresource:
        served["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {"group": group, "scope": "Namespaced", "names": names, "versions": [served]},
    }
