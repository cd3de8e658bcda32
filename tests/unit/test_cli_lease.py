"""``flexinfer lease acquire --wait`` and ``flexinfer lease run`` against an in-memory lease manager (the commands'
``LeaseApi`` port); tests/integration/test_leases.py runs them against the real one."""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from flexinfer_cli import gpu_lease as lease_cli
from flexinfer_cli.client import ApiError, CliError
from flexinfer_cli.config import Service
from flexinfer_cli.gpu_lease import (
    LeaseUsageError,
    acquire,
    exit_code,
    lease_body,
    parse_memory_option,
    parse_ttl,
    run_with_lease,
)

BODY = {"group": "gpu", "owner": "trainer", "ttlSeconds": 120}


def refused(status: int, message: str) -> ApiError:
    return ApiError(Service.LEASE_MANAGER, "POST", "/api/v1/leases", status, message)


def a_lease(phase: str, message: str = "") -> dict[str, Any]:
    return {"name": "trainer-gpu-lease", "group": "gpu", "owner": "trainer", "phase": phase, "message": message}


@dataclass
class FakeLeaseApi:
    """Answers scripted per call kind; records every call."""

    acquires: list[Any] = field(default_factory=list)  # an answer (dict) or an ApiError, one per POST /leases
    gets: list[dict[str, Any]] = field(default_factory=list)
    renews: list[Any] = field(default_factory=list)
    calls: list[tuple[str, str, Any]] = field(default_factory=list)

    def _next(self, script: list[Any], default: Any) -> Any:
        answer = script.pop(0) if script else default
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def get(self, path: str) -> Any:
        self.calls.append(("GET", path, None))
        return self._next(self.gets, a_lease("Held", "parked"))

    async def post(self, path: str, body: Any = None) -> Any:
        self.calls.append(("POST", path, body))
        if path.endswith("/renew"):
            return self._next(self.renews, a_lease("Held"))
        return self._next(self.acquires, a_lease("Held", "parked"))

    async def delete(self, path: str) -> Any:
        self.calls.append(("DELETE", path, None))
        return a_lease("Held")


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(lease_cli, "POLL", 0.01)
    yield


async def test_acquire_with_wait_prints_each_new_thing_it_waits_for_until_the_lease_is_held() -> None:
    held_by = "group gpu is leased by first (owner alice, held, expires 2026-06-01T13:00:00Z)"
    api = FakeLeaseApi(
        acquires=[refused(409, held_by), refused(409, held_by), a_lease("Parking", "waiting for a (Ready) to park")],
        gets=[
            a_lease("Parking", "waiting for a (Ready) to park"),
            a_lease("Parking", "waiting for a (Draining) to park"),
            a_lease("Held", "2 serving models of group gpu parked"),
        ],
    )
    lines: list[str] = []
    lease = await acquire(api, BODY, wait=True, echo=lines.append)
    assert lease["phase"] == "Held"
    assert lines == [
        f"waiting: {held_by}",
        "gpulease/trainer-gpu-lease acquired (group gpu, owner trainer, Parking)",
        "parking: waiting for a (Ready) to park",
        "parking: waiting for a (Draining) to park",
        "gpulease/trainer-gpu-lease held: 2 serving models of group gpu parked",
    ]
    assert [path for method, path, _ in api.calls if method == "POST"] == ["/api/v1/leases?wait=2s"] * 3


async def test_acquire_with_wait_gives_up_after_its_timeout_naming_the_lease_it_holds() -> None:
    api = FakeLeaseApi(gets=[a_lease("Parking", "waiting for a (Ready) to park")] * 1000)
    api.acquires = [a_lease("Parking", "waiting for a (Ready) to park")]
    with pytest.raises(CliError, match=r"lease trainer-gpu-lease is still held \(release it with `flexinfer lease"):
        await acquire(api, BODY, wait=True, echo=lambda _: None, give_up_after=0.05)


async def test_acquire_does_not_wait_out_a_refusal_waiting_cannot_cure() -> None:
    taken = refused(409, "the lease name x is taken by the lease of group lab (owner bob); give the lease another name")
    with pytest.raises(ApiError, match="give the lease another name"):
        await acquire(FakeLeaseApi(acquires=[taken]), BODY, wait=True, echo=lambda _: None)


def python(code: str) -> list[str]:
    return [sys.executable, "-c", code]


