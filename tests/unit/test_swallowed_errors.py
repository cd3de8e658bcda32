"""Failures that used to be swallowed (issue 26): a route creation that fails for another reason than "the route
exists" is raised, not taken for it; a batch with one unpublishable subject still publishes the rest."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from nats.errors import BadSubjectError
from nats.errors import TimeoutError as NatsTimeout
from nats.js.errors import KeyWrongLastSequenceError

from flexinfer_common.bus import Bus
from flexinfer_common.messages import Route
from flexinfer_scheduler.adapters.bus import NatsSchedulerBus

pytestmark = pytest.mark.asyncio(loop_scope="function")


class FakeKeyValue:
    def __init__(self, error: Exception | None) -> None:
        self.error = error
        self.created: list[str] = []

    async def create(self, key: str, value: bytes) -> int:
        if self.error is not None:
            raise self.error
        self.created.append(key)
        return 1


def bus_with(kv: FakeKeyValue) -> NatsSchedulerBus:
    bus = NatsSchedulerBus(Bus.__new__(Bus))
    bus._kv = kv  # type: ignore[assignment]
    return bus


ROUTE = Route(namespace="default", name="a", updated_at=datetime(2026, 1, 1, tzinfo=UTC))


async def test_create_route_says_false_only_when_the_route_exists() -> None:
    assert await bus_with(FakeKeyValue(None)).create_route(ROUTE)
    assert not await bus_with(FakeKeyValue(KeyWrongLastSequenceError())).create_route(ROUTE)


@pytest.mark.parametrize(
    "error",
    [pytest.param(NatsTimeout(), id="timeout"), pytest.param(ConnectionError("closed"), id="connection-closed")],
)
async def test_create_route_raises_any_other_failure(error: Exception) -> None:
    with pytest.raises(type(error)):
        await bus_with(FakeKeyValue(error)).create_route(ROUTE)


class FakeNats:
    """A NATS client that refuses a subject with whitespace as nats-py does, and acks every other publish."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self._cb: Any = None

    def new_inbox(self) -> str:
        return "_INBOX.x"

    async def subscribe(self, subject: str, cb: Any) -> Any:
        self._cb = cb
        return self

    async def unsubscribe(self) -> None:
        return None

    async def publish(self, subject: str, payload: bytes, reply: str = "", headers: Any = None) -> None:
        if any(c in subject for c in " \t\r\n"):
            raise BadSubjectError
        self.sent.append(subject)
        if reply:

            class Msg:
                pass

            msg = Msg()
            msg.subject = reply  # type: ignore[attr-defined]
            msg.data = b'{"stream":"S","seq":1}'  # type: ignore[attr-defined]
            await self._cb(msg)


async def test_an_unpublishable_subject_fails_alone_and_the_rest_of_the_batch_goes_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from flexinfer_common.metrics import UNPUBLISHABLE

    bus = Bus.__new__(Bus)
    fake = FakeNats()
    bus._nc = fake  # type: ignore[assignment]
    before = UNPUBLISHABLE._value.get()
    items: list[tuple[str, Any, str | None]] = [
        ("flexinfer.status.group.a\r\nb", ROUTE, None),
        ("flexinfer.actuator.command.default.a", ROUTE, "id-1"),
        ("flexinfer.status.model.default.a", ROUTE, None),
    ]
    assert await bus.publish_many(items) == [False, True, True]
    assert fake.sent == ["flexinfer.actuator.command.default.a", "flexinfer.status.model.default.a"]
    assert UNPUBLISHABLE._value.get() == before + 1
    assert "its subject is invalid" in caplog.text
