"""``flexinfer apply``: manifests (docs/reference.md section 1) -> admin API calls (section 4).

:func:`plan_apply` is pure: it maps parsed resources to the calls that configure them, in an order that lets the
first election see each group and its best fallback (:func:`apply_order`).
:func:`execute_plan` makes the calls. ``flexinfer up`` applies its FILE through the same two functions.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from flexinfer_cli.client import AdminClient, ApiError, CliError
from flexinfer_cli.config import Service
from flexinfer_cli.tables import MANIFEST_KINDS, VIEWS, Kind
from flexinfer_common.manifests import GPUGroup, GPULease, ManifestError, Model, ModelCache, Resource, load_manifests

STDIN = "-"


class ManifestFileError(CliError):
    """A FILE cannot be read or parsed; the message names the file, the document and the field."""

    exit_code = 2


@dataclass(frozen=True)
class ApiCall:
    """One admin API call that configures one resource."""

    resource: str  # as printed: model/<ns>/<name>, gpugroup/<name>, gpulease/<name>
    service: Service
    method: str
    path: str
    body: dict[str, Any]
    done: str = "configured"  # the word printed after the resource once the call succeeded


@dataclass(frozen=True)
class Skipped:
    resource: str
    reason: str


PlanStep = ApiCall | Skipped


@dataclass
class ApplyResult:
    lines: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def read_manifests(paths: Sequence[str | Path], *, read_stdin: Callable[[], str] | None = None) -> list[Resource]:
    """Parse every FILE (``-`` is standard input); raise ManifestFileError naming the file and the field."""
    resources: list[Resource] = []
    for path in paths:
        source = str(path)
        try:
            if source == STDIN:
                text = (read_stdin or sys.stdin.read)()
                source = "<stdin>"
            else:
                text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ManifestFileError(f"cannot read {source}: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise ManifestFileError(f"cannot read {source}: not UTF-8 text ({exc.reason})") from None
        try:
            resources.extend(load_manifests(text, source=source))
        except ManifestError as exc:
            raise ManifestFileError(str(exc)) from None
    return resources


def _manifest_body(resource: BaseModel) -> dict[str, Any]:
    """What the user wrote, validated and normalized (camelCase, durations as text), without ``status``."""
    body = resource.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)
    body.pop("status", None)
    return body


def apply_order(resource: Resource) -> tuple[int, int]:
    """GPUGroups first, then Models by descending priority, then the rest (each stable in file order): the
    scheduler may hold its first election before the last manifest arrives, and it must already see each group
    and its best fallback leader then (a fallback load that started first would keep the GPU)."""
    if isinstance(resource, GPUGroup):
        return (0, 0)
    if isinstance(resource, Model):
        return (1, -resource.spec.gpu.priority)
    return (2, 0)


def plan_apply(resources: Iterable[Resource], *, default_namespace: str) -> list[PlanStep]:
    """The admin API calls that configure ``resources``, in :func:`apply_order`. Pure: no I/O.

    - Model -> ``PUT scheduler /api/v1/models/{namespace}/{name}`` with the manifest (namespace filled in).
    - GPUGroup -> ``PUT scheduler /api/v1/gpugroups/{name}`` with the manifest.
    - GPULease -> ``POST lease-manager /api/v1/leases`` with ``{name, namespace, group, owner, node?, ttlSeconds?,
      memory?}``.
    - ModelCache is skipped: only the Kubernetes controller acts on it (it runs finetune Jobs).
    """
    steps: list[PlanStep] = []
    for resource in sorted(resources, key=apply_order):
        namespace = resource.metadata.namespace or default_namespace
        name = resource.metadata.name
        if isinstance(resource, Model | GPUGroup):
            view = VIEWS[MANIFEST_KINDS[type(resource)]]
            body = _manifest_body(resource)
            if isinstance(resource, Model):
                body.setdefault("metadata", {})["namespace"] = namespace
            steps.append(
                ApiCall(
                    resource=view.label(namespace, name),
                    service=view.service,
                    method="PUT",
                    path=view.manifest_path(namespace, name),
                    body=body,
                )
            )
        elif isinstance(resource, GPULease):
            lease: dict[str, Any] = {
                "name": name,
                "namespace": namespace,
                "group": resource.spec.group,
                "owner": resource.spec.owner,
            }
            if resource.spec.node is not None:
                lease["node"] = resource.spec.node
            if resource.spec.ttl_seconds is not None:
                lease["ttlSeconds"] = resource.spec.ttl_seconds
            if resource.spec.memory is not None:
                lease["memory"] = resource.spec.memory
            leases = VIEWS[Kind.LEASES]
            steps.append(
                ApiCall(
                    resource=leases.label(namespace, name),
                    service=leases.service,
                    method="POST",
                    path=leases.path,
                    body=lease,
                    done="created",
                )
            )
        elif isinstance(resource, ModelCache):
            steps.append(
                Skipped(
                    resource=f"modelcache/{namespace}/{name}",
                    reason="ModelCache is acted on by the Kubernetes controller only (it runs finetune Jobs)",
                )
            )
    return steps


async def _apply_lease(client: AdminClient, step: ApiCall) -> str:
    """Create the lease; re-applying a lease that already holds the group the same way changes nothing."""
    try:
        await client.request(step.method, step.path, step.body)
    except ApiError as exc:
        if exc.status != 409:
            raise
        try:
            current = await client.get(VIEWS[Kind.LEASES].get_path("", str(step.body["name"])))
        except ApiError:
            raise exc from None
        if (
            isinstance(current, dict)
            and current.get("group") == step.body["group"]
            and current.get("owner") == step.body["owner"]
        ):
            return f"{step.resource} unchanged"
        raise
    return f"{step.resource} {step.done}"


async def execute_plan(
    steps: Sequence[PlanStep],
    clients: Mapping[Service, AdminClient],
    *,
    echo: Callable[[str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> ApplyResult:
    """Make the calls in order; stop at the first failure (raising its CliError)."""
    result = ApplyResult()
    for step in steps:
        if isinstance(step, Skipped):
            line = f"{step.resource} skipped: {step.reason}"
            result.warnings.append(line)
            if warn:
                warn(line)
            continue
        client = clients[step.service]
        if step.service is Service.LEASE_MANAGER and step.method == "POST":
            line = await _apply_lease(client, step)
        else:
            await client.request(step.method, step.path, step.body)
            line = f"{step.resource} {step.done}"
        result.lines.append(line)
        if echo:
            echo(line)
    return result
