"""The ``flexinfer`` commands against a fake admin API (one aiohttp app standing in for the scheduler, the lease
manager and the proxy, run in a thread), and ``flexinfer demand`` against real NATS."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web
from typer.testing import CliRunner

from flexinfer_cli.embedded import free_port
from flexinfer_cli.main import app

REPO = Path(__file__).resolve().parents[2]
HOMELAB = str(REPO / "examples" / "homelab.yaml")


def error(status: int, message: str) -> web.Response:
    body = {"error": {"message": message, "type": "invalid_request_error", "code": status}}
    return web.json_response(body, status=status)


@dataclass
class FakeAdminApi:
    """Just enough of docs/reference.md section 4 to drive the CLI; records every /api/v1 request."""

    token: str | None = None
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    models: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    leases: dict[str, dict[str, Any]] = field(default_factory=dict)
    groups: dict[str, dict[str, Any]] = field(default_factory=dict)
    gpugroups: set[str] = field(default_factory=set)
    swaps: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    def app(self) -> web.Application:
        @web.middleware
        async def record(request: web.Request, handler: Any) -> web.StreamResponse:
            if request.path.startswith("/api/v1"):
                body = await request.json() if request.can_read_body else None
                self.requests.append((request.method, request.path, body))
                if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
                    return error(401, "missing or wrong bearer token (FLEXINFER_ADMIN_TOKEN)")
            response: web.StreamResponse = await handler(request)
            return response

        def answer(payload: Any) -> Any:
            async def handler(_: web.Request) -> web.Response:
                return web.json_response(payload() if callable(payload) else payload)

            return handler

        application = web.Application(middlewares=[record])
        application.router.add_get("/readyz", answer({"ready": True}))
        application.router.add_get("/api/v1/models", self.list_models)
        application.router.add_put("/api/v1/models/{ns}/{name}", self.put_model)
        application.router.add_get("/api/v1/models/{ns}/{name}", self.get_model)
        application.router.add_delete("/api/v1/models/{ns}/{name}", self.delete_model)
        application.router.add_delete("/api/v1/gpugroups/{name}", self.delete_group)
        application.router.add_get("/api/v1/groups/{name}", self.get_group)
        application.router.add_post("/api/v1/models/{ns}/{name}/promote", self.promote)
        application.router.add_put("/api/v1/gpugroups/{name}", self.put_group)
        application.router.add_get("/api/v1/groups", answer(lambda: {"items": list(self.groups.values())}))
        application.router.add_get("/api/v1/swaps", answer(lambda: {"items": self.swaps}))
        application.router.add_get("/api/v1/queues", self.queues)
        application.router.add_get("/api/v1/leases", answer(lambda: {"items": list(self.leases.values())}))
        application.router.add_post("/api/v1/leases", self.acquire)
        application.router.add_get("/api/v1/leases/{name}", self.get_lease)
        application.router.add_delete("/api/v1/leases/{name}", self.release)
        application.router.add_post("/api/v1/leases/{name}/renew", self.renew)
        return application

    async def list_models(self, _: web.Request) -> web.Response:
        return web.json_response({"items": list(self.models.values())})

    async def put_model(self, request: web.Request) -> web.Response:
        body = await request.json()
        if request.match_info["name"] == "rejected":
            detail = [{"loc": ["body", "spec", "gpu", "priority"], "msg": "Input should be a valid integer"}]
            return web.json_response({"detail": detail}, status=422)
        model = {**body, "status": {"phase": "Pending", "sharedGroup": {"state": "Parked"}}}
        self.models[(request.match_info["ns"], request.match_info["name"])] = model
        return web.json_response(model)

    async def get_model(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        model = self.models.get(key)
        return web.json_response(model) if model else error(404, f"model {key[0]}/{key[1]} not found")

    async def delete_model(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        model = self.models.pop(key, None)
        return web.json_response(model) if model else error(404, f"model {key[0]}/{key[1]} not found")

    async def delete_group(self, request: web.Request) -> web.Response:
        if request.match_info["name"] not in self.gpugroups:
            return error(404, f"gpugroup {request.match_info['name']} not found")
        self.gpugroups.discard(request.match_info["name"])
        return web.Response(status=204)

    async def get_group(self, request: web.Request) -> web.Response:
        group = self.groups.get(request.match_info["name"])
        return web.json_response(group) if group else error(404, f"group {request.match_info['name']} not found")

    async def promote(self, request: web.Request) -> web.Response:
        key = (request.match_info["ns"], request.match_info["name"])
        if key not in self.models:
            return error(404, f"model {key[0]}/{key[1]} not found")
        return web.json_response({}, status=202)

    async def put_group(self, request: web.Request) -> web.Response:
        self.gpugroups.add(request.match_info["name"])
        return web.json_response(await request.json())

    async def queues(self, _: web.Request) -> web.Response:
        return web.json_response(
            {"items": [{"namespace": "default", "model": "chat-large", "queued": 2, "oldestWaitSeconds": 3.5}]}
        )

    async def acquire(self, request: web.Request) -> web.Response:
        body = await request.json()
        for lease in self.leases.values():
            if lease["group"] == body["group"]:
                return error(409, f"group {body['group']} is leased by {lease['name']} (owner {lease['owner']})")
        name = body.get("name") or f"{body['owner']}-gpu-lease"
        lease = {
            "name": name,
            "group": body["group"],
            "owner": body["owner"],
            "node": body.get("node"),
            "ttlSeconds": body.get("ttlSeconds", 3600),
            "acquiredAt": "2026-01-01T00:00:00Z",
            "expiresAt": "2026-01-01T01:00:00Z",
            "renewTime": "2026-01-01T00:00:00Z",
        }
        self.leases[name] = lease
        return web.json_response(lease, status=201)

    async def get_lease(self, request: web.Request) -> web.Response:
        lease = self.leases.get(request.match_info["name"])
        return web.json_response(lease) if lease else error(404, "lease not found")

    async def release(self, request: web.Request) -> web.Response:
        if self.leases.pop(request.match_info["name"], None) is None:
            return error(404, f"lease {request.match_info['name']} not found")
        return web.Response(status=204)

    async def renew(self, request: web.Request) -> web.Response:
        lease = self.leases.get(request.match_info["name"])
        if lease is None:
            return error(404, "lease not found")
        lease["expiresAt"] = "2026-01-01T02:00:00Z"
        return web.json_response(lease)


@pytest.fixture
def api() -> Iterator[FakeAdminApi]:
    fake = FakeAdminApi()
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    runner = web.AppRunner(fake.app())

    async def serve() -> None:
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        fake.url = f"http://127.0.0.1:{port}"
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(serve(), loop).result(10)
    assert ready.wait(10)
    try:
        yield fake
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def env_for(api: FakeAdminApi, **extra: str) -> dict[str, str]:
    return {
        "FLEXINFER_SCHEDULER_URL": api.url,
        "FLEXINFER_LEASE_MANAGER_URL": api.url,
        "FLEXINFER_PROXY_URL": api.url,
        "FLEXINFER_ADMIN_TOKEN": "",
        "FLEXINFER_NAMESPACE": "",
        **extra,
    }


runner = CliRunner()


def test_apply_puts_each_model_and_prints_it(api: FakeAdminApi) -> None:
    result = runner.invoke(app, ["apply", "-f", HOMELAB], env=env_for(api))
    assert result.exit_code == 0, result.output
    # the group's fallback leader (highest priority) first
    assert result.stdout.splitlines() == ["model/default/chat-large configured", "model/default/chat-small configured"]
    assert [(method, path) for method, path, _ in api.requests] == [
        ("PUT", "/api/v1/models/default/chat-large"),
        ("PUT", "/api/v1/models/default/chat-small"),
    ]
    body = api.requests[1][2]
    assert body["metadata"] == {"name": "chat-small", "namespace": "default"}
    assert body["spec"]["gpu"] == {"shared": "homelab-gpu", "priority": 50, "swapCooldown": "20s"}


def test_apply_uses_flexinfer_namespace_and_the_admin_token(api: FakeAdminApi) -> None:
    api.token = "s3cret"
    result = runner.invoke(app, ["apply", "-f", HOMELAB], env=env_for(api, FLEXINFER_NAMESPACE="lab"))
    assert result.exit_code == 1
    assert "failed (401): missing or wrong bearer token" in result.stderr
    env = env_for(api, FLEXINFER_NAMESPACE="lab", FLEXINFER_ADMIN_TOKEN="s3cret")
    result = runner.invoke(app, ["apply", "-f", HOMELAB], env=env)
    assert result.exit_code == 0, result.output
    assert "model/lab/chat-small configured" in result.stdout


def test_apply_group_and_lease_then_reapply_lease_is_unchanged(api: FakeAdminApi, tmp_path: Path) -> None:
    manifest = tmp_path / "lease.yaml"
    manifest.write_text(
        """
