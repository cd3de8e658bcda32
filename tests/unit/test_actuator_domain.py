"""The actuator's pure rules, one table per decision."""

from __future__ import annotations

from typing import Any

import pytest

from flexinfer_actuator.domain.commands import (
    MISSING_COMMAND_MESSAGE,
    ActivatePlan,
    GenerationVerdict,
    ParkPlan,
    ProbeAnswer,
    ProcessUser,
    describe_exit,
    exit_failure_message,
    load_timeout_message,
    log_file_name,
    plan_activation,
    plan_park,
    probe_message,
    process_environment,
    readiness_url,
    render_command,
    should_apply,
    should_report_probe,
    tail_lines,
)
from flexinfer_actuator.domain.processes import ProcessPhase
from flexinfer_common.enums import ParkStrategy
from flexinfer_common.messages import RuntimeSpec
from tests.support.actuator import scale_command


@pytest.mark.parametrize(
    ("generation", "last_applied", "expected"),
    [
        pytest.param(0, None, GenerationVerdict.APPLY, id="first-command-for-model-applies"),
        pytest.param(7, None, GenerationVerdict.APPLY, id="first-command-after-restart-applies-any-generation"),
        pytest.param(4, 3, GenerationVerdict.APPLY, id="newer-generation-applies"),
        pytest.param(10, 3, GenerationVerdict.APPLY, id="gaps-in-generations-are-fine"),
        pytest.param(3, 3, GenerationVerdict.REREPORT, id="same-generation-re-reports"),
        pytest.param(2, 3, GenerationVerdict.STALE, id="older-generation-is-stale"),
        pytest.param(0, 3, GenerationVerdict.STALE, id="generation-zero-after-three-is-stale"),
    ],
)
def test_should_apply(generation: int, last_applied: int | None, expected: GenerationVerdict) -> None:
    assert should_apply(scale_command(generation=generation), last_applied) is expected


@pytest.mark.parametrize(
    ("argv", "port", "expected"),
    [
        pytest.param(["serve"], 9000, ["serve"], id="no-placeholder-unchanged"),
        pytest.param(["serve", "--port", "{port}"], 9000, ["serve", "--port", "9000"], id="whole-argument"),
        pytest.param(["serve", "--port={port}"], 9001, ["serve", "--port=9001"], id="inside-an-argument"),
        pytest.param(["x", "{port}:{port}"], 80, ["x", "80:80"], id="every-occurrence"),
        pytest.param(["x", "{port}", "{port}"], 81, ["x", "81", "81"], id="every-element"),
        pytest.param(
            ["python", "-c", "print({'a': 1})"], 1, ["python", "-c", "print({'a': 1})"], id="other-braces-kept"
        ),
        pytest.param(["x", "{PORT}", "{ port }"], 2, ["x", "{PORT}", "{ port }"], id="only-the-exact-placeholder"),
        pytest.param([], 3, [], id="empty-argv"),
    ],
)
def test_render_command(argv: list[str], port: int, expected: list[str]) -> None:
    assert render_command(argv, port) == expected


def test_render_command_leaves_the_spec_alone() -> None:
    argv = ["serve", "{port}"]
    render_command(argv, 1)
    assert argv == ["serve", "{port}"]


