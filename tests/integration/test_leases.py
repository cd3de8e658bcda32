"""GPU leases end to end on real NATS and Postgres, without Kubernetes: the lease manager's API, the scheduler's
election and the local actuator's model processes (the seed's "Training on a shared card (GPU lease)").

Time: the shortest TTL is 60 s. Where a test needs a lease to lapse, it moves the lease's ``expires_at`` to a
second from now in Postgres (what the passing of its TTL would do) instead of waiting a minute; nothing else about
the lease is touched."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from flexinfer_cli.apply_plan import execute_plan, plan_apply
from flexinfer_cli.client import AdminClient
from flexinfer_cli.config import Service
from flexinfer_cli.embedded import free_port
from flexinfer_common.bus import Bus
from flexinfer_common.manifests import load_manifests
from flexinfer_common.messages import LeaseEvent, RuntimeStatus
from flexinfer_testbed.kube_models import gpu_group
from flexinfer_testbed.system import System, fake_model, service_environment
from tests.integration.test_scheduler_policies import members, running, sql
from tests.support.processes import alive
from tests.support.system import SystemStarter
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

ALL = ("scheduler", "actuator", "proxy", "lease-manager")


@dataclass
class Recorder:
    """What the bus said: when each model was reported parked, and the lease events in order."""

    parked_at: dict[str, datetime] = field(default_factory=dict)
    lease_events: list[LeaseEvent] = field(default_factory=list)

    async def start(self, bus: Bus) -> None:
        async def on_runtime(msg: Any) -> None:
            status = RuntimeStatus.model_validate_json(msg.data)
            if status.phase.value == "Parked":
                self.parked_at[status.model] = status.time

        async def on_lease(msg: Any) -> None:
            self.lease_events.append(LeaseEvent.model_validate_json(msg.data))

        await bus.nc.subscribe("flexinfer.actuator.status.>", cb=on_runtime)
        await bus.nc.subscribe("flexinfer.events.lease.>", cb=on_lease)

    def kinds(self, lease: str) -> list[str]:
        return [event.kind for event in self.lease_events if event.name == lease]

    async def parked(self, model: str) -> datetime:
        """When ``model`` was reported parked (waiting for the report to arrive here)."""
        await wait_for(lambda: _async(model in self.parked_at))
        return self.parked_at[model]

    async def last_kind(self, lease: str, kind: str) -> None:
        await wait_for(lambda: _async(self.kinds(lease)[-1:] == [kind]))


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a Prometheus exposition, or None when the series is absent."""
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def acquire(system: System, body: dict[str, Any], wait: str | None = None) -> tuple[int, Any]:
    path = "/api/v1/leases" + (f"?wait={wait}" if wait else "")
    return await system.call("POST", "lease-manager", path, body)


async def all_parked_by(system: System, owner: str, group: str = "gpu") -> bool:
    return all(
        m["phase"] == "Preempted" and m["preemptedBy"] == f"gpu-lease/{owner}"
        for m in (await members(system, group)).values()
    )


async def phase_is(system: System, name: str, phase: str, group: str = "gpu") -> bool:
    return (await members(system, group)).get(name, {}).get("phase") == phase


async def leases_as_written(system: System) -> list[dict[str, Any]]:
    """The leases, without what the lease manager's own reconcile moves (phase, message, heldAt)."""
    kept = ("name", "namespace", "group", "owner", "node", "ttlSeconds", "acquiredAt", "expiresAt", "renewTime")
    items = (await system.get("lease-manager", "/api/v1/leases"))["items"]
    return [{key: item[key] for key in kept} for item in items]


@contextlib.asynccontextmanager
async def serving_a(start_system: SystemStarter) -> AsyncIterator[System]:
    """The scheduler, the actuator and the lease manager, with model ``a`` of group ``gpu`` Ready."""
    async with start_system(services=("scheduler", "actuator", "lease-manager")) as system:
        await system.put_model(fake_model("a"))
        await wait_for(lambda: phase_is(system, "a", "Ready"))
        yield system


