"""A GPUGroup changed in Kubernetes moves a model that holds its group's GPU only once the model is parked there
(issue 22: a change of membership must never leave two groups each scheduling one loaded model, nor a model running
on a card another group schedules). The scheduler's real loop and spec inbox on the in-memory ports, with an
actuator that runs a process per activated model and stops it on a park."""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from flexinfer_common import subjects
from flexinfer_common.bus import Delivery
from flexinfer_common.enums import ScaleAction, SwapReason
from flexinfer_common.keys import ModelKey
from flexinfer_common.manifests import GPUGroup
from flexinfer_common.messages import ModelStatusUpdate, ScaleCommand, SpecChange, SwapEvent
from flexinfer_scheduler.adapters.memory import MemoryBus, MemoryLeaderLock, MemoryStore
from flexinfer_scheduler.loop import Scheduler
from flexinfer_scheduler.ports import API_ORIGIN, GroupChangeRefused, Origin
from flexinfer_scheduler.settings import SchedulerSettings
from flexinfer_scheduler.specs import SpecInbox
from tests.unit.test_admin_api_machine import NAMES, AdminApiMachine, manifest
from tests.unit.test_scheduler_deletion import StrictActuator, World
from tests.unit.test_scheduler_loop import LoopClock

A = ModelKey("default", "a")
pytestmark = [pytest.mark.looptime, pytest.mark.asyncio(loop_scope="function")]


def change(
    kind: Literal["Model", "GPUGroup"], name: str, manifest: dict[str, Any] | None, w: World, generation: int
) -> SpecChange:
    return SpecChange(
        kind=kind,
        action="apply" if manifest is not None else "delete",
        namespace="default",
        name=name,
        manifest=manifest,
        generation=generation,
        observed_at=w.clock.now(),
        time=w.clock.now(),
    )


MODEL_A = {
    "apiVersion": "ai.flexinfer/v1alpha2",
    "kind": "Model",
    "metadata": {"name": "a", "namespace": "default"},
    "spec": {"local": {"command": ["serve", "{port}"]}},  # no spec.gpu.shared: its GPUGroup says where it runs
}
GROUP_G1 = {
    "apiVersion": "ai.flexinfer/v1alpha1",
    "kind": "GPUGroup",
    "metadata": {"name": "g1", "namespace": "default"},
    "spec": {"models": [{"name": "a", "priority": 10}]},
}


async def test_a_gpugroup_deleted_in_kubernetes_parks_its_loaded_model_there_before_it_moves() -> None:
    store, bus, clock = MemoryStore(), MemoryBus(), LoopClock()
    settings = SchedulerSettings(reconcile_interval=3, drain_timeout=20, activity_report_interval=1)
    scheduler = Scheduler(store=store, bus=bus, lock=MemoryLeaderLock(), settings=settings, clock=clock)
    actuator = StrictActuator(bus, clock)
    w = World(store, bus, scheduler, actuator, clock)
    inbox = SpecInbox(store=store, hooks=scheduler, clock=clock)

    async def spec(message: SpecChange) -> None:
        await inbox.handle(message, Delivery(f"flexinfer.spec.{message.kind}.default.{message.name}", "1", 1))

    stop = asyncio.Event()
    tasks = [asyncio.create_task(scheduler.run(stop)), asyncio.create_task(actuator.run())]
    try:
        await spec(change("Model", "a", MODEL_A, w, 1))
        await spec(change("GPUGroup", "g1", GROUP_G1, w, 1))
        await store.set_promoted("default", "a", clock.now())  # (v1alpha1: elected without waiting for demand)
        scheduler.kick()
        await w.until(lambda: w.serving(A) and store.models[A].group_name == "g1")

        await spec(change("GPUGroup", "g1", None, w, 2))  # deleted in the cluster: a's own group from now on
        row = store.models[A]
        assert row.group_name == "g1" and row.moving_to == "solo.default.a"  # not moved while it holds g1's card
        await w.until(lambda: store.models[A].group_name == "solo.default.a")
        await w.until(lambda: w.serving(A))  # its own group elects it: it serves again
        assert "g1" not in store.groups  # the group went once its last model left it
    finally:
        stop.set()
        tasks[1].cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    sent = [m for m in bus.messages(subjects.COMMAND_PREFIX) if isinstance(m, ScaleCommand)]
    by_generation = {m.generation: (m.action, m.group) for m in sent}  # (a command re-sent has its generation)
    assert [by_generation[g] for g in sorted(by_generation)] == [
        (ScaleAction.ACTIVATE, "g1"),
        (ScaleAction.PARK, "g1"),  # parked in the group it held, and confirmed, before its own group activates it
        (ScaleAction.ACTIVATE, "solo.default.a"),
    ]
    swaps = [m for m in bus.messages(subjects.EVENTS_PREFIX + ".swap") if isinstance(m, SwapEvent)]
    assert any(s.kind == "swap.started" and s.reason == SwapReason.GROUP_CHANGE and s.group == "g1" for s in swaps)
    messages = [
        m.status.message for m in bus.messages(subjects.MODEL_STATUS_PREFIX) if isinstance(m, ModelStatusUpdate)
    ]
    assert any(m.startswith("moving to a group of its own once parked in group 'g1'") for m in messages)


