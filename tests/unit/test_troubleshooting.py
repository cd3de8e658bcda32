"""One regression test per "Troubleshooting" heading of the seed, run on the control loop simulated in memory
(``Sim``: the planner, a store with the real filters, a bus, an actuator with processes, a proxy that refreshes
demand while requests wait). "Stale tmpfs Blocking Flash-Loader" is a Kubernetes node / init-container matter with
no scheduler logic behind it, so it has no test here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pytest

from flexinfer_common.enums import ModelPhase, RuntimePhase, SchedulingPolicy, SharedState
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.election import ElectionParams
from flexinfer_scheduler.domain.model import GroupSnapshot
from tests.unit.test_scheduler_properties import START, TICK, Process, Sim, member

A, B = ModelKey("default", "a"), ModelKey("default", "b")
HOUR = timedelta(hours=1)
QUEUE_TIMEOUT = timedelta(minutes=5)  # FLEXINFER_QUEUE_TIMEOUT: a request waits this long, then gets 504


@dataclass
class Proxy:
    """The proxy's side of demand: a request for a serving model is forwarded (and reported as activity); one for
    any other model waits, and its demand is refreshed every tick until it is served or times out."""

    sim: Sim
    refresh: bool = True
    queue_timeout: timedelta = QUEUE_TIMEOUT
    waiting: dict[ModelKey, datetime] = field(default_factory=dict)  # oldest waiting request per model

    def request(self, key: ModelKey) -> None:
        if not (self.sim.serving(key) and self.sim.snapshot.active == key):
            self.waiting.setdefault(key, self.sim.now)
        self.sim.demand(key)

    def tick(self) -> None:
        """One reconcile period: served requests leave the queue, the rest refresh their demand, then a round."""
        for key, since in list(self.waiting.items()):
            if self.sim.serving(key) or self.sim.now - since >= self.queue_timeout:
                del self.waiting[key]
            elif self.refresh:
                self.sim.demand(key)
        self.sim.round()
        self.sim.advance(TICK)


def two_models(
    *,
    a: int = 100,
    b: int = 100,
    cooldown: timedelta | None = None,
    idle: timedelta | None = None,
    policy: SchedulingPolicy = SchedulingPolicy.SEED,
) -> Sim:
    """Two models; the seed's election by default (the troubleshooting section describes it)."""
    return Sim(
        GroupSnapshot(
            "gpu",
            (
                member("a", priority=a, swap_cooldown=cooldown, idle_timeout=idle),
                member("b", priority=b, swap_cooldown=cooldown),
            ),
        ),
        params=ElectionParams(policy=policy),
    )


def bring_up(sim: Sim, key: ModelKey) -> None:
    assert sim.drive(key, until=sim.now + timedelta(minutes=1))
    sim.round()


def rounds(sim: Sim, duration: timedelta, proxy: Proxy | None = None) -> None:
    end = sim.now + duration
    while sim.now < end:
        if proxy is not None:
            proxy.tick()
        else:
            sim.round()
            sim.advance(TICK)


# ---- Rollout Restart Deadlock ---------------------------------------------------------------------------------


def restart_loading(sim: Sim, key: ModelKey) -> None:
    """``kubectl rollout restart``: a new pod replaces the old one and reports Loading for the same command."""
    generation = sim.member(key).command_generation
    sim.processes[key] = Process(RuntimePhase.LOADING, generation)
    sim.record_runtime(key, RuntimePhase.LOADING, generation)


def restart_failed(sim: Sim, key: ModelKey) -> None:
    """The process exits after it was Ready (what a local restart or an OOM kill looks like)."""
    sim.crash(key)


def restart_unknown(sim: Sim, key: ModelKey) -> None:
    """The actuator restarts with it: every runtime is gone and the scheduler knows nothing until it reports."""
    sim.restart_actuator()


@pytest.mark.parametrize(
    "restart",
    [
        pytest.param(restart_loading, id="runtime-goes-loading"),
        pytest.param(restart_unknown, id="runtime-goes-unknown"),
        pytest.param(restart_failed, id="runtime-goes-failed"),
    ],
)
@pytest.mark.parametrize(
    "wanted", [pytest.param(A, id="request-for-the-restarted-model"), pytest.param(B, id="request-for-the-other-model")]
)
def test_rollout_restart_deadlock(restart: Callable[[Sim, ModelKey], None], wanted: ModelKey) -> None:
    """Restarting the Active model must not leave the group with nothing running while a request waits: the
    demanded model is loaded within a few reconcile periods and shows as the group's one Active model, and the GPU
    does not go to a model nobody asked for. The restarted model has the lower priority, so a detour through the
    other model (a fallback while it restarts) would be a dead end: the priority gate would keep it waiting."""
    sim = two_models(a=50, b=100)
    bring_up(sim, A)
    rounds(sim, timedelta(minutes=3))  # A idles
    restart(sim, A)
    proxy = Proxy(sim)
    proxy.request(wanted)
    deadline = sim.now + 6 * TICK
    while not sim.serving(wanted):
        assert sim.now < deadline, f"{wanted.name} not loaded: running={sim.running}, snapshot={sim.snapshot}"
        assert set(sim.processes) <= {A, wanted}, f"loaded {sim.running}, which nobody asked for"
        proxy.tick()
    final = sim.round()
    assert final.active == wanted
    assert [k for k, v in final.statuses.items() if v.state == SharedState.ACTIVE] == [wanted]
    assert final.statuses[wanted].ready and final.statuses[wanted].phase == ModelPhase.READY
    assert sim.running == [wanted]


