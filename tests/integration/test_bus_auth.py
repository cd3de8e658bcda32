"""The bus's authorization on the real embedded NATS (the one `flexinfer up` runs, with the config it renders): every
identity tries every kind of publish and subscription, and only those its role needs get through (issue 22).

The expected table is written out here, from the roles (who writes what), not derived from
``flexinfer_common.nats_auth``: a permission added there by mistake makes a row fail.

A refused publish is dropped by the server, which tells the publisher with a ``Permissions Violation`` error; the
test waits for that error (the server has then handled the publish) and checks that an admin subscriber got nothing.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.aio.client import Client

from flexinfer_cli.embedded import _nats_says_info, find_nats_server, free_port
from flexinfer_common import subjects
from flexinfer_common.bus import STREAMS, Bus
from flexinfer_common.messages import Demand
from flexinfer_common.nats_auth import Identity, NatsAuth, inbox_prefix
from flexinfer_common.settings import CommonSettings, load_settings
from flexinfer_testbed.servers import NATS_PASSWORDS, TestServers, bare_url, identity_url

pytestmark = pytest.mark.integration

SCRATCH = "FLEXINFER_SCRATCH"  # the JetStream API rows target a stream that does not exist: an allowed call is harmless

PUBLISHES: dict[str, str] = {
    "demand": subjects.demand_subject("default", "m"),
    "in-flight": subjects.in_flight_subject("proxy-1"),
    "command": subjects.command_subject("default", "m"),
    "runtime-status": subjects.runtime_status_subject("default", "m"),
    "actuator-hello": subjects.actuator_hello_subject("actuator-1"),
    "model-status": subjects.model_status_subject("default", "m"),
    "group-status": subjects.group_status_subject("gpu"),
    "spec": subjects.spec_subject("Model", "default", "m"),
    "swap-event": subjects.event_subject("swap", "gpu"),
    "lease-event": subjects.event_subject("lease", "gpu"),
    "route-write": f"$KV.{subjects.ROUTES_BUCKET}.default.m",
    "stream-delete": f"$JS.API.STREAM.DELETE.{SCRATCH}",
    "stream-update": f"$JS.API.STREAM.UPDATE.{SCRATCH}",
    "stream-purge": f"$JS.API.STREAM.PURGE.{SCRATCH}",
    "message-delete": f"$JS.API.STREAM.MSG.DELETE.{SCRATCH}",
    "read-commands": f"$JS.API.CONSUMER.CREATE.{subjects.COMMAND_STREAM}.x.{subjects.COMMAND_PREFIX}.>",
    "read-routes": f"$JS.API.CONSUMER.CREATE.KV_{subjects.ROUTES_BUCKET}.x",
    "read-events": f"$JS.API.CONSUMER.CREATE.{subjects.EVENTS_STREAM}.x.{subjects.EVENTS_PREFIX}.>",
    "forged-reply": "_INBOX.actuator.forged",
}

ALL = frozenset(PUBLISHES)
ALLOWED_PUBLISH: dict[Identity, frozenset[str]] = {
    Identity.SCHEDULER: frozenset(
        {
            "command",
            "model-status",
            "group-status",
            "swap-event",
            "lease-event",
            "route-write",
            "stream-delete",
            "stream-update",
            "stream-purge",
            "message-delete",
            "read-commands",
            "read-routes",
            "read-events",
        }
    ),
    Identity.PROXY: frozenset({"demand", "in-flight", "read-routes"}),
    Identity.ACTUATOR: frozenset({"runtime-status", "actuator-hello", "spec", "read-commands", "read-events"}),
    Identity.LEASE_MANAGER: frozenset({"lease-event", "read-events"}),
    Identity.DEMAND: frozenset({"demand"}),
    Identity.OBSERVER: frozenset({"read-events"}),
    Identity.ADMIN: ALL,
}

# Core subscriptions (the pattern, and a subject the admin publishes on to see whether it is delivered): the
# inboxes, and (for observers) events.
SUBSCRIPTIONS: dict[str, tuple[str, str]] = {
    "every-subject": (">", "flexinfer.anything"),
    "every-inbox": ("_INBOX.>", "_INBOX.someone.1"),
    "scheduler-inbox": (inbox_prefix("scheduler") + ".>", inbox_prefix("scheduler") + ".1"),
    "actuator-inbox": (inbox_prefix("actuator") + ".>", inbox_prefix("actuator") + ".1"),
    "commands": (subjects.COMMAND_PREFIX + ".>", subjects.command_subject("default", "m")),
    "route-writes": (f"$KV.{subjects.ROUTES_BUCKET}.>", f"$KV.{subjects.ROUTES_BUCKET}.default.m"),
    "events": (subjects.EVENTS_PREFIX + ".>", subjects.event_subject("swap", "gpu")),
}
ALLOWED_SUBSCRIBE: dict[Identity, frozenset[str]] = {
    Identity.SCHEDULER: frozenset({"scheduler-inbox"}),
    Identity.PROXY: frozenset(),
    Identity.ACTUATOR: frozenset({"actuator-inbox"}),
    Identity.LEASE_MANAGER: frozenset(),
    Identity.DEMAND: frozenset(),
    Identity.OBSERVER: frozenset({"events"}),
    Identity.ADMIN: frozenset(SUBSCRIPTIONS),
}


@pytest.fixture
def authorized(servers: TestServers) -> str:
    if not NATS_PASSWORDS:
        pytest.fail(
            "the test NATS has no authorization: FLEXINFER_TEST_NATS_URL or Docker gave a bare server; "
            "run this test with the embedded one (FLEXINFER_TEST_DOCKER=0, no FLEXINFER_TEST_NATS_URL)"
        )
    return servers.nats_url


class Client_:
    """A connection (``nc``) as ``identity`` that remembers the server's errors (permission violations)."""

    def __init__(self, identity: Identity, nc: Client, errors: list[str]) -> None:
        self.identity = identity
        self.nc = nc
        self.errors = errors

    @classmethod
    async def connect(cls, url: str, identity: Identity) -> Client_:
        errors: list[str] = []

        async def on_error(exc: Exception) -> None:
            errors.append(str(exc))

        nc = await nats.connect(
            identity_url(url, identity),
            inbox_prefix=inbox_prefix(identity),
            error_cb=on_error,
            allow_reconnect=False,
            connect_timeout=2,
        )
        return cls(identity, nc, errors)

    def refused(self, what: str, subject: str) -> bool:
        """Whether the server answered ``Permissions Violation for <what> to "<subject>"`` yet (an answer that has not
        arrived only costs the caller a longer wait for a delivery that does not come)."""
        needle = f'Permissions Violation for {what} to "{subject}"'.lower()
        return any(needle in e.lower() for e in self.errors)