async def chat(proxy: str, model: str) -> tuple[int, dict[str, str]]:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as http, http.post(f"{proxy}/v1/chat/completions", json=body) as resp:
        await resp.read()
        return resp.status, dict(resp.headers)


async def test_an_acquire_answers_only_once_every_member_is_parked_and_a_release_re_promotes_serving(
    bus: Bus, caplog: pytest.LogCaptureFixture, start_system: SystemStarter
) -> None:
    caplog.set_level(logging.INFO)  # every log line on these paths is made (a bad one would break the reconcile)
    recorder = Recorder()
    await recorder.start(bus)
    async with start_system(services=ALL) as system:
        await system.put_model(fake_model("a", priority=10))
        await system.put_model(fake_model("b", priority=5))
        await wait_for(lambda: phase_is(system, "a", "Ready"))

        # (the counter is the process's: services run in the test's process, and an earlier test may have counted)
        labels = {"group": "gpu", "namespace": "default", "owner": "trainer"}
        before = metric(await system.metrics("lease-manager"), "flexinfer_gpu_lease_acquired_total", **labels) or 0
        status, lease = await acquire(
            system, {"group": "gpu", "owner": "trainer", "node": "box", "ttlSeconds": 600}, "30s"
        )
        answered = datetime.now(UTC)
        assert status == 201, lease
        # The answer came only once the group was parked: a was reported stopped before it, and every member shows
        # the lease.
        assert lease["phase"] == "Held" and lease["heldAt"] is not None, lease
        assert await recorder.parked("a") <= answered
        assert await all_parked_by(system, "trainer")
        assert await running(system) == []
        assert lease["name"] == "trainer-gpu-lease" and lease["node"] == "box" and lease["ttlSeconds"] == 600
        assert lease["expiresAt"] > lease["acquiredAt"]
        group = await system.get("scheduler", "/api/v1/groups/gpu")
        assert group["state"] == "Leased" and group["lease"]["name"] == "trainer-gpu-lease"

        # The seed's metrics (tests/unit/test_lease_manager.py checks that no other service has them).
        text = await system.metrics("lease-manager")
        labels = {"group": "gpu", "namespace": "default", "owner": "trainer"}
        assert metric(text, "flexinfer_gpu_lease_active", **labels) == 1
        assert metric(text, "flexinfer_gpu_lease_acquired_total", **labels) == before + 1
        expires = datetime.fromisoformat(lease["expiresAt"].replace("Z", "+00:00")).timestamp()
        assert metric(text, "flexinfer_gpu_lease_expires_timestamp_seconds", **labels) == pytest.approx(expires)

        # A second acquire for the held group: 409 naming the holder.
        status, refused = await acquire(system, {"group": "gpu", "owner": "other"})
        assert status == 409
        assert "group gpu is leased by trainer-gpu-lease (owner trainer" in refused["error"]["message"]

        # A request for a model of the leased group waits (it is not refused) and is served after the release.
        request = asyncio.create_task(chat(system.url("proxy"), "a"))

        async def queued() -> bool:
            queues = await system.get("proxy", "/api/v1/queues")
            return any(q.get("model") == "a" and q.get("queued") for q in queues["items"])

        await wait_for(queued)
        assert not request.done()
        status, released = await system.call(
            "DELETE", "lease-manager", "/api/v1/leases/trainer-gpu-lease?owner=trainer"
        )
        assert status == 200 and released["name"] == "trainer-gpu-lease"
        code, headers = await asyncio.wait_for(request, 30)
        assert code == 200 and headers.get("X-FlexInfer-Cold-Start") == "true"
        assert await phase_is(system, "a", "Ready")

        async def series_removed() -> bool:  # once the lease ended
            text = await system.metrics("lease-manager")
            return (
                metric(text, "flexinfer_gpu_lease_active", **labels) is None
                and metric(text, "flexinfer_gpu_lease_expires_timestamp_seconds", **labels) is None
            )

        await wait_for(series_removed)
        await recorder.last_kind("trainer-gpu-lease", "lease.released")
        assert recorder.kinds("trainer-gpu-lease") == ["lease.acquired", "lease.held", "lease.released"]

        # With ?wait, an acquire for a leased group waits for it to be free instead of answering 409.
        status, _ = await acquire(system, {"group": "gpu", "owner": "trainer", "ttlSeconds": 600})
        assert status == 201
        waiting = asyncio.create_task(acquire(system, {"group": "gpu", "owner": "other"}, "30s"))
        # A sleep, not an event: the lease manager shows no sign of a waiting acquire (it holds the request open and
        # retries on each lease change), so this only gives the request time to arrive and not be answered.
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await system.call("DELETE", "lease-manager", "/api/v1/leases/trainer-gpu-lease")
        status, taken = await asyncio.wait_for(waiting, 30)
        assert status == 201 and taken["owner"] == "other" and taken["phase"] == "Held", taken
        assert await all_parked_by(system, "other")
        text = await system.metrics("lease-manager")
        assert metric(text, "flexinfer_gpu_lease_acquired_total", **labels) == before + 2
        assert metric(text, "flexinfer_gpu_lease_active", group="gpu", owner="other") == 1


