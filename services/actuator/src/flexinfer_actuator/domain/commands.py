"""Pure decisions about scale commands. Nothing here performs I/O, reads the clock or keeps state: each function
maps its arguments to an answer, so every rule is a row in a table test."""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from flexinfer_actuator.domain.processes import ProcessPhase
from flexinfer_common.enums import ParkStrategy
from flexinfer_common.local_commands import env_name_allowed
from flexinfer_common.messages import RuntimeSpec, ScaleCommand

PORT_PLACEHOLDER = "{port}"
MISSING_COMMAND_MESSAGE = (
    "spec.local.command is missing: the local actuator needs the argv of the process to start for this model"
)


class GenerationVerdict(StrEnum):
    """What to do with a command, judged by its generation alone."""

    APPLY = "apply"  # newer than anything applied for the model (or the first one seen)
    REREPORT = "rereport"  # the generation applied last: change nothing, report the current status again
    STALE = "stale"  # older than the one applied: ignore it


def should_apply(command: ScaleCommand, last_applied_generation: int | None) -> GenerationVerdict:
    """Judge ``command`` against the last generation applied for its model (None: none applied yet)."""
    if last_applied_generation is None or command.generation > last_applied_generation:
        return GenerationVerdict.APPLY
    if command.generation == last_applied_generation:
        return GenerationVerdict.REREPORT
    return GenerationVerdict.STALE


class ActivatePlan(StrEnum):
    """What an ``activate`` means, given the model's runtime."""

    START = "start"  # nothing runs: start it, report Loading, probe until Ready
    WAKE = "wake"  # it sleeps (parked with the Sleep strategy): wake it, report Loading, probe until Ready
    KEEP_LOADING = "keep-loading"  # it is loading already: let it finish, report Loading under the new generation
    REPORT_READY = "report-ready"  # it is Ready already: report Ready under the new generation
    REFUSE_NO_COMMAND = "refuse-no-command"  # it must be started but the spec says nothing to start: Failed


def plan_activation(observed: ProcessPhase | None, *, has_command: bool) -> ActivatePlan:
    """Decide what activating means when the runtime is ``observed`` (None: nothing runs).

    A runtime being stopped (a load that timed out) is started afresh once it is gone.
    """
    if observed is ProcessPhase.READY:
        return ActivatePlan.REPORT_READY
    if observed is ProcessPhase.LOADING:
        return ActivatePlan.KEEP_LOADING
    if observed is ProcessPhase.SLEEPING:
        return ActivatePlan.WAKE
    return ActivatePlan.START if has_command else ActivatePlan.REFUSE_NO_COMMAND


class ParkPlan(StrEnum):
    """What a ``park`` means, given the model's runtime."""

    STOP = "stop"  # report Stopping, stop the process (TERM, grace, KILL), report Parked once it is reaped
    SLEEP = "sleep"  # report Stopping, put the server to sleep, report Parked (the process stays)
    REPORT_PARKED = "report-parked"  # nothing runs, or it sleeps already: report Parked


def plan_park(observed: ProcessPhase | None, strategy: ParkStrategy) -> ParkPlan:
    """Decide what parking means when the runtime is ``observed`` (None: nothing runs).

    Only a Ready server can be put to sleep; one still loading is stopped whatever the strategy, so a park always
    frees the GPU.
    """
    if observed is None or observed is ProcessPhase.SLEEPING:
        return ParkPlan.REPORT_PARKED
    if observed is ProcessPhase.READY and strategy is ParkStrategy.SLEEP:
        return ParkPlan.SLEEP
    return ParkPlan.STOP


def render_command(argv: list[str], port: int) -> list[str]:
    """Substitute ``{port}`` in every argv element (plain text replacement: other braces stay as they are)."""
    return [arg.replace(PORT_PLACEHOLDER, str(port)) for arg in argv]


# What a model process inherits from the actuator whatever FLEXINFER_LOCAL_ENV says: where programs are, the locale,
# the time zone, the temporary folder, who it is. Nothing else of ours (never a FLEXINFER_* setting: the admin token,
# the database URL and the bus credentials are among them).
INHERITED_ENV = (
    *("PATH", "HOME", "USER", "LOGNAME"),
    *("LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_MESSAGES", "TZ", "TMPDIR"),
)
_NEVER_INHERITED_PREFIX = "FLEXINFER_"


@dataclass(frozen=True)
class ProcessUser:
    """The unprivileged user a model process runs as (the actuator runs as root): its names and its home for this
    process (a private temporary folder: the user's own home is often ``/nonexistent``)."""

    name: str
    uid: int
    gid: int
    home: str


