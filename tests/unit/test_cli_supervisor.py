"""The supervisor of ``flexinfer up``: back-off policy, restarts, ordered stop."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from flexinfer_cli.supervisor import (
    EmbeddedWatch,
    Liveness,
    ServiceSpec,
    Supervisor,
    describe_exit,
    next_backoff,
    probe_counts,
)
from tests.support.processes import alive
from tests.support.waiting import wait_for


@pytest.mark.parametrize(
    ("previous", "uptime", "expected"),
    [
        pytest.param(0.0, 0.1, 0.5, id="first-crash-waits-initial"),
        pytest.param(0.5, 0.1, 1.0, id="second-crash-doubles"),
        pytest.param(1.0, 2.0, 2.0, id="keeps-doubling"),
        pytest.param(8.0, 5.0, 16.0, id="doubles-to-16"),
        pytest.param(16.0, 5.0, 30.0, id="capped-at-30"),
        pytest.param(30.0, 1.0, 30.0, id="stays-at-cap"),
        pytest.param(30.0, 59.9, 30.0, id="just-under-reset-still-backs-off"),
        pytest.param(30.0, 60.0, 0.5, id="up-60s-resets"),
        pytest.param(4.0, 3600.0, 0.5, id="long-run-resets"),
        pytest.param(0.1, 0.0, 0.5, id="below-initial-rounds-up"),
    ],
)
def test_next_backoff(previous: float, uptime: float, expected: float) -> None:
    assert next_backoff(previous, uptime) == expected


def test_next_backoff_custom_bounds() -> None:
    assert next_backoff(0.0, 0.0, initial=0.05, maximum=0.3, reset_after=1.0) == 0.05
    assert next_backoff(0.2, 0.0, initial=0.05, maximum=0.3, reset_after=1.0) == 0.3
    assert next_backoff(0.3, 1.0, initial=0.05, maximum=0.3, reset_after=1.0) == 0.05


@pytest.mark.parametrize(
    ("code", "text"),
    [
        pytest.param(0, "exit code 0", id="clean"),
        pytest.param(3, "exit code 3", id="error"),
        pytest.param(-signal.SIGKILL, "killed by SIGKILL", id="signal"),
        pytest.param(None, "did not start", id="not-started"),
    ],
)
def test_describe_exit(code: int | None, text: str) -> None:
    assert describe_exit(code) == text


def python(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", textwrap.dedent(code))


@pytest.mark.timeout(30)
async def test_restarts_a_crashing_child_with_growing_delays_and_stops_a_long_running_one() -> None:
    supervisor = Supervisor(
        [
            ServiceSpec("crasher", python("import sys; sys.exit(3)")),
            ServiceSpec("sleeper", python("import time; time.sleep(60)")),
        ],
        initial_backoff=0.05,
        max_backoff=0.4,
        reset_after=60.0,
        stop_timeout=5.0,
    )
    await supervisor.start()
    sleeper = supervisor.pid("sleeper")
    assert sleeper is not None
    try:
        await wait_for(lambda: len(supervisor.restarts) >= 5)
    finally:
        started = time.monotonic()
        await supervisor.stop()
        stop_took = time.monotonic() - started

    delays = [restart.delay for restart in supervisor.restarts]
    assert delays[:5] == [0.05, 0.1, 0.2, 0.4, 0.4]
    assert all(r.service == "crasher" and r.returncode == 3 for r in supervisor.restarts)
    assert supervisor.exits("crasher") == len(supervisor.restarts)
    assert supervisor.last_exit("crasher") == "exit code 3"
    # the long-running child answered SIGTERM at once: no restart, no wait for the kill timeout
    assert supervisor.exits("sleeper") == 0
    assert stop_took < 3.0
    assert not alive(sleeper)
    assert supervisor.pid("sleeper") is None


@pytest.mark.timeout(30)
async def test_no_restart_after_stop_even_during_back_off() -> None:
    supervisor = Supervisor([ServiceSpec("crasher", python("pass"))], initial_backoff=5.0, max_backoff=5.0)
    await supervisor.start()
    await wait_for(lambda: len(supervisor.restarts) == 1)
    started = time.monotonic()
    await supervisor.stop()
    assert time.monotonic() - started < 1.0  # the 5 s back-off was cut short
    await asyncio.sleep(0.1)
    assert len(supervisor.restarts) == 1
    assert supervisor.pid("crasher") is None


@pytest.mark.timeout(30)
async def test_stop_kills_a_child_that_ignores_sigterm() -> None:
    stubborn = python(
        """
        import signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    supervisor = Supervisor([ServiceSpec("stubborn", stubborn)], stop_timeout=0.5)
    await supervisor.start()
    pid = supervisor.pid("stubborn")
    assert pid is not None
    await asyncio.sleep(0.3)  # let it install its handler
    started = time.monotonic()
    await supervisor.stop()
    assert 0.4 < time.monotonic() - started < 5.0
    assert not alive(pid)


