"""``flexinfer simulate TRACE``: replay a request trace through the real election and swap code on a virtual clock,
once per policy, and compare what users would have seen.

The scheduler's own ``plan_group`` decides every pass (the same function the service runs); around it this module
plays the parts it does not decide, with the timings the seed documents: the proxy (per-model FIFO queues with the
queue limit and timeout, demand signals, requests in flight), the actuator (a load takes the model's
``loadSeconds``, 28 s by default; a park ``parkSeconds``, 4 s) and the model (each request takes its service time;
``concurrency`` requests at once). As the real proxy does, every request for a Ready model is forwarded at once
(it is in flight); what the model cannot start yet waits in the model's own queue (as in vLLM's scheduler), where
no queue timeout runs, and a park kills what is still in flight there. A pass runs on every event (as the
scheduler's event-driven passes) and every reconcile period.

Trace: JSON Lines. A line with ``at`` is a request: ``{"at": 12.5, "model": "chat", "tokens": 300}`` (service time
= tokens / the model's ``tokensPerSecond``) or ``{"at": 12.5, "model": "chat", "serviceSeconds": 2}``. A line
without ``at`` describes a model: ``{"model": "chat", "priority": 100, "loadSeconds": 28, "parkSeconds": 4,
"tokensPerSecond": 40, "concurrency": 4, "swapCooldown": "5m", "maxWait": "2m", "idleTimeout": "10m", "memory": "6Gi",
"devices": 1, "pinned": false}``. A line ``{"capacity": {"devices": 1, "memoryPerDevice": "24Gi"}}`` gives the
group a capacity: the planner then keeps every model that fits loaded side by side (``plan_resident_set``; a model
without ``memory`` takes a whole device); without it (or with ``Settings.one_at_a_time``), one model at a time.
Lines starting with ``#`` are comments.

Policies, side by side:
- ``seed``: the seed's exact v1alpha2: ``lastActiveTime`` moves only when a request for a model that is not serving
  triggers a scale-up (no activity from served requests, no refresh while requests wait), no bounded wait, no drain;
- ``flexinfer``: FlexInfer's default v1alpha2 (demand renewed while requests wait, activity from served requests,
  idle as quiet for 10 s and the quiet holder's yield, the hold of one measured load, the bounded wait, the drain);
- ``v1alpha1``: a GPUGroup with the seed's default policy (threshold 3, hysteresis 10 s, minimum run 30 s, ...);
- ``offline``: a lower bound on the loads any policy needs to answer every request within the queue timeout
  (nothing is simulated).
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import json
import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import IntEnum
from pathlib import Path
from typing import Any

from flexinfer_actuator.domain.commands import ActivatePlan, ParkPlan, plan_activation, plan_park
from flexinfer_actuator.domain.processes import ProcessPhase
from flexinfer_common.durations import parse_duration
from flexinfer_common.enums import GroupPolicy, ParkStrategy, RuntimePhase, ScaleAction, SchedulingPolicy
from flexinfer_common.keys import ModelKey
from flexinfer_common.quantity import parse_memory
from flexinfer_scheduler.domain.election import DRAIN_TIMEOUT, ElectionParams, cooldown_remaining
from flexinfer_scheduler.domain.model import Capacity, GroupSnapshot, Member, V1Alpha1Policy
from flexinfer_scheduler.domain.plan import apply_plan, plan_group
from flexinfer_scheduler.domain.residency import free_memory, memory_of, place, placement_of

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
NAMESPACE = "default"


class TraceError(ValueError):
    """A trace line is malformed; the message names the line and the field."""


@dataclass(frozen=True)
class ModelSpec:
    name: str
    priority: int = 0
    load_seconds: float = 28.0
    park_seconds: float = 4.0
    tokens_per_second: float = 40.0
    concurrency: int = 1
    swap_cooldown: timedelta | None = None
    max_wait: timedelta | None = None
    idle_timeout: timedelta | None = None
    memory: int | None = None  # bytes on each of its devices (None: a whole device, in a group with a capacity)
    devices: int = 1
    pinned: bool = False


@dataclass(frozen=True)
class Request:
    index: int
    at: float
    model: str
    service: float


@dataclass(frozen=True)
class Trace:
    models: dict[str, ModelSpec]
    requests: list[Request]
    capacity: Capacity | None = None  # the card(s): None, one model at a time

    @property
    def duration(self) -> float:
        return max((r.at + r.service for r in self.requests), default=0.0)


def _whole(value: Any) -> int:
    """A whole number >= 1 (not a bool, not 1.5)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{value!r} is not a whole number >= 1")
    return value


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{value!r} is not true or false")
    return value


_MODEL_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "priority": ("priority", int),
    "loadSeconds": ("load_seconds", float),
    "parkSeconds": ("park_seconds", float),
    "tokensPerSecond": ("tokens_per_second", float),
    "concurrency": ("concurrency", int),
    "swapCooldown": ("swap_cooldown", parse_duration),
    "maxWait": ("max_wait", parse_duration),
    "idleTimeout": ("idle_timeout", parse_duration),
    "memory": ("memory", parse_memory),
    "devices": ("devices", _whole),
    "pinned": ("pinned", _flag),
}


def _read_capacity(item: dict[str, Any], where: str) -> Capacity:
    """The card line: ``{"capacity": {"devices": 1, "memoryPerDevice": "24Gi"}}``."""
    extra = sorted(set(item) - {"capacity"})
    if extra:
        raise TraceError(f"{where}: a capacity line has only 'capacity' (found {', '.join(map(repr, extra))})")
    body = item["capacity"]
    if not isinstance(body, dict):
        raise TraceError(f"{where}: capacity: expected an object with 'devices' and 'memoryPerDevice'")
    unknown = sorted(set(body) - {"devices", "memoryPerDevice"})
    if unknown:
        raise TraceError(f"{where}: unknown capacity field {unknown[0]!r} (known: devices, memoryPerDevice)")
    if "memoryPerDevice" not in body:
        raise TraceError(f'{where}: capacity.memoryPerDevice: required (e.g. "24Gi")')
    try:
        devices = _whole(body.get("devices", 1))
    except ValueError as exc:
        raise TraceError(f"{where}: capacity.devices: {exc}") from None
    try:
        memory = parse_memory(body["memoryPerDevice"])
    except ValueError as exc:
        raise TraceError(f"{where}: capacity.memoryPerDevice: {exc}") from None
    return Capacity(devices, memory)


