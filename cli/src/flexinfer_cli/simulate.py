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
"tokensPerSecond": 40, "concurrency": 4, "swapCooldown": "5m", "maxWait": "2m", "idleTimeout": "10m"}``. Lines
starting with ``#`` are comments.

Policies, side by side:
- ``seed``: the seed's exact v1alpha2: ``lastActiveTime`` moves only when a request for a model that is not serving
  triggers a scale-up (no activity from served requests, no refresh while requests wait), no bounded wait, no drain;
- ``flexinfer``: FlexInfer's default v1alpha2 (demand renewed while requests wait, activity from served requests,
  the bounded wait, the quiet yield between models of different priorities, the drain);
- ``v1alpha1``: a GPUGroup with the seed's default policy (threshold 3, hysteresis 10 s, minimum run 30 s, ...);
- ``offline``: a lower bound on the loads any policy needs to answer every request within the queue timeout
  (nothing is simulated).
"""

from __future__ import annotations

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

from flexinfer_common.durations import parse_duration
from flexinfer_common.enums import GroupPolicy, RuntimePhase, ScaleAction
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import GroupSnapshot, Member, ModelKey, V1Alpha1Policy
from flexinfer_scheduler.domain.plan import apply_plan, plan_group

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

    @property
    def duration(self) -> float:
        return max((r.at + r.service for r in self.requests), default=0.0)


_MODEL_FIELDS: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "priority": ("priority", int),
    "loadSeconds": ("load_seconds", float),
    "parkSeconds": ("park_seconds", float),
    "tokensPerSecond": ("tokens_per_second", float),
    "concurrency": ("concurrency", int),
    "swapCooldown": ("swap_cooldown", parse_duration),
    "maxWait": ("max_wait", parse_duration),
    "idleTimeout": ("idle_timeout", parse_duration),
}


def read_trace(lines: Iterable[str], *, source: str = "trace") -> Trace:
    """Parse a JSONL trace (see the module docstring); raise TraceError naming the line and the problem."""
    models: dict[str, ModelSpec] = {}
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
    return Trace(models, requests)


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


#: the seed's exact v1alpha2 rules: FlexInfer's refinements (bounded wait, idle-aware fallback, quiet yield) off
SEED_RULES = ElectionParams(bounded_wait=False, idle_aware_fallback=False, quiet_after=None)

POLICIES: dict[str, Policy] = {
    "seed": Policy("seed", SEED_RULES, True, timedelta(0), 3.0),
    "flexinfer": Policy("flexinfer", ElectionParams(), False, timedelta(seconds=60), 3.0),
    "v1alpha1": Policy("v1alpha1", ElectionParams(), False, timedelta(seconds=60), 5.0, V1Alpha1Policy()),
}
OFFLINE = "offline"
ALL_POLICIES = (*POLICIES, OFFLINE)


@dataclass(frozen=True)
class Settings:
    queue_timeout: float = 300.0
    queue_max: int = 256
    demand_refresh: float = 10.0
    command_retry: float = 10.0
    quiet_yield: float | None = None  # the scheduler's FLEXINFER_QUIET_YIELD, for the flexinfer policy (None: off)


class Event(IntEnum):  # at equal times: runtime changes first, then finished requests, then arrivals
    LOADED = 0
    PARKED = 1
    DONE = 2
    ARRIVAL = 3
    EXPIRE = 4
    TICK = 5


@dataclass
class Segment:
    """Who held the GPU from ``start`` to ``end``: a model ``loading``, ``ready``, or ``stopping``."""

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
    depths: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    events: int = 0

    def percentile(self, model: str, q: float) -> float | None:
        waits = sorted(self.waits.get(model, []))
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
            )
            for spec in trace.models.values()
        )
        self.snapshot = GroupSnapshot(
            "gpu",
            members,
            policy=GroupPolicy.V1ALPHA1 if policy.v1alpha1 else GroupPolicy.V1ALPHA2,
            v1alpha1=policy.v1alpha1,
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
        self._segment: tuple[str, str, float] | None = None
        self._cooldown_end = 0.0

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
            if when > end and kind == Event.TICK:
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
        self._close_segment()
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
        if action is ScaleAction.ACTIVATE:
            if runtime is None or runtime.phase is RuntimePhase.STOPPING:
                if runtime is not None:
                    self._kill(name, runtime)
                runtime = self.runtimes[name] = _Runtime(RuntimePhase.LOADING, generation)
                self.outcome.loads += 1
                self.at(self.now + spec.load_seconds, Event.LOADED, (name, generation))
            runtime.generation = generation
            self._report(name, runtime.phase, generation)
        elif runtime is None:
            self._report(name, RuntimePhase.PARKED, generation)
        else:
            runtime.phase, runtime.generation = RuntimePhase.STOPPING, generation
            self._report(name, RuntimePhase.STOPPING, generation)
            self.at(self.now + spec.park_seconds, Event.PARKED, (name, generation))

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
        self._check_bound(snapshot, plan.active, plan.cooldown_remaining)
        self.snapshot = apply_plan(snapshot, plan)
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
        their maxWait (the election's default: the demand window), after the cooldown, and still not elected."""
        if self.outcome.over_bound is None:
            return
        if cooldown > timedelta(0):
            self._cooldown_end = self.now + cooldown.total_seconds()
            return
        holder = snapshot.member(snapshot.active)
        default = self.policy.params.demand_window
        for m in snapshot.members:
            queue = self.queues[m.key.name]
            if not queue or m.key == leader or (holder is not None and m.priority < holder.priority):
                continue
            bound = (m.max_wait if m.max_wait is not None else default).total_seconds()
            late = self.now - max(queue[0].at + bound, self._cooldown_end)
            self.outcome.over_bound = max(self.outcome.over_bound, late)

    # ---- accounting ----------------------------------------------------------------------------------------
    def _gpu_state(self) -> tuple[str, str] | None:
        for name, runtime in self.runtimes.items():
            if runtime.phase is RuntimePhase.READY:
                return name, "ready"
        for name, runtime in self.runtimes.items():
            return name, "loading" if runtime.phase is RuntimePhase.LOADING else "stopping"
        return None

    def _account(self, until: float) -> None:
        spent = until - self._last_account
        state = self._gpu_state()
        if spent > 0:
            if state is None:
                self.outcome.idle += spent
            elif state[1] == "ready":
                busy = any(r.in_flight for r in self.runtimes.values())
                if busy:
                    self.outcome.busy += spent
                else:
                    self.outcome.idle += spent
            else:
                self.outcome.loading += spent
        self._last_account = until
        current = (state[0], state[1], until) if state is not None else None
        if (current and current[:2]) != (self._segment and self._segment[:2]):
            self._close_segment(until)
            self._segment = current

    def _close_segment(self, until: float | None = None) -> None:
        if self._segment is not None:
            name, state, start = self._segment
            end = self.now if until is None else until
            if end > start:
                self.outcome.segments.append(Segment(name, state, start, end))
            self._segment = None


