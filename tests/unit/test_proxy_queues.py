"""The proxy's queues and demand signalling at run time, against an in-memory publisher (no NATS, no HTTP)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime

import pytest
from prometheus_client import REGISTRY
from pydantic import BaseModel

from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Demand, Route
from flexinfer_proxy.adapters.demand_publisher import DemandSignaller
from flexinfer_proxy.domain.errors import ErrorCode, ProxyError, shutting_down
from flexinfer_proxy.domain.routes import RouteTable
from flexinfer_proxy.queues import ModelQueues

KEY = ModelKey("default", "m")
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def route(*, ready: bool = False, failure: str | None = None) -> Route:
    return Route(
        namespace="default",
        name="m",
        ready=ready,
        endpoint="http://127.0.0.1:1" if ready else None,
        failure=failure,
        updated_at=T0,
    )


class FakePublisher:
    """Records what would go on the bus; ``down`` makes every publish fail like a dead NATS."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, Demand]] = []
        self.down = False
        self.sent_event = asyncio.Event()

    @property
    def connected(self) -> bool:
        return not self.down

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None:
        if self.down:
            raise ConnectionError("nats: no servers available")
        assert isinstance(message, Demand) and msg_id
        self.sent.append((subject, message))
        self.sent_event.set()

    def queued(self) -> list[int]:
        return [m.queued for _, m in self.sent]

    async def until(self, predicate: Callable[[list[int]], bool], *, within: float = 2.0) -> None:
        async with asyncio.timeout(within):
            while not predicate(self.queued()):
                self.sent_event.clear()
                await self.sent_event.wait()


class Rig:
    def __init__(self, *, queue_timeout: float = 5.0, refresh: float = 10.0) -> None:
        self.table = RouteTable([route()])
        self.publisher = FakePublisher()
        self.demand = DemandSignaller(
            self.publisher, source="proxy-test", refresh_interval=refresh, activity_interval=1.0
        )
        self.queues = ModelQueues(routes=self.table.get, demand=self.demand, queue_timeout=queue_timeout)

    def set_route(self, new: Route | None) -> None:
        if new is None:
            self.table.remove(KEY)
        else:
            self.table.put(new)
        self.queues.route_changed(KEY)

    async def request(self, log: list[str], name: str) -> str:
        """A queued request: wait for its turn, "forward" (log), leave."""
        waiter = self.queues.join(KEY)
        try:
            await self.queues.wait_turn(KEY, waiter)
            log.append(name)
            self.queues.leave(KEY, waiter)  # the forward started
            await asyncio.sleep(0)
            return name
        finally:
            self.queues.leave(KEY, waiter)


async def one_wait(made: Rig) -> ProxyError:
    """One request waits for its turn (the demand signaller running) until it is refused: the refusal."""
    await made.demand.start()
    try:
        waiter = made.queues.join(KEY)
        with pytest.raises(ProxyError) as caught:
            await made.queues.wait_turn(KEY, waiter)
        made.queues.leave(KEY, waiter)
    finally:
        await made.demand.stop()
    return caught.value


@pytest.fixture
async def rig() -> AsyncIterator[Rig]:
    made = Rig()
    await made.demand.start()
    yield made
    await made.demand.stop()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def test_queued_request_signals_demand_at_once_then_zero_when_served(rig: Rig) -> None:
    served: list[str] = []
    task = asyncio.create_task(rig.request(served, "a"))
    await rig.publisher.until(lambda q: q == [1])
    subject, demand = rig.publisher.sent[0]
    assert subject == "flexinfer.demand.default.m"
    assert (demand.model, demand.namespace, demand.source) == ("m", "default", "proxy-test")
    assert demand.valid_for == 35  # three of its 10 s refreshes and a margin: the scheduler keeps the count that long
    assert rig.queues.snapshot()[0].queued == 1

    rig.set_route(route(ready=True))
    assert await task == "a"
    await rig.publisher.until(lambda q: q[-1] == 0)
    assert rig.queues.snapshot() == []


async def test_drain_releases_in_arrival_order_one_after_another(rig: Rig) -> None:
    served: list[str] = []
    tasks = []
    for name in "abcde":
        tasks.append(asyncio.create_task(rig.request(served, name)))
        await settle()
    assert rig.queues.length(KEY) == 5
    rig.set_route(route(ready=True))
    await asyncio.gather(*tasks)
    assert served == list("abcde")