apiVersion: ai.flexinfer/v1alpha1
kind: GPUGroup
metadata: {name: lab-gpu}
spec: {models: [{name: a}, {name: b}]}
---
apiVersion: ai.flexinfer/v1alpha1
kind: GPULease
metadata: {name: lora-lease}
spec: {group: lab-gpu, owner: lora, ttlSeconds: 600}
"""
    )
    first = runner.invoke(app, ["apply", "-f", str(manifest)], env=env_for(api))
    assert first.exit_code == 0, first.output
    assert first.stdout.splitlines() == ["gpugroup/lab-gpu configured", "gpulease/lora-lease created"]
    again = runner.invoke(app, ["apply", "-f", str(manifest)], env=env_for(api))
    assert again.exit_code == 0, again.output
    assert again.stdout.splitlines() == ["gpugroup/lab-gpu configured", "gpulease/lora-lease unchanged"]


def test_apply_api_rejection_is_printed_readably(api: FakeAdminApi, tmp_path: Path) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text("apiVersion: ai.flexinfer/v1alpha2\nkind: Model\nmetadata: {name: rejected}\n")
    result = runner.invoke(app, ["apply", "-f", str(manifest)], env=env_for(api))
    assert result.exit_code == 1
    assert result.stderr.strip() == (
        "error: scheduler: PUT /api/v1/models/default/rejected failed (422): "
        "spec.gpu.priority: Input should be a valid integer"
    )


def test_apply_bad_manifest_exits_2_naming_the_field_and_sends_nothing(api: FakeAdminApi, tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(Path(HOMELAB).read_text().replace("priority: 100", "priority: lots"))
    result = runner.invoke(app, ["apply", "-f", str(manifest)], env=env_for(api))
    assert result.exit_code == 2
    assert "document 2" in result.stderr
    assert "spec.gpu.priority" in result.stderr
    assert api.requests == []


def test_get_models_table_and_json(api: FakeAdminApi) -> None:
    runner.invoke(app, ["apply", "-f", HOMELAB], env=env_for(api))
    table = runner.invoke(app, ["get", "models"], env=env_for(api))
    assert table.exit_code == 0, table.output
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SHARED", "PRIORITY", "PHASE", "STATE", "QUEUE", "LAST_ACTIVE"]  # the seed's
    assert lines[2].split() == ["chat-small", "homelab-gpu", "50", "Pending", "Parked", "<none>", "<none>"]
    as_json = runner.invoke(app, ["get", "model", "-o", "json"], env=env_for(api))
    assert as_json.exit_code == 0, as_json.output
    assert [m["metadata"]["name"] for m in json.loads(as_json.stdout)["items"]] == ["chat-large", "chat-small"]


def test_get_queues_from_the_proxy_and_empty_lists(api: FakeAdminApi) -> None:
    queues = runner.invoke(app, ["get", "queues"], env=env_for(api))
    assert queues.exit_code == 0, queues.output
    assert queues.stdout.splitlines() == ["MODEL        QUEUED   OLDEST_WAIT", "chat-large   2        3.5s"]
    swaps = runner.invoke(app, ["get", "swaps"], env=env_for(api))
    assert swaps.exit_code == 0
    assert swaps.stdout == ""
    assert "No swaps found." in swaps.stderr


LAB_MODEL = """
apiVersion: ai.flexinfer/v1alpha2
kind: Model
metadata: {name: chat-large, namespace: lab}
spec: {backend: vllm, gpu: {shared: lab-gpu, priority: 7}, serviceLabels: [chat]}
"""


def applied(api: FakeAdminApi, tmp_path: Path) -> None:
    """homelab.yaml's two models in default, and one chat-large in namespace lab."""
    lab = tmp_path / "lab.yaml"
    lab.write_text(LAB_MODEL)
    for manifest in (HOMELAB, str(lab)):
        assert runner.invoke(app, ["apply", "-f", manifest], env=env_for(api)).exit_code == 0