def read_trace(lines: Iterable[str], *, source: str = "trace") -> Trace:
    """Parse a JSONL trace (see the module docstring); raise TraceError naming the line and the problem."""
    models: dict[str, ModelSpec] = {}
    model_lines: dict[str, int] = {}
    capacity: Capacity | None = None
    raw_requests: list[tuple[int, dict[str, Any]]] = []
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        where = f"{source} line {number}"
        try:
            item = json.loads(text)
        except json.JSONDecodeError as exc:
            raise TraceError(f"{where}: not JSON: {exc}") from None
        if isinstance(item, dict) and "capacity" in item and "model" not in item:
            if capacity is not None:
                raise TraceError(f"{where}: capacity: given twice (a trace describes one group)")
            capacity = _read_capacity(item, where)
            continue
        if not isinstance(item, dict) or not isinstance(item.get("model"), str) or not item["model"]:
            raise TraceError(f"{where}: expected an object with a 'model' name")
        if "at" in item:
            raw_requests.append((number, item))
            continue
        values: dict[str, Any] = {"name": item["model"]}
        for key, value in item.items():
            if key == "model":
                continue
            if key not in _MODEL_FIELDS:
                raise TraceError(f"{where}: unknown model field {key!r} (known: {', '.join(_MODEL_FIELDS)})")
            attribute, convert = _MODEL_FIELDS[key]
            try:
                values[attribute] = convert(value)
            except (TypeError, ValueError) as exc:
                raise TraceError(f"{where}: {key}: {exc}") from None
        spec = ModelSpec(**values)
        if spec.concurrency < 1 or spec.load_seconds < 0 or spec.park_seconds < 0 or spec.tokens_per_second <= 0:
            raise TraceError(f"{where}: concurrency >= 1, loadSeconds/parkSeconds >= 0, tokensPerSecond > 0")
        models[spec.name] = spec
        model_lines[spec.name] = number
    if capacity is not None:
        for spec in models.values():
            need = spec.memory if spec.memory is not None else capacity.memory_per_device
            if need > capacity.memory_per_device or spec.devices > capacity.devices:
                field_name = "memory" if need > capacity.memory_per_device else "devices"
                raise TraceError(
                    f"{source} line {model_lines[spec.name]}: {field_name}: {spec.name} needs {spec.devices} x "
                    f"{need} bytes, more than the capacity's {capacity.devices} x {capacity.memory_per_device}: "
                    "it could never load"
                )
    requests: list[Request] = []
    for number, item in raw_requests:
        where = f"{source} line {number}"
        spec = models.setdefault(item["model"], ModelSpec(item["model"]))
        try:
            at = float(item["at"])
            if "serviceSeconds" in item:
                service = float(item["serviceSeconds"])
            else:
                service = float(item.get("tokens", 200)) / spec.tokens_per_second
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{where}: {exc}") from None
        if at < 0 or service < 0 or not math.isfinite(at + service):
            raise TraceError(f"{where}: 'at' and the service time must be finite and >= 0")
        requests.append(Request(len(requests), at, item["model"], service))
    requests.sort(key=lambda r: (r.at, r.index))
    if not requests:
        raise TraceError(f"{source}: no requests (lines with 'at')")
    return Trace(models, requests, capacity)


def load_trace(path: Path) -> Trace:
    with path.open() as handle:
        return read_trace(handle, source=str(path))


@dataclass(frozen=True)
class Policy:
    name: str
    params: ElectionParams
    seed_demand: bool  # lastActiveTime only on a scale-up (the seed's proxy)
    drain_timeout: timedelta
    reconcile: float
    v1alpha1: V1Alpha1Policy | None = None


#: a GPUGroup's v1alpha1 defaults (its drain timeout among them)
V1ALPHA1 = V1Alpha1Policy()

#: the seed's exact v1alpha2 rules (FLEXINFER_SCHEDULING_POLICY=seed)
SEED_RULES = ElectionParams(policy=SchedulingPolicy.SEED).seed()

POLICIES: dict[str, Policy] = {
    "seed": Policy("seed", SEED_RULES, True, timedelta(0), 3.0),
    "flexinfer": Policy("flexinfer", ElectionParams(), False, DRAIN_TIMEOUT, 3.0),
    "v1alpha1": Policy("v1alpha1", ElectionParams(), False, V1ALPHA1.drain_timeout, 5.0, V1ALPHA1),
}
OFFLINE = "offline"
ALL_POLICIES = (*POLICIES, OFFLINE)


@dataclass(frozen=True)
class Settings:
    queue_timeout: float = 300.0
    queue_max: int = 256
    demand_refresh: float = 10.0
    command_retry: float = 10.0
    quiet_yield: float | None = None  # the scheduler's FLEXINFER_QUIET_YIELD: the flexinfer policy's quiet period
    one_at_a_time: bool = False  # ignore the trace's capacity: one model on the GPU at a time (as without one)


class Event(IntEnum):  # at equal times: runtime changes first, then finished requests, then arrivals
    LOADED = 0
    PARKED = 1
    DONE = 2
    ARRIVAL = 3
    EXPIRE = 4
    TICK = 5
    RECHECK = 6  # a pass when a rule of time ends (the plan's ``recheck_at``), as the scheduler's


