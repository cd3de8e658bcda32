"""Go-style durations (``90s``, ``2m``, ``1h30m``, ``250ms``) and plain seconds, as the contract's settings use."""

from __future__ import annotations

import math
import re
from datetime import timedelta

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")


def parse_duration(value: str | int | float | timedelta) -> timedelta:
    """Parse ``90s``, ``2m``, ``1h30m``, ``0.5`` (seconds) or a number; raise ValueError naming the bad text."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    elif isinstance(value, int | float):
        seconds = float(value)
    else:
        text = value.strip()
        if not text:
            raise ValueError("empty duration")
        try:
            seconds = float(text)
        except ValueError:
            seconds = _parse_go(text)
    if not math.isfinite(seconds):
        raise ValueError(f"duration must be finite: {value!r}")
    if seconds < 0:
        raise ValueError(f"duration must not be negative: {value!r}")
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"duration too long: {value!r}") from None


def _parse_go(text: str) -> float:
    pos, total = 0, 0.0
    for match in _PART.finditer(text):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNITS[match.group(2)]
        pos = match.end()
    if pos != len(text) or pos == 0:
        raise ValueError(f"not a duration: {text!r} (use e.g. 90s, 2m, 1h30m or plain seconds)")
    return total


def format_duration(value: timedelta) -> str:
    """Render a timedelta the way Go prints short durations: ``5m``, ``90s`` -> ``1m30s``."""
    total = value.total_seconds()
    if total == 0:
        return "0s"
    if total < 1:
        return f"{round(total * 1000)}ms"
    hours, rest = divmod(total, 3600)
    minutes, seconds = divmod(rest, 60)
    out = ""
    if hours:
        out += f"{int(hours)}h"
    if minutes:
        out += f"{int(minutes)}m"
    if seconds:
        out += f"{seconds:g}s"
    return out