def test_get_lists_one_namespace_unless_all_namespaces(api: FakeAdminApi, tmp_path: Path) -> None:
    applied(api, tmp_path)
    default = runner.invoke(app, ["get", "models"], env=env_for(api))
    assert [line.split()[0] for line in default.stdout.splitlines()[1:]] == ["chat-large", "chat-small"]
    lab = runner.invoke(app, ["get", "models", "-n", "lab"], env=env_for(api))
    assert lab.stdout.splitlines()[1].split() == ["chat-large", "lab-gpu", "7", "Pending", "Parked", "<none>", "<none>"]
    everywhere = runner.invoke(app, ["get", "models", "-A"], env=env_for(api))
    lines = everywhere.stdout.splitlines()
    assert lines[0].split()[:2] == ["NAMESPACE", "NAME"]  # kubectl's -A: NAMESPACE leads
    assert [line.split()[:2] for line in lines[1:]] == [
        ["default", "chat-large"],
        ["default", "chat-small"],
        ["lab", "chat-large"],
    ]
    # FLEXINFER_NAMESPACE is the default namespace, as kubectl's context namespace is.
    via_env = runner.invoke(app, ["get", "models"], env=env_for(api, FLEXINFER_NAMESPACE="lab"))
    assert len(via_env.stdout.splitlines()) == 2
    empty = runner.invoke(app, ["get", "models", "-n", "nowhere"], env=env_for(api))
    assert empty.exit_code == 0 and "No models found in namespace nowhere." in empty.stderr