@dataclass
class Segment:
    """A model on the GPU from ``start`` to ``end``: ``loading``, ``ready``, or ``stopping`` (in a group with a
    capacity several models' segments overlap: they are loaded side by side)."""

    model: str
    state: str
    start: float
    end: float


@dataclass
class Outcome:
    policy: str
    loads: int
    busy: float = 0.0
    loading: float = 0.0
    idle: float = 0.0
    waits: dict[str, list[float]] = field(default_factory=dict)
    rejected: int = 0  # 429
    timed_out: int = 0  # 504
    killed: int = 0  # in flight when their model was stopped
    longest_wait: float = 0.0
    # the longest a model of priority >= the holder's, with requests waiting, was still not elected after its bound
    # (the later of its oldest request + maxWait and the end of the swap cooldown): FlexInfer's promise is ~0 (at
    # most a reconcile period); the load that follows is not counted. None: a v1alpha1 group, which has no bound
    over_bound: float | None = 0.0
    segments: list[Segment] = field(default_factory=list)
    # the most memory the loaded models (loading, ready or stopping) held on any one device at once, in bytes: at
    # most the capacity's memoryPerDevice (the planner's invariant). None: one model at a time (no capacity)
    peak_memory: int | None = None
    depths: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    events: int = 0

    def percentile(self, model: str | None, q: float) -> float | None:
        """The ``q``-th percentile of ``model``'s waits (None: over all requests)."""
        waits = sorted(
            self.waits.get(model, []) if model is not None else (w for ws in self.waits.values() for w in ws)
        )
        if not waits:
            return None
        return waits[min(len(waits) - 1, max(0, math.ceil(q / 100 * len(waits)) - 1))]


@dataclass
class _Runtime:
    phase: RuntimePhase
    generation: int
    in_flight: set[int] = field(default_factory=set)  # forwarded by the proxy: started or in the model's queue
    waiting: deque[Request] = field(default_factory=deque)  # forwarded, not started yet (the model's own queue)
    started: int = 0  # requests the model is serving (at most its concurrency)
    placement: tuple[int, ...] = ()  # the devices it was placed on (a group with a capacity)


def after_command(phase: RuntimePhase | None, action: ScaleAction) -> tuple[RuntimePhase, bool]:
    """What a model's runtime (``phase``: Loading, Ready or Stopping; None: nothing runs) reports once the actuator
    applies ``action``, by the actuator's own rules (``plan_activation``, ``plan_park`` with ScaleToZero), and
    whether that starts a fresh load (a runtime still stopping is gone first). The simulator's actuator, and the
    scheduler's property test's."""
    observed = ProcessPhase(phase.value) if phase is not None else None
    if action is ScaleAction.ACTIVATE:
        if plan_activation(observed, has_command=True) is ActivatePlan.START:
            return RuntimePhase.LOADING, True
        assert phase is not None  # Loading or Ready: it carries on under the new generation
        return phase, False
    if plan_park(observed, ParkStrategy.SCALE_TO_ZERO) is ParkPlan.REPORT_PARKED:
        return RuntimePhase.PARKED, False
    return RuntimePhase.STOPPING, False


