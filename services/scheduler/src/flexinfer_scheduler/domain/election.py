"""The leader elections of the seed, as pure functions of a group snapshot and ``now``. No side effects.

v1alpha2 (``spec.gpu.shared``), ``choose_shared_group_leader`` — the seed's four stages:
1. anti-thrashing: a member preempted within the group's cooldown (max ``swapCooldown``) keeps the Active model;
2. classify: readyLeader (loaded), recentLeader (active within 5 min), demandedLeader (within the 2 min demand
   window), fallbackLeader (any), each the best by priority, then most recent ``lastActiveTime``, then name;
3. demand preemption: the demanded model wins when the ready leader is idle and ``demandedPriority >= readyPriority``
   (the only path where a swap away from a loaded model can happen: a busy leader is never preempted);
4. fallback: readyLeader > recentLeader > fallbackLeader.

That is the seed's policy exactly, which the scheduler and the simulator run for ``FLEXINFER_SCHEDULING_POLICY=seed``
(or a group's ``spec.scheduling: seed``). FlexInfer's own policy (the default) is ``choose_flexinfer_leader`` below:
idle means quiet for ``quiet_period`` (FLEXINFER_QUIET_YIELD), a quiet holder yields to a waiting model whatever the
priorities, a new holder keeps the GPU for its measured load, a busy one is preempted after the bounded wait
(``spec.gpu.maxWait``), and a model whose idle timeout ran out since it was asked for is not loaded as a fallback.

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

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum

from flexinfer_common.enums import SchedulingPolicy
from flexinfer_common.keys import ModelKey
from flexinfer_scheduler.domain.model import GroupSnapshot, Member, V1Alpha1Policy, lease_is_active

_EPOCH_KEY = float("-inf")
QUIET_PERIOD = timedelta(seconds=10)
BOUNDED_WAIT = timedelta(minutes=4)
YIELD_AFTER = timedelta(seconds=240)
PATIENCE = timedelta(seconds=60)
PEER_PATIENCE = timedelta(seconds=150)
FEW = 4
SESSION_GAP = timedelta(minutes=1)
# The share of the queue timeout a quiet holder's yield may wait for by default (the rest is for the park and the
# load; a quiet holder has nothing to drain).
TIMEOUT_SHARE = 4 / 5
# What the bounded wait leaves of the queue timeout, beside the busy holder's drain (FLEXINFER_DRAIN_TIMEOUT, 60 s by
# default), for a park and a load (the seed's LLMs load in about 30 s).
LOAD_ALLOWANCE = timedelta(seconds=40)
# How long a swap waits for the outgoing model's requests in flight by default (FLEXINFER_DRAIN_TIMEOUT).
DRAIN_TIMEOUT = timedelta(seconds=60)


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
    # Which election a v1alpha2 group runs (a group's own ``spec.scheduling`` wins): FlexInfer's policy (below,
    # ``choose_flexinfer_leader``) or the seed's exact rules (``choose_shared_group_leader``).
    policy: SchedulingPolicy = SchedulingPolicy.FLEXINFER
    # FlexInfer's policy. ``quiet_period``: a holder with nothing in flight, nothing queued and no request for this
    # long is idle (the seed: not asked within the demand window). ``hold_factor`` x the holder's measured load
    # time, within [``hold_min``, ``hold_max``]: how long a new holder keeps the GPU while it is busy, so that its
    # load pays for itself (the seed's fixed 5-minute cooldown, when no member sets ``swapCooldown``).
    # ``flexinfer_max_wait``: the bounded wait of a member without ``spec.gpu.maxWait``. The scheduler and the
    # simulator fit ``quiet_period``, ``flexinfer_max_wait`` and ``yield_after`` to the user's timings (``fitted_to``).
    quiet_period: timedelta = QUIET_PERIOD
    hold_factor: float = 1.0
    hold_min: timedelta = timedelta(seconds=10)
    hold_max: timedelta = timedelta(minutes=5)
    flexinfer_max_wait: timedelta = BOUNDED_WAIT
    # A quiet holder yields once the waiting it would end is worth a load (``worth_a_load``): the member's requests
    # waiting x how long it has waited reaches ``yield_after`` (request-seconds); a peer's ``few`` requests or fewer
    # only once the holder was not asked for ``session_gap`` (its session ended); any member's once its oldest
    # waited ``patience``, a peer's (the holder's priority) ``peer_patience``.
    yield_after: timedelta = YIELD_AFTER
    patience: timedelta = PATIENCE
    peer_patience: timedelta = PEER_PATIENCE
    few: int = FEW
    session_gap: timedelta = SESSION_GAP
    # the operator's FLEXINFER_DEFAULT_SWAP_COOLDOWN when set explicitly: FlexInfer's policy then holds as the seed
    explicit_swap_cooldown: timedelta | None = None

    def max_wait(self, member: Member) -> timedelta | None:
        """The member's bounded wait: its ``spec.gpu.maxWait``, else ``flexinfer_max_wait``; the seed has none."""
        if self.policy is SchedulingPolicy.SEED:
            return None
        return member.max_wait if member.max_wait is not None else self.flexinfer_max_wait

    def seed(self) -> ElectionParams:
        """These parameters with the seed's exact rules."""
        return replace(self, policy=SchedulingPolicy.SEED)

    def fitted_to(
        self, queue_timeout: timedelta, quiet_yield: timedelta | None = None, drain_timeout: timedelta = DRAIN_TIMEOUT
    ) -> ElectionParams:
        """FlexInfer's defaults fitted to the timings the user set, so that no default waits past them:
        - the quiet period is FLEXINFER_QUIET_YIELD when set, else 10 s, or the demand window when that is shorter
          (a holder the seed would call idle, not asked within the window, is quiet too); the session gap likewise
          1 min, or the demand window when that is shorter;
        - ``yield_after`` 240 request-seconds, the patience 60 s and a peer's 150 s, or four fifths of the queue
          timeout when that is shorter: a quiet holder parks at once, so the last fifth is for the park and the load;
        - the bounded wait of a member without ``spec.gpu.maxWait`` is what the queue timeout leaves after the busy
          holder's drain (``drain_timeout``) and a park and a load (``LOAD_ALLOWANCE``, 40 s), at most 4 min and at
          least half the queue timeout: 3 min 20 s with the defaults (a 5 min timeout, a 60 s drain). A bound of four
          fifths of the timeout left 60 s for a drain of up to 60 s and the load, and a holder serving a backlog
          drains for all of it: its requests timed out (8 of 718 on a bursty day of models that serve one request
          at a time, 45 of a homelab day's 924 with a 2 min timeout; 0 and 5 with this bound)."""
        share = queue_timeout * TIMEOUT_SHARE
        room = queue_timeout - drain_timeout - LOAD_ALLOWANCE
        return replace(
            self,
            quiet_period=quiet_yield if quiet_yield is not None else min(QUIET_PERIOD, self.demand_window),
            flexinfer_max_wait=min(BOUNDED_WAIT, max(queue_timeout / 2, room)),
            yield_after=min(YIELD_AFTER, share),
            patience=min(PATIENCE, share),
            peer_patience=min(PEER_PATIENCE, share),
            session_gap=min(SESSION_GAP, self.demand_window),
        )


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
    """How long the group's holder keeps the GPU against demand: the seed's swap cooldown (v1alpha1: the cooldown
    after preemption), or under FlexInfer's policy the holder's hold (``hold_ends``)."""
    if snapshot.v1alpha1 is None and policy_of(snapshot, params) is SchedulingPolicy.FLEXINFER:
        holder = snapshot.member(snapshot.active)
        if holder is None:
            return timedelta(0)
        ends = hold_ends(holder, snapshot, params)
        return max(timedelta(0), ends - now) if ends is not None else timedelta(0)
    return seed_cooldown_remaining(snapshot, now, params)


