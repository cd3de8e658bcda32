"""Keeps the services of ``flexinfer up`` running as child processes, and stops them in order.

A service that exits while the supervisor is not stopping is restarted after a delay chosen by
:func:`next_backoff` (0.5 s doubling to 30 s, back to 0.5 s once a run lasted 60 s); every restart is a
structured log line. :meth:`Supervisor.stop` sends SIGTERM to one service at a time in the order given and
waits for it (SIGKILL after ``stop_timeout``), so a service stopped later can still finish its own shutdown
(the actuator, last, stops the model processes).

Liveness (docs/operations.md, "Liveness"): a service whose :class:`ServiceSpec` has a ``health_url`` is probed with
``GET`` every ``Liveness.period`` seconds, each probe given ``Liveness.timeout`` seconds, as a Kubernetes liveness
probe would. A service that fails ``Liveness.failure_threshold`` probes in a row (no answer in time, a refused
connection, a status outside 200-399) is stopped or hung, not crashed: the supervisor logs it, SIGKILLs its
process group (a SIGSTOPped process cannot handle SIGTERM) and the ordinary restart follows. Failures count only
once the service has answered one probe since it (re)started, or once ``Liveness.initial_delay`` has passed, so a
slow start is not mistaken for a hang.

Each child runs in its own session (``start_new_session``): a Ctrl-C in the terminal reaches only the
supervisor, which then stops the children in order. On Linux each child also gets
``PR_SET_PDEATHSIG=SIGTERM``, so it stops if the supervisor is killed outright. The kernel sends that signal
when the *thread* that forked the child exits; children are forked from the event-loop thread, so run the
supervisor on a loop whose thread lives as long as the process (``asyncio.run`` in the main thread).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

INITIAL_BACKOFF = 0.5
MAX_BACKOFF = 30.0
RESET_AFTER = 60.0
STOP_TIMEOUT = 15.0
LIVENESS_PERIOD = 5.0
LIVENESS_TIMEOUT = 2.0
LIVENESS_FAILURE_THRESHOLD = 3
LIVENESS_INITIAL_DELAY = 30.0

_PR_SET_PDEATHSIG = 1

log = logging.getLogger("flexinfer.up.supervisor")


def next_backoff(
    previous: float,
    uptime: float,
    *,
    initial: float = INITIAL_BACKOFF,
    maximum: float = MAX_BACKOFF,
    reset_after: float = RESET_AFTER,
) -> float:
    """How long to wait before restarting a service that just exited. Pure: no side effects.

    ``previous`` is the delay waited before the run that just ended (0 when it was the first run);
    ``uptime`` is how long that run lasted, in seconds. A run that lasted ``reset_after`` or longer counts as
    healthy, so the delay starts over at ``initial``; otherwise it doubles, up to ``maximum``.
    """
    if previous <= 0 or uptime >= reset_after:
        return min(initial, maximum)
    return min(max(previous * 2, initial), maximum)


@dataclass(frozen=True)
class Backoff:
    """The restart policy of :func:`next_backoff`: ``initial`` after a first or healthy run, doubling up to
    ``maximum``; a run of ``reset_after`` seconds or more counts as healthy."""

    initial: float = INITIAL_BACKOFF
    maximum: float = MAX_BACKOFF
    reset_after: float = RESET_AFTER

    def next(self, previous: float, uptime: float) -> float:
        return next_backoff(previous, uptime, initial=self.initial, maximum=self.maximum, reset_after=self.reset_after)


def describe_exit(returncode: int | None) -> str:
    if returncode is None:
        return "did not start"
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


def parent_death_preexec(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` arming ``PR_SET_PDEATHSIG`` in the child (Linux; None elsewhere)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before the fork, not in the child
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
        if os.getppid() != parent:  # the supervisor died between fork and prctl
            os._exit(1)

    return preexec


@dataclass(frozen=True)
class ServiceSpec:
    """A process to keep running: ``name`` is how logs and :class:`Supervisor` methods refer to it."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] | None = None  # None: the supervisor's own environment
    cwd: str | None = None
    health_url: str | None = None  # probed for liveness (GET, 200-399 is alive); None: not probed