class Simulation:
    """One policy over one trace. ``run()`` returns the :class:`Outcome`."""

    def __init__(self, trace: Trace, policy: Policy, settings: Settings) -> None:
        self.trace, self.policy, self.settings = trace, policy, settings
        self.keys = {name: ModelKey(NAMESPACE, name) for name in trace.models}
        members = tuple(
            Member(
                self.keys[spec.name],
                priority=spec.priority,
                swap_cooldown=spec.swap_cooldown,
                max_wait=spec.max_wait,
                idle_timeout=spec.idle_timeout,
                memory=spec.memory,
                devices=spec.devices,
                pinned=spec.pinned,
            )
            for spec in trace.models.values()
        )
        # a v1alpha1 GPUGroup holds one model at a time whatever the card (plan_group plans it so)
        use_capacity = not settings.one_at_a_time and policy.v1alpha1 is None
        self.capacity = trace.capacity if use_capacity else None
        self.snapshot = GroupSnapshot(
            "gpu",
            members,
            policy=GroupPolicy.V1ALPHA1 if policy.v1alpha1 else GroupPolicy.V1ALPHA2,
            v1alpha1=policy.v1alpha1,
            capacity=self.capacity,
        )
        self.now = 0.0
        self.events: list[tuple[float, int, int, Any]] = []
        self._sequence = 0
        self.queues: dict[str, deque[Request]] = {name: deque() for name in trace.models}
        self.queued_since: dict[str, float] = {}  # when the demand of a waiting queue was last signalled
        self.runtimes: dict[str, _Runtime] = {}
        self.ready_routes: set[str] = set()
        self.last_active: dict[str, float] = {}
        self.outcome = Outcome(policy.name, 0, waits={name: [] for name in trace.models})
        if policy.v1alpha1 is not None:
            self.outcome.over_bound = None
        self.outcome.depths = {name: [(0.0, 0)] for name in trace.models}
        self._last_account = 0.0
        self._passes = 0
        if self.capacity is not None:
            self.outcome.peak_memory = 0
        self._segments: dict[str, tuple[str, float]] = {}  # per model on the GPU: its state and since when
        self._cooldown_end = 0.0
        self._hold_end: dict[str, float] = {}  # a group with a capacity: when the residents in a model's way may go
        self._recheck_at: datetime | None = None  # the pass already due when a rule of time ends

    # ---- the clock and the event queue ---------------------------------------------------------------------
    def at(self, when: float, kind: Event, payload: Any = None) -> None:
        self._sequence += 1
        heapq.heappush(self.events, (when, int(kind), self._sequence, payload))

    def run(self) -> Outcome:
        for request in self.trace.requests:
            self.at(request.at, Event.ARRIVAL, request)
        self.at(0.0, Event.TICK)
        end = self.trace.duration + self.settings.queue_timeout
        while self.events:
            when, kind, _, payload = heapq.heappop(self.events)
            if when > end and kind in (Event.TICK, Event.RECHECK):
                continue  # no more reconciles; what is in flight (in a model's own queue too) still finishes
            self._account(when)
            self.now = when
            self.outcome.events += 1
            self._handle(Event(kind), payload)
            # every event at this instant first, then one pass (as the scheduler's event-driven passes)
            if self.events and self.events[0][0] == when:
                continue
            self._settle()
        self._account(self.now)
        for name in list(self._segments):
            self._close_segment(name, self.now)
        self.outcome.segments.sort(key=lambda s: (s.start, s.model))
        return self.outcome

    def _handle(self, kind: Event, payload: Any) -> None:
        if kind is Event.ARRIVAL:
            self._arrive(payload)
        elif kind is Event.DONE:
            name, request = payload
            runtime = self.runtimes.get(name)
            if runtime is not None and request.index in runtime.in_flight:
                runtime.in_flight.discard(request.index)
                runtime.started -= 1
                self._start(name, runtime)
        elif kind is Event.LOADED:
            name, generation = payload
            runtime = self.runtimes.get(name)
            if runtime is not None and runtime.phase is RuntimePhase.LOADING and runtime.generation == generation:
                runtime.phase = RuntimePhase.READY
                self._report(name, RuntimePhase.READY, generation)
        elif kind is Event.PARKED:
            name, generation = payload
            runtime = self.runtimes.get(name)
            if runtime is not None and runtime.phase is RuntimePhase.STOPPING and runtime.generation == generation:
                self._kill(name, runtime)
                del self.runtimes[name]
                self._report(name, RuntimePhase.PARKED, generation)
        elif kind is Event.EXPIRE:
            self._expire(payload)
        elif kind is Event.TICK:
            self._refresh_demand()
            self.at(self.now + self.policy.reconcile, Event.TICK)
        # (Event.RECHECK: nothing to do but the pass that follows every event)

    # ---- the proxy -----------------------------------------------------------------------------------------
    def _arrive(self, request: Request) -> None:
        name = request.model
        queue = self.queues[name]
        if name in self.ready_routes and not queue:
            self._forward(name, request)
            if not self.policy.seed_demand:
                self._touch(name)  # activity: FlexInfer's proxy reports forwarded requests
            return
        if len(queue) >= self.settings.queue_max:
            self.outcome.rejected += 1
            return
        queue.append(request)
        self._depth(name)
        self.at(request.at + self.settings.queue_timeout, Event.EXPIRE, request)
        if self.policy.seed_demand:
            if name not in self.ready_routes:
                self._touch(name)  # the seed's triggerScaleUp for a model that is not serving
        else:
            self._touch(name)
            self.queued_since[name] = self.now
        self._dispatch(name)

    def _forward(self, name: str, request: Request) -> None:
        runtime = self.runtimes[name]
        runtime.in_flight.add(request.index)
        runtime.waiting.append(request)
        self._start(name, runtime)

    def _start(self, name: str, runtime: _Runtime) -> None:
        """The model starts what it has room for, in the order it was forwarded; a request's wait ends here. Records
        the depth (the caller may have changed either queue)."""
        concurrency = self.trace.models[name].concurrency
        while runtime.waiting and runtime.started < concurrency:
            request = runtime.waiting.popleft()
            runtime.started += 1
            self._waited(name, self.now - request.at)
            self.at(self.now + request.service, Event.DONE, (name, request))
        self._depth(name)

    def _waited(self, name: str, waited: float) -> None:
        self.outcome.waits[name].append(waited)
        self.outcome.longest_wait = max(self.outcome.longest_wait, waited)

    def _kill(self, name: str, runtime: _Runtime) -> None:
        """A park (or a load over a stopping model) ends what is in flight; those never started waited until now."""
        self.outcome.killed += len(runtime.in_flight)
        for request in runtime.waiting:
            self._waited(name, self.now - request.at)
        runtime.waiting.clear()
        self._depth(name)

    def _dispatch(self, name: str) -> None:
        queue = self.queues[name]
        while queue and name in self.ready_routes:
            self._forward(name, queue.popleft())
        if not queue:
            self.queued_since.pop(name, None)

    def _expire(self, request: Request) -> None:
        queue = self.queues[request.model]
        try:
            queue.remove(request)
        except ValueError:
            return  # served already
        self.outcome.timed_out += 1
        self.outcome.longest_wait = max(self.outcome.longest_wait, self.settings.queue_timeout)
        # a request that gave up waited the whole timeout: it counts in the wait figures (else a policy that lets
        # requests time out would look fast)
        self.outcome.waits[request.model].append(self.settings.queue_timeout)
        self._depth(request.model)

    def _refresh_demand(self) -> None:
        if self.policy.seed_demand:
            return
        for name, since in list(self.queued_since.items()):
            if self.queues[name] and self.now - since >= self.settings.demand_refresh:
                self._touch(name)
                self.queued_since[name] = self.now

    def _touch(self, name: str) -> None:
        self.last_active[name] = self.now

    def _depth(self, name: str) -> None:
        """Record the requests waiting for ``name``: in the proxy's queue and in the model's own (not started)."""
        series = self.outcome.depths[name]
        runtime = self.runtimes.get(name)
        depth = len(self.queues[name]) + (len(runtime.waiting) if runtime is not None else 0)
        if series[-1][0] == self.now:
            series[-1] = (self.now, depth)
        elif series[-1][1] != depth:
            series.append((self.now, depth))

    # ---- the actuator --------------------------------------------------------------------------------------
    def _report(self, name: str, phase: RuntimePhase, generation: int) -> None:
        key = self.keys[name]
        members = []
        for m in self.snapshot.members:
            if m.key == key and m.runtime_generation <= generation <= m.command_generation:
                m = dataclasses.replace(m, runtime=phase.value, runtime_generation=generation)
            members.append(m)
        self.snapshot = dataclasses.replace(self.snapshot, members=tuple(members))

    def _apply(self, name: str, action: ScaleAction, generation: int) -> None:
        spec = self.trace.models[name]
        runtime = self.runtimes.get(name)
        phase, fresh = after_command(runtime.phase if runtime is not None else None, action)
        if fresh:
            if runtime is not None:
                self._kill(name, runtime)
            runtime = self.runtimes[name] = _Runtime(RuntimePhase.LOADING, generation)
            self.outcome.loads += 1
            self._note_memory(name, runtime)
            self.at(self.now + spec.load_seconds, Event.LOADED, (name, generation))
        if runtime is None:
            self._report(name, phase, generation)
            return
        runtime.phase, runtime.generation = phase, generation
        self._report(name, phase, generation)
        if phase is RuntimePhase.STOPPING:
            self.at(self.now + spec.park_seconds, Event.PARKED, (name, generation))

    def _note_memory(self, name: str, runtime: _Runtime) -> None:
        """A model starts loading: where the planner placed it, and the memory now held on each device."""
        if self.capacity is None or self.outcome.peak_memory is None:
            return
        member = self.snapshot.member(self.keys[name])
        assert member is not None
        runtime.placement = member.placement or tuple(range(min(member.devices, self.capacity.devices)))
        used = [0] * self.capacity.devices
        for other, held in self.runtimes.items():
            need = self.trace.models[other].memory or self.capacity.memory_per_device
            for device in held.placement:
                used[device] += need
        self.outcome.peak_memory = max(self.outcome.peak_memory, *used)

    # ---- the scheduler -------------------------------------------------------------------------------------
    def _settle(self) -> None:
        """Passes until nothing more changes at this instant (a report answers a command at once here)."""
        for _ in range(4):
            if not self._pass():
                break

    def _pass(self) -> bool:
        now = EPOCH + timedelta(seconds=self.now)
        members = []
        for m in self.snapshot.members:
            name = m.key.name
            last = self.last_active.get(name)
            runtime = self.runtimes.get(name)
            queued = 0 if self.policy.seed_demand else len(self.queues[name])
            members.append(
                dataclasses.replace(
                    m,
                    last_active_time=EPOCH + timedelta(seconds=last) if last is not None else None,
                    queued=queued,
                    in_flight=len(runtime.in_flight) if runtime is not None else 0,
                )
            )
        self._passes += 1
        snapshot = dataclasses.replace(self.snapshot, members=tuple(members))
        plan = plan_group(
            snapshot,
            now,
            self.policy.params,
            command_retry=timedelta(seconds=self.settings.command_retry),
            new_swap_id=f"s{self._passes}",
            drain_timeout=self.policy.drain_timeout,
            drain_settle=timedelta(0),
        )
        if self.capacity is None:
            self._check_bound(snapshot, plan.active, plan.cooldown_remaining)
        else:
            self._check_resident_bound(snapshot, plan.members, now)
        self.snapshot = apply_plan(snapshot, plan)
        if plan.recheck_at is not None and plan.recheck_at != self._recheck_at:
            self._recheck_at = plan.recheck_at
            self.at((plan.recheck_at - EPOCH).total_seconds(), Event.RECHECK)
        for command in plan.commands:
            self._apply(command.key.name, command.action, command.generation)
        ready = {
            key.name
            for key, view in plan.statuses.items()
            if view.ready and plan.members[key].desired_action == ScaleAction.ACTIVATE
        }
        changed = ready != self.ready_routes or bool(plan.commands)
        self.ready_routes = ready
        for name in ready:
            self._dispatch(name)
        return changed

    def _check_bound(self, snapshot: GroupSnapshot, leader: ModelKey | None, cooldown: timedelta) -> None:
        """Measure ``over_bound``: the models of priority >= the holder's whose oldest waiting request is older than
        their bound (``max_wait``: maxWait, default the fitted ``flexinfer_max_wait``; the demand window for the
        seed, which has none), after the cooldown, and still not elected."""
        if self.outcome.over_bound is None:
            return
        if cooldown > timedelta(0):
            self._cooldown_end = self.now + cooldown.total_seconds()
            return
        holder = snapshot.member(snapshot.active)
        for m in snapshot.members:
            queue = self.queues[m.key.name]
            if not queue or m.key == leader or (holder is not None and m.priority < holder.priority):
                continue
            limit = self.policy.params.max_wait(m) or self.policy.params.demand_window
            bound = limit.total_seconds()
            late = self.now - max(queue[0].at + bound, self._cooldown_end)
            self.outcome.over_bound = max(self.outcome.over_bound, late)

    def _check_resident_bound(self, snapshot: GroupSnapshot, members: dict[ModelKey, Member], now: datetime) -> None:
        """``over_bound`` in a group with a capacity: a model with requests waiting at the proxy counts once its bound
        passed while it is neither loaded (a resident: its requests wait for its load, not for the election) nor the
        one an eviction is making room for, and only if it may displace what stands in its way: it would fit once
        every resident it may evict (priority <= its own; a pinned one only for a higher priority) were gone. Its
        bound is the later of its oldest request + maxWait and the end of those residents' holds (each judged as the
        pair ``may_take_room`` judges)."""
        if self.outcome.over_bound is None or self.capacity is None:
            return
        making_room = {m.preempted_by for m in members.values() if m.evicting_since is not None}
        residents = {k: m for k, m in members.items() if m.desired_action == ScaleAction.ACTIVATE}
        for key, m in members.items():
            queue = self.queues[key.name]
            if not queue or key in residents or key.name in making_room:
                continue
            staying = {
                k: placement_of(r, self.capacity)
                for k, r in residents.items()
                if r.priority > m.priority or (r.pinned and r.priority >= m.priority)
            }
            room = free_memory(self.capacity, members, staying)
            if place(memory_of(m, self.capacity), m.devices, room) is None:
                continue
            limit = self.policy.params.max_wait(m) or self.policy.params.demand_window
            late = self.now - (queue[0].at + limit.total_seconds())
            if late <= 0:
                continue
            for k, r in residents.items():
                if k not in staying:
                    pair = dataclasses.replace(snapshot, members=(r, m), active=k, swap=None, lease=None)
                    hold = cooldown_remaining(pair, now, self.policy.params).total_seconds()
                    if hold > 0:
                        self._hold_end[key.name] = max(self._hold_end.get(key.name, 0.0), self.now + hold)
            late = self.now - max(queue[0].at + limit.total_seconds(), self._hold_end.get(key.name, 0.0))
            self.outcome.over_bound = max(self.outcome.over_bound, late)

    # ---- accounting ----------------------------------------------------------------------------------------
    def _states(self) -> dict[str, str]:
        """Each model on the GPU: ``ready`` (loaded: serving or idle), ``loading`` or ``stopping``."""
        names = {RuntimePhase.READY: "ready", RuntimePhase.LOADING: "loading"}
        return {name: names.get(runtime.phase, "stopping") for name, runtime in self.runtimes.items()}

    def _account(self, until: float) -> None:
        """The GPU is busy while any loaded model is serving, loading while none serves and one loads or stops,
        else idle (a loaded model with nothing in flight included)."""
        spent = until - self._last_account
        states = self._states()
        if spent > 0:
            if any(states[n] == "ready" and r.in_flight for n, r in self.runtimes.items()):
                self.outcome.busy += spent
            elif any(state != "ready" for state in states.values()):
                self.outcome.loading += spent
            else:
                self.outcome.idle += spent
        self._last_account = until
        for name in [n for n, (state, _) in self._segments.items() if states.get(n) != state]:
            self._close_segment(name, until)
        for name, state in states.items():
            if name not in self._segments:
                self._segments[name] = (state, until)

    def _close_segment(self, name: str, until: float) -> None:
        state, start = self._segments.pop(name)
        if until > start:
            self.outcome.segments.append(Segment(name, state, start, until))


