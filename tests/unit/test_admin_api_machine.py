"""A hypothesis state machine over what the admin API does (apply, delete, promote, apply again) and what the
actuator reports, on the scheduler's real loop and its in-memory ports (issue 22, "invariants under every API call").

The fake actuator behaves as the real one where it matters: one process per activated model, stopped by a park; a
command whose generation is not above the last it applied for its model is ignored (remembered across the model's
deletion). It handles the commands in the order they were published, one per step, so any interleaving of API calls,
election passes and reports is tried. After every step: never two processes of one group (the actuator's view,
which is what a GPU sees), no process left for a model whose row is gone, and no command of a lower generation than
one the actuator applied for that model (a generation never goes backwards across delete and re-apply).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from flexinfer_common import subjects
from flexinfer_common.enums import RuntimePhase
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import Model
from flexinfer_common.messages import ScaleCommand
from flexinfer_scheduler.adapters.memory import MemoryBus, MemoryLeaderLock, MemoryStore
from flexinfer_scheduler.loop import Scheduler
from flexinfer_scheduler.ports import GroupChangeRefused
from flexinfer_scheduler.settings import SchedulerSettings
from tests.support.actuator import done, reported

T = TypeVar("T")
NAMES = ("a", "b", "c")
GROUPS = ("gpu", "gpu2")
START = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


class ManualClock:
    def __init__(self) -> None:
        self.at = START

    def now(self) -> datetime:
        return self.at


def manifest(name: str, group: str, priority: int) -> Model:
    return Model.model_validate(
        {
            "apiVersion": "ai.flexinfer/v1alpha2",
            "kind": "Model",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"gpu": {"shared": group, "priority": priority}, "local": {"command": ["serve", "{port}"]}},
        }
    )


class AdminApiMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.store, self.bus = MemoryStore(), MemoryBus()
        settings_ = SchedulerSettings(reconcile_interval=3, drain_timeout=20, activity_report_interval=1)
        self.scheduler = Scheduler(
            store=self.store, bus=self.bus, lock=MemoryLeaderLock(), settings=settings_, clock=self.clock
        )
        self.run(self.scheduler._become_leader())
        self.scheduler.is_leader = True
        self.groups: dict[ModelKey, str] = {}  # the group of each process, as it was applied when started
        self.running: set[ModelKey] = set()
        self.applied: dict[ModelKey, int] = {}
        self.handled = 0
        self.backwards: list[str] = []

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coroutine)

    def teardown(self) -> None:
        self.loop.close()

    # -- the admin API -------------------------------------------------------------------------------------------
    @rule(name=st.sampled_from(NAMES), group=st.sampled_from(GROUPS), priority=st.integers(0, 3))
    def apply(self, name: str, group: str, priority: int) -> None:
        """PUT /api/v1/models/default/<name>: create, change (its group too), or apply again while deleted."""
        try:
            row, created = self.run(self.store.put_model(manifest(name, group, priority), self.clock.now()))
        except GroupChangeRefused:
            return  # 409: a model that may hold its GPU does not move to another group
        if created:
            self.run(self.scheduler.announce(row))
        self.scheduler.kick()

    @rule(name=st.sampled_from(NAMES))
    def delete(self, name: str) -> None:
        """DELETE /api/v1/models/default/<name> (as the API handler: the route goes when the row goes at once)."""
        deleted = self.run(self.store.request_deletion("default", name, self.clock.now()))
        if deleted is not None and deleted[1]:
            self.run(self.scheduler.forget_route("default", name))
        self.scheduler.kick()

    @rule(name=st.sampled_from(NAMES))
    def promote(self, name: str) -> None:
        self.run(self.store.set_promoted("default", name, self.clock.now()))
        self.scheduler.kick()

    # -- the scheduler and time ----------------------------------------------------------------------------------
    @rule()
    def election_pass(self) -> None:
        self.run(self.scheduler.reconcile())

    @rule(seconds=st.integers(1, 30))
    def time_passes(self, seconds: int) -> None:
        self.clock.at += timedelta(seconds=seconds)

    # -- the actuator --------------------------------------------------------------------------------------------
    @rule()
    def actuator_handles_the_next_command(self) -> None:
        commands = [m for m in self.bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
        if self.handled >= len(commands):
            return
        command = commands[self.handled]
        self.handled += 1
        key = ModelKey(command.namespace, command.model)
        last = self.applied.get(key, 0)
        if command.generation < last:
            self.backwards.append(f"{key} got generation {command.generation} after {last}")
        if command.generation <= last:
            return  # stale: ignored, as the real actuator does
        self.applied[key] = command.generation
        phase = done(command)
        if phase is RuntimePhase.READY:
            self.running.add(key)
            self.groups[key] = command.group
        else:
            self.running.discard(key)
        subject, status = reported(key.namespace, key.name, phase, command.generation, self.clock.now())
        self.run(self.bus.deliver(subject, status.to_bytes()))

    # -- what must hold after every step -------------------------------------------------------------------------
    @invariant()
    def never_two_processes_of_one_group(self) -> None:
        for group in GROUPS:
            holding = sorted(str(k) for k in self.running if self.groups[k] == group)
            assert len(holding) <= 1, f"two models run on {group}: {holding}"

    @invariant()
    def no_orphan_process_after_a_delete(self) -> None:
        orphans = [str(k) for k in self.running if k not in self.store.models]
        assert not orphans, f"processes of deleted models: {orphans}"

    @invariant()
    def generations_never_go_backwards(self) -> None:
        assert not self.backwards, self.backwards


AdminApiMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=60, deadline=None)
TestAdminApiMachine = AdminApiMachine.TestCase
