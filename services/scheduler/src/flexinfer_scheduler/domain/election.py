"""The leader elections of the seed, as pure functions of a group snapshot and ``now``. No side effects.

v1alpha2 (``spec.gpu.shared``), ``choose_shared_group_leader`` — the seed's four stages:
1. anti-thrashing: a member preempted within the group's cooldown (max ``swapCooldown``) keeps the Active model;
2. classify: readyLeader (loaded), recentLeader (active within 5 min), demandedLeader (within the 2 min demand
   window), fallbackLeader (any), each the best by priority, then most recent ``lastActiveTime``, then name;
3. demand preemption: the demanded model wins when the ready leader is idle and ``demandedPriority >= readyPriority``;
   and, FlexInfer's bounded wait, when it has waited ``spec.gpu.maxWait`` (default: the demand window) with a
   priority >= the leader's, even though the leader is busy (it then drains); lower priority never preempts;
4. fallback: readyLeader > recentLeader > fallbackLeader.

FlexInfer's quiet yield (opt-in: ``quiet_after``, the setting FLEXINFER_QUIET_YIELD; off by default, which keeps
the seed's "Lower-Priority Model Never Activates"; before stage 1): a model that holds the GPU but is quiet — nothing
in flight, nothing queued, no request for ``quiet_after`` (30 s, about one model load, is a good value) — is parked
as for its idle timeout when requests wait
for a model of another priority: a lower-priority model gets the GPU then (the seed's "wait for the active model to
scale to zero via idle timeout", without the minutes of an idle GPU), and a higher-priority model gets it back from
a quiet lower-priority one. It is no preemption (no cooldown starts; the yielded model comes back at its next
request by the rules above). "Busy" for the priority gate thus means: answering, queued, or asked within
``quiet_after``. Between models of the same priority the seed's rules and the bounded wait decide (a quiet yield
between peers would swap at every lull of two overlapping bursts: the seed's "Continuous Swap Loop").

Around those stages: an unexpired GPU lease means no leader at all (it beats even forcePromotion); then
forcePromotion / a promote call; then members that may not run are left out: one parked by its idle timeout or one
that failed to load, until a request or demand names it again (``lastActiveTime`` after the park or failure).

v1alpha1 (``GPUGroup``), ``determine_active_model``: demanded models (queued requests at or over the threshold)
sorted by priority descending, a busy incumbent among them; a challenger counts only once its demand has persisted
for the hysteresis window (the seed's delay: the incumbent keeps the GPU meanwhile); the incumbent keeps the GPU for
its minimum run duration, a preempted model may not return within the cooldown after preemption, and an incumbent
idle past the idle timeout is parked.

How long a member has wanted the GPU is ``Member.demand_since``, kept by the planner (``wants_gpu`` says when).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum

from flexinfer_scheduler.domain.model import GroupSnapshot, Member, ModelKey, V1Alpha1Policy, lease_is_active

_EPOCH_KEY = float("-inf")


class ElectionReason(StrEnum):
    LEASE = "gpu-lease"
    FORCE_PROMOTION = "force-promotion"
    COOLDOWN = "cooldown"
    DEMAND = "demand"
    MAX_WAIT = "max-wait"
    QUIET_YIELD = "quiet-yield"
    HYSTERESIS = "hysteresis"
    READY = "ready"
    RECENT = "recent"
    FALLBACK = "fallback"
    MINIMUM_RUN = "minimum-run"
    NO_CANDIDATE = "no-candidate"


@dataclass(frozen=True)
class ElectionParams:
    demand_window: timedelta = timedelta(minutes=2)
    recent_window: timedelta = timedelta(minutes=5)
    default_swap_cooldown: timedelta = timedelta(minutes=5)
    # FlexInfer's refinements of the seed's rules; both off: the seed's exact rules (the simulator compares them).
    # The bounded wait (``spec.gpu.maxWait``, default the demand window): a busy incumbent is preempted for a model
    # of priority >= its own whose requests waited that long.
    bounded_wait: bool = True
    # No recent/fallback load of a model whose idle timeout ran out since it was last asked for.
    idle_aware_fallback: bool = True
    # The quiet yield (opt-in, FLEXINFER_QUIET_YIELD): how long the holder must have had no request (and none in
    # flight or queued) before it yields to a waiting model of another priority; about one model load (30 s) is a
    # good value: a holder idle that long has lost at least what the reload will cost it should its next request
    # come at once. None (the default): never, as in the seed ("Lower-Priority Model Never Activates").
    quiet_after: timedelta | None = None

    def max_wait(self, member: Member) -> timedelta | None:
        if not self.bounded_wait:
            return None
        return member.max_wait if member.max_wait is not None else self.demand_window


@dataclass(frozen=True)
class Election:
    leader: ModelKey | None
    reason: ElectionReason
    idle_expired: tuple[ModelKey, ...] = ()
    detail: str = ""


def rank(member: Member) -> tuple[int, float, str, str]:
    """Sort key of the seed's tie-break: highest priority, then most recent lastActiveTime, then name."""
    last = member.last_active_time.timestamp() if member.last_active_time else _EPOCH_KEY
    return (-member.priority, -last, member.key.name, member.key.namespace)