def offline_lower_bound(trace: Trace, queue_timeout: float, capacity: Capacity | None = None) -> int:
    """At least this many loads are needed to answer every request within the queue timeout, whatever the policy
    (even one that knew the whole trace in advance, with instant service).

    A request is answered only if its model is loaded at some moment of its wait ``[at, at + timeout]``. Some pairs
    of requests must be answered in arrival order (``_Precedence``), so along a chain of such pairs the moments of
    answer rise. Two counts over those chains (dynamic programmes over the requests in arrival order), the larger:
    - one chain: each change of model along it is a load of its own, so 1 + the most changes;
    - a model at a time: a model answered, then a request of a model that cannot be loaded beside it, then the
      model again along a chain was loaded again in between; its loads are 1 + the most such returns, and loads of
      different models are different loads, so the sum over the models.
    Without a capacity no two models are loaded side by side; with one only models that cannot be count as apart."""
    order = _Precedence.of(trace, queue_timeout, capacity)
    if not order.requests:
        return 0
    changes = order.most(1, lambda _: 0, lambda previous, state, model: (state, int(order.apart[previous, model])))
    reloads = sum(1 + _reloads(order, model) for model in order.models)
    return max(len(order.models), 1 + changes, reloads)


def _reloads(order: _Precedence, model: str) -> int:
    """The most times ``model`` is answered again after a request of a model that cannot be loaded beside it, along
    one chain of requests answered in order: each time it was loaded again."""

    def advance(_: str, state: int, next_model: str) -> tuple[int, int]:
        if next_model == model:
            return _LOADED, int(state == _PUT_AWAY)
        if order.apart[next_model, model]:
            return (_NOT_YET if state == _NOT_YET else _PUT_AWAY), 0
        return state, 0

    return order.most(3, lambda first: _LOADED if first == model else _NOT_YET, advance)


