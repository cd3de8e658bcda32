"""The NATS client every service uses: JetStream streams and durable consumers created idempotently,
publishing with message ids (JetStream de-duplicates within its window), typed decoding, and a consumer loop
that rejects malformed messages with a logged reason and a counter, never blocking the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, NotRequired, TypedDict, TypeVar, Unpack

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.errors import BadSubjectError
from nats.js import JetStreamContext
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    DiscardPolicy,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.errors import BadRequestError, NotFoundError
from nats.js.kv import KeyValue
from pydantic import BaseModel, ValidationError

from flexinfer_common import subjects
from flexinfer_common.logs import get_logger
from flexinfer_common.messages import encode, message_id
from flexinfer_common.metrics import BAD_MESSAGES, UNPUBLISHABLE
from flexinfer_common.nats_auth import NatsAuth, redact_url, url_user

log = get_logger("flexinfer.bus")

M = TypeVar("M", bound=BaseModel)


def _stream(name: str, subject: str | list[str], max_age: timedelta, **extra: Any) -> StreamConfig:
    return StreamConfig(
        name=name,
        subjects=subject if isinstance(subject, list) else [subject],
        retention=RetentionPolicy.LIMITS,
        storage=StorageType.FILE,
        discard=DiscardPolicy.OLD,
        max_age=max_age.total_seconds(),
        duplicate_window=120.0,
        **extra,
    )


STREAMS: tuple[StreamConfig, ...] = (
    _stream(subjects.DEMAND_STREAM, subjects.DEMAND_PREFIX + ".>", timedelta(hours=1)),
    # The latest in-flight counts of each proxy (a new scheduler leader reads the present, not the history).
    _stream(subjects.IN_FLIGHT_STREAM, subjects.IN_FLIGHT_PREFIX + ".>", timedelta(minutes=10), max_msgs_per_subject=1),
    _stream(subjects.COMMAND_STREAM, subjects.COMMAND_PREFIX + ".>", timedelta(hours=1)),
    _stream(
        subjects.RUNTIME_STATUS_STREAM,
        [subjects.RUNTIME_STATUS_PREFIX + ".>", subjects.ACTUATOR_HELLO_PREFIX + ".>"],
        timedelta(hours=1),
    ),
    _stream(
        subjects.MODEL_STATUS_STREAM,
        [subjects.MODEL_STATUS_PREFIX + ".>", subjects.GROUP_STATUS_PREFIX + ".>"],
        timedelta(days=1),
        max_msgs_per_subject=1,
    ),
    _stream(subjects.EVENTS_STREAM, subjects.EVENTS_PREFIX + ".>", timedelta(days=1)),
    # The latest spec of each Kubernetes object (and the latest resync list per kind): a scheduler that was away
    # reads the state, not the history.
    _stream(subjects.SPEC_STREAM, subjects.SPEC_PREFIX + ".>", timedelta(days=7), max_msgs_per_subject=1),
)


_STOP_TIMEOUT = 5.0


def _raise_if_cancelled(task: asyncio.Task[None] | None) -> None:
    """End a consumer's loop that was asked to stop: nats-py's fetch can take a cancellation for a timeout, a
    connection error or even a message that arrived in the same turn (``asyncio.wait_for`` on Python 3.11; the task
    is then still cancelling), and the loop would fetch again, on a closed connection for ever, so that whoever stops
    it, or the event loop's shutdown, waits for nothing (see ``flexinfer_common.tasks``)."""
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


#: How long ``publish_many`` waits for JetStream's acks (the ones still missing count as not published).
ACK_WAIT = 10.0


#: How many of ``publish_many``'s messages may wait for their ack at once (nats-py's ``publish_async`` allows 4,000).
MAX_ACKS_PENDING = 4000

#: Messages for a stream of ``publish_many``'s ``sole_writer`` from which their acks are checked by sequence.
SEQUENCED_MIN = 100