@pytest.mark.parametrize(
    ("observed", "has_command", "expected"),
    [
        pytest.param(None, True, ActivatePlan.START, id="nothing-runs-start"),
        pytest.param(None, False, ActivatePlan.REFUSE_NO_COMMAND, id="nothing-runs-no-command-refuse"),
        pytest.param(ProcessPhase.LOADING, True, ActivatePlan.KEEP_LOADING, id="loading-keeps-loading"),
        pytest.param(ProcessPhase.READY, True, ActivatePlan.REPORT_READY, id="ready-only-re-reports"),
        pytest.param(ProcessPhase.READY, False, ActivatePlan.REPORT_READY, id="ready-needs-no-command"),
        pytest.param(ProcessPhase.SLEEPING, True, ActivatePlan.WAKE, id="sleeping-wakes"),
        pytest.param(ProcessPhase.SLEEPING, False, ActivatePlan.WAKE, id="sleeping-wakes-without-command"),
        pytest.param(ProcessPhase.STOPPING, True, ActivatePlan.START, id="stopping-starts-afresh"),
        pytest.param(ProcessPhase.STOPPING, False, ActivatePlan.REFUSE_NO_COMMAND, id="stopping-no-command-refuse"),
    ],
)
def test_plan_activation(observed: ProcessPhase | None, has_command: bool, expected: ActivatePlan) -> None:
    assert plan_activation(observed, has_command=has_command) is expected


@pytest.mark.parametrize(
    ("observed", "strategy", "expected"),
    [
        pytest.param(None, ParkStrategy.SCALE_TO_ZERO, ParkPlan.REPORT_PARKED, id="nothing-runs-already-parked"),
        pytest.param(None, ParkStrategy.SLEEP, ParkPlan.REPORT_PARKED, id="nothing-runs-sleep-strategy-parked"),
        pytest.param(ProcessPhase.READY, ParkStrategy.SCALE_TO_ZERO, ParkPlan.STOP, id="ready-scale-to-zero-stops"),
        pytest.param(ProcessPhase.READY, ParkStrategy.SLEEP, ParkPlan.SLEEP, id="ready-sleep-strategy-sleeps"),
        pytest.param(ProcessPhase.LOADING, ParkStrategy.SCALE_TO_ZERO, ParkPlan.STOP, id="loading-stops"),
        pytest.param(ProcessPhase.LOADING, ParkStrategy.SLEEP, ParkPlan.STOP, id="loading-cannot-sleep-so-stops"),
        pytest.param(ProcessPhase.SLEEPING, ParkStrategy.SLEEP, ParkPlan.REPORT_PARKED, id="sleeping-already-parked"),
        pytest.param(
            ProcessPhase.SLEEPING, ParkStrategy.SCALE_TO_ZERO, ParkPlan.REPORT_PARKED, id="sleeping-any-strategy-parked"
        ),
        pytest.param(ProcessPhase.STOPPING, ParkStrategy.SCALE_TO_ZERO, ParkPlan.STOP, id="stopping-finishes-stop"),
    ],
)
def test_plan_park(observed: ProcessPhase | None, strategy: ParkStrategy, expected: ParkPlan) -> None:
    assert plan_park(observed, strategy) is expected


NOBODY = ProcessUser(name="nobody", uid=65534, gid=65534, home="/tmp/flexinfer-m-x")