def offline_lower_bound(trace: Trace, queue_timeout: float) -> int:
    """At least this many loads are needed to answer every request within the queue timeout, whatever the policy
    (even one that knew the whole trace in advance, with instant loads and service).

    A request is answered only if its model holds the GPU at some moment of its wait ``[at, at + timeout]``. Take a
    chain of requests whose waits do not overlap, in time order: the GPU must hold their models in that order, so
    each change of model along the chain is a load. The bound is 1 + the most changes over all such chains (a
    dynamic programme over the requests in arrival order), and at least the number of distinct models."""
    models = sorted({r.model for r in trace.requests})
    best_by_model = dict.fromkeys(models, -1)  # the most changes of a chain ending at a compatible request of m
    compatible = 0
    best = 0
    ordered = sorted(trace.requests, key=lambda r: r.at)
    ends = sorted(((r.at + queue_timeout, i) for i, r in enumerate(ordered)), key=lambda e: e[0])
    scores: dict[int, int] = {}
    for i, r in enumerate(ordered):
        # every request whose wait ended before this one's began may precede it in a chain
        while compatible < len(ends) and ends[compatible][0] < r.at:
            j = ends[compatible][1]
            if j in scores:
                model = ordered[j].model
                best_by_model[model] = max(best_by_model[model], scores[j])
            compatible += 1
        same = best_by_model[r.model]
        other = max((v for m, v in best_by_model.items() if m != r.model), default=-1)
        score = max(same, other + 1 if other >= 0 else -1, 0)
        scores[i] = score
        best = max(best, score)
    return max(len(models), 1 + best)


@dataclass
class Comparison:
    trace: Trace
    outcomes: dict[str, Outcome]
    offline: int | None
    settings: Settings


def _with_settings(policy: Policy, settings: Settings) -> Policy:
    """The policy as the scheduler would run it with these settings (FLEXINFER_QUIET_YIELD for FlexInfer's)."""
    if policy.name != "flexinfer" or settings.quiet_yield is None:
        return policy
    quiet_after = timedelta(seconds=settings.quiet_yield)
    return dataclasses.replace(policy, params=dataclasses.replace(policy.params, quiet_after=quiet_after))


def simulate(trace: Trace, policies: Iterable[str] = ALL_POLICIES, settings: Settings | None = None) -> Comparison:
    settings = settings or Settings()
    outcomes: dict[str, Outcome] = {}
    offline = None
    for name in policies:
        if name == OFFLINE:
            offline = offline_lower_bound(trace, settings.queue_timeout)
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
        lines += _columns(table)
    return "\n".join(lines)


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
            "waitSeconds": {
                model: {f"p{q}": o.percentile(model, q) for q in (50, 95, 99)} for model in comparison.trace.models
            },
        }
    if comparison.offline is not None:
        out["policies"][OFFLINE] = {"swaps": comparison.offline}
    return out


_PALETTE = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7", "#9c755f")


def render_svg(comparison: Comparison) -> str:
    """A timeline per policy: which model holds the GPU (solid: serving, pale: loading or stopping) and, below,
    each model's queue depth. Written by hand: plain SVG, no plotting library."""
    models = list(comparison.trace.models)
    colours = {m: _PALETTE[i % len(_PALETTE)] for i, m in enumerate(models)}
    outcomes = list(comparison.outcomes.values())
    end = max([comparison.trace.duration, *(s.end for o in outcomes for s in o.segments)], default=1.0) or 1.0
    width, left, lane, depth_height, gap = 1200, 110, 22, 70, 34
    block = lane + depth_height + gap
    height = 40 + block * len(outcomes) + 30
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
    for row, o in enumerate(outcomes):
        top = 46 + row * block
        parts.append(f'<text x="6" y="{top + 15}">{_xml(o.policy)}</text>')
        parts.append(f'<rect x="{left}" y="{top}" width="{width - left - 20}" height="{lane}" fill="#f2f2f2"/>')
        for s in o.segments:
            opacity = "1" if s.state == "ready" else "0.35"
            parts.append(
                f'<rect x="{left + s.start * scale:.2f}" y="{top}" width="{max(0.5, (s.end - s.start) * scale):.2f}" '
                f'height="{lane}" fill="{colours[s.model]}" fill-opacity="{opacity}"/>'
            )
        base = top + lane + depth_height
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