class _Acks:
    """The acks of one ``publish_many`` call: ``results[i]`` is True (stored), False (refused) or None (no answer
    yet), from the replies to ``<inbox>.<i>``; ``bodies[i]`` the reply itself for each ``i`` in ``keep``."""

    def __init__(self, total: int, keep: frozenset[int] = frozenset()) -> None:
        self.results: list[bool | None] = [None] * total
        self.keep = keep
        self.bodies: dict[int, bytes] = {}  # the acks themselves, of the messages in ``keep``
        self.sent = 0
        self.received = 0
        self._progress = asyncio.Event()

    def refuse(self, index: int) -> None:
        """Item ``index`` could not be sent at all (it waits for no ack)."""
        self.results[index] = False

    def waiting(self) -> int:
        return self.sent - self.received

    async def on_reply(self, msg: Msg) -> None:
        token = msg.subject.rpartition(".")[2]
        index = int(token) if token.isdigit() else -1
        if not 0 <= index < len(self.results) or self.results[index] is not None:
            return  # not one of ours, or a repeated reply
        self.results[index] = _stored(msg.data)
        if index in self.keep:
            self.bodies[index] = msg.data
        self.received += 1
        self._progress.set()

    async def wait(self, *, below: int, deadline: float) -> None:
        """Until fewer than ``below`` sent messages wait for their ack, or the loop's clock reaches ``deadline``
        (those still waiting then count as lost)."""
        while self.waiting() >= below:
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            self._progress.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), left)


def _stored(data: bytes) -> bool:
    """Whether a JetStream publish reply is an ack (``{"stream": ..., "seq": ...}``), not an error
    (``{"error": {...}}``) or a no-responders status (an empty body). Looked for, not parsed: parsing 23,000 acks
    as JSON was a tenth of publishing them."""
    return b'"seq"' in data and b'"error"' not in data


def _sequence(ack: bytes | None) -> int | None:
    """The stream sequence a JetStream ack gives its message."""
    if ack is None:
        return None
    try:
        seq = json.loads(ack).get("seq")
    except (ValueError, AttributeError):
        return None
    return seq if isinstance(seq, int) else None


class BadMessage(ValueError):
    """A message that cannot be decoded; the text says why."""


@dataclass(frozen=True)
class Delivery:
    subject: str
    message_id: str
    num_delivered: int


def load_json(data: bytes) -> Any:
    """Parse a message body as JSON; BadMessage for anything that is not (bad bytes, nesting too deep)."""
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:  # JSONDecodeError is a ValueError
        raise BadMessage(f"not JSON: {exc}") from None
    except RecursionError:
        raise BadMessage("not JSON this service accepts: nested too deeply") from None


def decode_json(schema: type[M], subject: str, data: bytes) -> M:
    """Decode a message body; raise BadMessage with a readable reason."""
    raw = load_json(data)
    if not isinstance(raw, dict):
        raise BadMessage(f"expected a JSON object, got {type(raw).__name__}")
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise BadMessage(reasons) from None


Decoder = Callable[[str, bytes], M]
Handler = Callable[[M, Delivery], Awaitable[None]]


class ConsumerOptions(TypedDict, Generic[M]):
    """What a :class:`Consumer` reads and what it runs for each message (``Bus.consume`` takes the same)."""

    stream: str
    durable: str | None
    filter_subject: str
    decode: Decoder[M]
    handler: Handler[M]
    deliver_new_only: NotRequired[bool]  # without a deliver_policy: NEW rather than ALL
    deliver_policy: NotRequired[DeliverPolicy | None]