@dataclass(frozen=True)
class Liveness:
    """How the supervisor probes a service's ``health_url`` (the fields of a Kubernetes liveness probe)."""

    period: float = LIVENESS_PERIOD
    timeout: float = LIVENESS_TIMEOUT
    failure_threshold: int = LIVENESS_FAILURE_THRESHOLD
    initial_delay: float = LIVENESS_INITIAL_DELAY

    def __post_init__(self) -> None:
        if not (self.period > 0 and self.timeout > 0 and self.failure_threshold >= 1 and self.initial_delay >= 0):
            raise ValueError(
                f"liveness needs period > 0, timeout > 0, failure_threshold >= 1, initial_delay >= 0: {self}"
            )


def probe_counts(*, answered: bool, answered_since_start: bool, since_start: float, initial_delay: float) -> bool:
    """Whether a failed probe counts towards the threshold. Pure: a service that has not answered once since it
    (re)started gets ``initial_delay`` seconds before its failures count (it may still be importing, migrating)."""
    return not answered and (answered_since_start or since_start >= initial_delay)


Probe = Callable[[str, float], Awaitable[bool]]


async def http_probe(url: str, seconds: float) -> bool:
    """``GET url`` answered with a status 200-399 within ``seconds`` (what a Kubernetes httpGet probe
    accepts)."""
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=seconds)) as session,
            session.get(url, allow_redirects=False) as response,
        ):
            return 200 <= response.status < 400
    except (aiohttp.ClientError, TimeoutError, OSError):
        return False


@dataclass(frozen=True)
class Restart:
    """A restart the supervisor scheduled (also logged)."""

    service: str
    returncode: int | None
    uptime: float
    delay: float


def plan_restart(
    logger: logging.Logger,
    name: str,
    *,
    previous: float,
    uptime: float,
    returncode: int | None,
    reason: str,
    count: int,
    backoff: Backoff,
) -> Restart:
    """The restart after an unexpected exit (delay from ``backoff``), logged as one warning line."""
    delay = backoff.next(previous, uptime)
    logger.warning(
        "%s exited unexpectedly (%s) after %.1f s; restarting in %.1f s",
        name,
        reason,
        uptime,
        delay,
        extra={
            "child": name,
            "exit_code": returncode,
            "uptime_seconds": round(uptime, 3),
            "restart_in_seconds": delay,
            "restarts": count,
        },
    )
    return Restart(service=name, returncode=returncode, uptime=uptime, delay=delay)


@dataclass
class _Child:
    spec: ServiceSpec
    process: asyncio.subprocess.Process | None = None
    started_at: float = 0.0
    starts: int = 0
    exits: int = 0
    last_returncode: int | None = None
    backoff: float = 0.0
    task: asyncio.Task[None] | None = field(default=None, repr=False)
    probe_task: asyncio.Task[None] | None = field(default=None, repr=False)
    answered: bool = False  # a liveness probe succeeded since the last (re)start
    failures: int = 0  # liveness probes failed in a row
    liveness_kills: int = 0
    killed_by_liveness: bool = False