def seed_cooldown_remaining(snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> timedelta:
    """The seed's stage 1: the group's cooldown (max ``swapCooldown``) after its latest preemption."""
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


def parked_by_hand(member: Member) -> bool:
    """Parked as for its idle timeout (the status page's Park) and not asked for since: it leaves the GPU, and comes
    back once a request or demand names it again."""
    since = member.idle_parked_at
    return since is not None and (member.last_active_time is None or member.last_active_time <= since)


def is_eligible(member: Member) -> bool:
    """Left out after an idle park or a failed load, until a request or demand names the model again; and once
    deleted (it is parked as for a swap, then its row goes), or moving to another group (parked here first)."""
    if member.leaving:
        return False
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
    if policy_of(snapshot, params) is SchedulingPolicy.FLEXINFER:
        return asked_for(member, now, params)
    return member.queued > 0 or (
        member.last_active_time is not None and now - member.last_active_time <= params.demand_window
    )


def acts_on_time(snapshot: GroupSnapshot, params: ElectionParams) -> bool:
    """Whether the group is passed again when one of its rules of time ends (FlexInfer's policy), or only at the
    reconcile (a v1alpha1 group, and the seed's policy: as the seed, which acted at its reconcile)."""
    return snapshot.v1alpha1 is None and policy_of(snapshot, params) is SchedulingPolicy.FLEXINFER


def next_change(snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> datetime | None:
    """The first instant after ``now`` at which FlexInfer's election could decide otherwise though nothing new was
    reported: a rule of time ends (the holder's quiet period, hold or idle timeout; a session gap; a waiting
    member's patience, bound or crowd threshold; a demand window; a lease). None: only an event can change it, or
    the group does not act on time (``acts_on_time``). A superset: the pass then may well change nothing. The
    scheduler passes the group again at that instant instead of at its next reconcile, so a rule of time takes
    effect on time, not up to a reconcile interval (3 s) late."""
    if not acts_on_time(snapshot, params):
        return None
    times: list[datetime] = []
    if snapshot.lease is not None:
        times.append(snapshot.lease.expires_at)
    holder = snapshot.member(snapshot.active)
    # a holder serving or asked for becomes quiet only by an event (its last request answered)
    quiet = holder is not None and not holder.in_flight and not holder.queued
    quiet_from = now
    if holder is not None:
        ends = hold_ends(holder, snapshot, params)
        if ends is not None:
            times.append(ends)
        since = idle_reference(holder)
        if since is not None and quiet:
            quiet_from = max(now, since + params.quiet_period)
            times.append(quiet_from)
        if since is not None and holder.idle_timeout is not None:
            times.append(since + holder.idle_timeout)
    for m in snapshot.members:
        last = m.last_active_time
        if m is not holder and not asked_for(m, now, params):  # (FlexInfer's demand: ``wants_gpu``)
            continue
        if last is not None:
            times += (last + params.demand_window, last + params.recent_window, last + params.session_gap)
        if m is not holder and m.demand_since is not None:
            times += (m.demand_since + params.patience, m.demand_since + params.peer_patience)
            bound = params.max_wait(m)
            if bound is not None:
                times.append(m.demand_since + bound)
            if quiet and holder is not None and holder.last_active_time is not None:
                times.append(max(quiet_from, now + _until_worth_it(m, holder, now, params)))
    return first_after(times, now)


def first_after(times: Iterable[datetime | None], now: datetime) -> datetime | None:
    """The earliest of ``times`` after ``now`` (None among them: no such time), None when there is none: when a
    group is passed again (``next_change``, ``GroupPlan.recheck_at``)."""
    return min((t for t in times if t is not None and t > now), default=None)


def _until_worth_it(member: Member, holder: Member, now: datetime, params: ElectionParams) -> timedelta:
    """How long until ``member``'s requests waiting x its wait reach ``yield_after`` scaled by the quiet holder's
    heat (``worth_a_load``, its last case), with no new request: the wait grows and the heat falls, both linearly."""
    assert holder.last_active_time is not None
    window = params.demand_window.total_seconds()
    idle = (now - holder.last_active_time).total_seconds()
    count, target = max(1, member.queued), params.yield_after.total_seconds()
    cold = max(0.0, window - idle)  # the heat is 0 after this
    crossing = (target * (1 - idle / window) - count * waited(member, now).total_seconds()) / (count + target / window)
    return timedelta(seconds=max(0.0, min(cold, crossing)))


def policy_of(snapshot: GroupSnapshot, params: ElectionParams) -> SchedulingPolicy:
    """The group's own ``spec.scheduling``, else the setting."""
    return snapshot.scheduling or params.policy


def params_for(snapshot: GroupSnapshot, params: ElectionParams) -> ElectionParams:
    """The parameters the group is planned with: the seed's exact rules (no bounded wait, no quiet yield) for a
    v1alpha2 group whose policy is the seed, whether the setting or its own ``spec.scheduling`` says so; FlexInfer's
    (its bounded wait) for one that declares ``flexinfer`` under the ``seed`` setting."""
    if snapshot.v1alpha1 is not None or (snapshot.scheduling is None and params.policy is SchedulingPolicy.FLEXINFER):
        return params
    if policy_of(snapshot, params) is SchedulingPolicy.SEED:
        return params.seed()
    return replace(params, policy=SchedulingPolicy.FLEXINFER)


def released_at(member: Member) -> datetime | None:
    """When the member last lost the GPU (preempted, or parked while idle)."""
    times = [t for t in (member.preempted_at, member.idle_parked_at) if t is not None]
    return max(times) if times else None


def asked_for(member: Member, now: datetime, params: ElectionParams) -> bool:
    """FlexInfer's demand: requests wait for the member (at any proxy, or in an external producer's ``queued``),
    or a request or demand message named it within the demand window since it last lost the GPU (what it served
    before it was parked is no demand)."""
    if member.queued > 0:
        return True
    last = member.last_active_time
    if last is None or now - last > params.demand_window:
        return False
    released = released_at(member)
    return released is None or last > released


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


def _forced(snapshot: GroupSnapshot) -> Member | None:
    forced = [m for m in snapshot.members if m.force_promotion and not m.leaving]
    if forced:
        return best(forced)
    promoted = [m for m in snapshot.members if m.promoted_at is not None and not m.leaving]
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


def _active_candidate(snapshot: GroupSnapshot, candidates: list[Member]) -> Member | None:
    """The member on the GPU now, when it is still one of the ``candidates`` (not idle past its timeout, eligible)."""
    active = snapshot.member(snapshot.active)
    return active if active is not None and active in candidates else None


def choose_shared_group_leader(snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> Election:
    """The v1alpha2 election (see the module docstring). Pure: reads only its arguments."""
    first = _overrides_then_candidates(snapshot, now, lambda m: m.idle_timeout)
    if isinstance(first, Election):
        return first
    expired, candidates = first

    active = snapshot.member(snapshot.active)

    # Stage 1: anti-thrashing.
    if active is not None and active in candidates and seed_cooldown_remaining(snapshot, now, params) > timedelta(0):
        return Election(active.key, ElectionReason.COOLDOWN, expired)

    # Stage 2: classify.
    ready = best(m for m in candidates if m.loaded)
    recent = best(m for m in candidates if m.last_active_time and now - m.last_active_time <= params.recent_window)
    demanded = best(m for m in candidates if m.last_active_time and now - m.last_active_time <= params.demand_window)
    fallback = best(candidates)

    # Stage 3: demand-based preemption, the only path where a swap away from a loaded model can happen.
    if demanded is not None and (
        ready is None or (_is_idle(ready, now, params.demand_window) and demanded.priority >= ready.priority)
    ):
        return Election(demanded.key, ElectionReason.DEMAND, expired)

    # Stage 4: fallback.
    return _stage_four(ready, recent, fallback, expired)


def hold_ends(holder: Member, snapshot: GroupSnapshot, params: ElectionParams) -> datetime | None:
    """FlexInfer's policy: until when a busy holder keeps the GPU (None: it is still loading, and holds until its
    load is done). The group's ``swapCooldown`` after the latest preemption, as in the seed, when a member sets one
    (or the operator set FLEXINFER_DEFAULT_SWAP_COOLDOWN); else ``hold_factor`` x the holder's own measured load
    time (from its activate to Ready) from when it became Ready, so a load pays for itself."""
    explicit = [m.swap_cooldown for m in snapshot.members if m.swap_cooldown is not None]
    if params.explicit_swap_cooldown is not None:
        explicit.append(params.explicit_swap_cooldown)
    if explicit:
        latest = max((m.preempted_at for m in snapshot.members if m.preempted_at), default=None)
        end = latest + max(explicit) if latest is not None else None
        if holder.ready_since is None:
            return None
        return max(end, holder.ready_since) if end is not None else holder.ready_since
    if holder.ready_since is None:
        return None
    issued = holder.command_issued_at
    load = holder.ready_since - issued if issued is not None and issued <= holder.ready_since else params.hold_min
    hold = min(params.hold_max, max(params.hold_min, load * params.hold_factor))
    return holder.ready_since + hold


def worth_a_load(member: Member, holder: Member, now: datetime, params: ElectionParams) -> bool:
    """Whether the waiting a swap from the quiet ``holder`` to ``member`` would end is worth a load:
    - a member of higher priority than the holder: at once (a guest gives the GPU back as soon as it is quiet);
    - one of priority >= the holder's that waited past its bound (``maxWait``), or any whose oldest request waited
      the patience: 60 s, a peer 150 s; no request waits longer than that for a quiet GPU. A peer's is longer as
      the holder's session is as much a user's as its own: yielding in mid-session, between two of the holder's
      requests, costs a load back (on fresh many-models days 21 of 37 yields at 100 s were followed by a request
      for the holder within a minute). A lower priority's is short because it is asked rarely (an image model, a
      vision model beside a chat): the holder's load back is the same whenever it yields, and earlier is a shorter
      wait (the homelab days' median worst p95 167 -> 137 s at 100 -> 60 s, swaps as before);
    - a peer (the holder's priority) with a few requests waiting (``few``, at most 4): otherwise only once the holder
      was not asked for the session gap (1 min): its session's next turn usually comes within that, and a swap for
      a few requests is a load there and, when the holder is asked again, a load back. A user who moved from one
      model to the other waits about a minute less the time since the holder's last request;
    - else once its requests waiting x how long it has waited reach ``yield_after`` (request-seconds), scaled down
      the longer the holder has gone without a request (to nothing once it was not asked for the demand window, or
      never was: it is not coming back soon): a crowd, or a lower priority, takes a quiet GPU in seconds.
    """
    if member.priority > holder.priority:
        return True
    bound = params.max_wait(member)
    waiting = waited(member, now)
    patience = params.peer_patience if member.priority == holder.priority else params.patience
    if (bound is not None and member.priority >= holder.priority and waiting >= bound) or waiting >= patience:
        return True
    last = holder.last_active_time  # a holder nobody asked for (loaded as the fallback) is not coming back
    idle = (now - last).total_seconds() if last is not None else float("inf")
    if member.priority == holder.priority and member.queued <= params.few:
        return idle >= params.session_gap.total_seconds()
    hot = max(0.0, 1.0 - idle / params.demand_window.total_seconds())
    pressure = max(1, member.queued) * waiting.total_seconds()
    return pressure >= params.yield_after.total_seconds() * hot


def most_pressing(waiting: Iterable[Member], now: datetime, params: ElectionParams) -> Member | None:
    """Whom a quiet holder yields to: the highest priority, then one past its bound, then the most waiting ended
    by one load (requests waiting x how long), then the seed's tie-break."""

    def key(m: Member) -> tuple[int, bool, float, tuple[int, float, str, str]]:
        bound = params.max_wait(m)
        late = bound is not None and waited(m, now) >= bound
        return (-m.priority, not late, -max(1, m.queued) * waited(m, now).total_seconds(), rank(m))

    return min(waiting, key=key, default=None)


def first_in_line(waiting: Iterable[Member], now: datetime) -> Member | None:
    """FlexInfer's queue order: the highest priority, then members with requests waiting before those only named
    by a demand, then the longest waiting, then the seed's tie-break."""
    return min(waiting, key=lambda m: (-m.priority, m.queued == 0, m.demand_since or now, rank(m)), default=None)


def choose_flexinfer_leader(snapshot: GroupSnapshot, now: datetime, params: ElectionParams) -> Election:
    """FlexInfer's v1alpha2 election (the default policy). Pure: reads only its arguments.

    After the lease and forcePromotion, and with members idle past their timeout left out (as in the seed):
    1. an empty GPU goes to the first in line (``first_in_line``) of the members asked for (``asked_for``), else as
       the seed's stage 4 (ready > recent > fallback, never a model whose idle timeout ran out since it was asked,
       and, one model at a time, the fallback only when one member has the highest priority: peers wait for the
       first request);
    2. a quiet holder (nothing in flight or queued, no request for ``quiet_period``; at once for one nobody ever
       asked for) yields to the most pressing member whose wait is worth a load (``worth_a_load``), whatever the
       priorities: it is parked as idle (no preemption, no cooldown) and returns when asked again;
    3. a busy holder keeps the GPU until its hold ends (``hold_ends``: its load paid for);
    4. then a member of higher priority with requests waiting takes it (the holder drains first);
    5. then a member of priority >= the holder's whose requests waited past its bound (``maxWait``);
    6. else the holder keeps it. Lower priority never takes the GPU from a busy holder.
    """
    first = _overrides_then_candidates(snapshot, now, lambda m: m.idle_timeout)
    if isinstance(first, Election):
        return first
    expired, candidates = first
    holder = _active_candidate(snapshot, candidates)
    waiting = [m for m in candidates if m is not holder and asked_for(m, now, params)]
    if holder is None:
        taker = first_in_line(waiting, now)
        if taker is not None:
            return Election(taker.key, ElectionReason.DEMAND, expired)
        return _fallback(candidates, now, params, expired, side_by_side=snapshot.capacity is not None)
    # (a holder nobody ever asked for, loaded as the fallback, is quiet as soon as nothing is in flight: there is no
    # request its load must be kept for)
    never_asked = holder.last_active_time is None and not holder.in_flight and not holder.queued
    if never_asked or is_quiet(holder, now, params.quiet_period):
        taker = most_pressing((m for m in waiting if worth_a_load(m, holder, now, params)), now, params)
        if taker is not None:
            return Election(taker.key, ElectionReason.QUIET_YIELD, (*expired, holder.key))
        return Election(holder.key, ElectionReason.READY, expired)
    ends = hold_ends(holder, snapshot, params)
    if ends is None or now < ends:
        return Election(holder.key, ElectionReason.COOLDOWN, expired)
    pressing = [m for m in waiting if m.queued > 0]
    higher = first_in_line((m for m in pressing if m.priority > holder.priority), now)
    if higher is not None:
        return Election(higher.key, ElectionReason.DEMAND, expired)
    late = _longest_overdue(pressing, holder.priority, holder, now, params)
    if late is not None:
        return Election(late.key, ElectionReason.MAX_WAIT, expired)
    return Election(holder.key, ElectionReason.READY, expired)


def favourite(members: Sequence[Member]) -> Member | None:
    """``best`` of the members when it is the only one of its priority; None when none, or when peers share it."""
    top = best(members)
    if top is None or any(m is not top and m.priority == top.priority for m in members):
        return None
    return top


def _fallback(
    candidates: list[Member],
    now: datetime,
    params: ElectionParams,
    expired: tuple[ModelKey, ...],
    *,
    side_by_side: bool,
) -> Election:
    """The seed's stage 4 for an unasked group: readyLeader > recentLeader > fallbackLeader, never loading a model
    whose idle timeout ran out since it was last asked for. On a card that holds one model at a time the fallback
    is loaded only when one member has the highest priority (``favourite``): among peers the pick is a coin toss
    whose load is lost, and a swap away, as soon as the first request is for another one; the GPU waits for that
    request instead. (With a capacity the others load beside it, so nothing is lost.)"""
    ready = best(m for m in candidates if m.loaded)
    unasked = [m for m in candidates if m.loaded or not idle_timeout_expired(m, now, m.idle_timeout, loaded=False)]
    recent = best(m for m in unasked if m.last_active_time and now - m.last_active_time <= params.recent_window)
    fallback = best(unasked) if side_by_side else favourite(unasked)
    return _stage_four(ready, recent, fallback, expired)


def _stage_four(
    ready: Member | None, recent: Member | None, fallback: Member | None, expired: tuple[ModelKey, ...]
) -> Election:
    """The seed's stage 4: readyLeader > recentLeader > fallbackLeader, else no leader (both policies)."""
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
    incumbent = _active_candidate(snapshot, candidates)
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
    params = params_for(snapshot, params)
    if params.policy is SchedulingPolicy.SEED:
        return choose_shared_group_leader(snapshot, now, params)
    return choose_flexinfer_leader(snapshot, now, params)