def best(members: Iterable[Member]) -> Member | None:
    """The first of ``members`` in the seed's order (the first given of equals, as a stable sort's first)."""
    return min(members, key=rank, default=None)


def group_cooldown(members: Iterable[Member], default: timedelta) -> timedelta:
    """The maximum ``swapCooldown`` over the group's members (default 5 min for a member without one)."""
    return max((m.swap_cooldown if m.swap_cooldown is not None else default for m in members), default=default)


def cooldown_remaining(snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> timedelta:
    if snapshot.v1alpha1 is not None:
        window = snapshot.v1alpha1.cooldown_after_preemption
    else:
        window = group_cooldown(snapshot.members, params.default_swap_cooldown)
    latest = max((m.preempted_at for m in snapshot.members if m.preempted_at), default=None)
    if latest is None:
        return timedelta(0)
    return max(timedelta(0), latest + window - now)


def idle_reference(member: Member) -> datetime | None:
    """When the member was last busy: its last request, or when it became ready if it never served one since."""
    times = [t for t in (member.last_active_time, member.ready_since) if t is not None]
    return max(times) if times else None


def idle_timeout_expired(member: Member, now: datetime, timeout: timedelta | None, *, loaded: bool = True) -> bool:
    """The member went ``timeout`` without a request (``loaded=False``: would have, were it loaded now)."""
    if timeout is None or (loaded and not member.loaded):
        return False
    since = idle_reference(member)
    return since is not None and now - since >= timeout


def is_eligible(member: Member) -> bool:
    """Left out after an idle park or a failed load, until a request or demand names the model again."""
    for since in (member.idle_parked_at, member.failed_at):
        if since is not None and (member.last_active_time is None or member.last_active_time <= since):
            return False
    return True


def wants_gpu(member: Member, snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> bool:
    """Whether the member waits for the GPU (the clock of ``demand_since`` runs while this holds).

    v1alpha1: its queued requests reach the threshold. v1alpha2: requests wait for it, or a demand named it within
    the demand window. The model serving the group wants nothing: it has the GPU.
    """
    if member.key == snapshot.active and member.ready:
        return False
    if snapshot.v1alpha1 is not None:
        return member.queued >= snapshot.v1alpha1.request_queue_threshold
    return member.queued > 0 or (
        member.last_active_time is not None and now - member.last_active_time <= params.demand_window
    )


def waited(member: Member, now: datetime) -> timedelta:
    return now - member.demand_since if member.demand_since is not None else timedelta(0)


def _is_idle(member: Member, now: datetime, window: timedelta) -> bool:
    return member.last_active_time is None or now - member.last_active_time > window


def is_quiet(member: Member, now: datetime, after: timedelta) -> bool:
    """Serving nobody: nothing in flight or queued, and no request (or, if none since, no load) for ``after``."""
    if member.in_flight or member.queued:
        return False
    since = idle_reference(member)
    return since is None or now - since >= after


def quiet_yield(
    active: Member | None, candidates: list[Member], now: datetime, params: ElectionParams
) -> Member | None:
    """The waiting model that takes the GPU from a quiet holder, if any: the first in line (highest priority, then
    the longest waiting) among the members with requests queued, unless it is the holder's peer (same priority)."""
    if params.quiet_after is None or active is None or active not in candidates or not active.ready:
        return None
    if not is_quiet(active, now, params.quiet_after):
        return None
    waiting = [m for m in candidates if m is not active and m.queued > 0]
    if not waiting:
        return None
    first = min(waiting, key=lambda m: (-m.priority, m.demand_since or now, rank(m)))
    return first if first.priority != active.priority else None


def _longest_overdue(
    candidates: list[Member], floor: int, holder: Member | None, now: datetime, params: ElectionParams
) -> Member | None:
    """The bounded wait's pick: among the members of priority >= ``floor`` (other than the loaded ``holder``) with
    requests waiting for longer than their maxWait, the highest priority, then the longest waiting."""
    overdue = [
        m
        for m in candidates
        if m is not holder
        and m.queued > 0
        and m.priority >= floor
        and m.demand_since is not None
        and (bound := params.max_wait(m)) is not None
        and waited(m, now) >= bound
    ]
    return min(overdue, key=lambda m: (-m.priority, m.demand_since, rank(m))) if overdue else None


def _swapping_away(snapshot: GroupSnapshot, member: Member) -> bool:
    return snapshot.swap is not None and snapshot.swap.from_model == member.key


def _forced(snapshot: GroupSnapshot) -> Member | None:
    forced = [m for m in snapshot.members if m.force_promotion]
    if forced:
        return best(forced)
    promoted = [m for m in snapshot.members if m.promoted_at is not None]
    return max(promoted, key=lambda m: (m.promoted_at, m.key)) if promoted else None


def _overrides_then_candidates(
    snapshot: GroupSnapshot, now: datetime, idle_timeout: Callable[[Member], timedelta | None]
) -> Election | tuple[tuple[ModelKey, ...], list[Member]]:
    """What both elections do first: an unexpired lease means no leader; forcePromotion or a promote call wins
    next. Otherwise (members idle past their timeout, the members that may run)."""
    if lease_is_active(snapshot.lease, now):
        assert snapshot.lease is not None
        return Election(None, ElectionReason.LEASE, detail=f"gpu-lease/{snapshot.lease.owner}")
    forced = _forced(snapshot)
    if forced is not None:
        return Election(forced.key, ElectionReason.FORCE_PROMOTION)
    expired = tuple(m.key for m in snapshot.members if idle_timeout_expired(m, now, idle_timeout(m)))
    return expired, [m for m in snapshot.members if is_eligible(m) and m.key not in expired]


def choose_shared_group_leader(snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> Election:
    """The v1alpha2 election (see the module docstring). Pure: reads only its arguments."""
    first = _overrides_then_candidates(snapshot, now, lambda m: m.idle_timeout)
    if isinstance(first, Election):
        return first
    expired, candidates = first

    active = snapshot.member(snapshot.active)
    # The quiet yield: the holder is parked as for its idle timeout (listed with the expired ones), so it is not
    # preempted (no cooldown) and comes back only once asked again. It ignores the cooldown as an idle park does.
    taker = quiet_yield(active, candidates, now, params)
    if taker is not None and active is not None:
        return Election(taker.key, ElectionReason.QUIET_YIELD, (*expired, active.key))

    # Stage 1: anti-thrashing.
    if active is not None and active in candidates and cooldown_remaining(snapshot, now, params) > timedelta(0):
        return Election(active.key, ElectionReason.COOLDOWN, expired)

    # Stage 2: classify. A model whose idle timeout has run out since it was last asked for is no recent or
    # fallback leader: loaded, it would be parked again at once (a load for nothing, and a swap more).
    ready = best(m for m in candidates if m.loaded)
    unasked = [
        m
        for m in candidates
        if not params.idle_aware_fallback or m.loaded or not idle_timeout_expired(m, now, m.idle_timeout, loaded=False)
    ]
    recent = best(m for m in unasked if m.last_active_time and now - m.last_active_time <= params.recent_window)
    demanded = best(m for m in candidates if m.last_active_time and now - m.last_active_time <= params.demand_window)
    fallback = best(unasked)

    # Stage 3: demand-based preemption, the only path where a swap away from a loaded model can happen. Among the
    # demanded models of the top priority, one whose requests waited past its bound goes first (the bounded
    # wait): else, with no cooldown to hold a swap, a peer asked more recently took the GPU back from a model
    # elected for its bound before that one was even loaded.
    if demanded is not None and (
        ready is None or (_is_idle(ready, now, params.demand_window) and demanded.priority >= ready.priority)
    ):
        late = _longest_overdue(candidates, demanded.priority, ready, now, params)
        if late is not None and late is not demanded:
            return Election(late.key, ElectionReason.MAX_WAIT, expired)
        return Election(demanded.key, ElectionReason.DEMAND, expired)
    # The bounded wait: a model of priority >= the busy leader's whose requests have waited its maxWait takes the
    # GPU (the longest-waiting first among equal priorities); within the bound the loaded model keeps serving. Only
    # requests that still wait count: a busy model is not preempted for a demand nobody waits on any more. And the
    # loaded model first serves the requests that waited for it (queue order: its backlog is older than what is
    # forwarded to it later), so a burst for several models swaps once per model instead of thrashing. Not the
    # requests its own drain makes wait: once a swap away from it is under way, its route takes no new requests
    # and they queue, which must not undo the swap (they wait for its next turn, with their own bound).
    if ready is not None and (ready.queued == 0 or _swapping_away(snapshot, ready)):
        late = _longest_overdue(candidates, ready.priority, ready, now, params)
        if late is not None:
            return Election(late.key, ElectionReason.MAX_WAIT, expired)

    # Stage 4: fallback.
    for leader, reason in (
        (ready, ElectionReason.READY),
        (recent, ElectionReason.RECENT),
        (fallback, ElectionReason.FALLBACK),
    ):
        if leader is not None:
            return Election(leader.key, reason, expired)
    return Election(None, ElectionReason.NO_CANDIDATE, expired)


def determine_active_model(snapshot: GroupSnapshot, now: datetime, policy: V1Alpha1Policy) -> Election:
    """The v1alpha1 GPUGroup election. Pure: reads only its arguments.

    A member is demanded when the requests queued for it (summed over proxies) reach the queue threshold. The seed
    encodes the priority gate in the sort order: demanded members sort by priority descending, and a busy incumbent
    (demanded itself, or serving a request within the hysteresis window: its requests are forwarded, not queued)
    takes part in that sort and wins ties, so a lower-priority model waits for it to go idle while a higher-priority
    one takes the GPU. The winning challenger takes the GPU only once its demand has lasted the hysteresis window
    (the incumbent holds meanwhile, whoever else is demanded, so a short burst never swaps), the incumbent's
    minimum run duration (the v1alpha1 swap cooldown) is over, and, when the winner itself was preempted, the
    cooldown after preemption (so a preempted model cannot bounce straight back). An incumbent idle past the idle
    timeout is parked.
    """
    first = _overrides_then_candidates(snapshot, now, lambda _: policy.idle_timeout)
    if isinstance(first, Election):
        return first
    expired, candidates = first
    active = snapshot.member(snapshot.active)
    incumbent = active if active is not None and active in candidates else None
    demanded = sorted((m for m in candidates if m.queued >= policy.request_queue_threshold), key=rank)
    if incumbent is None:  # an empty GPU waits for nobody: no hysteresis
        if demanded:
            return Election(demanded[0].key, ElectionReason.DEMAND, expired)
        # Nothing demanded and nobody active: a member with any demand at all gets the GPU rather than nobody.
        waiting = best(m for m in candidates if m.queued > 0)
        if waiting is not None:
            return Election(waiting.key, ElectionReason.DEMAND, expired)
        return Election(None, ElectionReason.NO_CANDIDATE, expired)

    busy = incumbent in demanded or (
        incumbent.last_active_time is not None and now - incumbent.last_active_time <= policy.hysteresis_window
    )
    contenders = sorted(
        [*demanded, *([incumbent] if busy and incumbent not in demanded else [])],
        key=lambda m: (-m.priority, m.key != incumbent.key, rank(m)),
    )
    if not contenders or contenders[0].key == incumbent.key:
        return Election(incumbent.key, ElectionReason.READY, expired)
    winner = contenders[0]
    if waited(winner, now) < policy.hysteresis_window:
        return Election(incumbent.key, ElectionReason.HYSTERESIS, expired)
    if snapshot.leader_since is not None and now - snapshot.leader_since < policy.minimum_run_duration:
        return Election(incumbent.key, ElectionReason.MINIMUM_RUN, expired)
    if winner.preempted_at is not None and now - winner.preempted_at < policy.cooldown_after_preemption:
        return Election(incumbent.key, ElectionReason.COOLDOWN, expired)
    return Election(winner.key, ElectionReason.DEMAND, expired)


def elect(snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> Election:
    if snapshot.v1alpha1 is not None:
        return determine_active_model(snapshot, now, snapshot.v1alpha1)
    return choose_shared_group_leader(snapshot, now, params)
