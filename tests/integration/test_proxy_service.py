"""The proxy against real NATS: the test plays the scheduler (it writes Route entries into the routes KV bucket)
and runs the model servers in-process (the fake model, or a small recording upstream)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Unpack

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import REGISTRY

from flexinfer_common import subjects
from flexinfer_common.bus import Bus
from flexinfer_common.messages import Demand, Route
from flexinfer_proxy.adapters.routes_watcher import BAD_ROUTE_SUBJECT
from flexinfer_proxy.app import Proxy
from flexinfer_testbed.routes import RouteFields, make_route, write_route
from tests.support.proxy import fake_model_server, publish_route, serving, started_proxy
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(30)]

NS = "default"


# --------------------------------------------------------------------------- model servers


@dataclass
class Recorder:
    """A model server that records what reaches it. ``/sse`` streams one event, waits for ``gate``, then more."""

    seen: list[dict[str, Any]] = field(default_factory=list)
    gate: asyncio.Event = field(default_factory=asyncio.Event)
    client_gone: asyncio.Event = field(default_factory=asyncio.Event)
    #: the connection the last ``/sse`` stream came in on (None once closed; aiohttp drops it then)
    sse_request: web.Request | None = None

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        return app

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        self.seen.append(
            {"method": request.method, "path_qs": request.path_qs, "body": body, "headers": dict(request.headers)}
        )
        if request.path == "/sse":
            self.sse_request = request
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b"data: one\n\n")
            await self.gate.wait()
            try:
                await response.write(b"data: two\n\n")
                await response.write(b"data: [DONE]\n\n")
                await response.write_eof()
            except ConnectionError:
                self.client_gone.set()
            return response
        if request.path == "/teapot":
            return web.json_response({"error": {"message": "short and stout"}}, status=418)
        return web.json_response({"path_qs": request.path_qs, "n": len(self.seen)}, headers={"X-Upstream": "rec"})


# --------------------------------------------------------------------------- the harness


class Harness:
    """A started proxy plus what a test needs around it: the routes bucket, demand messages, an HTTP client."""

    def __init__(self, bus: Bus, proxy: Proxy, http: aiohttp.ClientSession) -> None:
        self.bus = bus
        self.proxy = proxy
        self.http = http
        self.base = f"http://127.0.0.1:{proxy.port}"
        self.demands: asyncio.Queue[tuple[str, Demand]] = asyncio.Queue()

    async def subscribe_demand(self) -> None:
        async def on_message(msg: Any) -> None:
            await self.demands.put((msg.subject, Demand.model_validate_json(msg.data)))

        await self.bus.nc.subscribe(subjects.DEMAND_PREFIX + ".>", cb=on_message)

    async def put_route(self, name: str, **fields: Unpack[RouteFields]) -> Route:
        """Write a route and wait until the proxy's table holds it."""
        return await publish_route(self.proxy, make_route(name, **fields), bus=self.bus, within=3.0)

    async def write_route(self, name: str, **fields: Unpack[RouteFields]) -> Route:
        """Write a route to the bucket, as the scheduler does (the proxy's watch delivers it a moment later)."""
        return await write_route(self.bus, make_route(name, **fields))

    @staticmethod
    def _key(namespace: str, name: str) -> Any:
        from flexinfer_common.keys import ModelKey

        return ModelKey(namespace, name)

    @staticmethod
    async def until(check: Callable[[], bool], *, within: float = 3.0) -> None:
        await wait_for(check, within=within)

    async def next_demand(
        self, match: Callable[[Demand], bool] = lambda d: True, *, within: float = 3.0
    ) -> tuple[str, Demand]:
        async with asyncio.timeout(within):
            while True:
                subject, demand = await self.demands.get()
                if match(demand):
                    return subject, demand

    async def queued(self, name: str) -> int:
        async with self.http.get(self.base + "/api/v1/queues") as resp:
            items = (await resp.json())["items"]
        return sum(i["queued"] for i in items if i["model"] == name)

    async def until_queued(self, name: str, count: int) -> None:
        async def queued_now() -> bool:
            return await self.queued(name) == count

        await wait_for(queued_now, within=3.0, what=f"{count} queued for {name}")

    def chat(self, model: str, text: str = "hello", **extra: Any) -> Awaitable[aiohttp.ClientResponse]:
        body = {"model": model, "messages": [{"role": "user", "content": text}], **extra}
        return self.http.post(self.base + "/v1/chat/completions", json=body)


