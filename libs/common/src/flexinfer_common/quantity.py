"""Kubernetes memory quantities (``6Gi``, ``512Mi``, ``1.5G``, plain bytes): one parser for manifests and traces."""

from __future__ import annotations

import re

_SUFFIXES = {
    "": 1,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
}
_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|k|M|G|T|P)?$")


def parse_memory(value: object) -> int:
    """Bytes from a quantity string or a non-negative integer; ``ValueError`` naming the value otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a memory quantity (e.g. 6Gi, 512Mi or bytes)")
    if isinstance(value, int):
        if value < 1:
            raise ValueError(f"{value} is not a positive number of bytes")
        return value
    if not isinstance(value, str):
        raise ValueError(f"{value!r} is not a memory quantity (e.g. 6Gi, 512Mi or bytes)")
    match = _QUANTITY.match(value.strip())
    if match is None:
        raise ValueError(f"{value!r} is not a memory quantity (e.g. 6Gi, 512Mi or bytes)")
    number, suffix = match.groups()
    size = int(float(number) * _SUFFIXES[suffix or ""])
    if size < 1:
        raise ValueError(f"{value!r} is not a positive amount of memory")
    return size
