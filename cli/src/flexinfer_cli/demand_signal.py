"""``flexinfer demand``: signal demand for a model over NATS, exactly as an external producer would
(docs/reference.md section 3): a ``Demand`` message on ``flexinfer.demand.<namespace>.<model>``.

It is published through JetStream so the answer says whether the scheduler's demand stream stored it.
"""

from __future__ import annotations

import asyncio
import os
from datetime import UTC, datetime
from typing import Any

from flexinfer_cli.bus_credentials import cli_auth, credentials_file
from flexinfer_cli.client import CliError
from flexinfer_cli.config import ModelRef, state_dir
from flexinfer_common.messages import Demand, message_id
from flexinfer_common.nats_auth import Identity, redact_url
from flexinfer_common.subjects import demand_subject


class NatsUnreachable(CliError):
    pass


def demand_message(ref: ModelRef, *, queued: int, source: str, now: datetime) -> tuple[str, Demand]:
    """The subject and message that signal demand for ``ref``. Pure."""
    message = Demand(model=ref.name, namespace=ref.namespace, queued=queued, source=source, time=now)
    return demand_subject(ref.namespace, ref.name), message


async def connect_nats(url: str, *, name: str = "flexinfer-cli", identity: Identity = Identity.DEMAND) -> Any:
    """A NATS connection for one CLI command (no reconnects), or NatsUnreachable saying what to do. It connects as
    ``identity`` with the credentials ``flexinfer up`` keeps in its state folder (or FLEXINFER_NATS_USER etc.)."""
    import nats
    from nats.errors import NoServersError
    from nats.errors import TimeoutError as NatsTimeoutError

    errors: list[Exception] = []
    auth = cli_auth(identity, url, os.environ, state_dir())
    shown = redact_url(url)

    async def remember(exc: Exception) -> None:  # reported once, below, instead of logged per attempt
        errors.append(exc)

    try:
        async with asyncio.timeout(10):
            return await nats.connect(
                servers=[part.strip() for part in url.split(",")],
                name=name,
                connect_timeout=2,
                allow_reconnect=False,
                # nats-py reads 0 as "retry forever"; 1 means one retry, then give up
                max_reconnect_attempts=1,
                reconnect_time_wait=0.1,
                error_cb=remember,
                **auth.connect_options(url),
            )
    except (OSError, nats.errors.Error, TimeoutError) as exc:
        if any("authorization violation" in str(e).lower() for e in (exc, *errors)):
            raise NatsUnreachable(
                f"NATS at {shown} refused "
                + (f"the credentials of {auth.user!r}" if auth.user else "a connection without credentials")
                + f". Run the CLI where `flexinfer up` keeps its state ({credentials_file(state_dir())}, or set "
                "FLEXINFER_STATE_DIR), or give FLEXINFER_NATS_USER and FLEXINFER_NATS_PASSWORD "
                "(or FLEXINFER_NATS_CREDS)."
            ) from None
        if not isinstance(exc, (OSError, NoServersError, NatsTimeoutError, TimeoutError)):
            raise NatsUnreachable(f"NATS at {shown} refused the connection: {exc}") from None
        cause = errors[-1] if errors else exc
        if isinstance(cause, ConnectionRefusedError):
            reason = "connection refused"
        elif isinstance(cause, OSError) and cause.strerror:
            reason = cause.strerror.lower()
        else:
            reason = str(cause) or type(cause).__name__
        raise NatsUnreachable(
            f"cannot reach NATS at {shown} ({reason}). Is FlexInfer running? Start it with "
            "`flexinfer up`, or point the CLI at its NATS with --nats-url / FLEXINFER_NATS_URL "
            "(`flexinfer up` prints it)."
        ) from None


async def publish_demand(url: str, ref: ModelRef, *, queued: int, source: str) -> str:
    """Publish one Demand; return its subject. Raise a CliError saying what went wrong."""
    from nats.errors import NoRespondersError
    from nats.errors import TimeoutError as NatsTimeoutError
    from nats.js.errors import NoStreamResponseError

    subject, message = demand_message(ref, queued=queued, source=source, now=datetime.now(UTC))
    nc = await connect_nats(url)
    try:
        await nc.jetstream(timeout=5).publish(subject, message.to_bytes(), headers={"Nats-Msg-Id": message_id(source)})
    except (NoStreamResponseError, NoRespondersError):
        raise CliError(
            f"no JetStream stream stores {subject} on {redact_url(url)}: the scheduler creates it when it starts. "
            "Is this the NATS of a running FlexInfer (`flexinfer up`)?"
        ) from None
    except (NatsTimeoutError, TimeoutError):
        raise CliError(
            f"NATS at {redact_url(url)} did not acknowledge the demand message in time (a NATS with authorization "
            "drops a publish the credentials do not allow: demand needs the `demand` identity)"
        ) from None
    finally:
        await nc.close()
    return subject
