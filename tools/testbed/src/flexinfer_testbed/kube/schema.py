"""Structural-schema handling of custom resources, as the apiextensions API server does it on every write:
null fields that are not `nullable` are dropped, unknown fields are pruned (reported so `fieldValidation`
Strict/Warn can refuse or warn), `default`s are applied (nested defaults too), then the object is validated
(type, enum, required, minimum/maximum, minLength/maxLength, pattern, minItems/maxItems).

CEL rules (`x-kubernetes-validations`), `format` checks other than int32/int64 ranges, `oneOf`/`anyOf`/`allOf`
and `not` are not evaluated.
"""

from __future__ import annotations

import copy
import re
from typing import Any

Schema = dict[str, Any]
INT32 = (-(2**31), 2**31 - 1)
ROOT_KEEP = frozenset({"apiVersion", "kind", "metadata"})


def _path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def prune(value: Any, schema: Schema | None, path: str = "", *, root: bool = True) -> tuple[Any, list[str]]:
    """Drop fields the schema does not declare and non-nullable nulls; return (pruned copy, unknown field paths)."""
    unknown: list[str] = []
    if schema is None:
        return copy.deepcopy(value), unknown
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema or root):
        props: dict[str, Schema] = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        preserve = schema.get("x-kubernetes-preserve-unknown-fields") is True
        embedded = schema.get("x-kubernetes-embedded-resource") is True
        result: dict[str, Any] = {}
        for key, item in value.items():
            child_path = _path(path, key)
            if (root or embedded) and key in ROOT_KEEP:
                result[key] = copy.deepcopy(item)
                continue
            if key in props:
                child: Schema | None = props[key]
            elif isinstance(additional, dict):
                child = additional
            elif additional is True or preserve:
                result[key] = copy.deepcopy(item)
                continue
            else:
                unknown.append(child_path)
                continue
            if item is None and not (child or {}).get("nullable"):
                continue
            result[key], more = prune(item, child, child_path, root=False)
            unknown.extend(more)
        return result, unknown
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = []
        for i, item in enumerate(value):
            pruned, more = prune(item, schema["items"], f"{path}[{i}]", root=False)
            items.append(pruned)
            unknown.extend(more)
        return items, unknown
    return copy.deepcopy(value), unknown


def apply_defaults(value: Any, schema: Schema | None) -> Any:
    """Fill in `default`s of absent properties, recursing into defaulted values too (in place; returns value)."""
    if schema is None:
        return value
    if isinstance(value, dict):
        for key, child in (schema.get("properties") or {}).items():
            if key not in value and "default" in child:
                value[key] = copy.deepcopy(child["default"])
            if key in value:
                value[key] = apply_defaults(value[key], child)
        additional = schema.get("additionalProperties")
        if isinstance(additional, dict):
            for key in list(value):
                if key not in (schema.get("properties") or {}):
                    value[key] = apply_defaults(value[key], additional)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            value[i] = apply_defaults(item, schema["items"])
    return value


def _type_ok(value: Any, schema: Schema) -> bool:
    if schema.get("x-kubernetes-int-or-string"):
        return (isinstance(value, int) and not isinstance(value, bool)) or isinstance(value, str)
    match schema.get("type"):
        case "object":
            return isinstance(value, dict)
        case "array":
            return isinstance(value, list)
        case "string":
            return isinstance(value, str)
        case "integer":
            return isinstance(value, int) and not isinstance(value, bool)
        case "number":
            return _is_number(value)
        case "boolean":
            return isinstance(value, bool)
        case _:
            return True


def _show(value: Any) -> str:
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# The bounds of a number (on its value), a string and an array (on their length): keyword, whether the value must be
# at least (True) or at most the bound, and the API server's message ({shown}: the value as it quotes it).
_BOUNDS: dict[type, tuple[tuple[str, bool, str], ...]] = {
    float: (
        ("minimum", True, "Invalid value: {shown}: {path} in body should be greater than or equal to {bound}"),
        ("maximum", False, "Invalid value: {shown}: {path} in body should be less than or equal to {bound}"),
    ),
    str: (
        ("minLength", True, "Invalid value: {shown}: {path} in body should be at least {bound} chars long"),
        ("maxLength", False, "Too long: may not be more than {bound} bytes"),
    ),
    list: (
        ("minItems", True, "Invalid value: {shown}: {path} in body should have at least {bound} items"),
        ("maxItems", False, "Too many: {shown}: must have at most {bound} items"),
    ),
}


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)  # bool is an int to Python, not to JSON


def _bound_errors(value: Any, schema: Schema, path: str) -> list[tuple[str, str]]:
    if _is_number(value):
        measure, shown, bounds = value, str(value), _BOUNDS[float]
    elif isinstance(value, str):
        measure, shown, bounds = len(value), _show(value), _BOUNDS[str]
    elif isinstance(value, list):
        measure, shown, bounds = len(value), str(len(value)), _BOUNDS[list]
    else:
        return []
    return [
        (path, message.format(shown=shown, path=path, bound=schema[keyword]))
        for keyword, at_least, message in bounds
        if keyword in schema and (measure < schema[keyword] if at_least else measure > schema[keyword])
    ]


def validate(value: Any, schema: Schema | None, path: str = "") -> list[tuple[str, str]]:
    """(field, message) pairs in the API server's wording; empty when the value is valid."""
    if schema is None:
        return []
    errors: list[tuple[str, str]] = []
    if value is None:
        return errors
    if not _type_ok(value, schema):
        kind = type(value).__name__.replace("str", "string").replace("dict", "object").replace("list", "array")
        errors.append(
            (
                path,
                f'Invalid value: "{kind}": {path} in body must be of type {schema.get("type")}: '
                f"{_show(value) if not isinstance(value, dict | list) else kind}",
            )
        )
        return errors
    if "enum" in schema and value not in schema["enum"]:
        supported = ", ".join(_show(v) for v in schema["enum"])
        errors.append((path, f"Unsupported value: {_show(value)}: supported values: {supported}"))
    errors.extend(_bound_errors(value, schema, path))
    if _is_number(value) and schema.get("format") == "int32" and not INT32[0] <= value <= INT32[1]:
        errors.append((path, f"Invalid value: {value}: {path} in body must be of type int32"))
    if isinstance(value, str) and "pattern" in schema and not re.search(schema["pattern"], value):
        errors.append((path, f"Invalid value: \"{value}\": {path} in body should match '{schema['pattern']}'"))
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors.extend(validate(item, schema["items"], f"{path}[{i}]"))
    if isinstance(value, dict):
        for key in schema.get("required") or []:
            if key not in value:
                errors.append((_path(path, key), "Required value"))
        props = schema.get("properties") or {}
        for key, item in value.items():
            if key in props:
                errors.extend(validate(item, props[key], _path(path, key)))
            elif isinstance(schema.get("additionalProperties"), dict):
                errors.extend(validate(item, schema["additionalProperties"], _path(path, key)))
    return errors
