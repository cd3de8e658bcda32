"""One module per ``flexinfer`` command; importing this package registers them all on :data:`flexinfer_cli.cli.app`,
in the order ``flexinfer --help`` lists them. A new command: a module here and its name in ``COMMANDS``."""

from __future__ import annotations

import importlib

COMMANDS = ("up", "apply", "get", "describe", "delete", "promote", "demand", "lease", "simulate")

for _command in COMMANDS:
    importlib.import_module(f"{__name__}.{_command}")
