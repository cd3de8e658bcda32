"""``flexinfer delete``: which admin API calls delete the resources of a FILE, or one KIND NAME. Pure planning
(:func:`plan_delete_resources`, :func:`plan_delete`), then :func:`execute_deletes`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from flexinfer_cli.client import AdminClient, ApiError
from flexinfer_cli.config import Service
from flexinfer_cli.tables import MANIFEST_KINDS, VIEWS, Kind
from flexinfer_common.manifests import GPUGroup, GPULease, Model, Resource


@dataclass(frozen=True)
class Deletion:
    resource: str  # as printed: model/<ns>/<name>, gpugroup/<name>, gpulease/<name>
    service: Service
    path: str


class NotDeletable(ValueError):
    """A kind the admin APIs cannot delete (queues, swaps)."""


def plan_delete(kind: Kind, names: Iterable[str], *, namespace: str) -> list[Deletion]:
    """The calls that delete ``names`` of ``kind`` (in ``namespace`` for models). Pure."""
    view = VIEWS[kind]
    if view.manifests is None:
        raise NotDeletable(f"{kind.value} cannot be deleted (delete models, groups or leases)")
    return [Deletion(view.label(namespace, name), view.service, view.manifest_path(namespace, name)) for name in names]


def plan_delete_resources(resources: Iterable[Resource], *, default_namespace: str) -> list[Deletion]:
    """The calls that delete the resources of a FILE: its leases first (serving may resume), then its models, then
    its GPUGroups (the reverse of ``apply``). ModelCaches are the Kubernetes controller's: not deleted here. Pure."""
    order = {GPULease: 0, Model: 1, GPUGroup: 2}
    steps: list[tuple[int, Deletion]] = []
    for resource in resources:
        rank = order.get(type(resource))
        if rank is None:
            continue
        kind = MANIFEST_KINDS[type(resource)]
        namespace = resource.metadata.namespace or default_namespace
        steps.extend((rank, step) for step in plan_delete(kind, [resource.metadata.name], namespace=namespace))
    return [step for _, step in sorted(steps, key=lambda pair: pair[0])]


@dataclass
class DeleteResult:
    deleted: list[str]
    missing: list[str]


async def execute_deletes(
    steps: Sequence[Deletion],
    clients: Mapping[Service, AdminClient],
    *,
    echo: Callable[[str], None],
) -> DeleteResult:
    """Delete in order; a resource that is already gone is noted (not an error here) and the rest go on. Any other
    API error stops at once (raised)."""
    result = DeleteResult([], [])
    for step in steps:
        try:
            await clients[step.service].delete(step.path)
        except ApiError as exc:
            if exc.status != 404:
                raise
            result.missing.append(step.resource)
            continue
        result.deleted.append(step.resource)
        echo(f"{step.resource} deleted")
    return result