@pytest.fixture
async def admin(authorized: str) -> AsyncIterator[Client]:
    nc = await nats.connect(identity_url(authorized, Identity.ADMIN))
    yield nc
    await nc.close()


@pytest.fixture(params=[pytest.param(i, id=i.value) for i in Identity])
async def client(request: pytest.FixtureRequest, authorized: str) -> AsyncIterator[Client_]:
    """A connection as each identity in turn (a test that takes it runs once for every identity)."""
    client = await Client_.connect(authorized, request.param)
    yield client
    await client.nc.close()


class Spy:
    """A subscription that notes what it receives."""

    def __init__(self) -> None:
        self.got = asyncio.Event()
        self.sub: Any = None

    async def start(self, nc: Client, subject: str) -> Spy:
        async def note(_msg: Any) -> None:
            self.got.set()

        self.sub = await nc.subscribe(subject, cb=note)
        await nc.flush()
        return self

    async def received(self, within: float) -> bool:
        try:
            await asyncio.wait_for(self.got.wait(), within)
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        await self.sub.unsubscribe()


async def attempt(
    send: Callable[[], Awaitable[None]], sender: Client, spy: Spy, refused: Callable[[], bool], within: float = 10.0
) -> bool:
    """Whether what ``send`` publishes reaches ``spy``: sent again every 0.2 s (the server, on a busy machine, now and
    then loses a message to a subscription made just before) until it arrives, or the server says it refused the
    publish or the subscription (then: whether anything came after all, in a short while)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    while loop.time() < deadline:
        await send()
        await sender.flush()
        if await spy.received(within=0.2):
            return True
        if refused():
            return await spy.received(within=0.1)
    return False


async def test_each_identity_publishes_only_its_own_subjects(admin: Client, client: Client_) -> None:
    outcome: dict[str, bool] = {}
    for row, subject in PUBLISHES.items():
        spy = await Spy().start(admin, subject)
        outcome[row] = await attempt(
            lambda subject=subject: client.nc.publish(subject, b'{"forged": true}'),
            client.nc,
            spy,
            lambda subject=subject: client.refused("Publish", subject),
        )
        await spy.stop()
    assert {row for row, through in outcome.items() if through} == ALLOWED_PUBLISH[client.identity]


async def test_each_identity_subscribes_only_to_its_own_inbox_and_reads(admin: Client, client: Client_) -> None:
    granted = set()
    for row, (pattern, sample) in SUBSCRIPTIONS.items():
        spy = await Spy().start(client.nc, pattern)
        if await attempt(
            lambda sample=sample: admin.publish(sample, b"x"),
            admin,
            spy,
            lambda pattern=pattern: client.refused("Subscription", pattern),
        ):
            granted.add(row)
        await spy.stop()
    assert granted == ALLOWED_SUBSCRIBE[client.identity]


async def test_a_connection_without_the_credentials_is_refused(authorized: str) -> None:
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(bare_url(authorized), allow_reconnect=False, connect_timeout=2)
    wrong = identity_url(authorized, Identity.PROXY).replace("proxy:", "proxy:x", 1)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(wrong, allow_reconnect=False, connect_timeout=2)
    bus = Bus(bare_url(authorized), name="intruder")
    with pytest.raises(ConnectionError, match="refused a connection without credentials"):
        await bus.connect(wait=5)


async def test_the_services_identities_do_their_jobs(clean_nats: str) -> None:
    """The allowed paths end to end, with the services' own Bus code: the scheduler creates the streams and writes a
    route, the proxy reads it and publishes demand (acknowledged by JetStream, on its own inbox), the demand identity
    (`flexinfer demand`, external producers) too; the proxy's route write is refused and changes nothing."""
    scheduler = Bus(identity_url(clean_nats, Identity.SCHEDULER), name="scheduler")
    proxy = Bus(identity_url(clean_nats, Identity.PROXY), name="proxy")
    producer = Bus(identity_url(clean_nats, Identity.DEMAND), name="producer")
    await scheduler.connect(wait=5)
    await proxy.connect(wait=5)
    await producer.connect(wait=5)
    try:
        await scheduler.ensure_streams()
        await proxy.ensure_streams(owner=False)
        routes = await scheduler.routes()
        await routes.put("default.m", b'{"endpoint": "http://127.0.0.1:9/"}')
        seen = await (await proxy.routes()).get("default.m")
        assert seen.value == b'{"endpoint": "http://127.0.0.1:9/"}'

        demand = Demand(model="m", namespace="default", queued=1, source="test")
        await proxy.publish(subjects.demand_subject("default", "m"), demand)
        await producer.publish(subjects.demand_subject("default", "m"), demand)
        info = await scheduler.js.stream_info(subjects.DEMAND_STREAM)
        assert info.state.messages == 2

        with pytest.raises(Exception):  # noqa: B017  (nats-py: a timeout, the publish was dropped)
            await asyncio.wait_for((await proxy.routes()).put("default.m", b'{"endpoint": "http://evil/"}'), 3)
        assert (await routes.get("default.m")).value == b'{"endpoint": "http://127.0.0.1:9/"}'
    finally:
        for bus in (producer, proxy, scheduler):
            await bus.close()


