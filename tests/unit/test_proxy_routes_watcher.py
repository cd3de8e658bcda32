"""The proxy's route watch takes its first snapshot whole, whatever order nats-py hands it over in.

nats-py's KV watch puts its end-of-snapshot marker first when the consumer's info overtakes the entries on the
connection (6 watches in 1,500 against a real nats-server here). Taken at its word, that marker replaced the table
with nothing: every route gone, every waiting request answered 404 `model_removed`, new ones 404 until the entries
arrived a moment later (the likely cause of a chaos run's 18 x 404 after a NATS restart). The watch is faked so
that each order is certain; the real watch runs in the proxy's integration tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import nats.errors
import pytest

from flexinfer_common import subjects
from flexinfer_common.keys import ModelKey
from flexinfer_common.messages import Route
from flexinfer_proxy.adapters.routes_watcher import RouteWatcher
from flexinfer_testbed.routes import make_route
from tests.support.waiting import wait_for


def entry(route: Route, revision: int) -> SimpleNamespace:
    """A KV entry as nats-py delivers it."""
    return SimpleNamespace(
        key=subjects.route_key(route.namespace, route.name),
        value=route.model_dump_json().encode(),
        revision=revision,
        operation=None,
    )


class Watch:
    """``kv.watchall()``: hands over ``updates`` in the order given, then nothing."""

    def __init__(self, updates: list[Any]) -> None:
        self._updates: asyncio.Queue[Any] = asyncio.Queue()
        for update in updates:
            self._updates.put_nowait(update)

    async def updates(self, timeout: float) -> Any:  # noqa: ASYNC109 (nats-py's KeyWatcher.updates)
        try:
            return await asyncio.wait_for(self._updates.get(), timeout)
        except TimeoutError:
            raise nats.errors.TimeoutError from None

    async def stop(self) -> None:
        pass


class Bucket:
    def __init__(self, last_sequence: int, updates: list[Any]) -> None:
        self._last = last_sequence
        self._watch = Watch(updates)

    async def status(self) -> SimpleNamespace:
        return SimpleNamespace(stream_info=SimpleNamespace(state=SimpleNamespace(last_seq=self._last)))

    async def watchall(self) -> Watch:
        return self._watch


class Bus:
    nc = SimpleNamespace(stats={"reconnects": 0})

    def __init__(self, bucket: Bucket) -> None:
        self._bucket = bucket

    async def routes(self) -> Bucket:
        return self._bucket


class Table:
    """The proxy's side (``RouteSink``): every whole replacement, and the single changes after it."""

    def __init__(self) -> None:
        self.replaced: list[list[str]] = []
        self.put: list[str] = []

    def replace_routes(self, routes: list[Route]) -> None:
        self.replaced.append(sorted(r.name for r in routes))

    def put_route(self, route: Route) -> None:
        self.put.append(route.name)

    def remove_route(self, key: ModelKey) -> None:
        raise AssertionError(f"nothing was deleted, yet {key} was removed")


A, B = make_route("a"), make_route("b", endpoint="http://127.0.0.1:9001")


@contextlib.asynccontextmanager
async def loaded(bucket: Bucket, *, poll: float = 1.0) -> AsyncIterator[tuple[RouteWatcher, Table]]:
    """A watcher on ``bucket``, once it loaded its first snapshot (it watches on until the block ends)."""
    table = Table()
    watcher = RouteWatcher(Bus(bucket), table, poll_interval=poll)  # type: ignore[arg-type]
    await watcher.start()
    try:
        await asyncio.wait_for(watcher.loaded.wait(), 5)
        yield watcher, table
    finally:
        await watcher.stop()


@pytest.mark.parametrize(
    "updates",
    [
        pytest.param([entry(A, 1), entry(B, 2), None], id="marker-after-the-entries"),
        pytest.param([None, entry(A, 1), entry(B, 2)], id="marker-before-the-entries"),
        pytest.param([entry(A, 1), None, entry(B, 2)], id="marker-between-the-entries"),
    ],
)
async def test_the_first_snapshot_replaces_the_table_whole_whatever_the_markers_place(updates: list[Any]) -> None:
    async with loaded(Bucket(2, updates)) as (watcher, table):
        pass
    assert table.replaced == [["a", "b"]]  # never an empty (or half) table: no route vanishes, no waiter gets 404
    assert table.put == []
    assert watcher.revision == 2  # what ``caught_up`` compares with the bucket's last sequence


async def test_an_empty_bucket_loads_an_empty_table_at_its_marker() -> None:
    async with loaded(Bucket(0, [None])) as (watcher, table):
        pass
    assert table.replaced == [[]]
    assert watcher.loaded.is_set()


async def test_a_snapshot_short_of_the_last_sequence_is_used_after_quiet(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # the entry at the bucket's last sequence is gone (deleted from the stream by hand): the proxy still starts
    with caplog.at_level(logging.WARNING, logger="flexinfer.proxy.routes"):
        async with loaded(Bucket(5, [None, entry(A, 1), entry(B, 2)]), poll=0.05) as (_, table):
            pass
    assert table.replaced == [["a", "b"]]
    assert "ended short of the bucket's last sequence" in caplog.text


async def test_updates_after_the_snapshot_apply_one_by_one() -> None:
    later = make_route("a", endpoint="http://127.0.0.1:9002")
    async with loaded(Bucket(1, [None, entry(A, 1), entry(later, 3)])) as (watcher, table):
        await wait_for(lambda: watcher.revision >= 3, within=5, what="the update after the snapshot")
    assert table.replaced == [["a"]]
    assert table.put == ["a"]