StartProxy = Callable[..., Awaitable[Harness]]


@pytest.fixture
async def start_proxy(bus: Bus, clean_nats: str) -> AsyncIterator[StartProxy]:
    async with contextlib.AsyncExitStack() as started:
        http = await started.enter_async_context(aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)))

        async def start(*, check_interval: float = 10.0, **overrides: Any) -> Harness:
            overrides = {"queue_timeout": 5, "demand_refresh_interval": 10, **overrides}
            proxy = await started.enter_async_context(
                started_proxy(clean_nats, instance_id="proxy-test-1", route_check_interval=check_interval, **overrides)
            )
            harness = Harness(bus, proxy, http)
            await harness.subscribe_demand()
            return harness

        yield start


@pytest.fixture
async def proxy(start_proxy: StartProxy) -> Harness:
    return await start_proxy()


@pytest.fixture
async def fake_model() -> AsyncIterator[str]:
    async with fake_model_server() as base:
        yield base


@pytest.fixture
async def recorder() -> AsyncIterator[tuple[Recorder, str]]:
    rec = Recorder()
    async with serving(rec.app()) as base:
        yield rec, base
    rec.gate.set()


# --------------------------------------------------------------------------- forwarding


async def test_ready_model_is_forwarded_and_reports_activity(proxy: Harness, fake_model: str) -> None:
    await proxy.put_route("m1", endpoint=fake_model)
    async with await proxy.chat("m1", "hi there") as resp:
        assert resp.status == 200
        assert resp.headers["X-Fake-Model"] == "m1"
        assert "X-FlexInfer-Cold-Start" not in resp.headers
        body = await resp.json()
    assert body["choices"][0]["message"]["content"] == "[m1] hi there"
    subject, demand = await proxy.next_demand()
    assert subject == subjects.demand_subject(NS, "m1")
    assert (demand.queued, demand.source) == (0, "proxy-test-1")
    # a busy model costs the bus nothing more: no second activity report within the interval
    for _ in range(5):
        async with await proxy.chat("m1") as resp:
            assert resp.status == 200
    # another model's first request reports at once: by the time its report is here, a second m1 report would be
    await proxy.put_route("m2", endpoint=fake_model)
    async with await proxy.chat("m2") as resp:
        assert resp.status == 200
    subject, _ = await proxy.next_demand()
    assert subject == subjects.demand_subject(NS, "m2")
    assert proxy.demands.empty()


async def test_sse_passes_through_chunk_by_chunk(proxy: Harness, recorder: tuple[Recorder, str]) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    async with proxy.http.post(proxy.base + "/default/m1/sse", json={"stream": True}) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        # The first event arrives while the model still holds back the second one: nothing is buffered.
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), timeout=2)
        assert first == b"data: one\n\n"
        rec.gate.set()
        rest = await resp.content.read()
    assert rest == b"data: two\n\ndata: [DONE]\n\n"


async def test_client_leaving_mid_stream_closes_the_model_connection(
    proxy: Harness, recorder: tuple[Recorder, str]
) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    async with aiohttp.ClientSession() as leaving, leaving.post(proxy.base + "/default/m1/sse") as resp:
        assert await resp.content.readuntil(b"\n\n") == b"data: one\n\n"
    assert rec.sse_request is not None
    sse = rec.sse_request

    def closed() -> bool:  # the proxy closed its connection to the model
        return sse.transport is None or sse.transport.is_closing()

    await wait_for(closed, within=2, what="the proxy to close the model's connection")
    rec.gate.set()
    async with asyncio.timeout(2):
        await rec.client_gone.wait()  # the model learns it can stop generating


async def test_fake_model_streaming_chat(proxy: Harness, fake_model: str) -> None:
    await proxy.put_route("m1", endpoint=fake_model)
    async with await proxy.chat("m1", "one two three", stream=True) as resp:
        assert resp.status == 200
        events = [line async for line in resp.content if line.startswith(b"data: ")]
    assert events[-1].strip() == b"data: [DONE]"
    words = "".join(
        json.loads(e[6:])["choices"][0]["delta"].get("content", "") for e in events[:-1] if json.loads(e[6:])["choices"]
    )
    assert words.split() == ["[m1]", "one", "two", "three"]