@pytest.mark.timeout(30)
async def test_stop_goes_in_the_given_order_one_service_at_a_time(tmp_path: Path) -> None:
    journal = tmp_path / "journal"
    child = python(
        f"""
        import signal, sys, time
        name = sys.argv[1]
        def stop(*_):
            time.sleep(0.1)  # a later service must not be signalled before this one is gone
            with open({str(journal)!r}, "a") as f:
                f.write(name + "\\n")
            sys.exit(0)
        signal.signal(signal.SIGTERM, stop)
        open({str(tmp_path)!r} + "/" + name + ".up", "w").close()
        time.sleep(60)
        """
    )
    names = ["scheduler", "actuator", "lease-manager", "proxy"]
    supervisor = Supervisor([ServiceSpec(name, (*child, name)) for name in names])
    await supervisor.start()
    await wait_for(lambda: all((tmp_path / f"{name}.up").exists() for name in names))
    await supervisor.stop(["proxy", "lease-manager", "scheduler", "actuator"])
    assert journal.read_text().split() == ["proxy", "lease-manager", "scheduler", "actuator"]


@pytest.mark.timeout(30)
async def test_children_run_in_their_own_session_with_the_given_env() -> None:
    probe = python(
        """
        import os, time
        print(os.getsid(0) == os.getpid(), os.environ.get("FLEXINFER_PROBE"), flush=True)
        time.sleep(60)
        """
    )
    supervisor = Supervisor([ServiceSpec("probe", probe, env={**os.environ, "FLEXINFER_PROBE": "yes"})])
    await supervisor.start()
    pid = supervisor.pid("probe")
    assert pid is not None
    try:
        assert os.getsid(pid) == pid  # a terminal Ctrl-C reaches the supervisor only
        assert os.getpgid(pid) == pid
    finally:
        await supervisor.stop()


@pytest.mark.timeout(30)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
async def test_children_die_with_the_supervisor_process(tmp_path: Path) -> None:
    """A supervisor killed with SIGKILL leaves no service behind (PR_SET_PDEATHSIG)."""
    pid_file = tmp_path / "child.pid"
    script = textwrap.dedent(
        f"""
        import asyncio, sys, time
        from pathlib import Path
        from flexinfer_cli.supervisor import ServiceSpec, Supervisor

        CHILD = "import os, time; open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)"

        async def main():
            child = (sys.executable, "-c", CHILD)
            supervisor = Supervisor([ServiceSpec("child", child)])
            await supervisor.start()
            await asyncio.sleep(60)

        asyncio.run(main())
        """
    )
    parent = await asyncio.create_subprocess_exec(sys.executable, "-c", script)
    try:
        await wait_for(lambda: pid_file.exists() and pid_file.read_text().strip() != "")
        child_pid = int(pid_file.read_text())
        assert alive(child_pid)
    finally:
        parent.kill()
        await parent.wait()
    await wait_for(lambda: not alive(child_pid), within=5.0)


class FakeEmbedded:
    """An embedded server whose process 'dies' when told and comes back on restart()."""

    def __init__(self) -> None:
        self.pid: int | None = 4242
        self.restarted = threading.Event()
        self.failures_left = 1  # the first restart fails (e.g. the port is still held)

    def restart(self) -> str:
        if self.failures_left:
            self.failures_left -= 1
            raise RuntimeError("address in use")
        self.pid = 4343
        self.restarted.set()
        return "nats://127.0.0.1:4222"


async def test_embedded_watch_restarts_a_dead_server_with_back_off_and_logs_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    server = FakeEmbedded()
    watch = EmbeddedWatch(server, name="NATS", poll_interval=0.01, initial_backoff=0.01, max_backoff=0.04)
    watch.start()
    try:
        server.pid = None  # SIGKILLed
        assert await asyncio.to_thread(server.restarted.wait, 10)
    finally:
        await watch.stop()
    assert server.pid == 4343
    # one failed attempt, then a doubled delay before the one that worked
    assert [r.delay for r in watch.restarts] == [0.01, 0.02]
    messages = [r.getMessage() for r in caplog.records]
    assert any("embedded NATS exited unexpectedly" in m for m in messages)
    assert any("cannot restart embedded NATS: address in use" in m for m in messages)


