"""Who the suite's model processes run as.

As root, the local actuator runs model processes as ``FLEXINFER_LOCAL_RUN_AS`` (default ``nobody``). The suite's
model servers run on this venv's Python; when that interpreter is out of ``nobody``'s reach (a pyenv or uv Python
under ``/root``, mode 0700, as on the CI image) they could not start as ``nobody``, so the suite says
``FLEXINFER_LOCAL_RUN_AS=root`` explicitly, for its own processes only. The drop to an unprivileged user is tested by
tests/integration/test_actuator_local.py::test_a_model_process_runs_as_nobody_and_cannot_read_the_admin_token, on
the system's Python.
"""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path


def reachable_by_others(path: Path) -> bool:
    """Every folder above ``path`` can be traversed by any user, and ``path`` itself read and run."""
    real = path.resolve()
    for folder in real.parents:
        if not folder.stat().st_mode & stat.S_IXOTH:
            return False
    mode = real.stat().st_mode
    return bool(mode & stat.S_IROTH and mode & stat.S_IXOTH)


def suite_run_as() -> dict[str, str]:
    """``{"FLEXINFER_LOCAL_RUN_AS": "root"}`` when the suite runs as root on an interpreter ``nobody`` cannot run."""
    if os.geteuid() == 0 and not reachable_by_others(Path(sys.executable)):
        return {"FLEXINFER_LOCAL_RUN_AS": "root"}
    return {}