async def test_unknown_model_is_404_with_an_openai_error(proxy: Harness) -> None:
    async with await proxy.chat("nope") as resp:
        assert resp.status == 404
        assert await resp.json() == {
            "error": {"message": "model 'nope' not found", "type": "invalid_request_error", "code": "model_not_found"}
        }


async def test_a_model_written_a_moment_ago_is_found_though_the_watch_lags(
    proxy: Harness, fake_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A request sent right after a route was written (``flexinfer apply`` returned) can reach the proxy before its
    route watch delivers the write. Such a request waits for the watch to catch up with the bucket instead of
    getting 404; a model nobody wrote still gets its 404, within the wait's bound."""
    await proxy.put_route("first", endpoint=fake_model)  # (the watch's pending read ends: the next ones lag)
    from nats.js.kv import KeyValue

    updates = KeyValue.KeyWatcher.updates

    async def lagging(self: Any, timeout: float = 5.0) -> Any:  # noqa: ASYNC109  (nats-py's own signature)
        entry = await updates(self, timeout=timeout)
        if entry is not None:
            await asyncio.sleep(0.5)  # a loaded proxy: the write is delivered half a second late
        return entry

    monkeypatch.setattr(KeyValue.KeyWatcher, "updates", lagging)
    await proxy.put_route("second", endpoint=fake_model)  # (read by the lagging watch from now on)
    await proxy.write_route("fresh", endpoint=fake_model)
    assert proxy.proxy.routes.get(proxy._key(NS, "fresh")) is None  # the table does not hold it yet
    async with await proxy.chat("fresh", "just applied") as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["choices"][0]["message"]["content"] == "[m1] just applied"  # (its server)
    started = asyncio.get_running_loop().time()
    async with await proxy.chat("never-written") as resp:
        assert resp.status == 404
    assert asyncio.get_running_loop().time() - started < 2.0
    # The same through a path prefix (/<namespace>/<name>/...), which names the model in the path.
    await proxy.write_route("fresh-prefixed", endpoint=fake_model)
    assert proxy.proxy.routes.get(proxy._key(NS, "fresh-prefixed")) is None
    async with proxy.http.get(f"{proxy.base}/{NS}/fresh-prefixed/v1/models") as resp:
        assert resp.status == 200, await resp.text()
    started = asyncio.get_running_loop().time()
    async with proxy.http.get(f"{proxy.base}/{NS}/never-written/v1/models") as resp:
        assert resp.status == 404
        assert (await resp.json())["error"]["code"] == "model_not_found"
    assert asyncio.get_running_loop().time() - started < 2.0


async def test_path_prefix_forwards_any_method_with_its_query(proxy: Harness, recorder: tuple[Recorder, str]) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    async with proxy.http.put(
        proxy.base + "/default/m1/v1/load_lora_adapter?name=x%20y&b=1", data=b"raw-bytes"
    ) as resp:
        assert resp.status == 200
        assert resp.headers["X-Upstream"] == "rec"
    assert rec.seen[-1]["method"] == "PUT"
    assert rec.seen[-1]["path_qs"] == "/v1/load_lora_adapter?name=x%20y&b=1", "forwarded as the client encoded it"
    assert rec.seen[-1]["body"] == b"raw-bytes"
    async with proxy.http.get(proxy.base + "/default/m1/teapot") as resp:
        assert resp.status == 418, "upstream errors pass through unchanged"
        assert (await resp.json())["error"]["message"] == "short and stout"


async def test_end_to_end_headers_pass_both_ways_and_hop_by_hop_ones_do_not(
    proxy: Harness, recorder: tuple[Recorder, str]
) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    headers = {
        "Authorization": "Bearer sk-client",
        "OpenAI-Organization": "org-1",
        "X-Request-Id": "abc",
        "Connection": "keep-alive, X-Hop",
        "X-Hop": "dropped: named in Connection",
        "Proxy-Authorization": "dropped",
    }
    body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}
    async with proxy.http.post(proxy.base + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        assert resp.headers["X-Upstream"] == "rec"
    seen = {name.lower(): value for name, value in rec.seen[-1]["headers"].items()}
    assert (seen["authorization"], seen["openai-organization"], seen["x-request-id"]) == (
        "Bearer sk-client",
        "org-1",
        "abc",
    )
    assert "x-hop" not in seen and "proxy-authorization" not in seen
    assert json.loads(rec.seen[-1]["body"]) == body, "the body goes through as sent"


async def test_metrics_count_requests_waits_and_cold_starts(proxy: Harness, fake_model: str) -> None:
    async with proxy.http.get(proxy.base + "/metrics") as resp:
        before = metric_samples(await resp.text())  # the registry is the test process's: count from here
    await proxy.put_route("m1")
    waiting = asyncio.create_task(proxy.chat("m1"))
    await proxy.until_queued("m1", 1)
    async with proxy.http.get(proxy.base + "/metrics") as resp:
        text = await resp.text()
    assert 'flexinfer_proxy_queue_depth{model="m1",namespace="default"} 1.0' in text
    await proxy.put_route("m1", endpoint=fake_model)
    async with await waiting as resp:
        assert resp.status == 200
    async with proxy.http.get(proxy.base + "/metrics") as resp:
        text = await resp.text()
    for name in (
        'flexinfer_proxy_queue_depth{model="m1",namespace="default"} 0.0',
        "flexinfer_proxy_queue_wait_seconds_count",
        'flexinfer_proxy_requests_total{code="200",model="m1",namespace="default"}',
        'flexinfer_proxy_cold_starts_total{model="m1",namespace="default"}',
    ):
        assert name in text, name

    # Per model, timed from the request's arrival: its wait is included, its first byte came before its end.
    after = metric_samples(text)

    def grew(name: str) -> float:
        key = name + '{model="m1",namespace="default"}'
        return after[key] - before.get(key, 0.0)

    assert grew("flexinfer_proxy_request_duration_seconds_count") == 1
    assert grew("flexinfer_proxy_time_to_first_byte_seconds_count") == 1
    waited = after["flexinfer_proxy_queue_wait_seconds_sum"] - before.get("flexinfer_proxy_queue_wait_seconds_sum", 0)
    first_byte = grew("flexinfer_proxy_time_to_first_byte_seconds_sum")
    assert waited <= first_byte <= grew("flexinfer_proxy_request_duration_seconds_sum")


def metric_samples(text: str) -> dict[str, float]:
    """``name{labels}`` -> value of a Prometheus text exposition (labels as the client library orders them)."""
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


async def test_expect_100_continue_is_answered_by_the_proxy(proxy: Harness, recorder: tuple[Recorder, str]) -> None:
    rec, base = recorder
    await proxy.put_route("m1", endpoint=base)
    body = json.dumps({"model": "m1", "input": "x"}).encode()
    for url in (proxy.base + "/v1/embeddings", proxy.base + "/default/m1/v1/embeddings"):
        async with proxy.http.post(url, data=body, expect100=True, timeout=aiohttp.ClientTimeout(total=3)) as resp:
            assert resp.status == 200
        assert rec.seen[-1]["body"] == body
        assert "Expect" not in rec.seen[-1]["headers"]


async def test_upstream_down_is_502(proxy: Harness) -> None:
    await proxy.put_route("m1", endpoint="http://127.0.0.1:9")  # discard port: nothing listens
    async with await proxy.chat("m1") as resp:
        assert resp.status == 502
        error = (await resp.json())["error"]
    assert error["code"] == "upstream_unavailable"
    assert "default/m1" in error["message"]


async def test_openai_client_works_through_the_proxy(proxy: Harness, fake_model: str) -> None:
    from openai import AsyncOpenAI

    await proxy.put_route("m1", endpoint=fake_model, labels=("chat",))
    client = AsyncOpenAI(base_url=proxy.base + "/v1", api_key="unused", max_retries=0)
    try:
        reply = await client.chat.completions.create(model="m1", messages=[{"role": "user", "content": "ping"}])
        assert reply.choices[0].message.content == "[m1] ping"
        stream = await client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "a b c"}], stream=True
        )
        pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
        assert "".join(pieces).split() == ["[m1]", "a", "b", "c"]
        assert len(pieces) > 1
        models = await client.models.list()
        assert [m.id for m in models.data] == ["m1", "chat"], "the service label is listed as an alias"
    finally:
        await client.close()