async def test_run_holds_the_lease_for_the_life_of_the_command_renewing_it_and_releasing_it_when_it_fails() -> None:
    api = FakeLeaseApi()
    lines: list[str] = []
    code = await run_with_lease(
        api, BODY, python("import time, sys; time.sleep(0.5); sys.exit(3)"), renew_every=0.05, echo=lines.append
    )
    assert code == 3
    kinds = [(method, path.split("?")[0]) for method, path, _ in api.calls]
    assert kinds[0] == ("POST", "/api/v1/leases")
    assert kinds[-1] == ("DELETE", "/api/v1/leases/trainer-gpu-lease")
    assert api.calls[-1][1].endswith("?owner=trainer")
    renewals = [body for method, path, body in api.calls if path.endswith("/renew")]
    assert len(renewals) >= 2 and all(body == {"owner": "trainer"} for body in renewals)
    assert lines[-2:] == [f"{sys.executable} ended (exit code 3)", "gpulease/trainer-gpu-lease released"]


async def test_run_takes_a_lost_lease_again_while_the_command_runs() -> None:
    api = FakeLeaseApi(renews=[ApiError(Service.LEASE_MANAGER, "POST", "/x", 404, "lease trainer-gpu-lease expired")])
    lines: list[str] = []
    code = await run_with_lease(api, BODY, python("import time; time.sleep(0.3)"), renew_every=0.05, echo=lines.append)
    assert code == 0
    again = [body for method, path, body in api.calls if method == "POST" and path == "/api/v1/leases"]
    assert again == [{**BODY, "name": "trainer-gpu-lease"}]
    assert "warning: gpulease/trainer-gpu-lease is gone (lease trainer-gpu-lease expired); taking it again" in lines


@pytest.mark.parametrize(
    ("command", "code"),
    [
        pytest.param(["no-such-command-anywhere"], 127, id="a-command-not-found-exits-127"),
        pytest.param(python("import os, signal; os.kill(os.getpid(), signal.SIGTERM)"), 143, id="killed-by-sigterm"),
    ],
)
async def test_run_releases_the_lease_however_the_command_ends(command: list[str], code: int) -> None:
    api = FakeLeaseApi()
    assert await run_with_lease(api, BODY, command, renew_every=10, echo=lambda _: None) == code
    assert api.calls[-1][0] == "DELETE"


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        pytest.param("1h", 3600, id="go-duration"),
        pytest.param("90s", 90, id="seconds-unit"),
        pytest.param("600", 600, id="plain-seconds"),
        pytest.param("1m", 60, id="the-minimum"),
    ],
)
def test_ttl_takes_durations(text: str, seconds: int) -> None:
    assert parse_ttl(text) == seconds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("59s", "--ttl: must be at least 60s (got 59s)", id="under-the-minimum"),
        pytest.param("soon", "--ttl: not a duration: 'soon'", id="not-a-duration"),
    ],
)
def test_a_bad_ttl_is_a_usage_error(text: str, message: str) -> None:
    with pytest.raises(LeaseUsageError, match=re.escape(message)):
        parse_ttl(text)


def test_exit_codes_follow_the_shell() -> None:
    assert (exit_code(0), exit_code(3), exit_code(-2), exit_code(-15)) == (0, 3, 130, 143)


@pytest.mark.parametrize(
    ("device", "seen"),
    [
        pytest.param(1, "1", id="memory-lease-runs-on-its-reserved-device"),
        pytest.param(None, "unset", id="whole-group-lease-leaves-the-environment-alone"),
    ],
)
async def test_run_gives_the_command_the_reserved_device(
    device: int | None, seen: str, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    held = {**a_lease("Held", "parked"), "memory": 4 << 30, "device": device}
    api = FakeLeaseApi(acquires=[held], gets=[held])
    out = tmp_path / "seen"
    script = f"import os; open({str(out)!r}, 'w').write(os.environ.get('CUDA_VISIBLE_DEVICES', 'unset'))"
    assert (
        await run_with_lease(api, {**BODY, "memory": 4 << 30}, python(script), renew_every=10, echo=lambda _: None) == 0
    )
    assert out.read_text() == seen


def test_memory_takes_quantities_and_a_bad_one_is_a_usage_error() -> None:
    assert lease_body(group="gpu", owner="trainer", memory=parse_memory_option("4Gi"))["memory"] == 4 << 30
    with pytest.raises(LeaseUsageError, match=r"^--memory: 'lots' is not a memory quantity"):
        parse_memory_option("lots")
