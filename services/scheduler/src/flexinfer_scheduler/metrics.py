"""The scheduler's metrics (docs/reference.md section 5); no other service registers them.

The per-group gauges describe the groups as the leader sees them, so only the leader shows them, and a group or a
member that goes away takes its series along (:class:`GroupGauges`): a dashboard never shows a deleted model as
the active one, and a standby never shows what it saw while it led.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import CollectorRegistry

from flexinfer_common.enums import ScaleAction
from flexinfer_scheduler.domain.model import GroupSnapshot
from flexinfer_scheduler.domain.plan import GroupPlan
from flexinfer_scheduler.domain.residency import device_usage


class _Series:
    """Labelled values kept as plain numbers and exposed when scraped, as one metric family of ``_family``'s kind (a
    prometheus_client child per label set took tens of microseconds to create: 1,000 groups swapping at once made
    1,000 of them in one pass)."""

    _family: type[CounterMetricFamily] | type[GaugeMetricFamily]

    def __init__(self, name: str, documentation: str, labelnames: tuple[str, ...], registry: CollectorRegistry) -> None:
        self.name, self.documentation, self._labelnames = name, documentation, labelnames
        self._values: dict[tuple[str, ...], float] = {}
        registry.register(self)

    def describe(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield self._family(self.name, self.documentation, labels=self._labelnames)

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        family = self._family(self.name, self.documentation, labels=self._labelnames)
        for labels, value in list(self._values.items()):
            family.add_metric(labels, value)
        yield family


class SeriesCounter(_Series):
    """A counter with labels (see :class:`_Series`)."""

    _family = CounterMetricFamily

    def inc(self, *labels: str, amount: float = 1.0) -> None:
        self._values[labels] = self._values.get(labels, 0.0) + amount

    def value(self, *labels: str) -> float:
        return self._values.get(labels, 0.0)


class SeriesGauge(_Series):
    """A gauge with labels (see :class:`_Series`: a first pass over 10,000 models sets one series per model)."""

    _family = GaugeMetricFamily

    def set(self, value: float, *labels: str) -> None:
        self._values[labels] = value

    def remove(self, *labels: str) -> None:
        self._values.pop(labels, None)


class SeriesHistogram:
    """A histogram with labels, kept as plain bucket counts and exposed when scraped (a prometheus_client child
    holds a lock per bucket: creating 3,000 of them, a phase for each of 1,000 groups, was a third of a second)."""

    def __init__(
        self,
        name: str,
        documentation: str,
        labelnames: tuple[str, ...],
        buckets: tuple[float, ...],
        registry: CollectorRegistry,
    ) -> None:
        self.name, self.documentation, self._labelnames = name, documentation, labelnames
        self._bounds = (*buckets, math.inf)
        self._series: dict[tuple[str, ...], list[float]] = {}  # a count per bucket (not cumulative), then the sum
        registry.register(self)

    def observe(self, value: float, *labels: str) -> None:
        series = self._series.get(labels)
        if series is None:
            series = self._series[labels] = [0.0] * (len(self._bounds) + 1)
        series[bisect.bisect_left(self._bounds, value)] += 1  # the first bucket whose bound is >= value
        series[-1] += value

    def describe(self) -> Iterator[HistogramMetricFamily]:
        yield HistogramMetricFamily(self.name, self.documentation, labels=self._labelnames)

    def collect(self) -> Iterator[HistogramMetricFamily]:
        family = HistogramMetricFamily(self.name, self.documentation, labels=self._labelnames)
        for labels, series in list(self._series.items()):
            total, buckets = 0.0, []
            for bound, count in zip(self._bounds, series, strict=False):
                total += count
                buckets.append(("+Inf" if bound == math.inf else repr(float(bound)), total))
            family.add_metric(list(labels), buckets, series[-1])
        yield family


SWAPS = SeriesCounter(
    "flexinfer_swaps_total", "Swaps started", ("group", "from_model", "to_model", "reason"), registry=REGISTRY
)
MODEL_RESTARTS = SeriesCounter(
    "flexinfer_model_restarts_total",
    "Model servers that crashed after they were Ready (each is restarted)",
    ("namespace", "model"),
    registry=REGISTRY,
)
SWAP_DURATION = SeriesHistogram(
    "flexinfer_swap_duration_seconds",
    "Time spent in each swap phase",
    ("group", "phase"),
    buckets=(0.1, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
    registry=REGISTRY,
)
ELECTION_DURATION = Histogram(
    "flexinfer_election_duration_seconds",
    "Time for one election pass over all groups",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
GROUP_ACTIVE_MODEL = SeriesGauge(
    "flexinfer_group_active_model",
    "1 for the active model of a group, 0 for its other members (only on the leading scheduler)",
    ("group", "model"),
    registry=REGISTRY,
)
GROUP_SWAP_STARTED = SeriesGauge(
    "flexinfer_group_swap_started_timestamp_seconds",
    "When the swap a group is in started (Unix time); no series while the group is not swapping",
    ("group",),
    registry=REGISTRY,
)
GROUP_MEMORY = SeriesGauge(
    "flexinfer_group_memory_bytes",
    "A group with a spec.capacity: per device, the GPU memory of its models not confirmed parked (state=used) and "
    "what is left (state=free)",
    ("group", "device", "state"),
    registry=REGISTRY,
)
LEASE_READ_ERRORS = Counter("flexinfer_lease_read_errors_total", "Lease reads that failed (election failed open)")
SCHEDULER_LEADER = Gauge("flexinfer_scheduler_leader", "1 while this scheduler replica leads (holds the lock)")


@dataclass(frozen=True)
class GroupView:
    """What the per-group gauges show of one group after a pass."""

    members: frozenset[str]
    active: str | None
    swap_started: datetime | None
    residents: frozenset[str] = frozenset()  # a group with a capacity: every model it holds
    memory: tuple[tuple[str, str, int], ...] = ()  # (device, used|free, bytes)


def group_view(group: GroupSnapshot, plan: GroupPlan) -> GroupView:
    """The gauges' view of a group after ``plan`` (made from the snapshot ``group``). Pure."""
    started = None
    if plan.swap_id is not None:
        started = next((u.swap.started_at for u in plan.swap_updates if u.swap.id == plan.swap_id), None)
        if started is None and group.swap is not None and group.swap.id == plan.swap_id:
            started = group.swap.started_at
    residents: frozenset[str] = frozenset()
    memory: tuple[tuple[str, str, int], ...] = ()
    if group.capacity is not None:
        after = plan.members.values() if plan.members else group.members
        residents = frozenset(m.key.name for m in after if m.desired_action is ScaleAction.ACTIVATE)
        memory = tuple(
            (str(d.index), state, value)
            for d in device_usage(group.capacity, after)
            for state, value in (("used", d.used), ("free", d.free))
        )
    return GroupView(
        members=frozenset(member.key.name for member in group.members),
        active=plan.active.name if plan.active else None,
        swap_started=started,
        residents=residents,
        memory=memory,
    )


