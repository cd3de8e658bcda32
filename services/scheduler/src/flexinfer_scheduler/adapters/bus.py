"""The scheduler's ports on real servers: NATS JetStream for messages and routes, a PostgreSQL advisory lock for
leadership."""

from __future__ import annotations

import asyncio
import contextlib

import asyncpg
from nats.js.errors import KeyWrongLastSequenceError
from nats.js.kv import KeyValue
from pydantic import BaseModel
from sqlalchemy.engine import make_url

from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.keys import ModelKey
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import Route
from flexinfer_scheduler.ports import Decoder, Handler, M, Stoppable

log = get_logger("flexinfer.scheduler")


class NatsSchedulerBus:
    """:class:`~flexinfer_scheduler.ports.SchedulerBus` on a connected :class:`Bus`; routes in the KV bucket."""

    def __init__(self, bus: Bus) -> None:
        self.bus = bus
        self._kv: KeyValue | None = None

    async def _routes(self) -> KeyValue:
        if self._kv is None:
            self._kv = await self.bus.routes()
        return self._kv

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None:
        await self.bus.publish(subject, message, msg_id=msg_id)

    async def consume(
        self, *, stream: str, durable: str | None, filter_subject: str, decode: Decoder[M], handler: Handler[M]
    ) -> Stoppable:
        return await self.bus.consume(
            stream=stream, durable=durable, filter_subject=filter_subject, decode=decode, handler=handler
        )

    async def publish_many(self, items: list[tuple[str, BaseModel, str | None]]) -> list[bool]:
        # The leader is the only writer of the status stream: its statuses' acks are checked by sequence.
        return await self.bus.publish_many(list(items), sole_writer=(subjects.STATUS_PREFIX + ".",))

    async def put_routes(self, routes: list[Route]) -> list[bool]:
        """A KV put is a publish on the bucket's subject: many go out together, their acks pipelined."""
        await self._routes()  # the bucket exists
        prefix = f"$KV.{subjects.ROUTES_BUCKET}."
        return await self.bus.publish_many(
            [(prefix + subjects.route_key(r.namespace, r.name), r.to_bytes(), None) for r in routes]
        )

    async def create_route(self, route: Route) -> bool:
        """False when the model has a route (the KV answers wrong last sequence); any other failure
        (the bus down, a timeout, a refused write) is raised, for the caller to log."""
        try:
            await (await self._routes()).create(subjects.route_key(route.namespace, route.name), route.to_bytes())
        except KeyWrongLastSequenceError as exc:
            log.debug("route exists", extra={"model": f"{route.namespace}/{route.name}", "error": repr(exc)})
            return False
        return True

    async def delete_route(self, key: ModelKey) -> None:
        await (await self._routes()).delete(subjects.route_key(key.namespace, key.name))


#: The sequence each new leader takes its epoch from (migration 0005_bus_auth).
LEADER_EPOCH_SEQUENCE = "scheduler_leader_epoch"


class AdvisoryLock:
    """:class:`~flexinfer_scheduler.ports.LeaderLock` as a PostgreSQL session advisory lock: held while the
    connection that took it lives (a crashed leader's lock is released by the server)."""

    def __init__(self, database_url: str, lock_id: int) -> None:
        self.url = make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.lock_id = lock_id
        self._conn: asyncpg.Connection | None = None
        self._held = False
        self.epoch = 0

    async def try_acquire(self) -> bool:
        try:
            if self._conn is None or self._conn.is_closed():
                self._conn = await asyncpg.connect(self.url, timeout=5)
            was_held = self._held
            self._held = bool(await self._conn.fetchval("SELECT pg_try_advisory_lock($1)", self.lock_id))
            if self._held and not was_held:
                # Taken while holding the lock: no other replica can take one until this connection ends.
                self.epoch = int(await self._conn.fetchval(f"SELECT nextval('{LEADER_EPOCH_SEQUENCE}')"))
                log.info("took the leader lock", extra={"leader_epoch": self.epoch})
            return self._held
        except Exception as exc:
            log.warning("cannot reach Postgres for the leader lock", extra={"error": repr(exc)})
            await self.release()
            return False

    async def still_held(self) -> bool:
        if self._conn is None or not self._held:
            return False
        try:
            await asyncio.wait_for(self._conn.fetchval("SELECT 1"), timeout=5)
        except Exception as exc:
            log.error("lost the leader lock's connection", extra={"error": repr(exc)})
            await self.release()
            return False
        return True

    async def release(self) -> None:
        conn, self._conn, self._held, self.epoch = self._conn, None, False, 0
        if conn is not None:
            with contextlib.suppress(Exception):
                await conn.close()
