"""Who may do what on the bus: one NATS identity per FlexInfer component, each allowed only its own subjects.

The single definition of the bus's permissions: ``flexinfer up`` renders it into its embedded server's config
(:func:`server_authorization`), the umbrella chart's bundled NATS carries the same lists (a unit test compares them),
and the integration tests try every forbidden publish and subscription against a real server.

NATS permissions are allow-lists: what is not listed is refused (a publish is dropped with a "Permissions
Violation" error, a subscription is refused). Every identity may subscribe only to its own inbox prefix
(``_INBOX.<identity>.>``; the client sets it, see :func:`inbox_prefix`), so none reads another's replies (acks,
JetStream deliveries of commands or routes). JetStream's API is a set of subjects too (``$JS.API.…``): a reader
gets the calls that create and read consumers of the streams it reads, a writer none beyond creating the streams
(idempotent; only the scheduler, which owns them, may update or delete streams, purge them or delete messages).
A KV write is a publish on ``$KV.<bucket>.<key>``: only the scheduler has it for the routes bucket.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from enum import StrEnum
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from flexinfer_common import subjects

JS_API = "$JS.API"
ROUTES_STREAM = f"KV_{subjects.ROUTES_BUCKET}"
ROUTES_WRITE = f"$KV.{subjects.ROUTES_BUCKET}.>"

#: Every stream (and the routes bucket's stream) any component creates at start.
ALL_STREAMS: tuple[str, ...] = (
    subjects.DEMAND_STREAM,
    subjects.IN_FLIGHT_STREAM,
    subjects.COMMAND_STREAM,
    subjects.RUNTIME_STATUS_STREAM,
    subjects.MODEL_STATUS_STREAM,
    subjects.EVENTS_STREAM,
    subjects.SPEC_STREAM,
    ROUTES_STREAM,
)


class Identity(StrEnum):
    """The bus's users. The value is the NATS user name (and the inbox prefix's last token)."""

    SCHEDULER = "scheduler"
    PROXY = "proxy"
    ACTUATOR = "actuator"
    LEASE_MANAGER = "lease-manager"
    DEMAND = "demand"  # `flexinfer demand` and external demand producers
    OBSERVER = "observer"  # `flexinfer describe`, dashboards: read statuses and events
    ADMIN = "admin"  # an operator with the nats CLI; the tests' fixtures


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def as_config(self) -> dict[str, Any]:
        return {"publish": {"allow": list(self.publish)}, "subscribe": {"allow": list(self.subscribe)}}


def inbox_prefix(identity: str) -> str:
    """The inbox prefix a client of ``identity`` uses (and the only one it may subscribe to)."""
    return f"_INBOX.{subjects.token(identity)}"


def _create_streams() -> tuple[str, ...]:
    """Create (idempotently) any of FlexInfer's streams, and ask JetStream about itself and them."""
    return (
        f"{JS_API}.INFO",
        *(f"{JS_API}.STREAM.CREATE.{stream}" for stream in ALL_STREAMS),
        *(f"{JS_API}.STREAM.INFO.{stream}" for stream in ALL_STREAMS),
    )


def _read(*streams: str) -> tuple[str, ...]:
    """Consume ``streams``: create, look up, pull from, ack and delete (its own) consumers; read single messages."""
    out: list[str] = []
    for stream in streams:
        out += [
            f"{JS_API}.CONSUMER.CREATE.{stream}",
            f"{JS_API}.CONSUMER.CREATE.{stream}.>",
            f"{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.*",
            f"{JS_API}.CONSUMER.INFO.{stream}.*",
            f"{JS_API}.CONSUMER.DELETE.{stream}.*",
            f"{JS_API}.CONSUMER.MSG.NEXT.{stream}.*",
            f"{JS_API}.STREAM.MSG.GET.{stream}",
            f"{JS_API}.DIRECT.GET.{stream}",
            f"{JS_API}.DIRECT.GET.{stream}.>",
            f"$JS.ACK.{stream}.>",
            f"$JS.FC.{stream}.>",
        ]
    return tuple(out)


def _inbox(identity: Identity) -> tuple[str, ...]:
    return (inbox_prefix(identity) + ".>",)


#: What each component may publish; each subscribes only to its own inbox (the admin and the observer: see
#: :func:`permissions`).
_PUBLISH: dict[Identity, tuple[str, ...]] = {
    # The owner of the streams and the sole writer of routes, commands, statuses and swap events.
    Identity.SCHEDULER: (
        f"{subjects.COMMAND_PREFIX}.>",
        f"{subjects.STATUS_PREFIX}.>",
        f"{subjects.EVENTS_PREFIX}.>",
        ROUTES_WRITE,
        f"{JS_API}.>",
        "$JS.ACK.>",
        "$JS.FC.>",
    ),
    Identity.PROXY: (
        f"{subjects.DEMAND_PREFIX}.>",
        f"{subjects.IN_FLIGHT_PREFIX}.>",
        *_create_streams(),
        *_read(ROUTES_STREAM),
    ),
    # Statuses of the runtimes it runs, its hello; in Kubernetes mode the specs it reads from the cluster. It
    # reads commands, and (Kubernetes mode) the statuses and swap events it writes back to the objects.
    Identity.ACTUATOR: (
        f"{subjects.RUNTIME_STATUS_PREFIX}.>",
        f"{subjects.ACTUATOR_HELLO_PREFIX}.>",
        f"{subjects.SPEC_PREFIX}.>",
        *_create_streams(),
        *_read(subjects.COMMAND_STREAM, subjects.MODEL_STATUS_STREAM, subjects.EVENTS_STREAM),
    ),
    Identity.LEASE_MANAGER: (
        f"{subjects.EVENTS_PREFIX}.lease.>",
        *_create_streams(),
        *_read(subjects.MODEL_STATUS_STREAM, subjects.EVENTS_STREAM),
    ),
    Identity.DEMAND: (f"{subjects.DEMAND_PREFIX}.>",),
}


