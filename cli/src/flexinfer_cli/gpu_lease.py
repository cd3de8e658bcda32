"""``flexinfer lease``: hold a group's GPU for other work (docs/reference.md section 7), through the lease
manager's API.

- ``acquire`` takes the lease; with ``--wait`` it waits for the group to be free and then until every serving
  member is parked (``Held``), printing what it waits for.
- ``run`` takes the lease, waits until it is Held, runs COMMAND, renews the lease while COMMAND runs and releases
  it however COMMAND ends. Signals for the wrapper (Ctrl-C, SIGTERM, SIGHUP) go to COMMAND, which runs in a process
  group of its own; when COMMAND has ended the lease is released. If the wrapper itself is killed outright
  (SIGKILL), COMMAND gets SIGTERM (it cannot hold the GPU without its lease) and the lease lapses at its TTL — which
  is why ``run`` uses a short TTL (2 minutes) and renews it every quarter of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import getpass
import os
import re
import signal
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol
from urllib.parse import quote

from pydantic import ValidationError

from flexinfer_cli.client import ApiError, CliError, ServiceUnreachable
from flexinfer_cli.supervisor import parent_death_preexec
from flexinfer_common.admin_api import Lease, LeaseAcquire
from flexinfer_common.clock import rfc3339
from flexinfer_common.durations import parse_duration
from flexinfer_common.manifests import MIN_LEASE_TTL_SECONDS
from flexinfer_common.quantity import parse_memory

LEASES = "/api/v1/leases"
RUN_TTL = timedelta(minutes=2)
POLL = 0.5
SERVER_WAIT = "2s"  # each acquire call waits this long on the server, then the CLI reports and asks again
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

Echo = Callable[[str], None]


class LeaseApi(Protocol):
    """What these commands need of the lease manager's API (an ``AdminClient``)."""

    async def get(self, path: str) -> Any: ...

    async def post(self, path: str, body: Any = None) -> Any: ...

    async def delete(self, path: str) -> Any: ...


class LeaseUsageError(CliError):
    exit_code = 2


class Interrupted(Exception):
    """A signal came while acquiring; ``lease``: what was taken meanwhile (to release), if anything."""

    def __init__(self, lease: dict[str, Any] | None) -> None:
        super().__init__("interrupted")
        self.lease = lease


def parse_ttl(text: str) -> int:
    """``--ttl``: a Go-style duration (``90s``, ``1h``) or seconds, at least 60 s."""
    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError as exc:
        raise LeaseUsageError(f"--ttl: {exc}") from None
    if seconds < MIN_LEASE_TTL_SECONDS:
        raise LeaseUsageError(f"--ttl: must be at least {MIN_LEASE_TTL_SECONDS}s (got {text})")
    return round(seconds)


def parse_memory_option(text: str) -> int:
    """``--memory``: a Kubernetes quantity (``4Gi``) or bytes."""
    try:
        return parse_memory(text)
    except ValueError as exc:
        raise LeaseUsageError(f"--memory: {exc}") from None


def parse_interval(text: str, option: str) -> float:
    try:
        seconds = parse_duration(text).total_seconds()
    except ValueError as exc:
        raise LeaseUsageError(f"{option}: {exc}") from None
    if seconds <= 0:
        raise LeaseUsageError(f"{option}: must be above 0 (got {text})")
    return seconds