def test_rollout_restart_of_a_crashed_model_keeps_its_failure_out_of_the_queue() -> None:
    """A crash after Ready is a restart, not a failed load: the proxy's queue is not failed with 503."""
    sim = two_models()
    bring_up(sim, A)
    sim.crash(A)
    plan = sim.plan()
    assert plan.active == A
    assert plan.statuses[A].failure is None
    assert any(c.key == A and not c.reissue for c in sim.inflight), "the crashed leader is activated afresh"


# ---- Lower-Priority Model Never Activates ---------------------------------------------------------------------


@pytest.mark.parametrize("policy", [SchedulingPolicy.SEED, SchedulingPolicy.FLEXINFER], ids=["seed", "flexinfer"])
def test_lower_priority_model_never_activates(policy: SchedulingPolicy) -> None:
    """By design a lower-priority model waits while a higher-priority one holds the GPU, even an idle one; it gets
    the GPU once the active model idles out via its idleTimeout; and the group does not flap: the idle-parked model
    is not re-elected until a request names it again (then it wins back the GPU, being higher priority).
    Under FlexInfer's policy "idle" is shorter: a holder quiet for its quiet period (10 s) while the lower one's
    requests wait is parked as for its idle timeout, the rest is the same."""
    sim = two_models(a=200, b=100, idle=timedelta(minutes=10))
    sim.params = dataclasses.replace(sim.params, policy=policy)
    quiet_yield = sim.params.quiet_period if policy is SchedulingPolicy.FLEXINFER else None
    proxy = Proxy(sim)
    bring_up(sim, A)
    busy_until = sim.now + timedelta(minutes=5)
    while sim.now < busy_until:
        proxy.request(A)
        if sim.now >= START + timedelta(minutes=1):
            proxy.request(B)
        proxy.tick()
        assert B not in sim.processes
    last_request = sim.member(A).last_active_time
    assert last_request is not None
    idle_out = last_request + (quiet_yield or timedelta(minutes=10))  # the quiet yield, else A's idle timeout

    while not sim.serving(B):  # B's requests keep waiting (and re-signalling demand) while A idles
        assert sim.now < idle_out + 3 * TICK, f"B still waits {sim.now - idle_out} after A idled out"
        if sim.now < idle_out:
            assert B not in sim.processes, f"B loaded {idle_out - sim.now} before A idled out"
        proxy.request(B)
        proxy.tick()
    assert sim.now >= idle_out
    parked = sim.member(A)
    assert parked.idle_parked_at is not None and A not in sim.processes
    assert sim.last_plan is not None and sim.last_plan.statuses[A].phase == ModelPhase.IDLE

    swaps = len(sim.swaps)
    for _ in range(60):  # B busy for 10 minutes, then everyone idle for 30: A (higher priority) stays parked
        proxy.request(B)
        proxy.tick()
    rounds(sim, timedelta(minutes=30), proxy)
    assert len(sim.swaps) == swaps and sim.running == [B] and sim.snapshot.active == B

    proxy.request(A)
    deadline = sim.now + 6 * TICK
    while not sim.serving(A):
        assert sim.now < deadline
        proxy.tick()


# ---- Continuous Swap Loop -------------------------------------------------------------------------------------


