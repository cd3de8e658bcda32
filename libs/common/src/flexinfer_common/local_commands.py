"""Which ``spec.local.command`` the local actuator may run: the allow-list rule (``FLEXINFER_LOCAL_COMMANDS``).

Pure: a command, its environment and the allow-list in, a verdict out. The scheduler's admin API refuses a manifest
the rule refuses (422 naming the rule), and the local back-end checks again right before it starts a process, so a
command reaches ``exec`` only when this machine's own setting allows it, never because an API call said so.

The rule, entry by entry (entries are executables, by name or by absolute path):
- a bare name in the command (``vllm``) is allowed only by the same bare name in the list, and is then looked up
  on the actuator's own ``PATH`` (never the ``PATH`` a manifest sets);
- a path in the command must be absolute and equal to an absolute entry (``/opt/llama/llama-server``); a relative
  path (``./x``) or a name that only matches an entry's base name is refused;
- the manifest's ``env`` may not set what decides which code runs (``PATH``, ``LD_PRELOAD`` and the like).
"""

from __future__ import annotations

import os.path
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

SETTING = "FLEXINFER_LOCAL_COMMANDS"

# Environment variables that choose which code a process loads: a manifest may not set them.
_CODE_LOADING_ENV = frozenset(
    {
        "PATH",
        "PYTHONPATH",
        "PYTHONHOME",
        "PYTHONSTARTUP",
        "PYTHONUSERBASE",
        "PYTHONEXECUTABLE",
        "BASH_ENV",
        "ENV",
        "NODE_OPTIONS",
        "PERL5LIB",
        "PERL5OPT",
        "RUBYOPT",
        "GCONV_PATH",
    }
)
_CODE_LOADING_ENV_PREFIXES = ("LD_", "DYLD_")


class CommandRule(StrEnum):
    """Why a command may or may not run."""

    ALLOWED = "allowed"
    NO_COMMAND = "no-command"  # nothing to run: allowed here (the actuator reports the missing command itself)
    NOT_ALLOWED = "executable-not-allowed"
    RELATIVE_PATH = "relative-path"
    ENV_NOT_ALLOWED = "env-not-allowed"


@dataclass(frozen=True)
class CommandVerdict:
    rule: CommandRule
    message: str = ""

    @property
    def allowed(self) -> bool:
        return self.rule in (CommandRule.ALLOWED, CommandRule.NO_COMMAND)


def invalid_entries(entries: Iterable[str]) -> list[str]:
    """The allow-list entries that are neither a bare name nor an absolute path."""
    return [e for e in entries if "/" in e and not os.path.isabs(e)]


def check_local_command(command: Sequence[str], env: Mapping[str, str], *, allowed: Sequence[str]) -> CommandVerdict:
    """Judge ``spec.local.command`` (and ``spec.local.env``) against the allow-list ``allowed``. No side effects."""
    if not command:
        return CommandVerdict(CommandRule.NO_COMMAND)
    executable = command[0]
    names = {e for e in allowed if "/" not in e}
    paths = {os.path.normpath(e) for e in allowed if os.path.isabs(e)}
    listed = ", ".join(allowed) if allowed else "nothing"
    if "/" in executable and not os.path.isabs(executable):
        return CommandVerdict(
            CommandRule.RELATIVE_PATH,
            f"spec.local.command: {executable!r} is a relative path; name an executable allowed by {SETTING} "
            f"by its name or absolute path (allowed: {listed})",
        )
    ok = os.path.normpath(executable) in paths if os.path.isabs(executable) else executable in names
    if not ok:
        return CommandVerdict(
            CommandRule.NOT_ALLOWED,
            f"spec.local.command: executable {executable!r} is not allowed by {SETTING} (allowed: {listed}); "
            f"the operator of this machine can add it to {SETTING}",
        )
    blocked = sorted(
        k for k in env if k.upper() in _CODE_LOADING_ENV or k.upper().startswith(_CODE_LOADING_ENV_PREFIXES)
    )
    if blocked:
        return CommandVerdict(
            CommandRule.ENV_NOT_ALLOWED,
            f"spec.local.env: {', '.join(blocked)} may not be set by a manifest (it decides which code runs; "
            f"rule of {SETTING})",
        )
    return CommandVerdict(CommandRule.ALLOWED)