# a model's state along a chain of requests (``offline_lower_bound``): not answered yet, loaded since its last
# request, or put away since (a request of a model that cannot be loaded beside it came after)
_NOT_YET, _LOADED, _PUT_AWAY = 0, 1, 2


@dataclass(frozen=True)
class _Precedence:
    """Which requests must be answered before which, whatever the policy. Request ``i`` (model ``a``) must come
    before a later request ``j`` (model ``b``):
    - when their waits do not overlap (``at_j - at_i > timeout``), whatever the models;
    - when ``b`` cannot be loaded beside ``a`` and ``at_j - at_i > timeout - load(a) - park(b)``: answering ``j``
      first would leave ``a`` to be loaded after ``b``'s park (each taking the model's ``loadSeconds`` and
      ``parkSeconds``), which ends after ``i`` gave up."""

    requests: list[Request]  # in arrival order
    models: list[str]
    apart: dict[tuple[str, str], bool]  # the two models cannot be loaded side by side
    gap: dict[tuple[str, str], float]  # a request of the first comes before one of the second arriving this much later

    @classmethod
    def of(cls, trace: Trace, queue_timeout: float, capacity: Capacity | None) -> _Precedence:
        models = sorted({r.model for r in trace.requests})
        specs = {name: trace.models.get(name) or ModelSpec(name) for name in models}
        apart = {(a, b): a != b and not _side_by_side(trace, a, b, capacity) for a in models for b in models}
        gap = {
            (a, b): max(0.0, queue_timeout - specs[a].load_seconds - specs[b].park_seconds)
            if apart[a, b]
            else queue_timeout
            for a in models
            for b in models
        }
        return cls(sorted(trace.requests, key=lambda r: r.at), models, apart, gap)

    def most(
        self, states: int, start: Callable[[str], int], advance: Callable[[str, int, str], tuple[int, int]]
    ) -> int:
        """The most a chain can count: a chain starts at any request in state ``start(model)`` with 0, and a request
        of ``model`` after one of ``previous`` in ``state`` takes it to ``advance(previous, state, model)``: the
        next state and what that step counts."""
        times: dict[str, list[float]] = {m: [] for m in self.models}
        # per model and state, the most counted by a chain ending at one of its requests so far (-1: none)
        running: dict[str, list[list[int]]] = {m: [[] for _ in range(states)] for m in self.models}
        best = 0
        for r in self.requests:
            values = [-1] * states
            values[start(r.model)] = 0
            for previous in self.models:
                before = bisect.bisect_left(times[previous], r.at - self.gap[previous, r.model])
                if not before:
                    continue
                for state in range(states):
                    value = running[previous][state][before - 1]
                    if value >= 0:
                        following, counted = advance(previous, state, r.model)
                        values[following] = max(values[following], value + counted)
            times[r.model].append(r.at)
            for state, value in enumerate(values):
                column = running[r.model][state]
                column.append(max(column[-1], value) if column else value)
            best = max(best, *values)
        return best


