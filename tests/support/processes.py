"""Whether a process a test started (or had started for it) still runs."""

from __future__ import annotations

import os
from pathlib import Path


def alive(pid: int) -> bool:
    """``pid`` exists and has not exited: a zombie (exited, not yet reaped by a parent that may be gone) counts as
    dead, and so does a process that is gone by the time its state is read."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        # the state follows the command name in parentheses, which may itself hold spaces or parentheses
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")