def test_get_names_one_object_in_every_format(api: FakeAdminApi, tmp_path: Path) -> None:
    applied(api, tmp_path)
    one_row = runner.invoke(app, ["get", "model", "chat-small"], env=env_for(api))
    assert one_row.exit_code == 0 and [line.split()[0] for line in one_row.stdout.splitlines()] == [
        "NAME",
        "chat-small",
    ]
    slash = runner.invoke(app, ["get", "model/chat-large", "-n", "lab"], env=env_for(api))
    assert slash.stdout.splitlines()[1].split()[2] == "7"

    as_json = json.loads(runner.invoke(app, ["get", "models", "chat-small", "-o", "json"], env=env_for(api)).stdout)
    assert as_json["metadata"]["name"] == "chat-small" and as_json["status"]["phase"] == "Pending"  # the object itself
    as_yaml = yaml.safe_load(runner.invoke(app, ["get", "models", "-o", "yaml"], env=env_for(api)).stdout)
    assert [m["metadata"]["name"] for m in as_yaml["items"]] == ["chat-large", "chat-small"]
    names = runner.invoke(app, ["get", "models", "-A", "-o", "name"], env=env_for(api))
    assert names.stdout.splitlines() == ["model/default/chat-large", "model/default/chat-small", "model/lab/chat-large"]
    wide = runner.invoke(app, ["get", "models", "-n", "lab", "-o", "wide"], env=env_for(api))
    header, row = wide.stdout.splitlines()
    assert header.split()[7:] == ["PREEMPTED_BY", "SERVICE_LABELS", "BACKEND", "REQUESTS", "RESTARTS", "MESSAGE"]
    assert row.split()[7:] == ["<none>", "chat", "vllm", "0", "0", "<none>"]
    bare = runner.invoke(app, ["get", "models", "--no-headers"], env=env_for(api))
    assert [line.split()[0] for line in bare.stdout.splitlines()] == ["chat-large", "chat-small"]