@pytest.mark.parametrize(
    ("base", "env", "kwargs", "expected"),
    [
        pytest.param({"PATH": "/bin"}, {}, {}, {"PATH": "/bin", "PORT": "9000"}, id="ours-plus-port"),
        pytest.param(
            {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/root", "TZ": "UTC"},
            {},
            {},
            {"PATH": "/bin", "LANG": "C.UTF-8", "HOME": "/root", "TZ": "UTC", "PORT": "9000"},
            id="basics-inherited",
        ),
        pytest.param(
            {"PATH": "/bin", "FLEXINFER_ADMIN_TOKEN": "s3cret", "FLEXINFER_DATABASE_URL": "pg://u:p@h/db"},
            {},
            {"pass_through": ("FLEXINFER_ADMIN_TOKEN",)},
            {"PATH": "/bin", "PORT": "9000"},
            id="never-our-settings",
        ),
        pytest.param(
            {"SSH_AUTH_SOCK": "/tmp/agent", "AWS_SECRET_ACCESS_KEY": "k", "PYTHONPYCACHEPREFIX": "/x"},
            {},
            {},
            {"PORT": "9000"},
            id="nothing-unlisted-inherited",
        ),
        pytest.param(
            {"CUDA_VISIBLE_DEVICES": "1", "HF_HOME": "/srv/hf", "OTHER": "x"},
            {},
            {"pass_through": ("CUDA_VISIBLE_DEVICES", "HF_*")},
            {"CUDA_VISIBLE_DEVICES": "1", "HF_HOME": "/srv/hf", "PORT": "9000"},
            id="operator-list-passes-through",
        ),
        pytest.param(
            {"HOME": "/root", "USER": "root", "PATH": "/bin"},
            {},
            {"user": NOBODY},
            {"HOME": NOBODY.home, "USER": "nobody", "LOGNAME": "nobody", "PATH": "/bin", "PORT": "9000"},
            id="run-as-user-gets-its-home",
        ),
        pytest.param(
            {},
            {"OLLAMA_HOST": "0.0.0.0:1"},
            {"preset_env": {"OLLAMA_HOST": "127.0.0.1:9000", "X": "1"}},
            {"OLLAMA_HOST": "0.0.0.0:1", "X": "1", "PORT": "9000"},
            id="spec-env-over-preset",
        ),
        pytest.param({"PORT": "5"}, {"PORT": "6"}, {}, {"PORT": "9000"}, id="port-wins-over-everything"),
    ],
)
def test_process_environment(
    base: dict[str, str], env: dict[str, str], kwargs: dict[str, Any], expected: dict[str, str]
) -> None:
    spec = RuntimeSpec(namespace="default", name="m", env=env)
    assert process_environment(base, spec, 9000, **kwargs) == expected


def test_a_placed_model_sees_only_its_devices_whatever_its_env_says() -> None:
    spec = RuntimeSpec(namespace="default", name="m", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, devices=[1, 2])
    env = process_environment({"CUDA_VISIBLE_DEVICES": "0"}, spec, 9000, pass_through=("CUDA_VISIBLE_DEVICES",))
    assert (env["CUDA_VISIBLE_DEVICES"], env["HIP_VISIBLE_DEVICES"], env["ROCR_VISIBLE_DEVICES"]) == ("1,2",) * 3


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("/health", "http://127.0.0.1:9000/health", id="absolute-path"),
        pytest.param("health", "http://127.0.0.1:9000/health", id="path-without-slash"),
        pytest.param("/v1/models?x=1", "http://127.0.0.1:9000/v1/models?x=1", id="query-kept"),
    ],
)
def test_readiness_url(path: str, expected: str) -> None:
    assert readiness_url(9000, path) == expected


@pytest.mark.parametrize(
    ("namespace", "name", "expected"),
    [
        pytest.param("default", "qwen3-8b", "default_qwen3-8b.log", id="plain"),
        pytest.param("team-a", "llama.3.1", "team-a_llama.3.1.log", id="dots-kept"),
        pytest.param("..", "../../etc/passwd", "__.._.._etc_passwd.log", id="no-escape-from-logs-folder"),
    ],
)
def test_log_file_name(namespace: str, name: str, expected: str) -> None:
    assert log_file_name(namespace, name) == expected
    assert "/" not in log_file_name(namespace, name)


@pytest.mark.parametrize(
    ("text", "count", "expected"),
    [
        pytest.param("a\nb\nc\n", 2, ["b", "c"], id="last-lines"),
        pytest.param("a\n\n  \nb\n", 5, ["a", "b"], id="blank-lines-skipped"),
        pytest.param("only", 3, ["only"], id="fewer-than-asked"),
        pytest.param("a\nb", 0, [], id="zero-lines"),
        pytest.param("", 3, [], id="empty"),
        pytest.param("x  \r\ny\t\n", 2, ["x", "y"], id="trailing-space-trimmed"),
    ],
)
def test_tail_lines(text: str, count: int, expected: list[str]) -> None:
    assert tail_lines(text, count) == expected


