"""Which ``spec.local.command`` the local actuator may run (``FLEXINFER_LOCAL_COMMANDS``) and which environment
variables ``spec.local.env`` may set (``FLEXINFER_LOCAL_ENV``): two allow-lists.

Pure: a command, its environment and the allow-lists in, a verdict out. The scheduler's admin API refuses a manifest
the rule refuses (422 naming the rule), and the local back-end checks again right before it starts a process, so a
command reaches ``exec`` only when this machine's own setting allows it, never because an API call said so.

The rule, entry by entry (entries are executables, by name or by absolute path):
- a bare name in the command (``vllm``) is allowed only by the same bare name in the list, and is then looked up
  on the actuator's own ``PATH`` (never the ``PATH`` a manifest sets);
- a path in the command must be absolute and equal to an absolute entry (``/opt/llama/llama-server``); a relative
  path (``./x``) or a name that only matches an entry's base name is refused;
- the manifest's ``env`` may set only the names ``FLEXINFER_LOCAL_ENV`` lists (exact names, or ``PREFIX_*``);
  a deny-list of dangerous names cannot be complete (``PYTHONPYCACHEPREFIX`` made an allowed Python server run a
  planted ``.pyc``), so everything unlisted is refused. What decides which code runs (``PATH``, ``LD_*``,
  ``PYTHON*`` but ``PYTHONUNBUFFERED``, ...) is refused even when listed, and cannot be put on the list.
"""

from __future__ import annotations

import os.path
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

SETTING = "FLEXINFER_LOCAL_COMMANDS"
ENV_SETTING = "FLEXINFER_LOCAL_ENV"
ENGINES_SETTING = "FLEXINFER_LOCAL_ENGINES"

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
_CODE_LOADING_ENV_PREFIXES = ("LD_", "DYLD_", "PYTHON")
# Harmless members of those families: how Python buffers its output (a model's log would lag without it).
_HARMLESS_ENV = frozenset({"PYTHONUNBUFFERED"})

# The names a manifest may set by default (``FLEXINFER_LOCAL_ENV`` replaces the list). Each is a knob a model server
# documents for choosing devices, threads, caches or its own behaviour; none names code to load or a place to load
# it from. (Where a server binds is the manifest's command line's business anyway; ``OLLAMA_HOST`` is left out because
# the ollama preset sets it to the loopback port it chose.)
DEFAULT_LOCAL_ENV: tuple[str, ...] = (
    # which GPU(s): NVIDIA, AMD (ROCm/HIP), Intel
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "HSA_OVERRIDE_GFX_VERSION",
    "ZE_AFFINITY_MASK",
    # CPU threads
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    # Hugging Face downloads and caches (HF_TOKEN for gated models: it is stored in the manifest)
    "HF_HOME",
    "HF_HUB_CACHE",
    "HF_HUB_OFFLINE",
    "HF_TOKEN",
    "TRANSFORMERS_OFFLINE",
    "TOKENIZERS_PARALLELISM",
    # PyTorch and vLLM
    "PYTORCH_CUDA_ALLOC_CONF",
    "VLLM_ATTENTION_BACKEND",
    "VLLM_CACHE_ROOT",
    "VLLM_LOGGING_LEVEL",
    "VLLM_SERVER_DEV_MODE",
    "VLLM_USE_V1",
    # llama.cpp's server reads each of its options as LLAMA_ARG_<OPTION>
    "LLAMA_ARG_*",
    "GGML_CUDA_ENABLE_UNIFIED_MEMORY",
    # ollama
    "OLLAMA_MODELS",
    "OLLAMA_KEEP_ALIVE",
    "OLLAMA_NUM_PARALLEL",
    "OLLAMA_MAX_LOADED_MODELS",
    "OLLAMA_CONTEXT_LENGTH",
    "OLLAMA_FLASH_ATTENTION",
    # FlexInfer's fake model server
    "FAKE_MODEL_*",
    # generic
    "PYTHONUNBUFFERED",
    "TZ",
)
_OWN_PREFIX = "FLEXINFER_"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class CommandRule(StrEnum):
    """Why a command may or may not run."""

    ALLOWED = "allowed"
    NO_COMMAND = "no-command"  # nothing to run: allowed here (the actuator reports the missing command itself)
    NOT_ALLOWED = "executable-not-allowed"
    RELATIVE_PATH = "relative-path"
    ENV_NOT_ALLOWED = "env-not-allowed"
    ENV_CODE_LOADING = "env-code-loading"


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