class Consumer(Generic[M]):
    """A pull consumer running its handler for each message, in order, one at a time.

    Durable (``durable`` names it): it resumes where it left off. Ephemeral (``durable`` None): it starts at
    ``deliver_policy`` (e.g. the last message of every subject: the current state of a last-value stream) and is
    created again, from the same point, if the server loses it.
    """

    def __init__(self, bus: Bus, **options: Unpack[ConsumerOptions[M]]) -> None:
        self.bus = bus
        self.stream = options["stream"]
        self.durable = options["durable"]
        self.filter_subject = options["filter_subject"]
        self.decode = options["decode"]
        self.handler = options["handler"]
        new_only = options.get("deliver_new_only", False)
        self.deliver_policy = options.get("deliver_policy") or (DeliverPolicy.NEW if new_only else DeliverPolicy.ALL)
        self._task: asyncio.Task[None] | None = None
        self._sub: JetStreamContext.PullSubscription | None = None

    @property
    def name(self) -> str:
        return self.durable or f"ephemeral:{self.filter_subject}"

    async def _subscribe(self) -> JetStreamContext.PullSubscription:
        config = ConsumerConfig(
            durable_name=self.durable,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=self.deliver_policy,
            filter_subject=self.filter_subject,
            ack_wait=30,
            max_deliver=20,
            max_ack_pending=10_000,
            inactive_threshold=None if self.durable else 120.0,
        )
        return await self.bus.js.pull_subscribe(
            self.filter_subject, durable=self.durable, stream=self.stream, config=config
        )

    async def start(self) -> None:
        self._sub = await self._subscribe()
        self._task = asyncio.create_task(self._run(self._sub), name=f"consumer:{self.name}")

    async def stop(self) -> None:
        """Stop consuming. Bounded: with NATS or the handler's database gone at that moment, a cancelled handler
        or an unsubscribe can hang, and whoever stops (a scheduler stepping down) must go on."""
        if self._task:
            self._task.cancel()
            done, pending = await asyncio.wait({self._task}, timeout=_STOP_TIMEOUT)
            for task in done:
                if not task.cancelled() and task.exception() is not None:
                    log.warning(
                        "consumer had failed", extra={"consumer": self.durable, "error": repr(task.exception())}
                    )
            if pending:
                log.warning("consumer did not stop in time; going on", extra={"consumer": self.durable})
        if self._sub is not None:
            # A pending pull's late reply would otherwise sit unread and stall the connection's drain.
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._sub.unsubscribe(), _STOP_TIMEOUT)
            self._sub = None

    async def _run(self, sub: JetStreamContext.PullSubscription) -> None:
        failures = 0
        task = asyncio.current_task()
        while True:
            _raise_if_cancelled(task)
            try:
                # One message per pull: nats-py's batched fetch, once a first message arrived, waits until the
                # batch fills or the pull expires (a second here), which put up to a second on every event.
                batch = await sub.fetch(batch=1, timeout=5.0)
            except TimeoutError:
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                log.warning("fetch failed; retrying", extra={"consumer": self.name, "error": repr(exc)})
                await asyncio.sleep(0.5)
                if self.durable is None and failures >= 3:
                    sub = await self._resubscribe(sub)
                continue
            failures = 0
            for msg in batch:
                await self._dispatch(msg)

    async def _resubscribe(self, old: JetStreamContext.PullSubscription) -> JetStreamContext.PullSubscription:
        """An ephemeral consumer the server lost (a restart, an inactivity timeout): make it again."""
        try:
            fresh = await self._subscribe()
        except Exception as exc:
            log.warning("cannot create the consumer again yet", extra={"consumer": self.name, "error": repr(exc)})
            return old
        with contextlib.suppress(Exception):
            await old.unsubscribe()
        self._sub = fresh
        log.info("consumer created again", extra={"consumer": self.name})
        return fresh

    async def _dispatch(self, msg: Msg) -> None:
        metadata = msg.metadata
        headers = msg.headers or {}
        delivery = Delivery(
            subject=msg.subject,
            message_id=headers.get("Nats-Msg-Id") or f"{metadata.stream}:{metadata.sequence.stream}",
            num_delivered=metadata.num_delivered,
        )
        try:
            message = self.decode(msg.subject, msg.data)
        except Exception as exc:  # BadMessage, or a decoder bug: either way this message is rejected, not fatal
            BAD_MESSAGES.labels(subject=self.filter_subject).inc()
            log.warning(
                "rejected malformed message",
                extra={"subject": msg.subject, "reason": str(exc), "consumer": self.name},
            )
            await _quietly(msg.term())
            return
        try:
            await self.handler(message, delivery)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("handler failed; message will be redelivered", extra={"subject": msg.subject})
            await _quietly(msg.nak(delay=1.0))
            return
        await _quietly(msg.ack())