@pytest.mark.parametrize(
    ("returncode", "expected"),
    [
        pytest.param(0, "exited with code 0", id="clean-exit"),
        pytest.param(1, "exited with code 1", id="error-exit"),
        pytest.param(-9, "killed by signal 9 (SIGKILL)", id="sigkill"),
        pytest.param(-4, "killed by signal 4 (SIGILL)", id="sigill-an-unportable-build"),
        pytest.param(-15, "killed by signal 15 (SIGTERM)", id="sigterm"),
        pytest.param(-200, "killed by signal 200", id="unnamed-signal"),
    ],
)
def test_describe_exit(returncode: int, expected: str) -> None:
    assert describe_exit(returncode) == expected


@pytest.mark.parametrize(
    ("returncode", "was_ready", "tail", "expected"),
    [
        pytest.param(
            1,
            False,
            ["loading weights", "load failed"],
            "process exited with code 1 before it was ready; last log lines:\nloading weights\nload failed",
            id="failed-load-quotes-log",
        ),
        pytest.param(-9, True, [], "process killed by signal 9 (SIGKILL) after it was Ready", id="killed-no-log"),
        pytest.param(
            -4,
            True,
            ["ggml_backend_amx_mul_mat"],
            "process killed by signal 4 (SIGILL) after it was Ready; last log lines:\nggml_backend_amx_mul_mat",
            id="crash-after-ready-quotes-log",
        ),
    ],
)
def test_exit_failure_message(returncode: int, was_ready: bool, tail: list[str], expected: str) -> None:
    assert exit_failure_message(returncode, was_ready=was_ready, log_tail=tail) == expected


def test_load_timeout_message_names_the_timeout() -> None:
    assert load_timeout_message(1.5, ["still loading"]) == (
        "not ready within the load timeout (1.5s); process stopped; last log lines:\nstill loading"
    )
    assert load_timeout_message(600, [], "GET /health → 404, 12 tries") == (
        "not ready within the load timeout (600s): GET /health → 404, 12 tries; process stopped"
    )


@pytest.mark.parametrize(
    ("path", "answer", "tries", "expected"),
    [
        pytest.param("/health", ProbeAnswer(status=404), 12, "GET /health → 404, 12 tries", id="status"),
        pytest.param("health", ProbeAnswer(status=503), 1, "GET /health → 503, 1 try", id="one-try"),
        pytest.param(
            "/v1/models",
            ProbeAnswer(error="connection refused"),
            40,
            "GET /v1/models → connection refused, 40 tries",
            id="no-answer",
        ),
    ],
)
def test_probe_message(path: str, answer: ProbeAnswer, tries: int, expected: str) -> None:
    assert probe_message(path, answer, tries) == expected


@pytest.mark.parametrize(
    ("answer", "last", "loading", "since", "expected"),
    [
        pytest.param(ProbeAnswer(status=404), None, 0.5, 0.5, False, id="quiet-first-second"),
        pytest.param(ProbeAnswer(status=404), None, 1.2, 1.2, True, id="first-answer-after-a-second"),
        pytest.param(ProbeAnswer(status=404), ProbeAnswer(status=503), 3, 0.1, True, id="answer-changed"),
        pytest.param(ProbeAnswer(status=404), ProbeAnswer(status=404), 3, 0.1, False, id="same-answer-not-repeated"),
        pytest.param(ProbeAnswer(status=404), ProbeAnswer(status=404), 30, 5.0, True, id="same-answer-refreshed"),
        pytest.param(ProbeAnswer(status=200), ProbeAnswer(status=503), 30, 9, False, id="ready-is-not-loading"),
    ],
)
def test_should_report_probe(
    answer: ProbeAnswer, last: ProbeAnswer | None, loading: float, since: float, expected: bool
) -> None:
    assert should_report_probe(answer, last_reported=last, loading_seconds=loading, seconds_since_report=since) is (
        expected
    )


def test_missing_command_message_names_the_field() -> None:
    assert "spec.local.command is missing" in MISSING_COMMAND_MESSAGE