async def elections(system: System) -> float:
    """How many election passes the scheduler has run (its flexinfer_election_duration_seconds histogram)."""
    return metric(await system.metrics("scheduler"), "flexinfer_election_duration_seconds_count") or 0.0


async def _async(value: Any) -> Any:
    return value


async def test_a_lease_beats_force_promotion_and_a_promote_call_and_a_lease_read_error_fails_open(
    database_url: str, start_system: SystemStarter
) -> None:
    services = ("scheduler", "actuator", "lease-manager")
    async with start_system(services=services) as system:
        await system.put_model(fake_model("a", priority=10))
        await system.put_model(
            fake_model("b", priority=5, gpu={"shared": "gpu", "priority": 5, "forcePromotion": True})
        )
        await wait_for(lambda: phase_is(system, "b", "Ready"))

        status, lease = await acquire(system, {"group": "gpu", "owner": "trainer"}, "30s")
        assert status == 201 and lease["phase"] == "Held", lease
        assert lease["ttlSeconds"] == 3600  # FLEXINFER_LEASE_DEFAULT_TTL
        status, _ = await system.call("POST", "scheduler", "/api/v1/models/default/a/promote")
        assert status == 200
        passes = await elections(system)

        async def three_more_elections() -> bool:  # the scheduler had three chances to act on the promote
            return await elections(system) >= passes + 3

        await wait_for(three_more_elections)
        assert await running(system) == [] and await all_parked_by(system, "trainer")

        async def serving() -> bool:  # the promoted or the force-promoted model
            return await phase_is(system, "a", "Ready") or await phase_is(system, "b", "Ready")

        await sql(database_url, "ALTER TABLE leases RENAME TO leases_unreadable")
        try:
            # The election cannot read leases: it proceeds as unleased, so a transient blip cannot park the lane.
            await wait_for(serving)
            errors = metric(await system.metrics("scheduler"), "flexinfer_lease_read_errors_total")
            assert errors is not None and errors >= 1
        finally:
            await sql(database_url, "ALTER TABLE leases_unreadable RENAME TO leases")
        await wait_for(lambda: all_parked_by(system, "trainer"))  # readable again: the lease holds again
        assert await running(system) == []

        await system.call("DELETE", "lease-manager", "/api/v1/leases/trainer-gpu-lease")
        await wait_for(serving)
        assert len(await running(system)) == 1


