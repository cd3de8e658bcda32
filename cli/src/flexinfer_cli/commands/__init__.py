"""One module per ``flexinfer`` command, its surface only (the work it calls is named in :mod:`flexinfer_cli`);
importing this package registers them all on :data:`flexinfer_cli.cli.app`, in the order ``flexinfer --help`` lists
them. A new command: a module here, its name in ``COMMANDS``, and its work in a module of its own."""

from __future__ import annotations

import importlib

COMMANDS = ("up", "apply", "get", "describe", "delete", "promote", "demand", "lease", "simulate")

for _command in COMMANDS:
    importlib.import_module(f"{__name__}.{_command}")