def _is_auth_error(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "authorization violation" in text or ("authentication" in text and "fail" in text)


async def _quietly(awaitable: Awaitable[Any]) -> None:
    try:
        await awaitable
    except Exception as exc:
        log.warning("ack/nak failed", extra={"error": repr(exc)})


class Bus:
    """A connection to NATS with JetStream. ``await connect()`` then ``ensure_streams()`` once at start."""

    def __init__(self, url: str, *, name: str, auth: NatsAuth | None = None) -> None:
        self.url = url
        self.name = name
        self.auth = auth or NatsAuth()
        self._nc: NatsClient | None = None
        self._js: JetStreamContext | None = None
        self._consumers: list[Consumer[Any]] = []
        self._closing = False

    @property
    def nc(self) -> NatsClient:
        if self._nc is None:
            raise RuntimeError("bus is not connected")
        return self._nc

    @property
    def js(self) -> JetStreamContext:
        if self._js is None:
            raise RuntimeError("bus is not connected")
        return self._js

    @property
    def connected(self) -> bool:
        return self._nc is not None and self._nc.is_connected

    async def connect(self, *, wait: float = 30.0) -> None:
        """Connect, retrying for up to ``wait`` seconds at start; later drops reconnect forever. Credentials the
        server refuses stop the start at once (retrying them cannot help), with a message that names the user."""
        refused = asyncio.Event()
        last_error: list[Exception] = []  # what nats-py reported last while connecting (a TLS failure, ...)

        tls_failure: list[ssl.SSLError] = []  # the latest TLS failure of any attempt (it says why; a reset does not)

        async def on_error(exc: Exception) -> None:
            last_error[:] = [exc]
            if isinstance(exc, ssl.SSLError):
                tls_failure[:] = [exc]
            if _is_auth_error(exc):
                if not refused.is_set():
                    log.error("nats refused our credentials", extra={"error": repr(exc), "user": self._who()})
                refused.set()
                return
            log.warning("nats error", extra={"error": repr(exc)})

        async def on_disconnect() -> None:
            # nats-py reports its own close (drain) as a disconnection too: only a lost connection is news
            if self._closing:
                log.debug("nats connection closed")
            else:
                log.warning("nats disconnected")

        async def on_reconnect() -> None:
            refused.clear()
            log.info("nats reconnected")

        self._closing = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait
        options = self.auth.connect_options(self.url)
        while True:
            attempt = asyncio.ensure_future(
                nats.connect(
                    servers=[u.strip() for u in self.url.split(",")],
                    name=self.name,
                    connect_timeout=2,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
                    error_cb=on_error,
                    disconnected_cb=on_disconnect,
                    reconnected_cb=on_reconnect,
                    **options,
                )
            )
            watch = asyncio.ensure_future(refused.wait())
            await asyncio.wait(
                {attempt, watch}, timeout=max(0.0, deadline - loop.time()) + 1.0, return_when="FIRST_COMPLETED"
            )
            watch.cancel()
            if attempt.done() and attempt.exception() is None:
                self._nc = attempt.result()
                break
            failure = attempt.exception() if attempt.done() else None
            if not attempt.done():
                attempt.cancel()
                with contextlib.suppress(BaseException):
                    await attempt
            if refused.is_set() or (failure is not None and _is_auth_error(failure)):
                who = self._who()
                raise ConnectionError(
                    f"NATS at {redact_url(self.url)} refused "
                    + (f"the credentials of {who!r}" if who else "a connection without credentials")
                    + " (FLEXINFER_NATS_USER/_PASSWORD, _CREDS or _NKEY)"
                ) from None
            if isinstance(failure, ssl.SSLError):
                tls_failure[:] = [failure]
            if loop.time() > deadline:
                cause = failure if failure is not None else next(iter(last_error), None)
                # A server that refuses the handshake answers with a TLS alert or, when it closes first (TLS 1.3
                # checks the client's certificate after the client is done), with a reset: either way it is TLS.
                tls = "tls" in options or self.url.startswith("tls://")
                if tls_failure or (tls and isinstance(cause, ConnectionResetError)):
                    cause = tls_failure[0] if tls_failure else cause
                    hint = " (TLS: FLEXINFER_NATS_TLS_CA, _CERT and _KEY)"
                else:
                    hint = ""
                raise ConnectionError(f"cannot reach NATS at {redact_url(self.url)}: {cause!r}{hint}") from None
            await asyncio.sleep(0.3)
        self._js = self._nc.jetstream(timeout=5)

    def _who(self) -> str | None:
        return self.auth.user or url_user(self.url) or self.auth.creds_file or self.auth.nkey_file

    async def ensure_streams(self, *, owner: bool = True) -> None:
        """Create the streams that are missing. The ``owner`` (the scheduler) also brings an existing stream's
        configuration up to date; the others may only create them (the bus's permissions refuse them an update,
        see :mod:`flexinfer_common.nats_auth`) and leave a stream that differs as it is."""
        for config in STREAMS:
            try:
                await self.js.add_stream(config)
            except BadRequestError as exc:
                if owner:
                    await self.js.update_stream(config)
                else:
                    log.info(
                        "stream exists with another configuration; its owner updates it",
                        extra={"stream": config.name, "error": exc.description},
                    )

    async def routes(self) -> KeyValue:
        """The routes KV bucket, created when missing."""
        try:
            return await self.js.key_value(subjects.ROUTES_BUCKET)
        except (NotFoundError, nats.js.errors.BucketNotFoundError):
            return await self.js.create_key_value(bucket=subjects.ROUTES_BUCKET, history=1)

    async def publish(self, subject: str, message: BaseModel, *, msg_id: str | None = None) -> None:
        """Publish to JetStream and wait for the store's ack (at-least-once). ``msg_id`` (from
        :func:`~flexinfer_common.messages.message_id`) is given by a caller that may retry this publish; without
        one, the message gets a fresh id of its own."""
        headers = {"Nats-Msg-Id": msg_id or message_id(self.name)}
        await self.js.publish(subject, encode(message), headers=headers)

    async def publish_many(
        self, items: list[tuple[str, BaseModel | bytes, str | None]], *, sole_writer: tuple[str, ...] = ()
    ) -> list[bool]:
        """Publish many messages to JetStream at once (subject, message or raw bytes, message id), the acks
        pipelined rather than awaited one by one; True for each message the store acknowledged.

        Each message is a core publish whose reply subject (``<inbox>.<index>``) gets the stream's ack, all on one
        subscription of this call. nats-py's ``publish_async`` does the same with a future, a semaphore, a fresh
        token and a parsed ``PubAck`` object per message: at 23,000 messages (a scheduler's first pass over 10,000
        models) that bookkeeping cost more than the publishing itself.

        ``sole_writer``: subject prefixes of one stream that only this caller writes (the scheduler's statuses).
        When at least :data:`SEQUENCED_MIN` of the messages (without a message id) go there, only the first and the
        last of them ask for an ack, and the stream's sequence numbers in those two acks tell whether every one in
        between was stored: nothing else wrote to the stream, so they must be exactly as many apart as the
        messages. If they are not (a message refused, or a write from elsewhere after all), all of those messages
        are sent again, each with its own ack. Handling 10,000 acks cost more than sending the messages."""
        if not items:
            return []
        sequenced = [
            i for i, (subject, _, msg_id) in enumerate(items) if not msg_id and subject.startswith(sole_writer)
        ]
        if len(sequenced) < SEQUENCED_MIN:
            return [stored is True for stored in (await self._publish_all(items, set())).results]
        acks = await self._publish_all(items, set(sequenced[1:-1]), keep=frozenset((sequenced[0], sequenced[-1])))
        first, last = (_sequence(acks.bodies.get(index)) for index in (sequenced[0], sequenced[-1]))
        results = acks.results
        if first is not None and last is not None and last - first == len(sequenced) - 1:
            for index in sequenced:
                results[index] = True
        else:
            log.warning(
                "stream sequence does not add up; sending one by one",
                extra={"messages": len(sequenced), "first": first, "last": last},
            )
            again = (await self._publish_all([items[index] for index in sequenced], set())).results
            for index, stored in zip(sequenced, again, strict=True):
                results[index] = stored
        return [stored is True for stored in results]

    async def _publish_all(
        self,
        items: list[tuple[str, BaseModel | bytes, str | None]],
        unacked: set[int],
        keep: frozenset[int] = frozenset(),
    ) -> _Acks:
        """Send the items, those of ``unacked`` without a reply subject (so without an ack); wait for the acks."""
        acks = _Acks(len(items), keep)
        deadline = asyncio.get_running_loop().time() + ACK_WAIT
        inbox = self.nc.new_inbox()
        sub = await self.nc.subscribe(inbox + ".*", cb=acks.on_reply)
        try:
            publish = self.nc.publish
            for index, (subject, message, msg_id) in enumerate(items):
                payload = message if isinstance(message, bytes) else encode(message)
                try:
                    if index in unacked:
                        await publish(subject, payload)
                        continue
                    if acks.waiting() >= MAX_ACKS_PENDING:
                        await acks.wait(below=MAX_ACKS_PENDING // 2, deadline=deadline)
                    await publish(
                        subject, payload, reply=f"{inbox}.{index}", headers={"Nats-Msg-Id": msg_id} if msg_id else None
                    )
                except BadSubjectError:
                    # One message whose subject cannot be sent (whitespace, CR/LF) fails alone: the rest of the
                    # batch (a park command among them) still goes out.
                    acks.refuse(index)
                    UNPUBLISHABLE.inc()
                    log.error("message not published: its subject is invalid", extra={"subject": repr(subject)[:200]})
                    continue
                acks.sent += 1
            await acks.wait(below=1, deadline=deadline)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        return acks

    async def publish_core(self, subject: str, message: BaseModel) -> None:
        """Fire and forget (still stored when a stream captures the subject)."""
        await self.nc.publish(subject, encode(message))

    async def consume(self, **options: Unpack[ConsumerOptions[M]]) -> Consumer[M]:
        """Start a :class:`Consumer`; closing the bus stops it."""
        consumer = Consumer(self, **options)
        await consumer.start()
        self._consumers.append(consumer)
        return consumer

    async def close(self) -> None:
        self._closing = True
        for consumer in self._consumers:
            await consumer.stop()
        self._consumers.clear()
        if self._nc is not None and not self._nc.is_closed:
            # Bounded: with the server gone, a drain could wait out its whole timeout.
            try:
                await asyncio.wait_for(self._nc.drain(), timeout=3)
            except Exception:
                with contextlib.suppress(Exception):
                    await self._nc.close()
        self._nc = None
        self._js = None


def decode_demand(subject: str, data: bytes) -> Any:
    """Decode a demand message; the subject's tokens fill ``namespace`` (and ``model``) when the body omits them.

    ``model`` may be given as ``namespace/name``.
    """
    from flexinfer_common.messages import Demand

    tokens = subjects.split_model_subject(subject, subjects.DEMAND_PREFIX)
    raw = load_json(data) if data.strip() else {}
    if not isinstance(raw, dict):
        raise BadMessage(f"expected a JSON object, got {type(raw).__name__}")
    if tokens is not None:
        raw.setdefault("namespace", tokens[0])
        raw.setdefault("model", tokens[1])
    model = raw.get("model")
    if isinstance(model, str) and "/" in model:
        namespace, _, name = model.partition("/")
        raw["namespace"], raw["model"] = namespace, name
    try:
        demand = Demand.model_validate(raw)
    except ValidationError as exc:
        reasons = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        raise BadMessage(reasons) from None
    if not demand.namespace:
        raise BadMessage("namespace: missing (not in the body, and the subject has no namespace token)")
    return demand