async def test_bad_lease_calls_get_a_4xx_naming_the_problem_and_change_nothing(
    database_url: str, start_system: SystemStarter
) -> None:
    services = ("scheduler", "lease-manager")
    async with start_system(services=services) as system:
        await system.put_model(fake_model("a"))
        await system.put_model(fake_model("k", group="lab"))
        status, held = await acquire(system, {"group": "gpu", "owner": "trainer", "ttlSeconds": 600})
        assert status == 201, held
        # a lease that Kubernetes manages (a GPULease written with kubectl): the API does not release it
        now = datetime.now(UTC)
        await sql(
            database_url,
            "INSERT INTO leases (name, namespace, group_name, owner, ttl_seconds, acquired_at, expires_at, renew_time,"
            " source, resource_uid) VALUES ('lab-lease', 'ml', 'lab', 'alice', 600, $1, $2, $1, 'gpulease', 'uid-1')",
            now,
            now + timedelta(minutes=10),
        )
        before = await leases_as_written(system)

        leases = "/api/v1/leases"
        trainers = "/api/v1/leases/trainer-gpu-lease"
        ok = {"group": "gpu", "owner": "x"}
        cases: list[tuple[str, str, Any, int, str, str]] = [
            (
                "POST",
                leases,
                {**ok, "ttlSeconds": 59},
                422,
                "invalid_lease",
                "ttlSeconds: must be at least 60 (got 59)",
            ),
            (
                "POST",
                leases,
                {"group": "nope", "owner": "x"},
                422,
                "unknown_group",
                "group 'nope' is not a GPU group: no Model has spec.gpu.shared 'nope' and no GPUGroup is named 'nope' "
                "(known groups: gpu, lab)",
            ),
            (
                "POST",
                leases,
                {**ok, "owner": "two words"},
                422,
                "invalid_lease",
                "owner: 'two words' is not a valid owner",
            ),
            ("POST", leases, {"group": "gpu"}, 422, "invalid_request", "owner: Field required"),
            ("POST", leases, {**ok, "ttl": 600}, 422, "invalid_request", "ttl: Extra inputs are not permitted"),
            ("POST", leases, {**ok, "ttlSeconds": "soon"}, 422, "invalid_request", "ttlSeconds: Input should be"),
            (
                "POST",
                leases,
                {**ok, "name": "Not_A_Name"},
                422,
                "invalid_lease",
                "name: 'Not_A_Name' is not a valid name",
            ),
            ("POST", leases, [1, 2], 422, "invalid_request", "Input should be a valid dictionary"),
            ("POST", leases + "?wait=soon", ok, 422, "invalid_request", "wait: not a duration: 'soon'"),
            ("POST", leases + "?wait=1h", ok, 422, "invalid_request", "wait: at most 10m"),
            (
                "POST",
                leases,
                {**ok, "name": "trainer-gpu-lease"},
                409,
                "group_leased",
                "group gpu is leased by trainer-gpu-lease (owner trainer",
            ),
            (
                "POST",
                leases,
                {"group": "lab", "owner": "x", "name": "trainer-gpu-lease"},
                409,
                "lease_name_taken",
                "the lease name trainer-gpu-lease is taken by the lease of group gpu",
            ),
            (
                "POST",
                trainers + "/renew",
                {"owner": "mallory"},
                409,
                "owner_mismatch",
                "lease trainer-gpu-lease is held by owner trainer, not mallory; nothing changed",
            ),
            ("POST", trainers + "/renew", {"ttlSeconds": 30}, 422, "invalid_lease", "ttlSeconds: must be at least 60"),
            (
                "POST",
                trainers + "/renew",
                {"ttlSeconds": 600, "extra": 1},
                422,
                "invalid_request",
                "extra: Extra inputs are not permitted",
            ),
            (
                "DELETE",
                trainers + "?owner=mallory",
                None,
                409,
                "owner_mismatch",
                "lease trainer-gpu-lease is held by owner trainer, not mallory; nothing changed",
            ),
            (
                "POST",
                "/api/v1/leases/ghost/renew",
                None,
                404,
                "lease_not_found",
                "lease ghost not found (it was released, or it expired)",
            ),
            ("DELETE", "/api/v1/leases/ghost", None, 404, "lease_not_found", "lease ghost not found"),
            ("GET", "/api/v1/leases/ghost", None, 404, "lease_not_found", "lease ghost not found"),
            (
                "DELETE",
                "/api/v1/leases/lab-lease",
                None,
                409,
                "managed_in_kubernetes",
                "lease lab-lease is the GPULease ml/lab-lease: delete it with "
                "`kubectl delete gpulease -n ml lab-lease`",
            ),
        ]
        for method, path, body, status_code, code, message in cases:
            status, answer = await system.call(method, "lease-manager", path, body)
            assert status == status_code, (method, path, body, answer)
            assert set(answer) == {"error"} and set(answer["error"]) == {"message", "type", "code"}, answer
            assert answer["error"]["code"] == code and message in answer["error"]["message"], (method, path, answer)
        status, answer = await system.call(
            "POST", "lease-manager", leases, data=b"{not json", headers={"Content-Type": "application/json"}
        )
        assert status == 422 and "JSON decode error" in answer["error"]["message"], answer

        assert await leases_as_written(system) == before  # nothing changed

        # The owner's own calls work: renew moves expiresAt forward, release ends it.
        status, renewed = await system.call(
            "POST", "lease-manager", "/api/v1/leases/trainer-gpu-lease/renew", {"owner": "trainer", "ttlSeconds": 900}
        )
        assert status == 200 and renewed["ttlSeconds"] == 900 and renewed["expiresAt"] > held["expiresAt"]
        assert renewed["renewTime"] > held["renewTime"] and renewed["acquiredAt"] == held["acquiredAt"]
        status, _ = await system.call("DELETE", "lease-manager", "/api/v1/leases/trainer-gpu-lease?owner=trainer")
        assert status == 200

        # `flexinfer apply -f` of a GPULease manifest (its code path): created, and unchanged when applied again.
        manifest = (
            "apiVersion: ai.flexinfer/v1alpha1\nkind: GPULease\nmetadata: {name: maint}\n"
            "spec: {group: gpu, owner: ops, ttlSeconds: 600}\n"
        )
        plan = plan_apply(load_manifests(manifest), default_namespace="default")
        async with AdminClient(Service.LEASE_MANAGER, system.url("lease-manager")) as client:
            clients = {Service.LEASE_MANAGER: client}
            assert (await execute_plan(plan, clients)).lines == ["gpulease/maint created"]
            assert (await execute_plan(plan, clients)).lines == ["gpulease/maint unchanged"]
        lease = await system.get("lease-manager", "/api/v1/leases/maint")
        assert (lease["group"], lease["owner"], lease["ttlSeconds"], lease["source"]) == ("gpu", "ops", 600, "api")


