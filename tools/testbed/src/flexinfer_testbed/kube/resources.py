"""What the emulator serves: one `ResourceType` per (group, plural), built in or from a CustomResourceDefinition.

The store is resource-agnostic: everything kind-specific it needs (scope, subresources, scale paths, which
fields a field selector may name, printer columns, the structural schema) is data on the ResourceType.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
BASE_FIELDS = frozenset({"metadata.name", "metadata.namespace"})


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""


@dataclass(frozen=True)
class ScalePaths:
    """Where a resource keeps the numbers its `scale` subresource shows (CRD `subresources.scale` layout)."""

    spec_replicas: str = ".spec.replicas"
    status_replicas: str = ".status.replicas"
    label_selector: str | None = None  # a JSONPath to a selector string; None: derived from .spec.selector


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    plural: str
    kind: str
    singular: str
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    status_subresource: bool = False
    scale: ScalePaths | None = None
    field_selectors: frozenset[str] = BASE_FIELDS
    #: None: the built-in table for this kind (or NAME/AGE); a tuple: a CRD's additionalPrinterColumns.
    printer_columns: tuple[PrinterColumn, ...] | None = None
    schema: dict[str, Any] | None = None
    #: Strategic merge patch is served for built-in kinds only (as the real server does).
    builtin: bool = True
    #: True when the type resets `status` on create (custom resources with a status subresource, Deployments...).
    reset_status_on_create: bool = False
    crd_name: str = field(default="", compare=False)

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def key(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def list_kind(self) -> str:
        return f"{self.kind}List"

    @property
    def subresources(self) -> tuple[str, ...]:
        return (("status",) if self.status_subresource else ()) + (("scale",) if self.scale else ())

    def qualified(self) -> str:
        """`plural.group` as error messages name it (`deployments.apps`, `pods`)."""
        return f"{self.plural}.{self.group}" if self.group else self.plural


POD_FIELDS = BASE_FIELDS | {
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
}
EVENT_FIELDS = BASE_FIELDS | {
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
}


def _builtin(group: str, kind: str, **options: Any) -> ResourceType:
    """A built-in kind, served at v1 of ``group``: its singular is the kind in lower case, its plural adds an s."""
    singular = kind.lower()
    return ResourceType(group, "v1", singular + "s", kind, singular, **options)


def builtin_types() -> list[ResourceType]:
    """The built-in kinds: core v1, apps/v1, batch/v1, coordination.k8s.io/v1, apiextensions.k8s.io/v1."""
    return [
        _builtin(
            "",
            "Namespace",
            namespaced=False,
            short_names=("ns",),
            status_subresource=True,
            field_selectors=BASE_FIELDS | {"status.phase"},
        ),
        _builtin(
            "",
            "Pod",
            short_names=("po",),
            categories=("all",),
            status_subresource=True,
            field_selectors=POD_FIELDS,
            reset_status_on_create=True,
        ),
        _builtin("", "Service", short_names=("svc",), categories=("all",), status_subresource=True),
        _builtin("", "ConfigMap", short_names=("cm",)),
        _builtin("", "Secret", field_selectors=BASE_FIELDS | {"type"}),
        _builtin("", "Event", short_names=("ev",), field_selectors=EVENT_FIELDS),
        _builtin("", "Node", namespaced=False, short_names=("no",), status_subresource=True),
        _builtin(
            "apps",
            "Deployment",
            short_names=("deploy",),
            categories=("all",),
            status_subresource=True,
            scale=ScalePaths(),
            reset_status_on_create=True,
        ),
        _builtin(
            "batch",
            "Job",
            categories=("all",),
            status_subresource=True,
            field_selectors=BASE_FIELDS | {"status.successful"},
            reset_status_on_create=True,
        ),
        _builtin("coordination.k8s.io", "Lease"),
        _builtin(
            "apiextensions.k8s.io",
            "CustomResourceDefinition",
            namespaced=False,
            short_names=("crd", "crds"),
            categories=("api-extensions",),
            status_subresource=True,
        ),
    ]


def types_from_crd(crd: dict[str, Any]) -> list[ResourceType]:
    """One ResourceType per served version of a CRD (apiextensions.k8s.io/v1)."""
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    found = []
    for version in spec.get("versions") or []:
        if not version.get("served", True):
            continue
        sub = version.get("subresources") or {}
        scale = sub.get("scale")
        columns = version.get("additionalPrinterColumns")
        found.append(
            ResourceType(
                group=spec["group"],
                version=version["name"],
                plural=names["plural"],
                kind=names["kind"],
                singular=names.get("singular") or names["kind"].lower(),
                namespaced=spec.get("scope", "Namespaced") == "Namespaced",
                short_names=tuple(names.get("shortNames") or ()),
                categories=tuple(names.get("categories") or ()),
                status_subresource="status" in sub,
                scale=ScalePaths(scale["specReplicasPath"], scale["statusReplicasPath"], scale.get("labelSelectorPath"))
                if scale
                else None,
                printer_columns=tuple(
                    PrinterColumn(
                        c["name"],
                        c.get("type", "string"),
                        c["jsonPath"],
                        c.get("description", ""),
                        int(c.get("priority", 0)),
                        c.get("format", ""),
                    )
                    for c in columns
                )
                if columns is not None
                else None,
                schema=(version.get("schema") or {}).get("openAPIV3Schema"),
                builtin=False,
                reset_status_on_create="status" in sub,
                crd_name=crd["metadata"]["name"],
            )
        )
    return found