async def test_models_list_and_admin_auth(start_proxy: StartProxy, fake_model: str) -> None:
    harness = await start_proxy(admin_token="s3cret")
    await harness.put_route("m1", endpoint=fake_model)
    await harness.put_route("m2", namespace="team")
    async with harness.http.get(harness.base + "/v1/models") as resp:
        listed = await resp.json()
    assert listed["object"] == "list"
    assert [(m["id"], m["namespace"], m["state"], m["ready"]) for m in listed["data"]] == [
        ("m1", "default", "Active", True),
        ("m2", "team", "Parked", False),
    ]
    async with harness.http.get(harness.base + "/api/v1/queues") as resp:
        assert resp.status == 401
        assert (await resp.json())["error"]["code"] == "unauthorized"
    headers = {"Authorization": "Bearer s3cret"}
    async with harness.http.get(harness.base + "/api/v1/queues", headers=headers) as resp:
        assert resp.status == 200
        assert await resp.json() == {"items": []}
    async with harness.http.get(harness.base + "/readyz") as resp:
        ready = await resp.json()
    assert resp.status == 200 and ready["checks"]["bus"] is True


async def test_deleted_route_makes_the_model_unknown(proxy: Harness, fake_model: str) -> None:
    await proxy.put_route("m1", endpoint=fake_model)
    kv = await proxy.bus.routes()
    await kv.delete(subjects.route_key(NS, "m1"))
    await proxy.until(lambda: len(proxy.proxy.routes) == 0)
    async with await proxy.chat("m1") as resp:
        assert resp.status == 404