def test_get_a_missing_name_fails_after_printing_the_others(api: FakeAdminApi, tmp_path: Path) -> None:
    applied(api, tmp_path)
    result = runner.invoke(app, ["get", "models", "chat-small", "ghost"], env=env_for(api))
    assert result.exit_code == 1
    assert result.stdout.splitlines()[1].split()[0] == "chat-small"
    assert 'model "ghost" not found in namespace default' in result.stderr
    assert runner.invoke(app, ["get", "model/a", "b"], env=env_for(api)).exit_code == 2


def test_delete_kind_name_and_file(api: FakeAdminApi, tmp_path: Path) -> None:
    applied(api, tmp_path)
    one = runner.invoke(app, ["delete", "model", "chat-small"], env=env_for(api))
    assert one.exit_code == 0, one.output
    assert one.stdout == "model/default/chat-small deleted\n"
    assert ("default", "chat-small") not in api.models
    again = runner.invoke(app, ["delete", "model", "chat-small"], env=env_for(api))
    assert again.exit_code == 1 and "model/default/chat-small not found" in again.stderr
    ignored = runner.invoke(app, ["delete", "model/chat-small", "--ignore-not-found"], env=env_for(api))
    assert ignored.exit_code == 0 and ignored.stdout == ""

    manifest = tmp_path / "all.yaml"
    manifest.write_text(
        LAB_MODEL
        + "---\napiVersion: ai.flexinfer/v1alpha1\nkind: GPUGroup\nmetadata: {name: lab-gpu}\n"
        + "spec: {models: [{name: chat-large, namespace: lab}]}\n"
    )
    assert runner.invoke(app, ["apply", "-f", str(manifest)], env=env_for(api)).exit_code == 0
    from_file = runner.invoke(app, ["delete", "-f", str(manifest)], env=env_for(api))
    assert from_file.exit_code == 0, from_file.output
    assert from_file.stdout.splitlines() == ["model/lab/chat-large deleted", "gpugroup/lab-gpu deleted"]
    deletes = [(m, path) for m, path, _ in api.requests if m == "DELETE"]
    assert deletes[-2:] == [("DELETE", "/api/v1/models/lab/chat-large"), ("DELETE", "/api/v1/gpugroups/lab-gpu")]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        pytest.param(["delete", "queues", "x"], "queues cannot be deleted", id="not-deletable"),
        pytest.param(["delete", "model"], "give the NAME", id="no-name"),
        pytest.param(["delete"], "give -f FILE or KIND NAME", id="nothing"),
        pytest.param(["delete", "model", "x", "-f", HOMELAB], "not both", id="both"),
    ],
)
def test_delete_usage_errors_exit_2_and_call_nothing(api: FakeAdminApi, args: list[str], message: str) -> None:
    result = runner.invoke(app, args, env=env_for(api))
    assert result.exit_code == 2 and message in result.stderr
    assert not [r for r in api.requests if r[0] == "DELETE"]