async def test_newcomer_during_a_drain_queues_behind(rig: Rig) -> None:
    served: list[str] = []
    first = asyncio.create_task(rig.request(served, "first"))
    await settle()
    rig.set_route(route(ready=True))
    late = asyncio.create_task(rig.request(served, "late"))  # joins while "first" is released but not yet gone
    await asyncio.gather(first, late)
    assert served == ["first", "late"]


async def test_client_that_leaves_is_removed_and_demand_drops_to_zero(rig: Rig) -> None:
    served: list[str] = []
    task = asyncio.create_task(rig.request(served, "gone"))
    await rig.publisher.until(lambda q: q == [1])
    task.cancel()  # what aiohttp does when the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await task
    assert rig.queues.length(KEY) == 0
    await rig.publisher.until(lambda q: q == [1, 0])


async def test_released_waiter_whose_client_left_passes_the_turn_on(rig: Rig) -> None:
    served: list[str] = []
    a = asyncio.create_task(rig.request(served, "a"))
    await settle()
    b = asyncio.create_task(rig.request(served, "b"))
    await settle()
    rig.set_route(route(ready=True))  # releases a ...
    a.cancel()  # ... whose client left before it could run
    await asyncio.gather(a, return_exceptions=True)
    assert await b == "b"


@pytest.mark.parametrize(
    ("new_route", "status", "code"),
    [
        pytest.param(route(failure="CUDA out of memory"), 503, ErrorCode.MODEL_FAILED, id="failure-503"),
        pytest.param(None, 404, ErrorCode.MODEL_REMOVED, id="deleted-404"),
    ],
)
async def test_route_failure_or_removal_fails_every_waiter(
    rig: Rig, new_route: Route | None, status: int, code: ErrorCode
) -> None:
    tasks = [asyncio.create_task(rig.request([], str(i))) for i in range(3)]
    await settle()
    rig.set_route(new_route)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(r, ProxyError) and (r.status, r.code) == (status, code) for r in results)
    if new_route is not None:
        assert "CUDA out of memory" in str(results[0])
    assert rig.queues.snapshot() == []
    await rig.publisher.until(lambda q: q[-1:] == [0])


@pytest.mark.parametrize(
    ("bus_down", "status", "code"),
    [
        pytest.param(False, 504, ErrorCode.QUEUE_TIMEOUT, id="demand-signalled-504"),
        pytest.param(True, 503, ErrorCode.DEMAND_UNAVAILABLE, id="demand-never-signalled-503"),
    ],
)
async def test_wait_past_the_queue_timeout(bus_down: bool, status: int, code: ErrorCode) -> None:
    made = Rig(queue_timeout=0.1)
    made.publisher.down = bus_down
    refused = await one_wait(made)
    assert (refused.status, refused.code) == (status, code)
    if bus_down:
        assert "nats: no servers available" in refused.message
    assert made.queues.length(KEY) == 0


async def test_each_waiter_times_out_on_its_own_deadline() -> None:
    made = Rig(queue_timeout=0.2)
    await made.demand.start()
    loop = asyncio.get_running_loop()
    try:
        first = made.queues.join(KEY)
        await asyncio.sleep(0.1)
        second = made.queues.join(KEY)
        timed: list[tuple[str, float]] = []
        for name, waiter in (("first", first), ("second", second)):
            with pytest.raises(ProxyError):
                await made.queues.wait_turn(KEY, waiter)
            timed.append((name, loop.time()))
            made.queues.leave(KEY, waiter)
    finally:
        await made.demand.stop()
    (_, at_first), (_, at_second) = timed
    assert at_second - at_first >= 0.07, "the second waiter got its full timeout, not the first one's"
    assert made.queues.length(KEY) == 0


async def test_newcomer_for_a_failed_model_queues_signals_demand_and_waits_for_the_retry(rig: Rig) -> None:
    served: list[str] = []
    early = asyncio.create_task(rig.request(served, "early"))
    await rig.publisher.until(lambda q: q == [1])
    failed = route(failure="CUDA out of memory")
    rig.set_route(failed)
    with pytest.raises(ProxyError) as caught:
        await early  # waiting when the failure was announced: 503 naming it
    assert (caught.value.status, caught.value.code) == (503, ErrorCode.MODEL_FAILED)

    newcomer = asyncio.create_task(rig.request(served, "newcomer"))  # no instant 503: it asks for a retry
    await rig.publisher.until(lambda q: q[-1:] == [1])
    rig.set_route(failed.model_copy(update={"updated_at": T0.replace(minute=1)}))  # same failure re-written
    await settle()
    assert not newcomer.done()
    rig.set_route(route())  # the scheduler retries (Loading, failure cleared) ...
    rig.set_route(failed)  # ... and it fails again: now the newcomer hears it
    with pytest.raises(ProxyError) as caught:
        await newcomer
    assert caught.value.code == ErrorCode.MODEL_FAILED

    third = asyncio.create_task(rig.request(served, "third"))
    await settle()
    rig.set_route(route(ready=True))  # a retry that works serves it
    assert await third == "third"


