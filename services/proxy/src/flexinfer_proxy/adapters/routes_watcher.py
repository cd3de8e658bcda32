"""Watching the routes KV bucket (the scheduler writes one entry per managed model) into the proxy's route table.

The first pass delivers every current entry, then a ``None`` marker: that snapshot replaces the table as a whole
(models that vanished meanwhile are removed) and marks the proxy ready. nats-py may hand the marker over before the
entries (its consumer info can overtake them on the connection: 6 watches in 1,500 here), and an empty snapshot
would drop every route and answer every waiter 404, so the snapshot counts as whole only once it holds the bucket's
last sequence as read before the watch began (or, should that entry be gone, after a poll of quiet that followed the
marker). Later updates apply one by one; a delete or purge removes the model. A malformed entry is logged and
counted (``flexinfer_bad_messages_total``) and changes nothing. If the watch breaks, NATS reconnected (an ordered
consumer may not survive a server restart), or its consumer vanished from the server (checked every
``check_interval`` of quiet), the watcher starts over from a fresh snapshot, with back-off. Meanwhile the proxy
keeps serving from the table it has.

A watch delivers a write a moment after the writer's acknowledgement, so a request sent right after ``flexinfer
apply`` returned can reach the proxy first. ``caught_up`` closes that gap for a request naming a model the table
does not hold: it reads the bucket's last sequence and waits (briefly) until the watch has applied it.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import nats.errors
from pydantic import ValidationError

from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import Route
from flexinfer_common.metrics import BAD_MESSAGES
from flexinfer_common.tasks import Background
from flexinfer_proxy.ports import RouteSink

log = get_logger("flexinfer.proxy.routes")

BAD_ROUTE_SUBJECT = f"$KV.{subjects.ROUTES_BUCKET}.>"
_REMOVALS = frozenset({"DEL", "PURGE"})


class BadRoute(ValueError):
    pass


def decode_route(kv_key: str, value: bytes | None) -> Route:
    """A route entry's value; raise BadRoute naming the problem."""
    if not value:
        raise BadRoute("empty value")
    try:
        route = Route.model_validate_json(value)
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise BadRoute(reasons) from None
    expected = subjects.route_key(route.namespace, route.name)
    if expected != kv_key:
        raise BadRoute(f"key {kv_key!r} holds the route of {route.namespace}/{route.name} (expected key {expected!r})")
    return route


def key_from_kv(kv_key: str) -> ModelKey:
    namespace, _, name = kv_key.partition(".")
    return ModelKey(subjects.untoken(namespace), subjects.untoken(name))


class _Restart(Exception):
    pass