def _side_by_side(trace: Trace, a: str, b: str, capacity: Capacity | None) -> bool:
    """Whether models ``a`` and ``b`` fit on the card(s) at once (never without a capacity)."""
    if capacity is None:
        return False
    first, second = (trace.models.get(n) or ModelSpec(n) for n in (a, b))
    memory = sum(m.memory if m.memory is not None else capacity.memory_per_device for m in (first, second))
    return first.devices + second.devices <= capacity.devices or memory <= capacity.memory_per_device


@dataclass
class Comparison:
    trace: Trace
    outcomes: dict[str, Outcome]
    offline: int | None
    settings: Settings


def _with_settings(policy: Policy, settings: Settings) -> Policy:
    """The policy as the scheduler would run it with these settings (FlexInfer's fitted to the queue timeout and
    FLEXINFER_QUIET_YIELD and its drain: ``ElectionParams.fitted_to``)."""
    if policy.name != "flexinfer":
        return policy
    quiet = timedelta(seconds=settings.quiet_yield) if settings.quiet_yield is not None else None
    params = policy.params.fitted_to(timedelta(seconds=settings.queue_timeout), quiet, policy.drain_timeout)
    return dataclasses.replace(policy, params=params)


def simulate(trace: Trace, policies: Iterable[str] = ALL_POLICIES, settings: Settings | None = None) -> Comparison:
    settings = settings or Settings()
    outcomes: dict[str, Outcome] = {}
    offline = None
    for name in policies:
        if name == OFFLINE:
            capacity = None if settings.one_at_a_time else trace.capacity
            offline = offline_lower_bound(trace, settings.queue_timeout, capacity)
        else:
            outcomes[name] = Simulation(trace, _with_settings(POLICIES[name], settings), settings).run()
    return Comparison(trace, outcomes, offline, settings)


# ---- presenting ------------------------------------------------------------------------------------------------


def _share(part: float, whole: float) -> str:
    return f"{100 * part / whole:.0f}%" if whole > 0 else "-"


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 120:
        return f"{value / 60:.1f}m"
    return f"{value:.1f}s"


def render_table(comparison: Comparison) -> str:
    """The per-policy table, then queue waits per model (p50 / p95 / p99)."""
    rows = [["POLICY", "SWAPS", "BUSY", "LOADING", "IDLE", "429", "504", "KILLED", "LONGEST WAIT", "OVER BOUND"]]
    for name, o in comparison.outcomes.items():
        whole = o.busy + o.loading + o.idle
        rows.append(
            [
                name,
                str(o.loads),
                _share(o.busy, whole),
                _share(o.loading, whole),
                _share(o.idle, whole),
                str(o.rejected),
                str(o.timed_out),
                str(o.killed),
                _seconds(o.longest_wait),
                _seconds(o.over_bound),
            ]
        )
    if comparison.offline is not None:
        rows.append([f"{OFFLINE} (lower bound)", str(comparison.offline), *["-"] * 8])
    lines = _columns(rows)
    capacity = comparison.trace.capacity
    peaks = {name: o.peak_memory for name, o in comparison.outcomes.items() if o.peak_memory is not None}
    if capacity is not None and peaks:
        held = ", ".join(f"{name} {_bytes(peak)}" for name, peak in peaks.items())
        lines.append("")
        lines.append(
            f"capacity {capacity.devices} x {_bytes(capacity.memory_per_device)}: "
            f"the most loaded on one device at once: {held}"
        )
    if comparison.outcomes:
        lines.append("")
        lines.append("queue wait p50 / p95 / p99 per model")
        header = ["MODEL", "REQUESTS", *comparison.outcomes]
        table = [header]
        counts: dict[str, int] = {}
        for r in comparison.trace.requests:
            counts[r.model] = counts.get(r.model, 0) + 1
        for model in comparison.trace.models:
            cells = [model, str(counts.get(model, 0))]
            for o in comparison.outcomes.values():
                cells.append(" / ".join(_seconds(o.percentile(model, q)) for q in (50, 95, 99)))
            table.append(cells)
        everyone = ["(all requests)", str(len(comparison.trace.requests))]
        everyone += [
            " / ".join(_seconds(o.percentile(None, q)) for q in (50, 95, 99)) for o in comparison.outcomes.values()
        ]
        table.append(everyone)
        lines += _columns(table)
    return "\n".join(lines)


def _bytes(value: int) -> str:
    return f"{value / 1024**3:.1f}Gi"