def test_describe_model_shows_spec_status_group_and_swaps(api: FakeAdminApi, tmp_path: Path) -> None:
    applied(api, tmp_path)
    api.groups["homelab-gpu"] = {
        "name": "homelab-gpu",
        "policy": "v1alpha2",
        "activeModel": {"namespace": "default", "name": "chat-large"},
        "state": "Serving",
        "cooldownRemainingSeconds": 95,
    }
    api.swaps = [
        {
            "group": "homelab-gpu",
            "fromModel": "default/chat-small",
            "toModel": "default/chat-large",
            "reason": "demand",
            "startedAt": "2026-01-01T00:00:00Z",
            "finishedAt": "2026-01-01T00:00:04Z",
            "phases": {"parking": 1.5, "loading": 2.5},
        },
        {"group": "other", "fromModel": "x/a", "toModel": "x/b", "reason": "demand"},
    ]
    result = runner.invoke(app, ["describe", "model", "chat-small", "--no-events"], env=env_for(api))
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.startswith("Name:         chat-small\nNamespace:    default\n")
    assert "Spec:\n" in text and "  GPU:\n" in text and "    Priority:         50\n" in text
    assert "Status:\n  Phase:" in text
    assert "Group:          homelab-gpu (v1alpha2), active default/chat-large, state Serving, cooldown 1m35s" in text
    assert "default/chat-small   default/chat-large   demand" in text and "x/a" not in text
    assert "Events:         <unavailable: not read (--no-events)>" in text

    missing = runner.invoke(app, ["describe", "model", "ghost"], env=env_for(api))
    assert missing.exit_code == 1 and 'model "ghost" not found in namespace default' in missing.stderr
    assert runner.invoke(app, ["describe", "swaps", "x"], env=env_for(api)).exit_code == 2


def test_describe_group_shows_the_election_and_why_each_member_holds_or_waits(api: FakeAdminApi) -> None:
    def member(name: str, priority: int, phase: str, state: str, **more: Any) -> dict[str, Any]:
        return {"namespace": "default", "name": name, "priority": priority, "phase": phase, "state": state, **more}

    api.groups["homelab-gpu"] = {
        "name": "homelab-gpu",
        "policy": "v1alpha2",
        "scheduling": "seed",
        "election": {"leader": {"namespace": "default", "name": "chat-large"}, "reason": "cooldown"},
        "activeModel": {"namespace": "default", "name": "chat-large"},
        "state": "Serving",
        "cooldownRemainingSeconds": 95,
        "models": [
            member("chat-large", 100, "Ready", "Active", requests={"waiting": 0, "inFlight": 2}),
            member(
                "chat-small",
                100,
                "Queued",
                "Queued",
                queuePosition=1,
                requests={"waiting": 3, "inFlight": 0},
                message="waiting: chat-large holds the GPU; swap cooldown ends at 19:05:12",
            ),
            member("embed", 10, "Preempted", "Parked", preemptedBy="default/chat-large"),
        ],
    }
    api.swaps = [
        {"group": "homelab-gpu", "fromModel": "default/embed", "toModel": "default/chat-large", "reason": "demand"},
        {"group": "other", "fromModel": "x/a", "toModel": "x/b", "reason": "demand"},
    ]
    result = runner.invoke(app, ["describe", "group", "homelab-gpu"], env=env_for(api))
    assert result.exit_code == 0, result.output
    text = result.stdout
    assert text.startswith("Name:         homelab-gpu\nPolicy:       v1alpha2\nScheduling:   seed\n")
    assert "Active Model: default/chat-large\nCooldown:     1m35s left\n" in text
    assert (
        "Election:     default/chat-large leads (cooldown: it keeps the GPU until its hold ends (the swap cooldown: "
        "its load pays for itself))\n"
    ) in text
    # per member: priority, phase, state, requests waiting and in flight, queue position
    assert "NAME                 PRIORITY   PHASE       STATE    WAITING   IN FLIGHT   QUEUE" in text
    assert "default/chat-small   100        Queued      Queued   3         0           1" in text
    # and why: the holder's election, a waiting member's own message (what it waits for, until when)
    assert "Why:\n" in text
    assert "  default/chat-large   holds the GPU: it keeps the GPU until its hold ends" in text
    assert "  default/chat-small   waiting: chat-large holds the GPU; swap cooldown ends at 19:05:12\n" in text
    assert "  default/embed        preempted by default/chat-large\n" in text
    assert "default/embed   default/chat-large   demand" in text and "x/a" not in text

    same = runner.invoke(app, ["describe", "group/homelab-gpu"], env=env_for(api))
    assert same.exit_code == 0 and same.stdout == text
    missing = runner.invoke(app, ["describe", "group", "ghost"], env=env_for(api))
    assert missing.exit_code == 1 and 'group "ghost" not found' in missing.stderr