@pytest.fixture
def nkey_server(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """A nats-server whose one user is an nkey (an external NATS configured that way); yields its URL, that user's
    seed file and a seed file of an unknown key."""
    import nkeys

    def seed_file(name: str) -> tuple[Path, str]:
        seed = nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER)
        path = tmp_path / f"{name}.nk"
        path.write_bytes(seed + b"\n")
        path.chmod(0o600)
        return path, nkeys.from_seed(bytearray(seed)).public_key.decode()

    user, public = seed_file("user")
    stranger, _ = seed_file("stranger")
    config = tmp_path / "nats.conf"
    config.write_text(json.dumps({"authorization": {"users": [{"nkey": public}]}}))
    port = free_port()
    proc = subprocess.Popen(
        [str(find_nats_server()), "-a", "127.0.0.1", "-p", str(port), "-js", "-sd", str(tmp_path), "-c", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while not _nats_says_info(port):
            assert proc.poll() is None and time.monotonic() < deadline, "nats-server did not start"
            time.sleep(0.02)
        yield f"nats://127.0.0.1:{port}", user, stranger
    finally:
        proc.terminate()
        proc.wait(10)


async def test_an_external_nats_with_nkey_users(nkey_server: tuple[str, Path, Path]) -> None:
    """FLEXINFER_NATS_NKEY: a service signs in with its seed file; an unknown key is refused at once."""
    url, user, stranger = nkey_server
    settings = load_settings(CommonSettings, nats_url=url, nats_nkey=str(user))
    bus = Bus(url, name="nkey-user", auth=settings.nats_auth())
    await bus.connect(wait=5)
    try:
        await bus.ensure_streams()
        assert (await bus.js.account_info()).streams == len(STREAMS)
    finally:
        await bus.close()
    intruder = Bus(url, name="stranger", auth=NatsAuth(nkey_file=str(stranger)))
    with pytest.raises(ConnectionError, match="refused the credentials of"):
        await intruder.connect(wait=5)
