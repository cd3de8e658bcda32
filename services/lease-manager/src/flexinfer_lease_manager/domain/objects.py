"""Reading Kubernetes objects as the watches deliver them: plain mappings whose fields may be missing. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

Object = Mapping[str, Any]
Key = tuple[str, str]  # namespace, name


def meta(obj: Object) -> Mapping[str, Any]:
    value = obj.get("metadata")
    return value if isinstance(value, Mapping) else {}


def key_of(obj: Object) -> Key:
    data = meta(obj)
    return (str(data.get("namespace") or ""), str(data.get("name") or ""))


def uid_of(obj: Object) -> str:
    return str(meta(obj).get("uid") or "")


def labels_of(obj: Object) -> Mapping[str, str]:
    labels = meta(obj).get("labels")
    return labels if isinstance(labels, Mapping) else {}


def being_deleted(obj: Object) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def owned_by(obj: Object, uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in meta(obj).get("ownerReferences") or [])


def kube_time(when: datetime) -> str:
    """Status times to the second, as Kubernetes writes its own."""
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")