@pytest.mark.parametrize(
    ("answered", "answered_since_start", "since_start", "counts"),
    [
        pytest.param(True, False, 0.0, False, id="an-answer-never-counts"),
        pytest.param(False, True, 0.0, True, id="silent-after-answering-counts"),
        pytest.param(False, False, 5.0, False, id="silent-while-starting-does-not-count"),
        pytest.param(False, False, 30.0, True, id="silent-past-the-initial-delay-counts"),
    ],
)
def test_which_failed_probes_count(
    answered: bool, answered_since_start: bool, since_start: float, counts: bool
) -> None:
    assert (
        probe_counts(
            answered=answered, answered_since_start=answered_since_start, since_start=since_start, initial_delay=30.0
        )
        is counts
    )


def test_liveness_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="failure_threshold"):
        Liveness(failure_threshold=0)


def stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP): state T in /proc."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] == "T"
    except OSError:
        return False


class FakeHealth:
    """A stand-in for ``GET /healthz``: a process answers unless it is stopped (as a SIGSTOPped server would not)."""

    def __init__(self) -> None:
        self.supervisor: Supervisor | None = None
        self.calls = 0

    async def __call__(self, url: str, seconds: float) -> bool:
        assert url == "http://127.0.0.1:1/healthz" and seconds == 0.05
        self.calls += 1
        assert self.supervisor is not None
        pid = self.supervisor.pid("hangs")
        return pid is not None and not stopped(pid)


@pytest.mark.timeout(30)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process state from /proc")
async def test_liveness_replaces_a_service_that_stops_answering(caplog: pytest.LogCaptureFixture) -> None:
    health = FakeHealth()
    supervisor = Supervisor(
        [ServiceSpec("hangs", python("import time; time.sleep(60)"), health_url="http://127.0.0.1:1/healthz")],
        initial_backoff=0.05,
        liveness=Liveness(period=0.02, timeout=0.05, failure_threshold=3, initial_delay=10.0),
        probe=health,
    )
    health.supervisor = supervisor
    await supervisor.start()
    try:
        first = supervisor.pid("hangs")
        assert first is not None
        await wait_for(lambda: health.calls >= 5)
        assert supervisor.liveness_kills("hangs") == 0  # it answers: left alone
        os.kill(first, signal.SIGSTOP)
        await wait_for(lambda: supervisor.pid("hangs") not in (None, first))
        assert not alive(first)  # killed, not left behind stopped
        assert supervisor.liveness_kills("hangs") == 1
        [restart] = supervisor.restarts
        assert restart.returncode == -signal.SIGKILL
        assert "did not answer GET http://127.0.0.1:1/healthz 3 times in a row" in caplog.text
        assert "killed by SIGKILL, its liveness probe failed" in caplog.text
        # the new process answers: it stays
        calls = health.calls
        await wait_for(lambda: health.calls >= calls + 10)
        assert supervisor.liveness_kills("hangs") == 1
    finally:
        await supervisor.stop()


@pytest.mark.timeout(30)
async def test_a_service_that_never_answered_gets_the_initial_delay() -> None:
    calls: list[str] = []

    async def silent(url: str, seconds: float) -> bool:
        calls.append(url)
        return False

    supervisor = Supervisor(
        [ServiceSpec("slow", python("import time; time.sleep(60)"), health_url="http://127.0.0.1:1/healthz")],
        liveness=Liveness(period=0.02, timeout=0.02, failure_threshold=2, initial_delay=0.5),
        probe=silent,
    )
    await supervisor.start()
    try:
        first = supervisor.pid("slow")
        await wait_for(lambda: len(calls) >= 5)
        assert supervisor.pid("slow") == first  # still starting: failures do not count yet
        await wait_for(lambda: supervisor.liveness_kills("slow") == 1)  # past 0.5 s they do
    finally:
        await supervisor.stop()


@pytest.mark.timeout(30)
async def test_stop_does_not_wait_out_the_timeout_for_a_stopped_service() -> None:
    supervisor = Supervisor([ServiceSpec("frozen", python("import time; time.sleep(60)"))], stop_timeout=10.0)
    await supervisor.start()
    pid = supervisor.pid("frozen")
    assert pid is not None
    os.kill(pid, signal.SIGSTOP)
    started = time.monotonic()
    await supervisor.stop()
    assert time.monotonic() - started < 3.0  # SIGTERM reached it: it was continued too
    assert not alive(pid)
