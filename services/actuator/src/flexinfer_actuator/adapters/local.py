"""The ``local`` back-end: one OS process per model on this machine.

Activate starts ``spec.command`` (``{port}`` substituted), or the backend preset of ``spec.backend``
(domain/presets.py), in its own session, with its output appended to ``<state_dir>/logs/<namespace>_<model>.log``
(mode 0600, written through the descriptor the actuator opened), reports ``Loading``, and probes the readiness URL
until it answers 2xx (``Ready``), the process exits or the load timeout passes (``Failed``); a slow load's Loading
message says what the probe gets (``GET /health → 404, 12 tries``), and an exit says why (``killed by signal 4
(SIGILL)``) with the last lines of the log. The environment is built from allow-lists (``FLEXINFER_LOCAL_ENV``),
never a copy of ours. When the actuator runs as root, the process runs as ``FLEXINFER_LOCAL_RUN_AS`` (default
``nobody``) in a private temporary folder that is also its ``HOME``. Park stops the process group (SIGTERM,
grace period, SIGKILL) and reports ``Parked`` once the process is reaped, or, with the ``Sleep`` strategy, puts the
server to sleep and keeps it. Every model process gets ``PR_SET_PDEATHSIG(SIGKILL)``, so none outlives the
actuator, even a SIGKILLed one.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import importlib.util
import os
import pwd
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

import aiohttp

from flexinfer_actuator.adapters.gpu import NullGpuMemory, process_parents
from flexinfer_actuator.adapters.sleep_mode import SleepMode
from flexinfer_actuator.domain.commands import (
    MISSING_COMMAND_MESSAGE,
    ActivatePlan,
    ParkPlan,
    ProbeAnswer,
    ProcessUser,
    exit_failure_message,
    load_timeout_message,
    local_endpoint,
    log_file_name,
    plan_activation,
    plan_park,
    probe_message,
    process_environment,
    readiness_url,
    render_command,
    should_report_probe,
    tail_lines,
)
from flexinfer_actuator.domain.gpu_memory import memory_per_device, model_memory, process_tree
from flexinfer_actuator.domain.presets import (
    PresetError,
    choose_engine,
    engine_for_program,
    engines_for,
    render_preset,
)
from flexinfer_actuator.domain.processes import Observation, ProcessInfo, ProcessPhase, log_fields
from flexinfer_actuator.ports import GpuMemory, StatusSink
from flexinfer_actuator.settings import ActuatorSettings
from flexinfer_common.clock import Clock, SystemClock
from flexinfer_common.enums import RuntimePhase
from flexinfer_common.keys import ModelKey
from flexinfer_common.local_commands import (
    DEFAULT_LOCAL_ENV,
    ENGINES_SETTING,
    allowed_commands,
    check_local_process,
)
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import WOKEN, RuntimeSpec
from flexinfer_common.settings import DEFAULT_LOCAL_COMMANDS
from flexinfer_common.tasks import Background
from flexinfer_common.tcp import free_port

log = get_logger("flexinfer.actuator.local")

LOG_TAIL_LINES = 5
_LOG_TAIL_BYTES = 16_384
_PROBE_TIMEOUT_SECONDS = 2.0
_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        prctl: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has prctl
        return None
    return prctl


# Resolved once in the parent: the pre-exec hook runs between fork and exec, where only async-signal-safe work
# belongs (no imports, no library loading).
_PRCTL = _load_prctl()


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """A pre-exec hook: the child gets SIGKILL when the actuator dies, however it dies."""

    def preexec() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the actuator died before prctl took effect
            os._exit(1)

    return preexec


@dataclass
class _Runtime:
    """One model process and what we know about it."""

    spec: RuntimeSpec
    generation: int
    process: asyncio.subprocess.Process
    port: int
    log_path: Path
    log_offset: int
    started_at: datetime
    readiness_path: str = "/health"
    workdir: Path | None = None  # the private folder of a process run as another user (removed once it exits)
    phase: ProcessPhase = ProcessPhase.LOADING
    ready_message: str = ""  # the message of its Ready report (a re-report with a new measurement keeps it)
    memory: int | None = None  # the GPU memory last measured (bytes), reported with Ready
    returncode: int | None = None
    exited: asyncio.Event = field(default_factory=asyncio.Event)
    watcher: asyncio.Task[None] | None = None
    prober: asyncio.Task[None] | None = None

    @property
    def key(self) -> ModelKey:
        return ModelKey(self.spec.namespace, self.spec.name)

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def endpoint(self) -> str:
        return local_endpoint(self.port)

    @property
    def where(self) -> dict[str, object]:
        """Log fields naming this process."""
        return log_fields(self.spec, self.generation, pid=self.pid, port=self.port)


class LocalProcessScaler:
    """The :class:`~flexinfer_actuator.ports.Scaler` that runs each model as a process on this machine."""

    backend = "local"

    def __init__(
        self,
        *,
        state_dir: Path,
        on_status: StatusSink,
        readiness_probe_interval: timedelta,
        park_grace_period: timedelta,
        load_timeout: timedelta,
        local_commands: tuple[str, ...] = DEFAULT_LOCAL_COMMANDS,
        local_env: tuple[str, ...] = DEFAULT_LOCAL_ENV,
        local_engines: Mapping[str, str] | None = None,
        run_as: str | None = None,
        clock: Clock | None = None,
        gpu: GpuMemory | None = None,
        gpu_memory_interval: timedelta = timedelta(seconds=30),
    ) -> None:
        """``run_as``: the user model processes run as when we run as root (None or ``root``: as we run).
        ``gpu``: measures what each Ready model's processes hold on the GPU (None: no GPU, nothing measured), when
        it becomes Ready and every ``gpu_memory_interval`` while it runs (a changed figure is re-reported)."""
        self.logs_dir = Path(state_dir).absolute() / "logs"
        self._on_status = on_status
        self._probe_interval = readiness_probe_interval.total_seconds()
        self._grace = park_grace_period.total_seconds()
        self._load_timeout = load_timeout.total_seconds()
        self._engines = dict(local_engines or {})
        self._allowed = allowed_commands(local_commands, self._engines)
        self._allowed_env = local_env
        self._user = _model_user(run_as)
        self._clock = clock or SystemClock()
        self._runtimes: dict[ModelKey, _Runtime] = {}
        self._report_locks: dict[ModelKey, asyncio.Lock] = {}
        self._watchers: set[asyncio.Task[None]] = set()
        self._http: aiohttp.ClientSession | None = None
        self._sleep_mode = SleepMode(timeout=self._load_timeout)
        self._gpu: GpuMemory = gpu or NullGpuMemory()
        self._gpu_interval = gpu_memory_interval.total_seconds()
        self._measurer = Background("gpu-memory", self._measure_periodically)

    @classmethod
    def from_settings(
        cls, settings: ActuatorSettings, *, on_status: StatusSink, gpu: GpuMemory | None = None
    ) -> LocalProcessScaler:
        return cls(
            state_dir=settings.state_dir,
            on_status=on_status,
            readiness_probe_interval=settings.readiness_probe_interval,
            park_grace_period=settings.park_grace_period,
            load_timeout=settings.load_timeout,
            local_commands=settings.local_commands,
            local_env=settings.local_env,
            local_engines=settings.local_engines,
            run_as=settings.local_run_as,
            gpu=gpu,
            gpu_memory_interval=settings.gpu_memory_interval,
        )

    # ------------------------------------------------------------------ the Scaler protocol

    async def activate(self, spec: RuntimeSpec, *, generation: int) -> None:
        runtime = self._runtimes.get(ModelKey(spec.namespace, spec.name))
        plan = plan_activation(runtime.phase if runtime else None, has_command=bool(spec.command or spec.backend))
        log.info(
            "activate",
            extra={"namespace": spec.namespace, "model": spec.name, "generation": generation, "plan": plan.value},
        )
        if plan is ActivatePlan.REFUSE_NO_COMMAND:
            log.warning("cannot start: no command", extra={"namespace": spec.namespace, "model": spec.name})
            await self._report(
                Observation(spec.namespace, spec.name, RuntimePhase.FAILED, generation, message=MISSING_COMMAND_MESSAGE)
            )
            return
        if plan is ActivatePlan.START:
            if runtime is not None:  # a process still being stopped (a load that timed out): let it go first
                await self._cancel_prober(runtime)
                await self._stop(runtime)
            await self._start(spec, generation)
            return
        assert runtime is not None
        runtime.generation = generation
        if plan is ActivatePlan.KEEP_LOADING:
            await self._emit(runtime, RuntimePhase.LOADING)
        elif plan is ActivatePlan.REPORT_READY:
            await self._emit_ready(runtime)
        else:
            await self._wake(runtime, spec)

    async def park(self, spec: RuntimeSpec, *, generation: int) -> None:
        runtime = self._runtimes.get(ModelKey(spec.namespace, spec.name))
        plan = plan_park(runtime.phase if runtime else None, spec.park_strategy)
        log.info(
            "park",
            extra={"namespace": spec.namespace, "model": spec.name, "generation": generation, "plan": plan.value},
        )
        if plan is ParkPlan.REPORT_PARKED:
            if runtime is None:
                await self._report(Observation(spec.namespace, spec.name, RuntimePhase.PARKED, generation))
            else:  # asleep
                runtime.generation = generation
                await self._emit(runtime, RuntimePhase.PARKED, message="sleeping")
            return
        assert runtime is not None
        runtime.phase = ProcessPhase.STOPPING  # from now on an exit is expected, and a probe cannot turn it Ready
        runtime.generation = generation
        await self._cancel_prober(runtime)
        await self._emit(runtime, RuntimePhase.STOPPING)
        if plan is ParkPlan.SLEEP:
            if await self._sleep_mode.sleep(runtime.endpoint) is None and not runtime.exited.is_set():
                runtime.phase = ProcessPhase.SLEEPING
                log.info("model sleeps", extra=runtime.where)
                await self._emit(runtime, RuntimePhase.PARKED, message="sleeping")
                return
            log.warning("sleep failed; stopping the process instead", extra=runtime.where)
        await self._stop(runtime)
        await self._emit(runtime, RuntimePhase.PARKED, with_pid=False)

    def snapshot(self) -> list[ProcessInfo]:
        return [
            ProcessInfo(
                namespace=r.spec.namespace,
                name=r.spec.name,
                pid=r.pid,
                port=r.port,
                phase=r.phase,
                generation=r.generation,
                started_at=r.started_at,
                endpoint=r.endpoint,
            )
            for r in self._runtimes.values()
            if not r.exited.is_set()
        ]

    async def close(self) -> None:
        """Stop every model process (SIGTERM, grace, SIGKILL) and report each Parked."""
        await self._measurer.stop()
        runtimes = list(self._runtimes.values())
        for runtime in runtimes:
            runtime.phase = ProcessPhase.STOPPING
            await self._cancel_prober(runtime)
        results = await asyncio.gather(*(self._shut_down(r) for r in runtimes), return_exceptions=True)
        for runtime, result in zip(runtimes, results, strict=True):
            if isinstance(result, BaseException):
                log.error("could not stop a model process", extra={**runtime.where, "error": repr(result)})
        for watcher in list(self._watchers):
            watcher.cancel()
        if self._watchers:
            await asyncio.gather(*self._watchers, return_exceptions=True)
        if self._http is not None:
            await self._http.close()
            self._http = None
        await self._sleep_mode.close()
        with contextlib.suppress(Exception):  # the driver's shutdown: nothing to do about a failure on the way out
            self._gpu.close()

    # ------------------------------------------------------------------ GPU memory

    async def measure(self) -> None:
        """Measure every Ready model's GPU memory and re-report Ready for each whose figure changed."""
        for runtime in [r for r in self._runtimes.values() if r.phase is ProcessPhase.READY]:
            memory = await self._measure(runtime)
            if memory != runtime.memory and runtime.phase is ProcessPhase.READY and not runtime.exited.is_set():
                await self._emit_ready(runtime, memory=memory)

    async def _measure(self, runtime: _Runtime) -> int | None:
        """What the model's process tree holds on its busiest device now (None: nothing measured)."""
        if isinstance(self._gpu, NullGpuMemory):
            return None
        try:
            usage, parents = await asyncio.to_thread(lambda: (self._gpu.processes(), process_parents()))
        except Exception as exc:  # a driver error must not fail the model
            log.warning("could not measure GPU memory", extra={**runtime.where, "error": repr(exc)})
            return runtime.memory
        return model_memory(memory_per_device(usage, process_tree(runtime.pid, parents)))

    async def _measure_periodically(self) -> None:
        while True:
            await asyncio.sleep(self._gpu_interval)
            try:
                await self.measure()
            except Exception:
                log.exception("GPU memory measurement failed")

    async def _emit_ready(self, runtime: _Runtime, *, memory: int | None = None, message: str | None = None) -> None:
        """Report Ready with the GPU memory measured (``memory``, else measured now)."""
        if message is not None:
            runtime.ready_message = message
        runtime.memory = memory if memory is not None else await self._measure(runtime)
        if self._gpu_interval > 0 and not isinstance(self._gpu, NullGpuMemory):
            self._measurer.start()
        await self._emit(
            runtime, RuntimePhase.READY, endpoint=runtime.endpoint, message=runtime.ready_message, memory=runtime.memory
        )

    # ------------------------------------------------------------------ starting and stopping

    async def _start(self, spec: RuntimeSpec, generation: int) -> None:
        where = {"namespace": spec.namespace, "model": spec.name}

        async def refuse(message: str, rule: str) -> None:
            log.warning("refused to start a model process", extra={**where, "rule": rule})
            await self._report(Observation(spec.namespace, spec.name, RuntimePhase.FAILED, generation, message=message))

        verdict = check_local_process(spec.command, spec.env, allowed=self._allowed, allowed_env=self._allowed_env)
        if not verdict.allowed:
            await refuse(verdict.message, verdict.rule.value)
            return
        search_path = _search_path()
        readiness_path = spec.readiness_path or "/health"
        preset_env: dict[str, str] = {}
        if spec.command:
            # A bare name is looked up on this actuator's PATH, never on one the manifest could set.
            executable = shutil.which(spec.command[0], path=search_path)
            if executable is None:
                await refuse(f"cannot start {spec.command[0]!r}: not found on the actuator's PATH", "not-found")
                return
            template = [executable, *spec.command[1:]]
        else:
            try:
                engine, program = choose_engine(spec.backend or "", self._find_engines(spec.backend or "", search_path))
                launch = render_preset(spec, engine=engine, executable=program)
            except PresetError as exc:
                await refuse(str(exc), "preset")
                return
            template, readiness_path, preset_env = launch.argv, launch.readiness_path, launch.env
            log.info("backend preset", extra={**where, "engine": engine.id, "readiness_path": readiness_path})
        port = spec.port or free_port()  # the model binds it a moment later
        argv = render_command(template, port)
        log_path = self.logs_dir / log_file_name(spec.namespace, spec.name)
        started_at = self._clock.now()
        workdir: Path | None = None
        try:
            user = None
            as_user: dict[str, object] = {}
            if self._user is not None:
                workdir, user = _private_home(self._user, f"{spec.namespace}_{spec.name}")
                as_user = {"cwd": str(workdir), "user": user.uid, "group": user.gid, "extra_groups": []}
            env = process_environment(
                {**os.environ, "PATH": search_path},
                spec,
                port,
                pass_through=self._allowed_env,
                preset_env=render_command_env(preset_env, port),
                user=user,
            )
            with _open_log(self.logs_dir, log_path) as log_file:
                header = f"--- {started_at.isoformat()} generation {generation}, port {port}: {shlex.join(argv)}\n"
                log_file.write(header.encode())
                log_file.flush()
                offset = log_file.tell()  # this run's output starts here (failure messages quote only it)
                process = await asyncio.create_subprocess_exec(
                    *argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                    preexec_fn=_die_with_parent(os.getpid()),
                    **as_user,  # type: ignore[arg-type]
                )
        except OSError as exc:
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)
            log.warning(
                "cannot start model process",
                extra={"namespace": spec.namespace, "model": spec.name, "argv": argv, "error": str(exc)},
            )
            message = f"cannot start {argv[0]!r}: {exc.strerror or exc}"
            if self._user is not None and isinstance(exc, PermissionError):
                message += (
                    f" (model processes run as {self._user.pw_name!r}, FLEXINFER_LOCAL_RUN_AS: the executable, its "
                    "interpreter and the weights must be readable by that user)"
                )
            await self._report(Observation(spec.namespace, spec.name, RuntimePhase.FAILED, generation, message=message))
            return
        runtime = _Runtime(
            spec=spec,
            generation=generation,
            process=process,
            port=port,
            log_path=log_path,
            log_offset=offset,
            started_at=started_at,
            readiness_path=readiness_path,
            workdir=workdir,
        )
        self._runtimes[runtime.key] = runtime
        # The watcher exists from the first moment, so the exit of a process is always noticed; it reports only
        # after the Loading below, because reports for a model are serialized in call order.
        runtime.watcher = self._spawn_watcher(runtime)
        log.info("started model process", extra={**runtime.where, "argv": argv, "log": str(log_path)})
        await self._emit(runtime, RuntimePhase.LOADING)
        if not runtime.exited.is_set():
            runtime.prober = asyncio.create_task(self._probe_until_ready(runtime), name=f"probe:{runtime.key}")

    async def _stop(self, runtime: _Runtime) -> None:
        """SIGTERM the process group, wait the grace period, SIGKILL; return once the process is reaped."""
        runtime.phase = ProcessPhase.STOPPING
        if not runtime.exited.is_set():
            self._signal_group(runtime, signal.SIGTERM)
            try:
                grace = runtime.spec.drain_seconds if runtime.spec.drain_seconds is not None else self._grace
                await asyncio.wait_for(runtime.exited.wait(), grace)
            except TimeoutError:
                log.warning("process ignored SIGTERM for the grace period; killing it", extra=runtime.where)
                self._signal_group(runtime, signal.SIGKILL)
                await runtime.exited.wait()
        log.info("model process stopped", extra={**runtime.where, "returncode": runtime.returncode})

    async def _shut_down(self, runtime: _Runtime) -> None:
        await self._stop(runtime)
        await self._emit(runtime, RuntimePhase.PARKED, with_pid=False, message="actuator stopped")

    def _signal_group(self, runtime: _Runtime, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(runtime.pid, sig)

    def _spawn_watcher(self, runtime: _Runtime) -> asyncio.Task[None]:
        task = asyncio.create_task(self._watch(runtime), name=f"watch:{runtime.key}")
        self._watchers.add(task)
        task.add_done_callback(self._watchers.discard)
        return task

    async def _watch(self, runtime: _Runtime) -> None:
        """Wait for the process to exit; an exit nobody asked for is a failure."""
        runtime.returncode = await runtime.process.wait()
        # Whatever the model started in its session (vLLM workers, a shell's children) goes with it. Right after the
        # reap, so the group id cannot have been reused by an unrelated process.
        self._signal_group(runtime, signal.SIGKILL)
        runtime.exited.set()
        if runtime.workdir is not None:
            shutil.rmtree(runtime.workdir, ignore_errors=True)
        if self._runtimes.get(runtime.key) is runtime:
            del self._runtimes[runtime.key]
        phase = runtime.phase
        if phase is ProcessPhase.STOPPING:  # whoever stops it reports
            return
        if runtime.prober is not None:
            runtime.prober.cancel()
        if phase is ProcessPhase.SLEEPING:  # parked already; the next activate starts it afresh
            log.warning("sleeping model process exited", extra={**runtime.where, "returncode": runtime.returncode})
            return
        message = exit_failure_message(
            runtime.returncode, was_ready=phase is ProcessPhase.READY, log_tail=self._log_tail(runtime)
        )
        log.warning("model process exited unexpectedly", extra={**runtime.where, "reason": message})
        await self._emit(runtime, RuntimePhase.FAILED, message=message)

    # ------------------------------------------------------------------ readiness, sleep and wake

    async def _probe_until_ready(self, runtime: _Runtime) -> None:
        url = readiness_url(runtime.port, runtime.readiness_path)
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self._load_timeout
        tries = 0
        reported: ProbeAnswer | None = None
        reported_at = started
        while True:
            answer = await self._probe(url)
            tries += 1
            if answer.ready:
                break
            if runtime.exited.is_set():
                return
            now = loop.time()
            if now >= deadline:
                log.warning("model not ready within the load timeout; stopping it", extra=runtime.where)
                await self._stop(runtime)
                probe = probe_message(runtime.readiness_path, answer, tries)
                message = load_timeout_message(self._load_timeout, self._log_tail(runtime), probe)
                await self._emit(runtime, RuntimePhase.FAILED, message=message)
                return
            if runtime.phase is ProcessPhase.LOADING and should_report_probe(
                answer, last_reported=reported, loading_seconds=now - started, seconds_since_report=now - reported_at
            ):
                reported, reported_at = answer, now
                await self._emit(
                    runtime, RuntimePhase.LOADING, message=probe_message(runtime.readiness_path, answer, tries)
                )
            await asyncio.sleep(self._probe_interval)
        if runtime.exited.is_set() or runtime.phase is not ProcessPhase.LOADING:
            return
        runtime.phase = ProcessPhase.READY
        log.info("model ready", extra={**runtime.where, "endpoint": runtime.endpoint, "probes": tries})
        await self._emit_ready(runtime, message="")

    async def _wake(self, runtime: _Runtime, spec: RuntimeSpec) -> None:
        """Wake a sleeping server and probe it again; start afresh when it cannot be woken."""
        # It stays Sleeping while the wake request runs, so an exit meanwhile is not reported as a failure.
        await self._emit(runtime, RuntimePhase.LOADING)
        if await self._sleep_mode.wake(runtime.endpoint) is None and not runtime.exited.is_set():
            # wake_up's answer is the readiness signal: no waiting for the next probe.
            runtime.phase = ProcessPhase.READY
            log.info("model woken", extra={**runtime.where, "endpoint": runtime.endpoint})
            await self._emit_ready(runtime, message=WOKEN)
            return
        log.warning("wake_up failed; starting the model afresh", extra=runtime.where)
        await self._stop(runtime)
        if not (spec.command or spec.backend):
            await self._report(
                Observation(
                    spec.namespace, spec.name, RuntimePhase.FAILED, runtime.generation, message=MISSING_COMMAND_MESSAGE
                )
            )
            return
        await self._start(spec, runtime.generation)

    async def _probe(self, url: str) -> ProbeAnswer:
        try:
            async with self._session().get(
                url, timeout=aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_SECONDS)
            ) as response:
                return ProbeAnswer(status=response.status)
        except TimeoutError:
            return ProbeAnswer(error="timed out")
        except aiohttp.ClientConnectorError as exc:
            return ProbeAnswer(error=_connect_error(exc))
        except (aiohttp.ClientError, OSError) as exc:
            return ProbeAnswer(error=type(exc).__name__)

    def _find_engines(self, backend: str, search_path: str) -> dict[str, str]:
        """The engines of ``backend`` this machine has: engine id -> executable (FLEXINFER_LOCAL_ENGINES first)."""
        configured = self._engines.get(backend)
        if configured:
            engine = engine_for_program(backend, configured)
            executable = shutil.which(configured, path=search_path)
            if engine is None or executable is None:
                raise PresetError(
                    f"{ENGINES_SETTING} names {configured!r} for backend {backend!r}: "
                    + ("not found on the actuator's PATH" if executable is None else "no engine of it runs that")
                )
            return {engine.id: executable}
        found: dict[str, str] = {}
        for engine in engines_for(backend):
            if engine.module:
                # Only looked up, not imported: the actuator runs no engine code.
                if importlib.util.find_spec(engine.module.split(".")[0]) is not None:
                    found[engine.id] = sys.executable
            else:
                executable = shutil.which(engine.program, path=search_path)
                if executable is not None:
                    found[engine.id] = executable
        return found

    def _session(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            # No keep-alive: a model's port may be served by a new process after a restart.
            self._http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True))
        return self._http

    # ------------------------------------------------------------------ reporting

    async def _emit(
        self,
        runtime: _Runtime,
        phase: RuntimePhase,
        *,
        endpoint: str | None = None,
        message: str = "",
        with_pid: bool = True,
        memory: int | None = None,
    ) -> None:
        """Report ``phase`` for this process, stamped with the generation it answers now."""
        await self._report(
            Observation(
                namespace=runtime.spec.namespace,
                name=runtime.spec.name,
                phase=phase,
                generation=runtime.generation,
                endpoint=endpoint,
                message=message,
                pid=runtime.pid if with_pid else None,
                memory=memory,
            )
        )

    async def _report(self, observation: Observation) -> None:
        # One lock per model keeps its reports in call order (asyncio locks are FIFO) across the tasks that make them.
        lock = self._report_locks.setdefault(ModelKey(observation.namespace, observation.name), asyncio.Lock())
        async with lock:
            await self._on_status(observation)

    async def _cancel_prober(self, runtime: _Runtime) -> None:
        prober, runtime.prober = runtime.prober, None
        if prober is not None and prober is not asyncio.current_task():
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober

    def _log_tail(self, runtime: _Runtime) -> list[str]:
        """The last lines this run of the process wrote to its log."""
        try:
            with runtime.log_path.open("rb") as log_file:
                size = log_file.seek(0, os.SEEK_END)
                log_file.seek(max(runtime.log_offset, size - _LOG_TAIL_BYTES))
                text = log_file.read().decode("utf-8", errors="replace")
        except OSError:
            return []
        return tail_lines(text, LOG_TAIL_LINES)