def _columns(rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def as_json(comparison: Comparison) -> dict[str, Any]:
    out: dict[str, Any] = {"requests": len(comparison.trace.requests), "policies": {}}
    for name, o in comparison.outcomes.items():
        whole = o.busy + o.loading + o.idle
        out["policies"][name] = {
            "swaps": o.loads,
            "gpu": {
                k: round(v / whole, 4) if whole else 0
                for k, v in (("busy", o.busy), ("loading", o.loading), ("idle", o.idle))
            },
            "rejected429": o.rejected,
            "timedOut504": o.timed_out,
            "killed": o.killed,
            "longestWaitSeconds": round(o.longest_wait, 3),
            "overBoundSeconds": None if o.over_bound is None else round(o.over_bound, 3),
            "peakMemoryPerDeviceBytes": o.peak_memory,
            "waitSeconds": {
                model: {f"p{q}": o.percentile(model, q) for q in (50, 95, 99)} for model in comparison.trace.models
            },
            "allRequestsWaitSeconds": {f"p{q}": o.percentile(None, q) for q in (50, 95, 99)},
        }
    if comparison.offline is not None:
        out["policies"][OFFLINE] = {"swaps": comparison.offline}
    return out


_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def _side_by_side_at_once(outcome: Outcome) -> bool:
    """Whether two models were ever on the GPU at the same time (a group with a capacity)."""
    latest_end = -math.inf
    for s in outcome.segments:  # sorted by start
        if s.start < latest_end:
            return True
        latest_end = max(latest_end, s.end)
    return False


def render_svg(comparison: Comparison) -> str:
    """A timeline per policy: which model holds the GPU (solid: loaded, pale: loading or stopping) and, below,
    each model's queue depth; a policy that ever loaded models side by side (a group with a capacity) gets one
    lane per model instead, so co-resident models show one above the other. Written by hand: plain SVG, no
    plotting library."""
    models = list(comparison.trace.models)
    colours = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(models)}
    outcomes = list(comparison.outcomes.values())
    end = max([comparison.trace.duration, *(s.end for o in outcomes for s in o.segments)], default=1.0) or 1.0
    width, left, lane, model_lane, depth_height, gap = 1200, 110, 22, 14, 70, 34
    lanes = {o.policy: _side_by_side_at_once(o) for o in outcomes}
    heights = {p: 16 + model_lane * len(models) if several else lane for p, several in lanes.items()}
    height = 40 + sum(h + depth_height + gap for h in heights.values()) + 30
    scale = (width - left - 20) / end
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="18" font-size="14">GPU holder and queue depth over {_seconds(end)}</text>',
    ]
    x = left
    for m in models:
        parts.append(f'<rect x="{x}" y="26" width="10" height="10" fill="{colours[m]}"/>')
        parts.append(f'<text x="{x + 14}" y="35">{_xml(m)}</text>')
        x += 24 + 7 * len(m)
    top = 46
    for o in outcomes:
        parts.append(f'<text x="6" y="{top + 15}">{_xml(o.policy)}</text>')
        if lanes[o.policy]:  # one lane per model, under a line with the policy's name
            parts.append(f'<text x="{left}" y="{top + 11}" fill="#666">models loaded side by side</text>')
            rows = {m: (top + 16 + i * model_lane, model_lane - 2) for i, m in enumerate(models)}
            for m, (y, h) in rows.items():
                parts.append(f'<text x="{left - 6}" y="{y + h - 2}" text-anchor="end" font-size="10">{_xml(m)}</text>')
                parts.append(f'<rect x="{left}" y="{y}" width="{width - left - 20}" height="{h}" fill="#f2f2f2"/>')
        else:
            rows = dict.fromkeys(models, (top, lane))
            parts.append(f'<rect x="{left}" y="{top}" width="{width - left - 20}" height="{lane}" fill="#f2f2f2"/>')
        for s in o.segments:
            opacity = "1" if s.state == "ready" else "0.35"
            y, h = rows[s.model]
            parts.append(
                f'<rect x="{left + s.start * scale:.2f}" y="{y}" width="{max(0.5, (s.end - s.start) * scale):.2f}" '
                f'height="{h}" fill="{colours[s.model]}" fill-opacity="{opacity}"/>'
            )
        base = top + heights[o.policy] + depth_height
        top = base + gap
        peak = max([d for series in o.depths.values() for _, d in series] + [1])
        parts.append(f'<text x="6" y="{base}" fill="#666">queue (max {peak})</text>')
        parts.append(f'<line x1="{left}" y1="{base}" x2="{width - 20}" y2="{base}" stroke="#999"/>')
        for m, series in o.depths.items():
            points = _steps(series, end, left, scale, base, (depth_height - 6) / peak)
            parts.append(f'<polyline points="{points}" fill="none" stroke="{colours[m]}" stroke-width="1.2"/>')
    for tick in _ticks(end):
        tx = left + tick * scale
        parts.append(f'<text x="{tx:.1f}" y="{height - 10}" text-anchor="middle" fill="#666">{_seconds(tick)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _steps(series: list[tuple[float, int]], end: float, left: int, scale: float, base: int, unit: float) -> str:
    points: list[str] = []
    last = 0
    for t, d in _thin(series, end):
        x = left + t * scale
        points.append(f"{x:.1f},{base - last * unit:.1f}")
        points.append(f"{x:.1f},{base - d * unit:.1f}")
        last = d
    points.append(f"{left + end * scale:.1f},{base - last * unit:.1f}")
    return " ".join(points)


def _thin(series: list[tuple[float, int]], end: float, buckets: int = 2400) -> Iterator[tuple[float, int]]:
    """At most one point per bucket of the time axis (the highest depth in it), so a long trace stays small."""
    size = end / buckets if end > 0 else 1.0
    current: int | None = None
    best: tuple[float, int] | None = None
    for t, d in series:
        bucket = int(t / size)
        if bucket != current:
            if best is not None:
                yield best
            current, best = bucket, (t, d)
        elif best is not None and d >= best[1]:
            best = (best[0], d)
    if best is not None:
        yield best


def _ticks(end: float) -> list[float]:
    for step in (10, 30, 60, 300, 600, 1800, 3600, 7200, 14400):
        if end / step <= 12:
            return [i * step for i in range(int(end // step) + 1)]
    return [0.0, end]


def _xml(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