@dataclass
class LeaseManagerProcess:
    """The lease manager as a real process, so that a test can SIGKILL it."""

    process: asyncio.subprocess.Process
    url: str

    @classmethod
    async def start(cls, database_url: str, nats_url: str) -> LeaseManagerProcess:
        port = free_port()
        env = service_environment(
            database_url=database_url, nats_url=nats_url, lease_manager_port=str(port), lease_refresh_interval="1s"
        )
        process = await asyncio.create_subprocess_exec(sys.executable, "-m", "flexinfer_lease_manager", env=env)
        url = f"http://127.0.0.1:{port}"

        async def ready() -> bool:
            try:
                async with aiohttp.ClientSession() as http, http.get(url + "/readyz") as resp:
                    return resp.status == 200
            except aiohttp.ClientError:
                return False

        await wait_for(ready, within=30)
        return cls(process, url)

    async def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        await self.process.wait()


@pytest.fixture
async def lease_manager_processes() -> AsyncIterator[list[LeaseManagerProcess]]:
    started: list[LeaseManagerProcess] = []
    yield started
    for each in started:
        if each.process.returncode is None:
            await each.kill()


async def lapse(database_url: str, name: str) -> None:
    """What the passing of the TTL does to an unrenewed lease (the TTL is 60 s at least): now >= expiresAt soon."""
    await sql(database_url, "UPDATE leases SET expires_at = now() + interval '1 second' WHERE name = $1", name)


