"""Label and field selectors, parsed as the API server parses them (k8s.io/apimachinery/pkg/labels, fields).

Pure functions: `parse_label_selector(text)` / `parse_field_selector(text, allowed)` return a predicate-bearing
selector or raise `ApiError` (400 BadRequest) naming the problem.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from flexinfer_testbed.kube.errors import ApiError, Reason, bad_request


class Op(StrEnum):
    EQUALS = "="
    NOT_EQUALS = "!="
    IN = "in"
    NOT_IN = "notin"
    EXISTS = "exists"
    DOES_NOT_EXIST = "!"


@dataclass(frozen=True)
class Requirement:
    key: str
    op: Op
    values: frozenset[str] = frozenset()

    def matches(self, labels: dict[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        match self.op:
            case Op.EQUALS | Op.IN:
                return present and value in self.values
            case Op.NOT_EQUALS | Op.NOT_IN:
                return not present or value not in self.values
            case Op.EXISTS:
                return present
            case Op.DOES_NOT_EXIST:
                return not present


@dataclass(frozen=True)
class LabelSelector:
    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: dict[str, str] | None) -> bool:
        return all(r.matches(labels or {}) for r in self.requirements)


_KEY = r"[A-Za-z0-9]([-A-Za-z0-9_./]*[A-Za-z0-9])?"
_VALUE = r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_SET_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^)]*)\)\s*$")
_EQ_RE = re.compile(rf"^\s*(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})\s*$")
_EXISTS_RE = re.compile(rf"^\s*(?P<neg>!)?\s*(?P<key>{_KEY})\s*$")


def _split_terms(text: str) -> list[str]:
    """Split on commas that are not inside a set's parentheses."""
    terms, depth, current = [], 0, ""
    for char in text:
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        if char == "," and depth == 0:
            terms.append(current)
            current = ""
        else:
            current += char
    terms.append(current)
    return [t for t in terms if t.strip()]


def parse_label_selector(text: str | None) -> LabelSelector:
    if not text or not text.strip():
        return LabelSelector()
    requirements = []
    for term in _split_terms(text):
        if m := _SET_RE.match(term):
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            requirements.append(Requirement(m["key"], Op.IN if m["op"] == "in" else Op.NOT_IN, values))
        elif m := _EQ_RE.match(term):
            op = Op.NOT_EQUALS if m["op"] == "!=" else Op.EQUALS
            requirements.append(Requirement(m["key"], op, frozenset({m["value"]})))
        elif m := _EXISTS_RE.match(term):
            requirements.append(Requirement(m["key"], Op.DOES_NOT_EXIST if m["neg"] else Op.EXISTS))
        else:
            raise bad_request(f"unable to parse requirement: found '{term.strip()}', expected a valid selector term")
    return LabelSelector(tuple(requirements))


def selector_from_label_selector(spec: dict[str, Any] | None) -> LabelSelector:
    """A `metav1.LabelSelector` object (matchLabels, matchExpressions) as a selector."""
    spec = spec or {}
    requirements = [Requirement(k, Op.EQUALS, frozenset({v})) for k, v in (spec.get("matchLabels") or {}).items()]
    ops = {"In": Op.IN, "NotIn": Op.NOT_IN, "Exists": Op.EXISTS, "DoesNotExist": Op.DOES_NOT_EXIST}
    for expr in spec.get("matchExpressions") or []:
        requirements.append(Requirement(expr["key"], ops[expr["operator"]], frozenset(expr.get("values") or [])))
    return LabelSelector(tuple(requirements))


def format_label_selector(spec: dict[str, Any] | None) -> str:
    """`metav1.FormatLabelSelector`-like text (used in Scale.status.selector)."""
    spec = spec or {}
    parts = [f"{k}={v}" for k, v in sorted((spec.get("matchLabels") or {}).items())]
    for expr in spec.get("matchExpressions") or []:
        op = expr["operator"]
        if op in ("In", "NotIn"):
            parts.append(f"{expr['key']} {op.lower()} ({','.join(sorted(expr.get('values') or []))})")
        else:
            parts.append(expr["key"] if op == "Exists" else f"!{expr['key']}")
    return ",".join(parts)


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    value: str
    negate: bool

    def matches(self, obj: dict[str, Any]) -> bool:
        actual = field_value(obj, self.field)
        return (actual != self.value) if self.negate else (actual == self.value)


@dataclass(frozen=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: dict[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)


def field_value(obj: dict[str, Any], path: str) -> str:
    """The string a field selector compares against; absent fields are the empty string, as in the API server."""
    node: Any = obj
    for part in path.split("."):
        if not isinstance(node, dict):
            return ""
        node = node.get(part)
    if node is None:
        return ""
    if isinstance(node, bool):
        return "true" if node else "false"
    return str(node)


def parse_field_selector(text: str | None, allowed: frozenset[str], resource: str) -> FieldSelector:
    if not text or not text.strip():
        return FieldSelector()
    requirements = []
    for term in text.split(","):
        term = term.strip()
        if not term:
            continue
        m = re.match(r"^([^=!]+?)\s*(==|=|!=)\s*(.*)$", term)
        if not m:
            raise bad_request(f"invalid selector: '{text}'; can't understand '{term}'")
        field, op, value = m[1].strip(), m[2], m[3].strip()
        if field not in allowed:
            # The API server's words; `resource` names which fields it does support, for the reader of a test.
            raise ApiError(
                Reason.BAD_REQUEST,
                f"field label not supported: {field}",
                causes=[{"field": field, "message": f"{resource} supports: {', '.join(sorted(allowed))}"}],
            )
        requirements.append(FieldRequirement(field, value, negate=op == "!="))
    return FieldSelector(tuple(requirements))