def alternate_sessions(sim: Sim, proxy: Proxy, session: timedelta) -> None:
    """Users of ``a`` and ``b`` take turns: a request every tick for one model, switching every ``session``."""
    elapsed = sim.now - START
    proxy.request(A if (elapsed // session) % 2 == 0 else B)


def always_the_other_one(sim: Sim, proxy: Proxy, session: timedelta) -> None:
    """The worst case: every tick, a request for whichever model is not active (the active one never busy)."""
    proxy.request(B if sim.snapshot.active == A else A)


def preempting_swaps(sim: Sim) -> int:
    return sum(1 for s in sim.swaps if s.from_model is not None)


@pytest.mark.parametrize(
    "cooldown",
    [
        pytest.param(timedelta(minutes=2), id="swapCooldown-2m"),
        pytest.param(None, id="swapCooldown-default-5m"),
        pytest.param(timedelta(minutes=10), id="swapCooldown-10m"),
    ],
)
@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param(alternate_sessions, id="alternating-3-minute-sessions"),
        pytest.param(always_the_other_one, id="always-the-inactive-model"),
    ],
)
def test_continuous_swap_loop(cooldown: timedelta | None, pattern: Callable[[Sim, Proxy, timedelta], None]) -> None:
    """Two equal-priority models both in demand swap at most once per group cooldown (plus the first swap, which
    no cooldown precedes) over a simulated hour; raising swapCooldown lowers the rate, as the seed's fix says."""
    sim = two_models(cooldown=cooldown)
    window = cooldown or timedelta(minutes=5)
    proxy = Proxy(sim)
    while sim.now < START + HOUR:
        pattern(sim, proxy, timedelta(minutes=3))
        proxy.tick()
        assert len(sim.processes) <= 1
    swaps = preempting_swaps(sim)
    assert swaps <= HOUR // window + 1, f"{swaps} swaps in an hour with a {window} cooldown"
    assert swaps >= 2, "the scenario must actually make the models swap"


def test_continuous_swap_loop_longer_cooldown_fewer_swaps() -> None:
    counts = []
    for cooldown in (timedelta(minutes=2), timedelta(minutes=5), timedelta(minutes=10)):
        sim = two_models(cooldown=cooldown)
        proxy = Proxy(sim)
        while sim.now < START + HOUR:
            always_the_other_one(sim, proxy, timedelta(0))
            proxy.tick()
        counts.append(preempting_swaps(sim))
    assert counts == sorted(counts, reverse=True) and counts[0] > counts[-1], counts


# ---- Demand Signal Not Being Detected -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("busy_for", "preempted_ago", "max_wait", "wins_after"),
    [
        # The incumbent serves requests for 6 minutes and B's maxWait is longer: the demand must outlive its
        # 2-minute window meanwhile, and B wins once the incumbent is idle.
        pytest.param(
            timedelta(minutes=6), None, timedelta(minutes=30), timedelta(minutes=8), id="incumbent-busy-then-idle"
        ),
        # A preemption a minute ago: the 5-minute cooldown holds the incumbent although it is idle.
        pytest.param(timedelta(0), timedelta(minutes=1), None, timedelta(minutes=4), id="swap-cooldown-active"),
    ],
)
def test_demand_signal_not_being_detected(
    busy_for: timedelta, preempted_ago: timedelta | None, max_wait: timedelta | None, wins_after: timedelta
) -> None:
    """A waiting request keeps its demand alive: the proxy re-signals every 10 s, so lastActiveTime never falls out
    of the 2-minute window while the request waits, and the model wins as soon as the incumbent is idle and no
    cooldown runs. Without the refresh the seed's symptom appears: the one signal expires after 2 minutes."""
    for refresh in (True, False):
        sim = two_models()
        sim.write(B, max_wait=max_wait)
        bring_up(sim, A)
        if preempted_ago is not None:
            sim.write(B, preempted_at=sim.now - preempted_ago)
        # the client waits the whole 10 minutes; the proxy re-signals every 10 s (or, as a control, never)
        proxy = Proxy(sim, refresh=refresh, queue_timeout=timedelta(minutes=10))
        start = sim.now
        proxy.request(B)
        won_at = None
        while sim.now < start + timedelta(minutes=10):
            if sim.now < start + busy_for:
                proxy.request(A)
            proxy.tick()
            if sim.serving(B):
                won_at = sim.now - start
                break
        if refresh:
            assert won_at is not None, "B never got the GPU although its request kept waiting"
            assert wins_after - 2 * TICK <= won_at <= wins_after + 4 * TICK, won_at
            assert won_at > timedelta(minutes=2), "the demand outlived the 2-minute window thanks to the refresh"
        else:
            assert won_at is None, f"B won at {won_at} with one demand signal: it should have expired after 2 minutes"


def test_a_busy_incumbent_no_longer_starves_an_equal_priority_model() -> None:
    """The starvation of issue 11: steady traffic on A (a request every tick, so A is never idle) and one request
    for B of equal priority. Under FlexInfer's policy B gets the GPU once it has waited its maxWait (the
    parameters' bound), plus a drain and a few reconcile periods — before the 5-minute queue timeout. Under the
    seed's it waits until its request times out."""
    sim = two_models(policy=SchedulingPolicy.FLEXINFER)
    bring_up(sim, A)
    proxy = Proxy(sim)
    start = sim.now
    proxy.request(B)
    while not sim.serving(B):
        assert sim.now - start < QUEUE_TIMEOUT, "B starved behind a busy A"
        proxy.request(A)
        proxy.tick()
    bound = sim.params.flexinfer_max_wait
    assert bound <= sim.now - start <= bound + 4 * TICK
    assert sim.running == [B]