class GroupGauges:
    """``flexinfer_group_active_model`` and ``flexinfer_group_swap_started_timestamp_seconds``: set from each pass,
    writing only what changed, and removing the series of members and groups that went away."""

    def __init__(self) -> None:
        self._shown: dict[str, GroupView] = {}

    def show(self, group: str, view: GroupView) -> None:
        before = self._shown.get(group)
        if before == view:
            return
        old_members = before.members if before else frozenset()
        for gone in old_members - view.members:
            GROUP_ACTIVE_MODEL.remove(group, gone)
        for member in view.members:
            GROUP_ACTIVE_MODEL.set(1 if member == view.active or member in view.residents else 0, group, member)
        for device, state, _ in before.memory if before else ():
            if not any((device, state) == (d, s) for d, s, _ in view.memory):
                GROUP_MEMORY.remove(group, device, state)
        for device, state, value in view.memory:
            GROUP_MEMORY.set(value, group, device, state)
        if view.swap_started is not None:
            GROUP_SWAP_STARTED.set(view.swap_started.timestamp(), group)
        elif before is not None and before.swap_started is not None:
            GROUP_SWAP_STARTED.remove(group)
        self._shown[group] = view

    def retain(self, groups: Iterable[str]) -> None:
        """Remove the series of every group not in ``groups`` (the groups that exist after a full pass)."""
        keep = set(groups)
        for group in [g for g in self._shown if g not in keep]:
            self._forget(group)

    def clear(self) -> None:
        """Remove every series (this replica no longer leads)."""
        self.retain(())

    def _forget(self, group: str) -> None:
        view = self._shown.pop(group)
        for member in view.members:
            GROUP_ACTIVE_MODEL.remove(group, member)
        for device, state, _ in view.memory:
            GROUP_MEMORY.remove(group, device, state)
        if view.swap_started is not None:
            GROUP_SWAP_STARTED.remove(group)