async def test_malformed_route_entry_is_ignored_and_counted(proxy: Harness, fake_model: str) -> None:
    def bad_count() -> float:
        return REGISTRY.get_sample_value("flexinfer_bad_messages_total", {"subject": BAD_ROUTE_SUBJECT}) or 0.0

    before = bad_count()
    kv = await proxy.bus.routes()
    await kv.put("default.garbage", b"{not json")
    await kv.put("default.halfway", json.dumps({"namespace": "default", "name": "halfway"}).encode())
    await proxy.put_route("m1", endpoint=fake_model)  # the watcher lives on
    assert bad_count() == before + 2
    assert [r.name for r in proxy.proxy.routes] == ["m1"]
    async with await proxy.chat("m1") as resp:
        assert resp.status == 200


async def test_watcher_recovers_when_the_bucket_is_recreated(start_proxy: StartProxy, fake_model: str) -> None:
    harness = await start_proxy(check_interval=0.2)
    await harness.put_route("m1")
    await harness.bus.js.delete_stream(f"KV_{subjects.ROUTES_BUCKET}")  # the scheduler's bucket is lost ...
    await harness.put_route("m1", endpoint=fake_model)  # ... and written again (bus.routes() recreates it)
    async with await harness.chat("m1") as resp:
        assert resp.status == 200


# --------------------------------------------------------------------------- queueing


async def test_queued_request_signals_demand_and_is_answered_when_ready(
    start_proxy: StartProxy, fake_model: str
) -> None:
    harness = await start_proxy(demand_refresh_interval=0.3)
    await harness.put_route("m1")
    request = asyncio.create_task(harness.chat("m1", "wake up"))
    subject, demand = await harness.next_demand()
    assert subject == subjects.demand_subject(NS, "m1")
    assert (demand.model, demand.namespace, demand.queued, demand.source) == ("m1", NS, 1, "proxy-test-1")
    _, refreshed = await harness.next_demand(within=2)  # still waiting: the demand is kept alive
    assert refreshed.queued == 1
    assert await harness.queued("m1") == 1

    await harness.put_route("m1", endpoint=fake_model)
    async with await request as resp:
        assert resp.status == 200
        assert resp.headers["X-FlexInfer-Cold-Start"] == "true"
        assert int(resp.headers["X-FlexInfer-Queue-Wait-Ms"]) >= 300
        assert (await resp.json())["choices"][0]["message"]["content"] == "[m1] wake up"
    _, final = await harness.next_demand(lambda d: d.queued == 0)
    assert final.queued == 0
    assert await harness.queued("m1") == 0