async def test_a_dead_lease_manager_strands_nothing_its_lease_lapses_at_its_ttl(
    database_url: str, bus: Bus, lease_manager_processes: list[LeaseManagerProcess], start_system: SystemStarter
) -> None:
    recorder = Recorder()
    await recorder.start(bus)
    services = ("scheduler", "actuator")
    async with start_system(services=services) as system:
        await system.put_model(fake_model("a"))
        await wait_for(lambda: phase_is(system, "a", "Ready"))
        manager = await LeaseManagerProcess.start(database_url, bus.url)
        lease_manager_processes.append(manager)
        assert system.http is not None
        async with system.http.post(
            manager.url + "/api/v1/leases?wait=30s", json={"group": "gpu", "owner": "trainer", "ttlSeconds": 60}
        ) as resp:
            lease = await resp.json()
            assert resp.status == 201 and lease["phase"] == "Held", lease
        await manager.kill()

        # Nobody renews it now; the lease still holds until its TTL (the scheduler had three chances to end it)...
        passes = await elections(system)

        async def three_more_elections() -> bool:
            return await elections(system) >= passes + 3

        await wait_for(three_more_elections)
        assert await all_parked_by(system, "trainer") and await running(system) == []
        # ... and when it lapses, serving is back within one reconcile, with no lease manager at all.
        await lapse(database_url, "trainer-gpu-lease")
        started = time.monotonic()
        await wait_for(lambda: phase_is(system, "a", "Ready"))
        assert time.monotonic() - started < 10

    # A lease manager that starts again finds the lapsed lease and ends it.
    async with start_system(services=("lease-manager",)) as again:
        await recorder.last_kind("trainer-gpu-lease", "lease.expired")
        assert (await again.get("lease-manager", "/api/v1/leases"))["items"] == []


# ------------------------------------------------------------------------------------------ flexinfer lease run