def test_describe_without_nats_still_describes(api: FakeAdminApi, tmp_path: Path) -> None:
    applied(api, tmp_path)
    env = env_for(api, FLEXINFER_NATS_URL=f"nats://127.0.0.1:{free_port()}")
    result = runner.invoke(app, ["describe", "model/chat-large", "-n", "lab"], env=env)
    assert result.exit_code == 0, result.output
    assert "Name:         chat-large\nNamespace:    lab" in result.stdout
    assert "Events:         <unavailable: cannot reach NATS at" in result.stdout


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout == "flexinfer 0.1.0\n"


def test_get_unknown_kind_is_a_usage_error(api: FakeAdminApi) -> None:
    result = runner.invoke(app, ["get", "pods"], env=env_for(api))
    assert result.exit_code == 2
    assert api.requests == []


def test_promote(api: FakeAdminApi) -> None:
    runner.invoke(app, ["apply", "-f", HOMELAB], env=env_for(api))
    ok = runner.invoke(app, ["promote", "default/chat-small"], env=env_for(api))
    assert ok.exit_code == 0, ok.output
    assert ok.stdout.strip() == "model/default/chat-small promoted"
    assert api.requests[-1][:2] == ("POST", "/api/v1/models/default/chat-small/promote")
    missing = runner.invoke(app, ["promote", "ghost"], env=env_for(api))
    assert missing.exit_code == 1
    assert "scheduler: POST /api/v1/models/default/ghost/promote failed (404): model default/ghost not found" in (
        missing.stderr
    )
    bad = runner.invoke(app, ["promote", "Not/A/Model"], env=env_for(api))
    assert bad.exit_code == 2


def test_lease_acquire_renew_release(api: FakeAdminApi) -> None:
    acquired = runner.invoke(
        app, ["lease", "acquire", "--group", "g", "--owner", "lora", "--node", "box", "--ttl", "600"], env=env_for(api)
    )
    assert acquired.exit_code == 0, acquired.output
    assert acquired.stdout.strip() == (
        "gpulease/lora-gpu-lease acquired (group g, owner lora, expires 2026-01-01T01:00:00Z)"
    )
    assert api.requests[-1] == (
        "POST",
        "/api/v1/leases",
        {"group": "g", "owner": "lora", "node": "box", "ttlSeconds": 600},
    )

    held = runner.invoke(app, ["lease", "acquire", "--group", "g", "--owner", "other"], env=env_for(api))
    assert held.exit_code == 1
    assert "(409): group g is leased by lora-gpu-lease (owner lora)" in held.stderr

    table = runner.invoke(app, ["get", "leases"], env=env_for(api))
    assert table.stdout.splitlines()[1].split() == ["lora-gpu-lease", "g", "lora", "box", "2026-01-01T01:00:00Z"]
    wide = runner.invoke(app, ["get", "lease", "lora-gpu-lease", "-o", "wide"], env=env_for(api))
    assert wide.stdout.splitlines()[0].split()[5:] == ["PHASE", "TTL", "ACQUIRED", "RENEWED", "SOURCE", "MESSAGE"]
    assert wide.stdout.splitlines()[1].split()[5:7] == ["<none>", "10m"]  # the --ttl 600 it was acquired with
    assert runner.invoke(app, ["get", "lease", "-o", "name"], env=env_for(api)).stdout == "gpulease/lora-gpu-lease\n"

    renewed = runner.invoke(app, ["lease", "renew", "lora-gpu-lease", "-o", "json"], env=env_for(api))
    assert renewed.exit_code == 0, renewed.output
    assert json.loads(renewed.stdout)["expiresAt"] == "2026-01-01T02:00:00Z"

    released = runner.invoke(app, ["lease", "release", "lora-gpu-lease"], env=env_for(api))
    assert released.exit_code == 0, released.output
    assert released.stdout.strip() == "gpulease/lora-gpu-lease released"
    again = runner.invoke(app, ["lease", "acquire", "--group", "g", "--owner", "lora"], env=env_for(api))
    assert again.exit_code == 0, again.output
    deleted = runner.invoke(app, ["delete", "lease", "lora-gpu-lease"], env=env_for(api))  # kubectl's habit
    assert deleted.exit_code == 0 and deleted.stdout == "gpulease/lora-gpu-lease deleted\n"
    gone = runner.invoke(app, ["lease", "release", "lora-gpu-lease"], env=env_for(api))
    assert gone.exit_code == 1
    assert "lease lora-gpu-lease not found" in gone.stderr


