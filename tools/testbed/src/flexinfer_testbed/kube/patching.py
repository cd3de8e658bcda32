"""The three PATCH flavours the API server accepts, as pure functions of (document, patch) -> new document.

- JSON merge patch (RFC 7386), `application/merge-patch+json`.
- Strategic merge patch, `application/strategic-merge-patch+json`: a merge patch where the lists Kubernetes
  declares with `patchStrategy: merge` are merged element by element on their `patchMergeKey` (the table
  `MERGE_KEYS` below; it covers the Pod, Deployment, Job and metadata fields a controller or `kubectl apply`
  touches), and the directives `$patch` (`replace`, `delete`, `merge`), `$retainKeys`,
  `$deleteFromPrimitiveList/<field>` and `$setElementOrder/<field>` are honoured. Every other list is replaced,
  as with a merge patch. The real server takes the list strategies from each Go type; here a field name decides,
  whatever object it sits in, which is exact for the built-in kinds listed and harmless elsewhere.
  Custom resources refuse it with 415, as the real server does.
- JSON patch (RFC 6902), `application/json-patch+json`: add, remove, replace, move, copy, test.
"""

from __future__ import annotations

import copy
from typing import Any

from flexinfer_testbed.kube.errors import ApiError, Reason, bad_request

#: list field name -> merge key, for lists Kubernetes merges by key under a strategic merge patch.
MERGE_KEYS: dict[str, str] = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "volumeDevices": "devicePath",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "ownerReferences": "uid",
    "conditions": "type",
    "containerStatuses": "name",
    "initContainerStatuses": "name",
    "resourceClaims": "name",
    "topologySpreadConstraints": "topologyKey",
}
#: (parent list, list) pairs whose merge key differs from MERGE_KEYS[list].
CONTAINER_PORT_KEY = "containerPort"
#: primitive lists merged as sets (patchStrategy merge on []string).
SET_LISTS = frozenset({"finalizers"})


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    return _smp_value(target, patch, field="", parent="")


def _smp_value(target: Any, patch: Any, *, field: str, parent: str) -> Any:
    if isinstance(patch, dict):
        return _smp_map(target if isinstance(target, dict) else {}, patch, field=field)
    if isinstance(patch, list):
        return _smp_list(target if isinstance(target, list) else [], patch, field=field, parent=parent)
    return copy.deepcopy(patch)


def _smp_map(target: dict[str, Any], patch: dict[str, Any], *, field: str) -> dict[str, Any]:
    directive = patch.get("$patch")
    if directive == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if directive == "delete":
        return {}
    result = copy.deepcopy(target)
    retain = patch.get("$retainKeys")
    for key, value in patch.items():
        if key in ("$patch", "$retainKeys") or key.startswith("$setElementOrder/"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if v not in value]
            continue
        if value is None or (isinstance(value, dict) and value.get("$patch") == "delete"):
            result.pop(key, None)
        else:
            result[key] = _smp_value(result.get(key), value, field=key, parent=field)
    if isinstance(retain, list):
        result = {k: v for k, v in result.items() if k in retain}
    return result


def _merge_key(field: str, parent: str) -> str | None:
    if field == "ports" and parent in ("containers", "initContainers", "ephemeralContainers", ""):
        return CONTAINER_PORT_KEY
    return MERGE_KEYS.get(field)


def _smp_list(target: list[Any], patch: list[Any], *, field: str, parent: str) -> list[Any]:
    if field in SET_LISTS:
        result = copy.deepcopy(target)
        result.extend(v for v in patch if v not in result)
        return result
    key = _merge_key(field, parent)
    if key is None or not all(isinstance(item, dict) for item in patch):
        if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
            return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and "$patch" in i)]
        return copy.deepcopy(patch)
    if any(item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if "$patch" not in i]
    result = copy.deepcopy(target)
    for item in patch:
        if key not in item:
            raise bad_request(f"map: {item} does not contain declared merge key: {key}")
        index = next(
            (i for i, existing in enumerate(result) if isinstance(existing, dict) and existing.get(key) == item[key]),
            None,
        )
        if item.get("$patch") == "delete":
            if index is not None:
                result.pop(index)
            continue
        if index is None:
            result.append(_smp_map({}, item, field=field))
        else:
            result[index] = _smp_map(result[index], item, field=field)
    return result


# ------------------------------------------------------------------------------------------------ JSON patch


def _pointer(path: str) -> list[str]:
    if path == "":
        return []
    if not path.startswith("/"):
        raise bad_request(f'the json patch path "{path}" must start with "/"')
    return [part.replace("~1", "/").replace("~0", "~") for part in path[1:].split("/")]


def _parent(doc: Any, parts: list[str], path: str) -> Any:
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ApiError(
                Reason.INVALID,
                f"the server rejected our request due to an error in our request: jsonpatch path {path}: missing value",
            )
    return node


def _get(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    if not parts:
        return doc
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent[last]
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent[int(last)]
    raise ApiError(Reason.INVALID, f"jsonpatch path {path}: missing value")


def _remove(doc: Any, path: str) -> Any:
    parts = _pointer(path)
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict) and last in parent:
        return parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return parent.pop(int(last))
    raise ApiError(Reason.INVALID, f"jsonpatch remove operation does not apply: doc is missing path: {path}")


def _add(doc: Any, path: str, value: Any, *, replace: bool) -> Any:
    parts = _pointer(path)
    if not parts:
        return value
    parent = _parent(doc, parts, path)
    last = parts[-1]
    if isinstance(parent, dict):
        if replace and last not in parent:
            raise ApiError(Reason.INVALID, f"jsonpatch replace operation does not apply: doc is missing key: {path}")
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-" and not replace:
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent) - (1 if replace else 0):
            if replace:
                parent[int(last)] = value
            else:
                parent.insert(int(last), value)
        else:
            raise ApiError(Reason.INVALID, f"jsonpatch path {path}: index out of range")
    else:
        raise ApiError(Reason.INVALID, f"jsonpatch path {path}: parent is not a container")
    return doc


def json_patch(target: Any, operations: Any) -> Any:
    if not isinstance(operations, list):
        raise bad_request("json patch must be a list of operations")
    doc = copy.deepcopy(target)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise bad_request(f"invalid json patch operation: {op}")
        kind, path = op["op"], op["path"]
        if kind == "add":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=False)
        elif kind == "replace":
            doc = _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif kind == "remove":
            _remove(doc, path)
        elif kind == "move":
            value = _remove(doc, op["from"])
            doc = _add(doc, path, value, replace=False)
        elif kind == "copy":
            doc = _add(doc, path, copy.deepcopy(_get(doc, op["from"])), replace=False)
        elif kind == "test":
            if _get(doc, path) != op.get("value"):
                raise ApiError(Reason.INVALID, f"jsonpatch test operation does not apply: {path}")
        else:
            raise bad_request(f'Unexpected kind: "{kind}"')
    return doc
