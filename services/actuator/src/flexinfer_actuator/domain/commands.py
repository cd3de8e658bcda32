"""Pure decisions about scale commands. Nothing here performs I/O, reads the clock or keeps state: each function
maps its arguments to an answer, so every rule is a row in a table test."""

from __future__ import annotations

from enum import StrEnum

from flexinfer_actuator.domain.processes import ProcessPhase
from flexinfer_common.enums import ParkStrategy
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


# Our settings that are secrets: a model process (code we do not control) never sees them.
SECRET_VARIABLES = frozenset(
    {"FLEXINFER_ADMIN_TOKEN", "FLEXINFER_PROXY_API_KEYS", "FLEXINFER_DATABASE_URL", "FLEXINFER_NATS_URL"}
)


def process_environment(base: dict[str, str], spec: RuntimeSpec, port: int) -> dict[str, str]:
    """The environment of a model process: ours without our secrets, then the spec's ``env``, then ``PORT``."""
    own = {k: v for k, v in base.items() if k not in SECRET_VARIABLES}
    return {**own, **spec.env, "PORT": str(port)}


def readiness_url(port: int, readiness_path: str) -> str:
    path = readiness_path if readiness_path.startswith("/") else "/" + readiness_path
    return f"http://127.0.0.1:{port}{path}"


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
    """``exit code 1`` or ``killed by signal 9 (SIGKILL)`` (asyncio reports a signal as a negative code)."""
    if returncode >= 0:
        return f"exit code {returncode}"
    number = -returncode
    return f"killed by signal {number}{_signal_suffix(number)}"


def _signal_suffix(number: int) -> str:
    names = {1: "SIGHUP", 2: "SIGINT", 6: "SIGABRT", 9: "SIGKILL", 11: "SIGSEGV", 15: "SIGTERM"}
    return f" ({names[number]})" if number in names else ""


def exit_failure_message(returncode: int, *, was_ready: bool, log_tail: list[str]) -> str:
    """Why a model's process is gone, with the last lines it logged."""
    when = "after it was Ready" if was_ready else "before it was ready"
    return _with_log(f"process exited {when} ({describe_exit(returncode)})", log_tail)


def load_timeout_message(load_timeout_seconds: float, log_tail: list[str]) -> str:
    return _with_log(f"not ready within the load timeout ({load_timeout_seconds:g}s); process stopped", log_tail)


def _with_log(summary: str, log_tail: list[str]) -> str:
    if not log_tail:
        return summary
    return summary + "; last log lines:\n" + "\n".join(log_tail)