class Supervisor:
    """Start services, restart the ones that exit, stop them in order. One instance per run."""

    def __init__(
        self,
        services: Sequence[ServiceSpec],
        *,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        reset_after: float = RESET_AFTER,
        stop_timeout: float = STOP_TIMEOUT,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
        liveness: Liveness | None = None,
        probe: Probe = http_probe,
    ) -> None:
        names = [spec.name for spec in services]
        if len(set(names)) != len(names):
            raise ValueError(f"service names must be unique: {names}")
        self._children = {spec.name: _Child(spec) for spec in services}
        self.backoff = Backoff(initial_backoff, max_backoff, reset_after)
        self.stop_timeout = stop_timeout
        self._clock = clock
        self._log = logger or log
        self._stopping = asyncio.Event()
        self._preexec = parent_death_preexec()
        self.restarts: list[Restart] = []
        self.liveness = liveness or Liveness()
        self._probe = probe

    # -- observing ------------------------------------------------------------------------------------

    @property
    def names(self) -> list[str]:
        return list(self._children)

    def pid(self, name: str) -> int | None:
        """The service's pid while it runs."""
        process = self._children[name].process
        return process.pid if process is not None and process.returncode is None else None

    def exits(self, name: str) -> int:
        """How many times the service exited (or failed to start) while not being stopped."""
        return self._children[name].exits

    def last_exit(self, name: str) -> str:
        return describe_exit(self._children[name].last_returncode)

    def liveness_kills(self, name: str) -> int:
        """How many times the service was killed for failing its liveness probe."""
        return self._children[name].liveness_kills

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    # -- running --------------------------------------------------------------------------------------

    async def start(self) -> None:
        """Start every service (in the order given) and watch each; returns once all are spawned."""
        if self._stopping.is_set():
            raise RuntimeError("a stopped Supervisor cannot start again")
        for child in self._children.values():
            await self._spawn(child)
            child.task = asyncio.create_task(self._watch(child), name=f"supervise:{child.spec.name}")
            if child.spec.health_url is not None:
                child.probe_task = asyncio.create_task(self._probe_liveness(child), name=f"liveness:{child.spec.name}")

    async def _spawn(self, child: _Child) -> None:
        spec = child.spec
        child.process = await asyncio.create_subprocess_exec(
            *spec.argv,
            stdin=subprocess.DEVNULL,
            env=dict(spec.env) if spec.env is not None else None,
            cwd=spec.cwd,
            start_new_session=True,
            preexec_fn=self._preexec,
        )
        child.started_at = self._clock()
        child.starts += 1
        child.answered, child.failures, child.killed_by_liveness = False, 0, False
        self._log.info(
            "started %s",
            spec.name,
            extra={"child": spec.name, "pid": child.process.pid, "start": child.starts},
        )

    async def _watch(self, child: _Child) -> None:
        name = child.spec.name
        while True:
            returncode: int | None = None
            if child.process is not None:
                returncode = await child.process.wait()
            if self._stopping.is_set():
                return
            uptime = self._clock() - child.started_at if child.process is not None else 0.0
            child.exits += 1
            child.last_returncode = returncode
            reason = describe_exit(returncode)
            if child.killed_by_liveness:
                reason += ", its liveness probe failed"
            restart = plan_restart(
                self._log,
                name,
                previous=child.backoff,
                uptime=uptime,
                returncode=returncode,
                reason=reason,
                count=child.exits,
                backoff=self.backoff,
            )
            child.backoff = delay = restart.delay
            self.restarts.append(restart)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), delay)
            if self._stopping.is_set():
                return
            try:
                await self._spawn(child)
            except OSError as exc:
                self._log.error("cannot start %s: %s", name, exc, extra={"child": name, "error": str(exc)})
                child.process = None

    async def _probe_liveness(self, child: _Child) -> None:
        """Probe ``child``'s health URL every period; kill its process group after ``failure_threshold`` failures in
        a row (its watch then restarts it)."""
        spec, live = child.spec, self.liveness
        assert spec.health_url is not None
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), live.period)
            process = child.process
            if self._stopping.is_set() or process is None or process.returncode is not None:
                continue
            answered = await self._probe(spec.health_url, live.timeout)
            if process is not child.process or process.returncode is not None or self._stopping.is_set():
                continue  # it exited or was replaced meanwhile
            counts = probe_counts(
                answered=answered,
                answered_since_start=child.answered,
                since_start=self._clock() - child.started_at,
                initial_delay=live.initial_delay,
            )
            if answered:
                if not child.answered:  # from here on its failed probes count (before: its start-up grace)
                    self._log.info(
                        "%s answers its liveness probe",
                        spec.name,
                        extra={"child": spec.name, "pid": process.pid, "url": spec.health_url},
                    )
                child.answered, child.failures = True, 0
                continue
            if not counts:
                continue
            child.failures += 1
            if child.failures < live.failure_threshold:
                continue
            child.liveness_kills += 1
            child.killed_by_liveness = True
            self._log.warning(
                "%s did not answer GET %s %d times in a row (every %.1f s, %.1f s each): killing it to restart it",
                spec.name,
                spec.health_url,
                child.failures,
                live.period,
                live.timeout,
                extra={
                    "child": spec.name,
                    "pid": process.pid,
                    "url": spec.health_url,
                    "failures": child.failures,
                    "liveness_kills": child.liveness_kills,
                },
            )
            child.failures = 0
            _kill_group(process.pid)

    async def stop(self, order: Sequence[str] | None = None) -> None:
        """Stop restarting, then SIGTERM each service in ``order`` (default: reverse start order) and wait for
        it up to ``stop_timeout`` before SIGKILL. Services missing from ``order`` are stopped last. Idempotent."""
        self._stopping.set()
        tasks = [
            task for child in self._children.values() for task in (child.task, child.probe_task) if task is not None
        ]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        sequence = list(order) if order is not None else list(reversed(self._children))
        sequence += [name for name in self._children if name not in sequence]
        for name in sequence:
            await self._stop_one(self._children[name])

    async def _stop_one(self, child: _Child) -> None:
        process, name = child.process, child.spec.name
        if process is None:
            return
        if process.returncode is None:
            self._log.info("stopping %s", name, extra={"child": name, "pid": process.pid})
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
                process.send_signal(signal.SIGCONT)  # a stopped (SIGSTOP) process handles SIGTERM only once continued
            try:
                await asyncio.wait_for(process.wait(), self.stop_timeout)
            except TimeoutError:
                self._log.warning(
                    "%s did not stop within %.0f s; killing it",
                    name,
                    self.stop_timeout,
                    extra={"child": name, "pid": process.pid},
                )
                _kill_group(process.pid)
                await process.wait()
            self._log.info(
                "%s stopped (%s)",
                name,
                describe_exit(process.returncode),
                extra={"child": name, "exit_code": process.returncode},
            )
        # Whatever the service left behind in its process group goes too (model servers have their own).
        _kill_group(process.pid)

    def kill_all(self) -> None:
        """SIGKILL every service's process group now (a second Ctrl-C). ``stop()`` still reaps them."""
        self._stopping.set()
        for child in self._children.values():
            if child.process is not None and child.process.returncode is None:
                self._log.warning("killing %s", child.spec.name, extra={"child": child.spec.name})
                _kill_group(child.process.pid)