def check_local_command(command: Sequence[str], *, allowed: Sequence[str]) -> CommandVerdict:
    """Judge ``spec.local.command`` against the allow-list ``allowed``. No side effects."""
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
    return CommandVerdict(CommandRule.ALLOWED)


def loads_code(name: str) -> bool:
    """True for a variable that decides which code a process runs (``PATH``, ``LD_PRELOAD``, ``PYTHONPATH``...)."""
    upper = name.upper()
    if upper in _HARMLESS_ENV:
        return False
    return upper in _CODE_LOADING_ENV or upper.startswith(_CODE_LOADING_ENV_PREFIXES)


def env_name_allowed(name: str, allowed: Iterable[str]) -> bool:
    """``name`` is on the list: equal to an entry, or starting with the prefix of a ``PREFIX_*`` entry. Never a
    variable deciding which code runs, never one of FlexInfer's own settings (the secrets are among them)."""
    if loads_code(name) or name.upper().startswith(_OWN_PREFIX):
        return False
    return any(name.startswith(e[:-1]) if e.endswith("*") else name == e for e in allowed)


def check_local_env(env: Mapping[str, str], *, allowed: Sequence[str]) -> CommandVerdict:
    """Judge ``spec.local.env`` against the allow-list ``allowed`` (``FLEXINFER_LOCAL_ENV``). No side effects."""
    loading = sorted(k for k in env if loads_code(k))
    if loading:
        return CommandVerdict(
            CommandRule.ENV_CODE_LOADING,
            f"spec.local.env: {', '.join(loading)} may not be set by a manifest (it decides which code runs; "
            f"no entry of {ENV_SETTING} can allow it)",
        )
    refused = sorted(k for k in env if not env_name_allowed(k, allowed))
    if refused:
        listed = ", ".join(allowed) if allowed else "nothing"
        return CommandVerdict(
            CommandRule.ENV_NOT_ALLOWED,
            f"spec.local.env: {', '.join(refused)} is not allowed by {ENV_SETTING} (allowed: {listed}); "
            f"the operator of this machine can add a variable to {ENV_SETTING}",
        )
    return CommandVerdict(CommandRule.ALLOWED)


def check_local_process(
    command: Sequence[str], env: Mapping[str, str], *, allowed: Sequence[str], allowed_env: Sequence[str]
) -> CommandVerdict:
    """Both rules: the command (when there is one) and the environment (always: a backend preset uses it too)."""
    verdict = check_local_command(command, allowed=allowed)
    if not verdict.allowed:
        return verdict
    env_verdict = check_local_env(env, allowed=allowed_env)
    return env_verdict if not env_verdict.allowed else verdict


def invalid_env_entries(entries: Iterable[str]) -> list[str]:
    """The ``FLEXINFER_LOCAL_ENV`` entries that are not a variable name (or ``PREFIX_*``), or that would allow a
    variable deciding which code runs (``PYTHONPATH``, ``LD_*``, ``PY*``, ``*``) or a FlexInfer setting
    (``FLEXINFER_*``)."""
    bad = []
    for entry in entries:
        stem = entry[:-1] if entry.endswith("*") else entry
        malformed = not _ENV_NAME.match(stem or "_") or (entry.endswith("*") and not stem)
        if (
            malformed
            or loads_code(stem)
            or stem.upper().startswith(_OWN_PREFIX)
            or (
                entry.endswith("*")
                and any(
                    p.startswith(stem.upper()) for p in (*_CODE_LOADING_ENV, *_CODE_LOADING_ENV_PREFIXES, _OWN_PREFIX)
                )
            )
        ):
            bad.append(entry)
    return bad


def is_interpreter(executable: str) -> bool:
    """A Python interpreter (``python``, ``/opt/venv/bin/python3.11``): it runs any code it is given."""
    return os.path.basename(executable).startswith("python")


def allowed_commands(local_commands: Sequence[str], local_engines: Mapping[str, str]) -> tuple[str, ...]:
    """The command allow-list with the engines ``FLEXINFER_LOCAL_ENGINES`` names: an engine's executable may also
    be a ``spec.local.command``. Not an interpreter named for a Python engine: allowing it would allow any code
    (a preset runs it with its own ``-m module`` only)."""
    extra = [e for e in local_engines.values() if not is_interpreter(e) and e not in local_commands]
    return (*local_commands, *extra)
