"""The recent events of a model for ``flexinfer describe``, read from the ``FLEXINFER_EVENTS`` JetStream stream
(docs/reference.md section 3: ``flexinfer.events.<kind>.<group>``, kept for a day) through a short-lived consumer that
acknowledges nothing and vanishes on its own."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from pydantic import ValidationError

from flexinfer_cli.client import CliError
from flexinfer_cli.demand_signal import connect_nats
from flexinfer_cli.descriptions import Event, Events
from flexinfer_common import subjects
from flexinfer_common.clock import rfc3339
from flexinfer_common.messages import LeaseEvent, ModelEvent, SwapEvent
from flexinfer_common.nats_auth import Identity, redact_url

FETCH_BATCH = 256
MAX_EVENTS = 5_000  # read at most this many messages of the group (newest kept)


def event_line(subject: str, payload: bytes, *, model: str) -> Event | None:
    """The Events line of one bus message about ``model`` (``namespace/name``); None when it is about another model
    or is not an event this CLI knows. Pure."""
    kind = subject.split(".")[2] if subject.count(".") >= 3 else ""
    try:
        data: Any = json.loads(payload)
        if kind == "swap":
            swap = SwapEvent.model_validate(data)
            if model not in {swap.from_model, swap.to_model}:
                return None
            moved = f"{swap.from_model or '<none>'} -> {swap.to_model or '<none>'}"
            text = f"{moved} ({swap.reason.value}), {swap.phase.value}"
            return Event(swap.time, swap.kind, text + (f": {swap.message}" if swap.message else ""))
        if kind == "lease":
            lease = LeaseEvent.model_validate(data)
            until = f" until {rfc3339(lease.expires_at)}" if lease.expires_at else ""
            return Event(
                lease.time, lease.kind, f"gpulease/{lease.name} of {lease.owner} on group {lease.group}{until}"
            )
        if kind == "model":
            event = ModelEvent.model_validate(data)
            if f"{event.namespace}/{event.model}" != model:
                return None
            state = event.status.shared_group.state
            text = event.status.phase.value + (f", {state.value}" if state else "")
            return Event(event.time, event.kind, text + (f": {event.status.message}" if event.status.message else ""))
    except (ValueError, ValidationError):
        return None
    return None


def events_of(messages: Iterable[tuple[str, bytes]], *, model: str) -> tuple[Event, ...]:
    found = (event_line(subject, data, model=model) for subject, data in messages)
    return tuple(event for event in found if event is not None)


async def recent_events(url: str, *, group: str, model: str, now: datetime, since: timedelta) -> Events:
    """The events of ``model``'s group since ``now - since`` that concern it. Never raises: when NATS cannot be read,
    ``Events.unavailable`` says why (describe prints everything else)."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
    from nats.js.errors import NotFoundError

    try:
        nc = await connect_nats(url, identity=Identity.OBSERVER)
    except CliError as exc:
        return Events(unavailable=str(exc))
    messages: list[tuple[str, bytes]] = []
    try:
        js = nc.jetstream(timeout=5)
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_TIME,
            opt_start_time=now - since,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
        )
        subscription = await js.pull_subscribe(
            f"{subjects.EVENTS_PREFIX}.*.{subjects.token(group)}", stream=subjects.EVENTS_STREAM, config=config
        )
        try:
            while len(messages) < MAX_EVENTS:
                info = await subscription.consumer_info()
                if not info.num_pending:
                    break
                batch = await subscription.fetch(min(FETCH_BATCH, info.num_pending), timeout=2)
                messages.extend((m.subject, m.data) for m in batch)
        finally:
            with contextlib.suppress(Exception):
                await subscription.unsubscribe()
    except NotFoundError:
        return Events(unavailable=f"no {subjects.EVENTS_STREAM} stream on {redact_url(url)} (the scheduler creates it)")
    except Exception as exc:  # a describe prints what it has; the events' absence says why
        return Events(unavailable=f"cannot read events from NATS at {redact_url(url)}: {exc or type(exc).__name__}")
    finally:
        await nc.close()
    return Events(items=events_of(messages, model=model))