def _kill_group(pid: int) -> None:
    """SIGKILL the process group led by ``pid`` (each service is a session leader)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


class EmbeddedServer(Protocol):
    """What :class:`EmbeddedWatch` needs of ``flexinfer_cli.embedded``'s servers."""

    @property
    def pid(self) -> int | None: ...

    def restart(self) -> str: ...


class EmbeddedWatch:
    """Keeps an embedded server (NATS, PostgreSQL) running like a service: when its process dies, restart it on
    the same port after :func:`next_backoff`'s delay, logged the same way. The server starts and restarts in a
    thread (its start blocks until it answers)."""

    def __init__(
        self,
        server: EmbeddedServer,
        *,
        name: str,
        poll_interval: float = 0.2,
        initial_backoff: float = INITIAL_BACKOFF,
        max_backoff: float = MAX_BACKOFF,
        reset_after: float = RESET_AFTER,
        clock: Callable[[], float] = time.monotonic,
        logger: logging.Logger | None = None,
    ) -> None:
        self.server = server
        self.name = f"embedded {name}"
        self.poll_interval = poll_interval
        self.backoff = Backoff(initial_backoff, max_backoff, reset_after)
        self._clock = clock
        self._log = logger or log
        self.stopping = False
        self.restarts: list[Restart] = []
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._watch(), name=f"supervise:{self.name}")

    async def stop(self) -> None:
        self.stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _watch(self) -> None:
        backoff, started_at = 0.0, self._clock()
        while not self.stopping:
            if self.server.pid is not None:
                await asyncio.sleep(self.poll_interval)
                continue
            restart = plan_restart(
                self._log,
                self.name,
                previous=backoff,
                uptime=self._clock() - started_at,
                returncode=None,
                reason="process gone",
                count=len(self.restarts) + 1,
                backoff=self.backoff,
            )
            backoff = restart.delay
            self.restarts.append(restart)
            await asyncio.sleep(backoff)
            if self.stopping:
                return
            started_at = self._clock()
            try:
                await asyncio.to_thread(self.server.restart)
            except Exception as exc:
                self._log.error(
                    "cannot restart %s: %s", self.name, exc, extra={"child": self.name, "error": str(exc)[:500]}
                )
                continue
            self._log.info("%s restarted", self.name, extra={"child": self.name, "pid": self.server.pid})