def test_lease_ttl_below_minimum_is_a_usage_error(api: FakeAdminApi) -> None:
    result = runner.invoke(app, ["lease", "acquire", "--group", "g", "--owner", "o", "--ttl", "10"], env=env_for(api))
    assert result.exit_code == 2
    assert api.requests == []


def test_unreachable_service_names_it_and_suggests_up() -> None:
    port = free_port()
    result = runner.invoke(app, ["get", "leases"], env={"FLEXINFER_LEASE_MANAGER_URL": f"http://127.0.0.1:{port}"})
    assert result.exit_code == 1
    assert f"cannot reach the lease-manager at http://127.0.0.1:{port} (connection refused)" in result.stderr
    assert "flexinfer up" in result.stderr


def test_default_address_comes_from_the_port_variable() -> None:
    port = free_port()
    env = {"FLEXINFER_SCHEDULER_URL": "", "FLEXINFER_SCHEDULER_PORT": str(port)}
    result = runner.invoke(app, ["get", "swaps"], env=env)
    assert f"cannot reach the scheduler at http://127.0.0.1:{port}" in result.stderr


def test_up_with_a_bad_manifest_starts_nothing(tmp_path: Path) -> None:
    manifest = tmp_path / "bad.yaml"
    manifest.write_text(Path(HOMELAB).read_text().replace("swapCooldown: 20s", "swapCooldown: later", 1))
    state = tmp_path / "state"
    result = runner.invoke(app, ["up", "-f", str(manifest), "--state-dir", str(state)])
    assert result.exit_code == 2
    assert "spec.gpu.swapCooldown" in result.stderr
    assert not state.exists()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        pytest.param(
            {"FLEXINFER_LIVENESS_FAILURE_THRESHOLD": "0"}, "FLEXINFER_LIVENESS_FAILURE_THRESHOLD", id="threshold"
        ),
        pytest.param({"FLEXINFER_LIVENESS_PERIOD": "soon"}, "FLEXINFER_LIVENESS_PERIOD", id="period"),
        pytest.param(
            {"FLEXINFER_LIVENESS_PERIOD": "1s", "FLEXINFER_LIVENESS_TIMEOUT": "5s"},
            "FLEXINFER_LIVENESS_TIMEOUT <= FLEXINFER_LIVENESS_PERIOD",
            id="timeout-beyond-period",
        ),
    ],
)
def test_up_with_a_bad_liveness_setting_names_it(tmp_path: Path, env: dict[str, str], named: str) -> None:
    state = tmp_path / "state"
    result = runner.invoke(app, ["up", "--state-dir", str(state)], env={**env, "FLEXINFER_DATABASE_URL": ""})
    assert result.exit_code == 2
    assert named in result.stderr
    assert not state.exists()


def test_up_with_a_bad_setting_names_the_variable(tmp_path: Path) -> None:
    state = tmp_path / "state"
    result = runner.invoke(
        app, ["up", "--state-dir", str(state)], env={"FLEXINFER_QUEUE_MAX": "none", "FLEXINFER_DATABASE_URL": ""}
    )
    assert result.exit_code == 2
    assert "FLEXINFER_QUEUE_MAX" in result.stderr
    assert not state.exists()


def test_demand_with_nats_unreachable() -> None:
    port = free_port()
    result = runner.invoke(app, ["demand", "chat"], env={"FLEXINFER_NATS_URL": f"nats://127.0.0.1:{port}"})
    assert result.exit_code == 1
    assert f"cannot reach NATS at nats://127.0.0.1:{port}" in result.stderr