def process_environment(
    inherited: Mapping[str, str],
    spec: RuntimeSpec,
    port: int,
    *,
    pass_through: Sequence[str] = (),
    preset_env: Mapping[str, str] | None = None,
    user: ProcessUser | None = None,
) -> dict[str, str]:
    """The environment of a model process, built from allow-lists, never a copy of ours.

    In order (later wins): ``INHERITED_ENV`` and the names ``pass_through`` allows (FLEXINFER_LOCAL_ENV) from
    ``inherited``; ``HOME``/``USER``/``LOGNAME`` of ``user`` when it drops privileges; the backend preset's variables;
    the spec's ``env`` (already judged by the env rule); ``PORT``; the devices it was placed on, as the visible
    devices of CUDA and ROCm (last: a manifest's env cannot widen a placement that keeps co-resident models within
    the card's memory).
    """
    own = {
        k: v
        for k, v in inherited.items()
        if not k.startswith(_NEVER_INHERITED_PREFIX) and (k in INHERITED_ENV or env_name_allowed(k, pass_through))
    }
    if user is not None:
        own.update(HOME=user.home, USER=user.name, LOGNAME=user.name)
    placed = {}
    if spec.devices is not None:
        visible = ",".join(str(d) for d in spec.devices)
        placed = {name: visible for name in VISIBLE_DEVICES_ENV}
    return {**own, **(preset_env or {}), **spec.env, "PORT": str(port), **placed}


#: what tells a CUDA or ROCm process which devices it may use (the seed's amd.com/gpu nodes read the HIP/ROCR ones)
VISIBLE_DEVICES_ENV = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def readiness_url(port: int, readiness_path: str | None) -> str:
    readiness_path = readiness_path or "/health"
    path = readiness_path if readiness_path.startswith("/") else "/" + readiness_path
    return local_endpoint(port) + path


def local_endpoint(port: int) -> str:
    return f"http://127.0.0.1:{port}"


def log_file_name(namespace: str, name: str) -> str:
    """``<namespace>_<model>.log``; a path separator in a name cannot escape the logs folder."""
    return f"{_safe(namespace)}_{_safe(name)}.log"


def _safe(part: str) -> str:
    cleaned = part.replace("/", "_").replace("\\", "_").replace("\0", "_")
    return cleaned if cleaned.strip(".") else "_"


def tail_lines(text: str, count: int) -> list[str]:
    """The last ``count`` non-blank lines of ``text``."""
    if count <= 0:
        return []
    lines = [line.rstrip() for line in text.splitlines() if line.strip()]
    return lines[-count:]


def describe_exit(returncode: int) -> str:
    """``exited with code 1`` or ``killed by signal 4 (SIGILL)`` (asyncio reports a signal as a negative code)."""
    if returncode >= 0:
        return f"exited with code {returncode}"
    number = -returncode
    return f"killed by signal {number}{_signal_suffix(number)}"


def _signal_suffix(number: int) -> str:
    try:
        return f" ({signal.Signals(number).name})"
    except ValueError:
        return ""


def exit_failure_message(returncode: int, *, was_ready: bool, log_tail: list[str]) -> str:
    """Why a model's process is gone, with the last lines it logged: ``process killed by signal 4 (SIGILL) after it
    was Ready``."""
    when = "after it was Ready" if was_ready else "before it was ready"
    return _with_log(f"process {describe_exit(returncode)} {when}", log_tail)


def load_timeout_message(load_timeout_seconds: float, log_tail: list[str], probe: str = "") -> str:
    """``not ready within the load timeout (600s): GET /health → 404, 12000 tries; process stopped``."""
    answers = f": {probe}" if probe else ""
    summary = f"not ready within the load timeout ({load_timeout_seconds:g}s){answers}; process stopped"
    return _with_log(summary, log_tail)


# ---- readiness-probe answers while loading


@dataclass(frozen=True)
class ProbeAnswer:
    """What one readiness probe got: an HTTP status, or why there was none (``connection refused``, ``timed out``)."""

    status: int | None = None
    error: str = ""

    @property
    def ready(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    def text(self) -> str:
        return str(self.status) if self.status is not None else (self.error or "no answer")


PROBE_QUIET_SECONDS = 1.0
"""A load shorter than this reports no probe answers (connection refused for a moment is how every server starts)."""
PROBE_REPORT_EVERY_SECONDS = 5.0
"""While the answer stays the same, the Loading message (with its count of tries) is refreshed this often."""


def probe_message(path: str, answer: ProbeAnswer, tries: int) -> str:
    """``GET /health → 404, 12 tries``."""
    shown = path if path.startswith("/") else "/" + path
    return f"GET {shown} → {answer.text()}, {tries} {'try' if tries == 1 else 'tries'}"


def should_report_probe(
    answer: ProbeAnswer,
    *,
    last_reported: ProbeAnswer | None,
    loading_seconds: float,
    seconds_since_report: float,
) -> bool:
    """Whether a probe's answer is worth a Loading report: not during the first second of a load, then when the
    answer changes (503 → 404) and at most every few seconds while it stays the same. A ready answer is reported
    as Ready, never here."""
    if answer.ready or loading_seconds < PROBE_QUIET_SECONDS:
        return False
    if last_reported != answer:
        return True
    return seconds_since_report >= PROBE_REPORT_EVERY_SECONDS


def _with_log(summary: str, log_tail: list[str]) -> str:
    if not log_tail:
        return summary
    return summary + "; last log lines:\n" + "\n".join(log_tail)