def permissions(identity: Identity) -> Permissions:
    """What ``identity`` may publish and subscribe to."""
    if identity is Identity.ADMIN:
        return Permissions(publish=(">",), subscribe=(">",))
    if identity is Identity.OBSERVER:
        return Permissions(
            publish=(f"{JS_API}.INFO", *_read(subjects.MODEL_STATUS_STREAM, subjects.EVENTS_STREAM)),
            subscribe=(*_inbox(identity), f"{subjects.STATUS_PREFIX}.>", f"{subjects.EVENTS_PREFIX}.>"),
        )
    if identity not in _PUBLISH:  # pragma: no cover - the enum is closed
        raise ValueError(f"unknown identity {identity!r}")
    return Permissions(publish=_PUBLISH[identity], subscribe=_inbox(identity))


#: Which identity each service of ``flexinfer up`` connects as.
SERVICE_IDENTITIES: dict[str, Identity] = {
    "scheduler": Identity.SCHEDULER,
    "proxy": Identity.PROXY,
    "actuator": Identity.ACTUATOR,
    "lease-manager": Identity.LEASE_MANAGER,
}


def server_authorization(passwords: dict[Identity, str]) -> dict[str, Any]:
    """The ``authorization`` block of a nats-server config: one user per identity, with its password and
    permissions. ``passwords`` must name every identity."""
    return {
        "authorization": {
            "timeout": 2,
            "users": [
                {
                    "user": identity.value,
                    "password": passwords[identity],
                    "permissions": permissions(identity).as_config(),
                }
                for identity in Identity
            ],
        }
    }


@dataclass(frozen=True)
class NatsAuth:
    """How a client authenticates to NATS and verifies the server (settings ``FLEXINFER_NATS_*``)."""

    user: str | None = None
    password: str | None = None
    creds_file: str | None = None  # a NATS credentials file: a user JWT and its nkey seed
    nkey_file: str | None = None  # an nkey seed file (a server configured with nkey users)
    tls_ca: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None
    inbox_prefix: str | None = None

    def __repr__(self) -> str:  # never the password
        return f"NatsAuth(user={self.user!r}, creds_file={self.creds_file!r}, nkey_file={self.nkey_file!r})"

    def connect_options(self, url: str) -> dict[str, Any]:
        """nats-py's ``connect`` arguments for this identity (the URL's own ``user:password`` still counts)."""
        options: dict[str, Any] = {}
        if self.user:
            options["user"] = self.user
            options["password"] = self.password or ""
        if self.creds_file:
            options["user_credentials"] = self.creds_file
        if self.nkey_file:
            options["nkeys_seed"] = self.nkey_file
        prefix = self.inbox_prefix or _default_inbox_prefix(self.user or url_user(url))
        if prefix:
            options["inbox_prefix"] = prefix
        if self.tls_ca or self.tls_cert:
            context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.tls_ca)
            if self.tls_cert:
                context.load_cert_chain(self.tls_cert, self.tls_key)
            options["tls"] = context
        return options


def url_user(url: str) -> str | None:
    return next((urlsplit(u.strip()).username for u in url.split(",") if urlsplit(u.strip()).username), None)


def _default_inbox_prefix(user: str | None) -> str | None:
    return inbox_prefix(user) if user else None


def redact_url(url: str) -> str:
    """``url`` (one or a comma-separated list) without passwords: ``nats://proxy:***@host:4222``."""
    out = []
    for part in url.split(","):
        split = urlsplit(part.strip())
        if split.password is not None:
            host = split.hostname or ""
            if ":" in host:
                host = f"[{host}]"
            netloc = f"{split.username}:***@{host}" + (f":{split.port}" if split.port else "")
            part = urlunsplit(split._replace(netloc=netloc))
        out.append(part.strip())
    return ",".join(out)


def chart_permissions() -> dict[str, Any]:
    """The permissions of every identity, as the umbrella chart's bundled NATS reads them
    (``charts/flexinfer/files/nats-permissions.json``; regenerate with ``python -m flexinfer_common.nats_auth``)."""
    return {identity.value: permissions(identity).as_config() for identity in Identity}


if __name__ == "__main__":  # pragma: no cover - the chart file's generator
    import json
    import sys

    json.dump(chart_permissions(), sys.stdout, indent=2)
    sys.stdout.write("\n")