def default_owner() -> str:
    """The user's login name, made a valid owner (letters, digits, '.', '_', '-')."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = ""
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", user).strip("._-")
    return cleaned or "flexinfer-cli"


def lease_body(
    *,
    group: str,
    owner: str,
    node: str | None = None,
    ttl_seconds: int | None = None,
    name: str | None = None,
    namespace: str | None = None,
    memory: int | None = None,
) -> dict[str, Any]:
    """The body of ``POST /api/v1/leases`` (the lease manager's own request model)."""
    request = LeaseAcquire(
        group=group, owner=owner, node=node, ttl_seconds=ttl_seconds, name=name, namespace=namespace, memory=memory
    )
    body: dict[str, Any] = request.model_dump(by_alias=True, exclude_none=True)
    return body


def lease_path(name: str, suffix: str = "") -> str:
    return f"{LEASES}/{quote(name, safe='')}{suffix}"


def lease_line(verb: str, answer: Any) -> str:
    """``gpulease/<name> <verb> (group G, owner O, <phase>, expires T)``, read through the API's Lease model."""
    try:
        lease = Lease.model_validate(answer)
    except ValidationError:
        raise CliError(f"the lease manager's answer is not a lease: {str(answer)[:200]}") from None
    details = [f"group {lease.group}", f"owner {lease.owner}"]
    if lease.phase is not None:
        details.append(lease.phase.value)
    if lease.memory is not None:
        details.append(f"{lease.memory} bytes" + (f" on device {lease.device}" if lease.device is not None else ""))
    if lease.expires_at is not None:
        details.append(f"expires {rfc3339(lease.expires_at)}")
    return f"gpulease/{lease.name} {verb} ({', '.join(details)})"


def _leased(exc: ApiError) -> bool:
    """A 409 because the group is held by another lease (waiting helps), not because of a name or an owner."""
    return exc.status == 409 and " is leased by " in exc.message


async def acquire(
    client: LeaseApi,
    body: dict[str, Any],
    *,
    wait: bool,
    echo: Echo,
    give_up_after: float | None = None,
    stop: asyncio.Event | None = None,
) -> dict[str, Any]:
    """Take the lease. With ``wait``: until the group is free, then until the lease is Held, printing each new thing
    it waits for; ``give_up_after`` (seconds) gives up (a lease already taken is kept: the error names it)."""
    if not wait:
        lease: dict[str, Any] = await client.post(LEASES, body)
        return lease
    deadline = None if give_up_after is None else time.monotonic() + give_up_after
    shown = ""

    def show(line: str) -> None:
        nonlocal shown
        if line != shown:
            echo(line)
            shown = line

    def timed_out() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    while True:
        try:
            lease = await client.post(f"{LEASES}?wait={SERVER_WAIT}", body)
            break
        except ApiError as exc:
            if not _leased(exc):
                raise
            show(f"waiting: {exc.message}")
            if stop is not None and stop.is_set():
                raise Interrupted(None) from None
            if timed_out():
                raise CliError(f"gave up waiting for group {body['group']}: {exc.message}") from None
    echo(lease_line("acquired", lease))
    name = str(lease["name"])
    while lease.get("phase") != "Held":
        show(f"parking: {lease.get('message') or 'waiting for the serving models to park'}")
        if stop is not None and stop.is_set():
            raise Interrupted(lease)
        if timed_out():
            raise CliError(
                f"gave up waiting for group {lease['group']} to park; lease {name} is still held (release it with "
                f"`flexinfer lease release {name}`)"
            )
        await _pause(stop, POLL)
        lease = await client.get(lease_path(name))
    echo(f"gpulease/{name} held: {lease.get('message') or 'every serving model is parked'}")
    return lease


async def _pause(stop: asyncio.Event | None, seconds: float) -> None:
    if stop is None:
        await asyncio.sleep(seconds)
        return
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


# ------------------------------------------------------------------------------------------ lease run


def exit_code(returncode: int) -> int:
    """A shell's convention: a command killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


async def run_with_lease(
    client: LeaseApi,
    body: dict[str, Any],
    command: Sequence[str],
    *,
    renew_every: float,
    echo: Echo,
) -> int:
    """Hold a lease for the life of ``command``; return the exit code to exit with."""
    loop = asyncio.get_running_loop()
    interrupted = asyncio.Event()
    received: list[signal.Signals] = []
    process: asyncio.subprocess.Process | None = None

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        if process is not None and process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, sig)  # COMMAND decides how to end; the lease is released once it has
        else:
            interrupted.set()

    for sig in FORWARDED:
        loop.add_signal_handler(sig, on_signal, sig)
    lease: dict[str, Any] | None = None
    try:
        try:
            lease = await acquire(client, body, wait=True, echo=echo, stop=interrupted)
        except Interrupted as exc:
            lease = exc.lease
            echo(f"interrupted ({received[-1].name}) before {command[0]} started")
            return exit_code(-received[-1])
        env = command_env(lease)
        try:
            process = await asyncio.create_subprocess_exec(
                *command, preexec_fn=parent_death_preexec(signal.SIGTERM), process_group=0, env=env
            )
        except OSError as exc:
            echo(f"cannot run {command[0]}: {exc.strerror or exc}")
            return 127 if isinstance(exc, FileNotFoundError) else 126
        where = f" (CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']})" if env is not None else ""
        echo(f"running {' '.join(command)} (pid {process.pid}) while gpulease/{lease['name']} holds the GPU{where}")
        renewer = asyncio.create_task(_keep_renewed(client, lease, body, renew_every, echo))
        try:
            returncode = await process.wait()
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
        echo(f"{command[0]} ended ({_ended(returncode)})")
        return exit_code(returncode)
    finally:
        for sig in FORWARDED:
            loop.remove_signal_handler(sig)
        if lease is not None:
            await _release(client, lease, echo)


def command_env(lease: dict[str, Any]) -> dict[str, str] | None:
    """COMMAND's environment: for a lease with memory reserved on one device, ``CUDA_VISIBLE_DEVICES`` is that
    device (the group's device index, as its capacity counts them), so the work lands where the memory was freed;
    otherwise (the whole group is leased) COMMAND inherits the environment as it is."""
    device = lease.get("device")
    if not isinstance(device, int) or isinstance(device, bool):
        return None
    return {**os.environ, "CUDA_VISIBLE_DEVICES": str(device)}


def _ended(returncode: int) -> str:
    if returncode < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-returncode).name}"
        return f"killed by signal {-returncode}"
    return f"exit code {returncode}"


async def _keep_renewed(
    client: LeaseApi, lease: dict[str, Any], body: dict[str, Any], every: float, echo: Echo
) -> None:
    name, owner = str(lease["name"]), str(lease["owner"])
    while True:
        await asyncio.sleep(every)
        try:
            await client.post(lease_path(name, "/renew"), {"owner": owner})
        except ApiError as exc:
            if exc.status != 404:
                echo(f"warning: cannot renew gpulease/{name}: {exc.message}")
                continue
            # It lapsed (a long outage of the lease manager) or someone released it: COMMAND still uses the GPU.
            echo(f"warning: gpulease/{name} is gone ({exc.message}); taking it again")
            try:
                await client.post(LEASES, {**body, "name": name})
            except CliError as again:
                echo(f"warning: cannot take gpulease/{name} again: {again}")
        except ServiceUnreachable as exc:
            echo(f"warning: cannot renew gpulease/{name}: {exc}; it lapses at its TTL unless renewed in time")


async def _release(client: LeaseApi, lease: dict[str, Any], echo: Echo) -> None:
    name = str(lease["name"])
    try:
        await client.delete(lease_path(name) + f"?owner={quote(str(lease['owner']), safe='')}")
    except ApiError as exc:
        if exc.status != 404:
            echo(f"warning: cannot release gpulease/{name}: {exc.message}; it lapses at its TTL")
            return
    except CliError as exc:
        echo(f"warning: cannot release gpulease/{name}: {exc}; it lapses at its TTL")
        return
    echo(f"gpulease/{name} released")
