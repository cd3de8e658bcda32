"""Fencing end to end: two scheduler replicas take the real leader lock (a PostgreSQL advisory lock) in turn, each
gets its epoch from the database's sequence, and the actuator on real NATS obeys the new leader while refusing the
deposed one's commands, however high their generations (issue 22: a command that does not come from the current
leader is refused, not merely one with a lower number)."""

from __future__ import annotations

import pytest

from flexinfer_actuator.metrics import ACTUATOR_COMMANDS
from flexinfer_common.bus import Bus
from flexinfer_common.enums import RuntimePhase, ScaleAction
from flexinfer_scheduler.adapters.bus import AdvisoryLock
from tests.integration.test_actuator_local import (  # noqa: F401  (fixtures)
    StartActuator,
    StatusLog,
    debug_logs,
    send,
    start_actuator,
    statuses,
)
from tests.support.processes import alive
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


async def test_the_actuator_obeys_only_the_current_leader(
    bus: Bus,
    database_url: str,
    statuses: StatusLog,  # noqa: F811
    start_actuator: StartActuator,  # noqa: F811
) -> None:
    old, new = AdvisoryLock(database_url, 4242), AdvisoryLock(database_url, 4242)
    assert await old.try_acquire()
    assert not await new.try_acquire()  # one leader at a time
    deposed_epoch = old.epoch
    await old.release()  # the old leader's connection dropped: it is deposed, though it may still be sending
    assert await new.try_acquire()
    assert new.epoch > deposed_epoch > 0
    fenced = ACTUATOR_COMMANDS.labels(action="park", result="fenced")
    before = fenced._value.get()

    actuator = await start_actuator()
    await send(bus, "echo", ScaleAction.ACTIVATE, 15, epoch=deposed_epoch)  # the old leader, before the takeover
    await statuses.wait_for("echo", RuntimePhase.READY, generation=15)
    await send(bus, "echo", ScaleAction.ACTIVATE, 1, epoch=new.epoch)  # the new leader: lower generation, obeyed
    ready = await statuses.wait_for("echo", RuntimePhase.READY, generation=1)
    assert actuator.highest_epoch == new.epoch

    await send(bus, "echo", ScaleAction.PARK, 1_000_000, epoch=deposed_epoch)  # the deposed leader: refused
    await wait_for(lambda: fenced._value.get() == before + 1, what="the deposed leader's park refused")
    await send(bus, "echo", ScaleAction.ACTIVATE, 2, epoch=new.epoch)  # later in the stream than the refused park
    await statuses.wait_for("echo", RuntimePhase.READY, generation=2)
    assert (RuntimePhase.STOPPING, 1_000_000) not in statuses.sequence("echo")
    assert ready.pid is not None and alive(ready.pid)

    await send(bus, "echo", ScaleAction.PARK, 3, epoch=new.epoch)
    await statuses.wait_for("echo", RuntimePhase.PARKED, generation=3)
    await new.release()