def _search_path() -> str:
    """Our PATH with this Python's bin folder first: a bare ``flexinfer-fake-model`` or ``vllm`` in a command means
    the one installed beside FlexInfer (the venv need not be activated)."""
    return os.pathsep.join(p for p in (str(Path(sys.executable).parent), os.environ.get("PATH", "")) if p)


def render_command_env(env: Mapping[str, str], port: int) -> dict[str, str]:
    return {k: v.replace("{port}", str(port)) for k, v in env.items()}


def _connect_error(exc: aiohttp.ClientConnectorError) -> str:
    os_error = exc.os_error
    if isinstance(os_error, ConnectionRefusedError):
        return "connection refused"
    return (os_error.strerror if isinstance(os_error, OSError) and os_error.strerror else None) or "cannot connect"


def _model_user(run_as: str | None) -> pwd.struct_passwd | None:
    """Who model processes run as: ``run_as`` when we are root and it is not root; else None (as we run)."""
    if run_as is None or os.geteuid() != 0:
        return None
    entry = pwd.getpwuid(int(run_as)) if run_as.isdigit() else pwd.getpwnam(run_as)
    if entry.pw_uid == 0:
        log.warning("model processes run as root, as FLEXINFER_LOCAL_RUN_AS says", extra={"run_as": run_as})
        return None
    return entry


def _private_home(user: pwd.struct_passwd, label: str) -> tuple[Path, ProcessUser]:
    """A folder of the model's own (0700, owned by ``user``) outside the 0700 state directory: its working
    directory and ``HOME`` (``nobody``'s own home is ``/nonexistent``). Removed when the process exits."""
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in label)[:60]
    folder = Path(tempfile.mkdtemp(prefix=f"flexinfer-{safe}-"))
    os.chown(folder, user.pw_uid, user.pw_gid)
    return folder, ProcessUser(name=user.pw_name, uid=user.pw_uid, gid=user.pw_gid, home=str(folder))


@contextlib.contextmanager
def _open_log(logs_dir: Path, path: Path) -> Iterator[BinaryIO]:
    """The model's log, for appending: 0600 and owned by the actuator (the model writes through the descriptor it
    inherits, so it needs no access to the state directory; the actuator reads the file for failure messages)."""
    logs_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(logs_dir, 0o700)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # a log an older FlexInfer left world-readable (0644)
    except OSError:
        os.close(fd)
        raise
    with os.fdopen(fd, "ab") as log_file:
        yield log_file