async def test_timeout_while_the_route_still_carries_its_failure_names_it() -> None:
    made = Rig(queue_timeout=0.1)
    made.set_route(route(failure="exit 1"))
    refused = await one_wait(made)
    assert (refused.status, refused.code) == (503, ErrorCode.MODEL_FAILED)
    assert "exit 1" in refused.message


async def test_demand_of_clients_that_left_ends_without_new_activity(rig: Rig) -> None:
    task = asyncio.create_task(rig.request([], "gone"))
    await rig.publisher.until(lambda q: q == [1])
    await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await rig.publisher.until(lambda q: q == [1, 0])
    first, final = (m for _, m in rig.publisher.sent)
    assert final.time == first.time, "leaving is not activity: the last active time stays the request's"


async def test_activity_reports_the_current_queue_length(rig: Rig) -> None:
    tasks = [asyncio.create_task(rig.request([], str(i))) for i in range(3)]
    await rig.publisher.until(lambda q: q[-1:] == [3])
    rig.demand.activity(KEY)
    await rig.publisher.until(lambda q: q[-1:] == [3] and len(q) >= 2)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_shutdown_answers_every_waiter() -> None:
    made = Rig()
    tasks = [asyncio.create_task(made.request([], str(i))) for i in range(2)]
    await settle()
    made.queues.fail_all(shutting_down())
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert [r.code for r in results if isinstance(r, ProxyError)] == [ErrorCode.SHUTTING_DOWN] * 2


async def test_bus_down_demand_is_retried_on_the_refresh_tick() -> None:
    made = Rig(refresh=0.1)
    made.publisher.down = True
    await made.demand.start()
    try:
        task = asyncio.create_task(made.request([], "a"))
        await asyncio.sleep(0.05)
        assert made.publisher.sent == []
        made.publisher.down = False
        await made.publisher.until(lambda q: q == [1], within=1.0)
        await made.publisher.until(lambda q: q == [1, 1], within=1.0)  # still waiting: refreshed
        made.set_route(route(ready=True))
        await task
        await made.publisher.until(lambda q: q[-1] == 0, within=1.0)
    finally:
        await made.demand.stop()


async def test_activity_is_reported_at_most_once_per_interval() -> None:
    now = [100.0]
    publisher = FakePublisher()
    demand = DemandSignaller(
        publisher, source="p", refresh_interval=10.0, activity_interval=1.0, monotonic=lambda: now[0]
    )
    for _ in range(50):
        demand.activity(KEY)
    now[0] += 0.5
    demand.activity(KEY)
    await settle()
    assert publisher.queued() == [0]
    now[0] += 0.6
    demand.activity(KEY)
    await settle()
    assert publisher.queued() == [0, 0]
    await demand.stop()


def depth(key: ModelKey = KEY) -> float | None:
    return REGISTRY.get_sample_value("flexinfer_proxy_queue_depth", {"namespace": key.namespace, "model": key.name})


@pytest.mark.parametrize("waiting_when_removed", [True, False], ids=["with-waiters", "queue-empty"])
async def test_a_removed_model_takes_its_queue_depth_series_along(rig: Rig, waiting_when_removed: bool) -> None:
    served: list[str] = []
    task = asyncio.create_task(rig.request(served, "a"))
    await rig.publisher.until(lambda q: q == [1])
    assert depth() == 1
    if not waiting_when_removed:
        rig.set_route(route(ready=True))
        await task
        assert depth() == 0  # the model still exists: 0 waiting is a value
    rig.set_route(None)
    if waiting_when_removed:
        with pytest.raises(ProxyError):
            await task
    assert depth() is None
    # The model comes back: its series does too, once something waits.
    rig.set_route(route())
    assert depth() is None
    again = asyncio.create_task(rig.request(served, "b"))
    await settle()
    assert depth() == 1
    rig.set_route(route(ready=True))
    await again