GPUGROUPS = {"v1": "api", "v2": "kubernetes"}  # v1 is written through the admin API, v2 comes from the cluster


class MembershipMachine(AdminApiMachine):
    """The admin-API state machine with GPUGroups too: models without ``spec.gpu.shared`` are grouped by the
    GPUGroup that lists them; ``v1`` is applied and deleted through the admin API (a move of a loaded model is
    refused), ``v2`` from Kubernetes (such a move waits for the park). After every step, beyond the admin API's
    invariants: never two processes in any group, and a running model runs in the group the scheduler has it in."""

    def __init__(self) -> None:
        super().__init__()
        self.observed = 0

    def origin(self, gpugroup: str) -> Origin:
        if GPUGROUPS[gpugroup] == "api":
            return API_ORIGIN
        self.observed += 1
        return Origin("kubernetes", self.clock.now(), self.observed)

    @rule(name=st.sampled_from(NAMES), priority=st.integers(0, 3))
    def apply_without_a_group(self, name: str, priority: int) -> None:
        model = manifest(name, "gpu", priority).model_copy(deep=True)
        model.spec.gpu.shared = None
        try:
            row, created = self.run(self.store.put_model(model, self.clock.now()))
        except GroupChangeRefused:
            return
        if created:
            self.run(self.scheduler.announce(row))
        self.scheduler.kick()

    @rule(
        gpugroup=st.sampled_from(sorted(GPUGROUPS)),
        members=st.lists(st.sampled_from(NAMES), min_size=1, max_size=3, unique=True),
    )
    def apply_gpugroup(self, gpugroup: str, members: list[str]) -> None:
        resource = GPUGroup.model_validate(
            {
                "apiVersion": "ai.flexinfer/v1alpha1",
                "kind": "GPUGroup",
                "metadata": {"name": gpugroup},
                "spec": {"models": [{"name": m, "priority": i} for i, m in enumerate(members)]},
            }
        )
        try:
            self.run(self.store.put_gpugroup(resource, self.clock.now(), self.origin(gpugroup)))
        except GroupChangeRefused:
            assert GPUGROUPS[gpugroup] == "api", "a change from Kubernetes is never refused"
            return
        self.scheduler.kick()

    @rule(gpugroup=st.sampled_from(sorted(GPUGROUPS)))
    def delete_gpugroup(self, gpugroup: str) -> None:
        try:
            self.run(self.store.delete_group(gpugroup, self.origin(gpugroup)))
        except GroupChangeRefused:
            assert GPUGROUPS[gpugroup] == "api", "a deletion from Kubernetes is never refused"
            return
        self.scheduler.kick()

    @invariant()
    def never_two_processes_in_any_group(self) -> None:
        for group in set(self.groups.values()):
            holding = sorted(str(k) for k in self.running if self.groups[k] == group)
            assert len(holding) <= 1, f"two models run in {group}: {holding}"

    @invariant()
    def a_running_model_runs_in_its_group(self) -> None:
        for key in self.running:
            row = self.store.models.get(key)
            if row is not None:  # (a deleted one is the invariant above)
                assert row.group_name == self.groups[key], f"{key} runs in {self.groups[key]}, is in {row.group_name}"


MembershipMachine.TestCase.settings = settings(max_examples=100, stateful_step_count=50, deadline=None)
TestMembershipMachine = MembershipMachine.TestCase