class RouteWatcher:
    def __init__(
        self,
        bus: Bus,
        sink: RouteSink,
        *,
        poll_interval: float = 1.0,
        check_interval: float = 10.0,
        retry_delay: float = 0.2,
        max_retry_delay: float = 5.0,
    ) -> None:
        self._bus = bus
        self._sink = sink
        self._poll = min(poll_interval, check_interval)
        self._check_interval = check_interval
        self._retry_delay = retry_delay
        self._max_retry_delay = max_retry_delay
        self.loaded = asyncio.Event()
        self.watching = False
        self._synced = False
        self._worker = Background("route-watcher", self._run)
        self.revision = 0  # the bucket's sequence the table reflects (the last entry the watch applied)
        self._advanced = asyncio.Event()  # set (and replaced) whenever ``revision`` moves
        self._checking: asyncio.Task[bool] | None = None  # one look at the bucket at a time, shared

    async def start(self) -> None:
        self._worker.start()

    async def stop(self) -> None:
        await self._worker.stop()
        self.watching = False

    async def _run(self) -> None:
        delay = self._retry_delay
        while True:
            self._synced = False
            try:
                await self._watch()
            except asyncio.CancelledError:
                raise
            except _Restart as why:
                log.info("restarting the routes watch", extra={"reason": str(why)})
            except Exception as exc:
                log.warning("routes watch failed; retrying", extra={"error": repr(exc), "retry_in": delay})
            self.watching = False
            if self._synced:  # it worked for a while: start the back-off over
                delay = self._retry_delay
            await asyncio.sleep(delay)
            delay = min(delay * 2, self._max_retry_delay)

    def _reconnects(self) -> int:
        try:
            return int(self._bus.nc.stats["reconnects"])
        except (RuntimeError, KeyError, AttributeError):
            return -1

    async def _watch(self) -> None:
        reconnects = self._reconnects()
        kv = await self._bus.routes()
        whole_at = await self._last_sequence(kv)  # the snapshot is whole once it holds this (module docstring)
        watcher: Any = await kv.watchall()
        self.watching = True
        snapshot: dict[str, Route] | None = {}
        newest = 0  # the newest sequence the snapshot holds
        marked = False  # nats-py said the snapshot ended
        keys: dict[str, ModelKey] = {}
        loop = asyncio.get_running_loop()
        next_check = loop.time() + self._check_interval
        try:
            while True:
                try:
                    entry: Any = await watcher.updates(timeout=self._poll)
                except nats.errors.TimeoutError:
                    if snapshot is not None and marked:
                        log.warning(
                            "the routes snapshot ended short of the bucket's last sequence; using it",
                            extra={"holds": newest, "last_sequence": whole_at},
                        )
                        keys, snapshot = self._replace(snapshot), None
                        continue
                    # Quiet bucket. nats-py reconnects by itself; once it did, start over from a fresh snapshot.
                    if self._reconnects() != reconnects:
                        raise _Restart("NATS reconnected") from None
                    if loop.time() >= next_check:
                        await self._check_alive(watcher)
                        next_check = loop.time() + self._check_interval
                    continue
                if entry is None:
                    marked = True
                elif snapshot is None:  # (a snapshot's entries count once it replaced the table)
                    self._apply(entry, snapshot, keys)
                    self._advance(entry.revision)
                    continue
                else:
                    self._apply(entry, snapshot, keys)
                    newest = max(newest, int(entry.revision or 0))
                    self.revision = max(self.revision, newest)
                if snapshot is not None and marked and newest >= whole_at:
                    keys, snapshot = self._replace(snapshot), None
        finally:
            with contextlib.suppress(Exception):
                await watcher.stop()

    @staticmethod
    async def _last_sequence(kv: Any) -> int:
        """The bucket's last sequence (0: it never held an entry)."""
        return int((await kv.status()).stream_info.state.last_seq or 0)

    def _replace(self, snapshot: dict[str, Route]) -> dict[str, ModelKey]:
        """The whole snapshot replaces the table, and the proxy is ready; returns the key of each route entry."""
        self._sink.replace_routes(list(snapshot.values()))
        self._synced = True
        self.loaded.set()
        self._advance(self.revision)
        log.info("routes loaded", extra={"models": len(snapshot)})
        return {k: ModelKey(r.namespace, r.name) for k, r in snapshot.items()}

    def _advance(self, revision: int | None) -> None:
        self.revision = max(self.revision, int(revision or 0))
        advanced, self._advanced = self._advanced, asyncio.Event()
        advanced.set()

    async def caught_up(self, within: float = 1.0) -> bool:
        """Wait until the table holds every route written to the bucket before this call (at most ``within``
        seconds); False when it does not (yet), or the bucket cannot be read. Concurrent callers share one look."""
        if self._checking is None or self._checking.done():
            self._checking = asyncio.create_task(self._catch_up(within), name="routes-caught-up")
        return await asyncio.shield(self._checking)

    async def _catch_up(self, within: float) -> bool:
        try:
            async with asyncio.timeout(within):
                last = await self._last_sequence(await self._bus.routes())
                while not (self.loaded.is_set() and self.revision >= last):
                    await self._advanced.wait()
                return True
        except TimeoutError:
            return False
        except Exception as exc:
            log.warning("could not read the routes bucket's sequence", extra={"error": repr(exc)})
            return False

    @staticmethod
    async def _check_alive(watcher: Any) -> None:
        """Restart when the watch's consumer is gone from the server (e.g. the bucket was deleted and recreated)."""
        subscription = getattr(watcher, "_sub", None)
        if subscription is None:
            return
        try:
            await subscription.consumer_info()
        except Exception as exc:
            raise _Restart(f"the watch consumer is gone: {exc!r}") from None

    def _apply(self, entry: Any, snapshot: dict[str, Route] | None, keys: dict[str, ModelKey]) -> None:
        kv_key: str = entry.key
        if entry.operation in _REMOVALS:
            if snapshot is not None:
                snapshot.pop(kv_key, None)
                return
            self._sink.remove_route(keys.pop(kv_key) if kv_key in keys else key_from_kv(kv_key))
            return
        try:
            route = decode_route(kv_key, entry.value)
        except BadRoute as exc:
            BAD_MESSAGES.labels(subject=BAD_ROUTE_SUBJECT).inc()
            log.warning("ignored a malformed route entry", extra={"key": kv_key, "reason": str(exc)})
            return
        if snapshot is not None:
            snapshot[kv_key] = route
            return
        keys[kv_key] = ModelKey(route.namespace, route.name)
        self._sink.put_route(route)