async def test_drained_requests_reach_the_model_in_arrival_order(
    proxy: Harness, recorder: tuple[Recorder, str]
) -> None:
    rec, base = recorder
    await proxy.put_route("m1")
    tasks = []
    for i in range(6):
        tasks.append(asyncio.create_task(proxy.chat("m1", f"request-{i}")))
        await proxy.until_queued("m1", i + 1)
    await proxy.put_route("m1", endpoint=base)
    responses = await asyncio.gather(*tasks)
    for resp in responses:
        assert resp.status == 200
        resp.release()
    order = [json.loads(seen["body"])["messages"][0]["content"] for seen in rec.seen]
    assert order == [f"request-{i}" for i in range(6)]


async def test_full_queue_is_429_with_retry_after(start_proxy: StartProxy) -> None:
    harness = await start_proxy(queue_max=2)
    await harness.put_route("m1")
    waiting = [asyncio.create_task(harness.chat("m1")) for _ in range(2)]
    await harness.until_queued("m1", 2)
    async with await harness.chat("m1") as resp:
        assert resp.status == 429
        assert resp.headers["Retry-After"] == "5"
        assert resp.headers["Content-Type"] == "application/json"
        error = (await resp.json())["error"]
        assert (error["code"], error["type"]) == ("queue_full", "rate_limit_error")
    for task in waiting:
        task.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)


async def test_wait_past_the_queue_timeout_is_504(start_proxy: StartProxy) -> None:
    harness = await start_proxy(queue_timeout=0.4)
    await harness.put_route("m1")
    async with await harness.chat("m1") as resp:
        assert resp.status == 504
        assert resp.headers["Content-Type"] == "application/json"
        assert await resp.json() == {
            "error": {
                "message": "model 'default/m1' did not become ready within 0.4s",
                "type": "server_error",
                "code": "queue_timeout",
            }
        }
    assert await harness.queued("m1") == 0


async def test_failed_route_answers_waiters_503_and_a_newcomer_asks_for_a_retry(
    proxy: Harness, fake_model: str
) -> None:
    await proxy.put_route("m1")
    waiting = [asyncio.create_task(proxy.chat("m1")) for _ in range(2)]
    await proxy.until_queued("m1", 2)
    await proxy.put_route("m1", failure="process exited with code 1")
    for resp in await asyncio.gather(*waiting):
        assert resp.status == 503
        assert resp.headers["Content-Type"] == "application/json"
        error = (await resp.json())["error"]
        assert error["code"] == "model_failed"
        assert "process exited with code 1" in error["message"]
    await proxy.next_demand(lambda d: d.queued == 0)
    # A newcomer is not turned away: the scheduler retries a failed model only when a request names it again.
    newcomer = asyncio.create_task(proxy.chat("m1", "try again"))
    _, demand = await proxy.next_demand(lambda d: d.queued == 1)
    assert demand.model == "m1"
    await proxy.put_route("m1")  # the retry: loading, failure cleared
    await proxy.put_route("m1", endpoint=fake_model)
    async with await newcomer as resp:
        assert resp.status == 200
        assert resp.headers["X-FlexInfer-Cold-Start"] == "true"
        assert (await resp.json())["choices"][0]["message"]["content"] == "[m1] try again"


async def test_client_that_disconnects_leaves_the_queue_and_the_demand(proxy: Harness) -> None:
    await proxy.put_route("m1")
    impatient = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=0.5))
    try:
        with pytest.raises(TimeoutError):
            async with impatient.post(proxy.base + "/v1/chat/completions", json={"model": "m1"}):
                pass
    finally:
        await impatient.close()
    _, first = await proxy.next_demand()
    assert first.queued == 1
    _, after = await proxy.next_demand()
    assert after.queued == 0
    assert await proxy.queued("m1") == 0


async def test_shutdown_answers_waiters_503(start_proxy: StartProxy) -> None:
    harness = await start_proxy()
    await harness.put_route("m1")
    waiting = asyncio.create_task(harness.chat("m1"))
    await harness.until_queued("m1", 1)
    await harness.proxy.stop()
    async with await waiting as resp:
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "shutting_down"
