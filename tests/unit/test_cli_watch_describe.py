"""``flexinfer get --watch`` (what changed between two polls; the command in a real process, stopped with Ctrl-C),
``describe``'s page and its events read from a real NATS, and shell completion of kinds and names."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from flexinfer_cli.descriptions import Event, Events, events_section, title
from flexinfer_cli.events import event_line
from flexinfer_cli.main import app
from flexinfer_cli.watching import Snapshot, changes, watch
from flexinfer_common import subjects
from flexinfer_common.enums import SwapPhase, SwapReason
from flexinfer_common.messages import SwapEvent
from tests.unit.test_cli_commands import HOMELAB, FakeAdminApi, api, env_for  # noqa: F401 - the api fixture

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def snap(**values: str) -> Snapshot[str, str]:
    return Snapshot(tuple(values.items()))


@pytest.mark.parametrize(
    ("previous", "current", "printed"),
    [
        pytest.param(None, snap(a="1", b="2"), ["1", "2"], id="first-poll-prints-all"),
        pytest.param(snap(a="1", b="2"), snap(a="1", b="2"), [], id="nothing-changed"),
        pytest.param(snap(a="1", b="2"), snap(a="1", b="3"), ["3"], id="one-changed"),
        pytest.param(snap(a="1"), snap(a="1", c="9"), ["9"], id="one-new"),
        pytest.param(snap(a="1", b="2"), snap(a="1"), [], id="deleted-prints-nothing"),
    ],
)
def test_changes(previous: Snapshot[str, str] | None, current: Snapshot[str, str], printed: list[str]) -> None:
    assert changes(previous, current) == printed


async def test_watch_prints_the_list_then_what_changes_until_stopped() -> None:
    polls = iter([snap(a="1"), snap(a="1"), snap(a="2", b="5"), snap(a="2", b="5")])
    shown: list[tuple[list[str], bool]] = []
    stop = asyncio.Event()

    async def poll() -> Snapshot[str, str]:
        try:
            return next(polls)
        except StopIteration:
            stop.set()
            return snap(a="2", b="5")

    def show(values: Sequence[str], first: bool) -> None:
        shown.append((list(values), first))

    async def no_wait(_: float) -> None:
        return None

    await watch(poll, show, interval=1.0, stop=stop, sleep=no_wait)
    assert shown == [(["1"], True), (["2", "5"], False)]


async def test_a_stop_ends_the_wait_between_polls_at_once() -> None:
    """Ctrl-C sets the stop: with an hour between polls, the watch still ends as soon as it is set."""
    stop = asyncio.Event()
    polls = 0

    async def poll() -> Snapshot[str, str]:
        nonlocal polls
        polls += 1
        asyncio.get_running_loop().call_later(0.05, stop.set)
        return snap(a="1")

    await asyncio.wait_for(watch(poll, lambda values, first: None, interval=3600, stop=stop), timeout=10)
    assert polls == 1


def test_get_watch_in_a_real_process_prints_changes_and_stops_on_ctrl_c(api: FakeAdminApi) -> None:  # noqa: F811
    runner = CliRunner()
    assert runner.invoke(app, ["apply", "-f", HOMELAB], env=env_for(api)).exit_code == 0
    env = {**os.environ, **env_for(api)}
    process = subprocess.Popen(
        [sys.executable, "-m", "flexinfer_cli", "get", "models", "-w", "--watch-interval", "0.1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        lines = [process.stdout.readline() for _ in range(3)]
        assert lines[0].split()[0] == "NAME" and [line.split()[0] for line in lines[1:]] == ["chat-large", "chat-small"]
        api.models[("default", "chat-small")]["status"] = {"phase": "Loading", "sharedGroup": {"state": "Active"}}
        changed = process.stdout.readline()
        assert changed.split()[:5] == ["chat-small", "homelab-gpu", "50", "Loading", "Active"]
        # The widths of the first print hold: the changed line lines up under the header.
        assert changed.index("Loading") == lines[0].index("PHASE")
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err


def test_title_case_like_kubectl_describe() -> None:
    assert [title(k) for k in ("swapCooldown", "gpu", "readinessPath", "ttlSeconds")] == [
        "Swap Cooldown",
        "GPU",
        "Readiness Path",
        "TTL Seconds",
    ]


def test_events_section_keeps_the_last_ten_oldest_first() -> None:
    events = Events(items=tuple(Event(T0 + timedelta(minutes=i), "swap.phase", f"e{i}") for i in range(12)))
    lines = events_section(events, T0 + timedelta(minutes=20))
    assert lines[1].split() == ["AGE", "KIND", "MESSAGE"]
    assert [line.split()[-1] for line in lines[2:]] == [f"e{i}" for i in range(2, 12)]
    assert lines[2].split()[0] == "18m"
    assert events_section(Events(), T0) == ["Events:         <none>"]


def swap_event(kind: str, from_model: str, to_model: str, phase: SwapPhase, at: datetime) -> SwapEvent:
    return SwapEvent(
        kind=kind,  # type: ignore[arg-type]
        swap_id="s1",
        group="homelab-gpu",
        from_model=from_model,
        to_model=to_model,
        reason=SwapReason.DEMAND,
        phase=phase,
        time=at,
    )


def test_event_line_keeps_only_this_models_events() -> None:
    mine = swap_event("swap.started", "default/a", "default/b", SwapPhase.DRAINING, T0)
    other = swap_event("swap.started", "default/c", "default/d", SwapPhase.DRAINING, T0)
    subject = subjects.event_subject("swap", "homelab-gpu")
    line = event_line(subject, mine.to_bytes(), model="default/b")
    assert line == Event(T0, "swap.started", "default/a -> default/b (demand), draining")
    assert event_line(subject, other.to_bytes(), model="default/b") is None
    assert event_line(subject, b"not json", model="default/b") is None


@pytest.mark.parametrize(
    ("words", "expected"),
    [
        pytest.param(["get", "mo"], ["model", "models"], id="kinds"),
        pytest.param(["describe", ""], ["model", "group"], id="describe-kinds"),
        pytest.param(["get", "models", "chat-s"], ["chat-small"], id="model-names"),
        pytest.param(["promote", "chat-"], ["chat-large", "chat-small"], id="promote-names"),
        pytest.param(["get", "models", "-n", "lab", ""], [], id="names-in-another-namespace"),
    ],
)
def test_shell_completion_of_kinds_and_names(
    api: FakeAdminApi,  # noqa: F811
    words: list[str],
    expected: list[str],
) -> None:
    runner = CliRunner()
    assert runner.invoke(app, ["apply", "-f", HOMELAB], env=env_for(api)).exit_code == 0
    line = " ".join(["flexinfer", *words])
    env = {
        **env_for(api),
        "_FLEXINFER_COMPLETE": "complete_bash",
        "COMP_WORDS": line,
        "COMP_CWORD": str(len(words)),
    }
    result = runner.invoke(app, [], env=env, prog_name="flexinfer")
    assert result.stdout.split() == expected, result.output
