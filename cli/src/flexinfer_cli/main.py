"""The ``flexinfer`` command (docs/reference.md section 7): the Typer app of :mod:`flexinfer_cli.cli` with every
command of :mod:`flexinfer_cli.commands` registered on it.

Exit codes: 0 done, 1 the operation failed (an API error, a resource not found, a service not reachable, ``up``
could not start), 2 bad input (a usage error, a bad manifest or setting).
"""

from __future__ import annotations

import flexinfer_cli.commands  # noqa: F401 - registers the commands
from flexinfer_cli.cli import app

__all__ = ["app", "main"]


def main() -> None:
    app()