async def flexinfer(*args: str, env: dict[str, str]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "flexinfer_cli",
        *args,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


CHECK_PARKED = """
import json, sys, urllib.request
group = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/groups/gpu"))
parked = all(m["phase"] == "Preempted" and m["preemptedBy"] == "gpu-lease/trainer" for m in group["models"])
open(sys.argv[2], "w").write(json.dumps({"parked": parked, "state": group["state"]}))
sys.exit(3)
"""

SLEEP_UNTIL_SIGNALLED = """
import os, signal, sys, time
open(sys.argv[1], "w").write(str(os.getpid()))
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
time.sleep(120)
"""


async def test_lease_run_releases_however_the_command_ends_and_a_killed_wrapper_leaves_it_to_the_ttl(
    database_url: str, tmp_path: Path, start_system: SystemStarter
) -> None:
    async with serving_a(start_system) as system:
        env = {"FLEXINFER_LEASE_MANAGER_URL": system.url("lease-manager")}
        run = ("lease", "run", "--group", "gpu", "--owner", "trainer", "--ttl", "60s", "--")

        # The command runs only once the group is parked, and fails: the lease is released, its code passed on.
        report = tmp_path / "report.json"
        cli = await flexinfer(*run, sys.executable, "-c", CHECK_PARKED, system.url("scheduler"), str(report), env=env)
        _, stderr = await asyncio.wait_for(cli.communicate(), 60)
        assert cli.returncode == 3, stderr.decode()
        assert json.loads(report.read_text()) == {"parked": True, "state": "Leased"}
        lines = stderr.decode().splitlines()
        assert any(line.startswith("flexinfer: gpulease/trainer-gpu-lease held:") for line in lines), lines
        assert lines[-1] == "flexinfer: gpulease/trainer-gpu-lease released", lines
        assert (await system.get("lease-manager", "/api/v1/leases"))["items"] == []
        await wait_for(lambda: phase_is(system, "a", "Ready"))

        # Ctrl-C for the wrapper reaches the command; once it has ended the lease is released.
        pid_file = tmp_path / "pid-1"
        cli = await flexinfer(*run, sys.executable, "-c", SLEEP_UNTIL_SIGNALLED, str(pid_file), env=env)
        await wait_for(lambda: _async(pid_file.exists() and pid_file.read_text()), within=60)
        cli.send_signal(signal.SIGINT)
        _, stderr = await asyncio.wait_for(cli.communicate(), 30)
        assert cli.returncode == 130, stderr.decode()  # the command died of the forwarded SIGINT
        assert stderr.decode().splitlines()[-1] == "flexinfer: gpulease/trainer-gpu-lease released"
        assert (await system.get("lease-manager", "/api/v1/leases"))["items"] == []

        # SIGKILL of the wrapper: the command gets SIGTERM, and the lease lapses at its TTL (not released).
        pid_file = tmp_path / "pid-2"
        cli = await flexinfer(*run, sys.executable, "-c", SLEEP_UNTIL_SIGNALLED, str(pid_file), env=env)
        await wait_for(lambda: _async(pid_file.exists() and pid_file.read_text()), within=60)
        command_pid = int(pid_file.read_text())
        cli.send_signal(signal.SIGKILL)
        await cli.wait()
        await wait_for(lambda: _async(not alive(command_pid)))
        leases = (await system.get("lease-manager", "/api/v1/leases"))["items"]
        assert [lease["name"] for lease in leases] == ["trainer-gpu-lease"]
        assert await running(system) == []
        await lapse(database_url, "trainer-gpu-lease")
        await wait_for(lambda: phase_is(system, "a", "Ready"))


async def small_and_tuned_side_by_side(system: System) -> None:
    """Group ``gpu`` with one 24Gi device, and two models on it that fit together: ``small`` (12Gi, priority 5) and
    ``tuned`` (10Gi, priority 10), both served."""
    group = gpu_group("gpu", capacity={"devices": 1, "memoryPerDevice": "24Gi"})
    status, answer = await system.call("PUT", "scheduler", "/api/v1/gpugroups/gpu", group)
    assert status in (200, 201), answer
    await system.put_model(fake_model("small", priority=5, gpu={"shared": "gpu", "priority": 5, "memory": "12Gi"}))
    await system.put_model(fake_model("tuned", priority=10, gpu={"shared": "gpu", "priority": 10, "memory": "10Gi"}))
    for name in ("small", "tuned"):
        code, _ = await chat(system.url("proxy"), name)
        assert code == 200
    assert await running(system) == ["small", "tuned"]


async def test_a_lease_with_memory_parks_only_the_model_that_must_go_and_a_release_lets_it_back(
    bus: Bus, start_system: SystemStarter
) -> None:
    """In a group with a capacity (one 24Gi device) holding two small models, a lease with ``memory: 8Gi`` parks
    only the cheaper one (12Gi free is enough), the other keeps serving, and the release lets the parked one load
    again beside it."""
    recorder = Recorder()
    await recorder.start(bus)
    async with start_system(services=ALL) as system:
        await small_and_tuned_side_by_side(system)

        # More than one device holds, or not a quantity: refused, naming memory, and nothing parks.
        for memory, words in (("30Gi", "more than one device of group gpu holds"), ("lots", "memory")):
            status, refused = await acquire(system, {"group": "gpu", "owner": "trainer", "memory": memory})
            assert status == 422 and "memory" in refused["error"]["message"] and words in refused["error"]["message"]
        assert await running(system) == ["small", "tuned"]

        status, lease = await acquire(system, {"group": "gpu", "owner": "trainer", "memory": "8Gi"}, "30s")
        assert status == 201 and lease["phase"] == "Held", lease
        assert lease["memory"] == 8 << 30 and lease["device"] == 0, lease
        assert await running(system) == ["tuned"], "only the cheaper model (the lower priority) went"
        parked = await members(system)
        assert parked["small"]["phase"] == "Preempted" and parked["small"]["preemptedBy"] == "gpu-lease/trainer"
        assert parked["tuned"]["phase"] == "Ready"
        assert "tuned" not in recorder.parked_at
        code, _ = await chat(system.url("proxy"), "tuned")
        assert code == 200, "the other keeps serving while the lease holds"
        view = await system.get("scheduler", "/api/v1/groups/gpu")
        assert view["lease"]["device"] == 0 and view["lease"]["memory"] == 8 << 30 and view["state"] != "Leased"
        assert view["election"]["reason"] != "gpu-lease", "a reservation is not a lease on the whole group"
        assert (await system.get("lease-manager", "/api/v1/leases/trainer-gpu-lease"))["device"] == 0

        status, _ = await system.call("DELETE", "lease-manager", "/api/v1/leases/trainer-gpu-lease")
        assert status == 200
        code, _ = await asyncio.wait_for(chat(system.url("proxy"), "small"), 30)
        assert code == 200, "released: the parked model loads again"
        assert await running(system) == ["small", "tuned"]
        assert "tuned" not in recorder.parked_at
