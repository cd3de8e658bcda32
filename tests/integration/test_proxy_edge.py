"""The proxy's edge against real sockets (loopback only): connection caps, header and body deadlines under a
slow-body flood while another client keeps being answered, and bodies that must be refused cleanly."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from flexinfer_common.bus import Bus
from flexinfer_common.enums import ModelPhase, SharedState
from flexinfer_proxy.app import Proxy
from flexinfer_testbed.routes import make_route
from tests.support.proxy import fake_model_server, proxy_to_model, publish_route, started_proxy
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

CHAT = {"model": "m1", "messages": [{"role": "user", "content": "hi"}]}


@contextlib.asynccontextmanager
async def proxy_to_fake_model(nats_url: str, *, labels: tuple[str, ...] = (), **overrides: Any) -> AsyncIterator[Proxy]:
    """A started proxy whose model ``m1`` (with service ``labels``) is Ready on a fake model server."""
    async with (
        fake_model_server() as model,
        proxy_to_model(nats_url, model, instance_id="proxy-edge", labels=labels, **overrides) as proxy,
    ):
        yield proxy


def shed_count(proxy_metrics: str, reason: str) -> float:
    for line in proxy_metrics.splitlines():
        if line.startswith(f'flexinfer_proxy_shed_total{{reason="{reason}"}}'):
            return float(line.split()[-1])
    return 0.0


async def metrics(http: aiohttp.ClientSession, base: str) -> str:
    async with http.get(base + "/metrics") as resp:
        return await resp.text()


def error_of(answer: bytes) -> tuple[int, dict[str, Any]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)["error"]


async def slow_body(port: int, results: list[str], *, trickle: float) -> None:
    """A slow-loris on the body: headers announcing 1 MB, then one byte every ``trickle`` seconds."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError as exc:
        results.append(f"connect failed: {exc}")
        return
    try:
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000\r\n\r\n{"
        )
        while True:
            try:
                answer = await asyncio.wait_for(reader.read(4096), trickle)
            except TimeoutError:
                writer.write(b" ")
                continue
            results.append(answer.split(b"\r\n", 1)[0].decode() if answer else "closed")
            return
    except ConnectionError:
        results.append("closed")
    finally:
        writer.close()


async def test_a_slow_body_flood_is_shed_while_another_client_keeps_being_answered(nats_url: str) -> None:
    flood = 2000
    async with (
        proxy_to_fake_model(
            nats_url,
            proxy_max_connections=1500,
            proxy_max_connections_per_client=1000,
            proxy_header_timeout="2s",
            proxy_body_timeout="2s",
            proxy_body_min_rate=1000,
        ) as proxy,
        # The other client comes from another loopback address (its own per-address cap), on fresh connections.
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), force_close=True),
            timeout=aiohttp.ClientTimeout(total=5),
        ) as http,
    ):
        base = f"http://127.0.0.1:{proxy.port}"
        before = await metrics(http, base)
        results: list[str] = []
        started = time.monotonic()
        attackers = [asyncio.create_task(slow_body(proxy.port, results, trickle=1.0)) for _ in range(flood)]
        answered = 0
        slowest = 0.0
        while len(results) < flood:
            assert time.monotonic() - started < 30, f"the flood was not shed in time ({len(results)} ended)"
            sent = time.monotonic()
            async with http.post(base + "/v1/chat/completions", json=CHAT) as resp:
                assert resp.status == 200, await resp.text()
                assert (await resp.json())["choices"][0]["message"]["content"] == "[m1] hi"
            slowest = max(slowest, time.monotonic() - sent)
            answered += 1
            await asyncio.sleep(0.05)
        await asyncio.gather(*attackers)
        took = time.monotonic() - started
        after = await metrics(http, base)

    timed_out = results.count("HTTP/1.1 408 Request Timeout")
    refused = results.count("HTTP/1.1 503 Service Unavailable") + results.count("closed")
    assert timed_out == 1000, f"the 1,000 admitted slow bodies are cut: {sorted(set(results))}"
    assert timed_out + refused == flood, sorted(set(results))
    assert shed_count(after, "body_timeout") - shed_count(before, "body_timeout") == 1000
    per_client = shed_count(after, "max_connections_per_client") - shed_count(before, "max_connections_per_client")
    assert per_client == 1000, "each refused connection is counted"
    assert answered >= 10 and slowest < 3.0, (answered, slowest)
    print(f"flood of {flood} shed in {took:.1f}s; {answered} answers meanwhile, slowest {slowest * 1000:.0f} ms")


async def test_per_address_cap_refuses_the_excess_with_503_and_serves_other_addresses(nats_url: str) -> None:
    async with proxy_to_fake_model(nats_url, proxy_max_connections_per_client=2) as proxy:
        held = [await asyncio.open_connection("127.0.0.1", proxy.port) for _ in range(2)]
        await wait_for(lambda: proxy.server.admitted == 2, what="two admitted")
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        status, error = error_of(await asyncio.wait_for(reader.read(), 5))
        assert (status, error["code"]) == (503, "too_many_connections")
        assert "2 from one address" in error["message"]
        writer.close()
        async with (
            aiohttp.ClientSession(connector=aiohttp.TCPConnector(local_addr=("127.0.0.3", 0))) as other,
            other.post(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", json=CHAT) as resp,
        ):
            assert resp.status == 200, "another address has its own cap"
        for _, held_writer in held:
            held_writer.close()
        await wait_for(lambda: proxy.server.admitted == 0, what="the held connections to close")
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert (await asyncio.wait_for(reader.read(), 5)).startswith(b"HTTP/1.1 200"), "slots free again"
        writer.close()


async def test_headers_past_the_header_timeout_get_408_and_silent_connections_are_closed(nats_url: str) -> None:
    async with proxy_to_fake_model(nats_url, proxy_header_timeout="1s") as proxy:
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        status, error = error_of(await asyncio.wait_for(reader.read(), 5))
        assert (status, error["code"]) == (408, "request_timeout") and "headers" in error["message"]
        assert 1.0 <= time.monotonic() - started < 3.5
        writer.close()
        silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        assert await asyncio.wait_for(silent_reader.read(), 5) == b"", "a connection that says nothing is closed"
        silent_writer.close()


async def test_a_body_nested_thousands_deep_is_a_400(nats_url: str) -> None:
    async with (
        proxy_to_fake_model(nats_url) as proxy,
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{proxy.port}/v1/chat/completions",
            data=b"[" * 3000,
            headers={"Content-Type": "application/json"},
        ) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
        assert error["code"] == "invalid_request" and "nested too deeply" in error["message"]


# --------------------------------------------------------------------------- the whole OpenAI and Anthropic surface


def rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_a_large_transcription_upload_streams_through_with_bounded_memory(nats_url: str, tmp_path: Any) -> None:
    import hashlib

    from openai import AsyncOpenAI

    size = 96 * 1024 * 1024
    audio = tmp_path / "speech.wav"
    digest = hashlib.sha256()
    with audio.open("wb") as out:
        block = bytes(range(256)) * 4096  # 1 MiB
        for _ in range(size // len(block)):
            out.write(block)
            digest.update(block)
    async with proxy_to_fake_model(nats_url, labels=("whisper",), proxy_max_request_body=size + 1024 * 1024) as proxy:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="unused", max_retries=0)
        baseline = rss_bytes()
        peak = baseline
        held_peak = 0
        sampling = True

        def held_by_the_proxy() -> int:
            """Body bytes the proxy's client connections hold right now (collected, or kept while sniffing)."""
            held = 0
            for conn in proxy.server.connections:
                for request in {conn.current, conn.active} - {None}:
                    assert request is not None
                    held += len(request.body) + sum(map(len, request.parts))
            return held

        async def sample() -> None:
            nonlocal peak, held_peak
            while sampling:
                peak = max(peak, rss_bytes())
                held_peak = max(held_peak, held_by_the_proxy())
                await asyncio.sleep(0.005)

        sampler = asyncio.create_task(sample())
        try:
            with audio.open("rb") as file:
                reply = await client.audio.transcriptions.create(model="whisper", file=("speech.wav", file))
        finally:
            sampling = False
            await sampler
            await client.close()
    assert reply.text == f"[m1] transcribed {size} bytes sha256:{digest.hexdigest()} model=whisper"
    grown = peak - baseline
    assert grown < size / 3, f"memory grew by {grown / 2**20:.0f} MiB for a {size / 2**20:.0f} MiB upload"
    assert held_peak < 2 * 1024 * 1024, f"the proxy held {held_peak} bytes of the body at once"
    print(f"96 MiB transcription upload: peak RSS +{grown / 2**20:.1f} MiB, at most {held_peak} body bytes held")


# The SDK marks audio.translations deprecated (OpenAI's own models moved on); clients still call it, so the proxy
# still serves it, and the SDK's warning says nothing about FlexInfer.
@pytest.mark.filterwarnings("ignore:deprecated:DeprecationWarning")
async def test_every_openai_endpoint_through_the_sdk(clean_nats: str) -> None:
    import base64

    import httpx
    from openai import AsyncOpenAI

    async with proxy_to_fake_model(clean_nats, labels=("chat",)) as proxy:
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="unused", max_retries=0)
        try:
            translated = await client.audio.translations.create(model="m1", file=("a.mp3", b"ID3" + b"x" * 1000))
            assert translated.text.startswith("[m1] translated 1003 bytes") and translated.text.endswith("model=m1")
            text = await client.audio.transcriptions.create(
                model="chat", file=("a.wav", b"RIFF"), response_format="text", language="en"
            )
            assert str(text).strip().startswith("[m1] transcribed 4 bytes")
            speech = await client.audio.speech.create(model="m1", voice="alloy", input="hello there")
            assert speech.content == b"FAKE-AUDIO[m1] hello there"
            images = await client.images.generate(model="chat", prompt="a red fox", n=2)
            assert images.data is not None and len(images.data) == 2
            assert base64.b64decode(images.data[0].b64_json or "") == b"FAKE-IMAGE[m1] a red fox"
            response = await client.responses.create(model="m1", input="what is up")
            assert response.output_text == "[m1] what is up"
            ranked = await client.post(
                "/rerank",
                body={"model": "m1", "query": "red fox", "documents": ["a blue sky", "the red fox", "red"]},
                cast_to=httpx.Response,
            )
            assert [r["index"] for r in ranked.json()["results"]] == [1, 2, 0]
            models = await client.models.list()
            listed = {m.id: m.model_extra or {} for m in models.data}
            assert set(listed) == {"m1", "chat"}
            assert listed["chat"]["alias_of"] == "default/m1" and listed["chat"]["ready"] is True
            alias = await client.models.retrieve("chat")
            assert alias.id == "chat" and (alias.model_extra or {})["alias_of"] == "default/m1"
        finally:
            await client.close()


async def test_anthropic_messages_through_the_sdk_with_the_key_as_x_api_key(nats_url: str) -> None:
    import anthropic

    async with proxy_to_fake_model(nats_url, proxy_api_keys="sk-proxy") as proxy:
        base = f"http://127.0.0.1:{proxy.port}"
        client = anthropic.AsyncAnthropic(base_url=base, api_key="sk-proxy", max_retries=0)
        wrong = anthropic.AsyncAnthropic(base_url=base, api_key="sk-wrong", max_retries=0)
        try:
            message = await client.messages.create(
                model="m1", max_tokens=32, messages=[{"role": "user", "content": "bonjour"}]
            )
            assert message.content[0].type == "text" and message.content[0].text == "[m1] bonjour"
            async with client.messages.stream(
                model="m1", max_tokens=32, messages=[{"role": "user", "content": "a b c"}]
            ) as stream:
                pieces = [text async for text in stream.text_stream]
            assert "".join(pieces).split() == ["[m1]", "a", "b", "c"] and len(pieces) > 1
            with pytest.raises(anthropic.AuthenticationError):
                await wrong.messages.create(model="m1", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        finally:
            await client.close()
            await wrong.close()


def multipart(*parts: tuple[str, bytes, str | None]) -> tuple[bytes, bytes]:
    """A multipart/form-data body from (name, value, filename) parts, in that order; and its Content-Type."""
    boundary = b"b0undary"
    body = b""
    for name, value, filename in parts:
        disposition = f'form-data; name="{name}"' + (f'; filename="{filename}"' if filename else "")
        body += b"--" + boundary + b"\r\nContent-Disposition: " + disposition.encode() + b"\r\n\r\n" + value + b"\r\n"
    return body + b"--" + boundary + b"--\r\n", b"multipart/form-data; boundary=" + boundary


@pytest.mark.parametrize(
    ("parts", "status", "says"),
    [
        pytest.param(
            [("file", b"x" * 10, "a.wav"), ("model", b"m1", None)], 200, "transcribed 10 bytes", id="file-first"
        ),
        pytest.param([("file", b"x" * 10, "a.wav")], 400, "no 'model' field", id="no-model"),
        pytest.param(
            [("file", b"x" * (2 * 1024 * 1024), "a.wav"), ("model", b"m1", None)],
            400,
            "send the 'model' field before the file",
            id="model-after-a-large-file",
        ),
        pytest.param([("model", b"nope", None), ("file", b"x", "a.wav")], 404, "'nope' not found", id="unknown-model"),
    ],
)
async def test_multipart_bodies_are_routed_by_their_model_field_or_refused_naming_it(
    nats_url: str, parts: list[tuple[str, bytes, str | None]], status: int, says: str
) -> None:
    body, content_type = multipart(*parts)
    async with (
        proxy_to_fake_model(nats_url) as proxy,
        aiohttp.ClientSession() as http,
        http.post(
            f"http://127.0.0.1:{proxy.port}/v1/audio/transcriptions",
            data=body,
            headers={"Content-Type": content_type.decode()},
        ) as resp,
    ):
        answer = await resp.json()
    assert resp.status == status, answer
    assert says in (answer["text"] if status == 200 else answer["error"]["message"])


# --------------------------------------------------------------------------- waiting streams kept alive


@contextlib.asynccontextmanager
async def proxy_with_a_loading_model(nats_url: str, **overrides: Any) -> AsyncIterator[tuple[Proxy, Bus, str]]:
    """A started proxy whose model ``m1`` is Loading (its requests wait); the fake model's URL to make it Ready."""
    async with (
        fake_model_server() as model,
        started_proxy(nats_url, instance_id="proxy-edge", **overrides) as proxy,
    ):
        await put_route(proxy, proxy.bus, None)
        yield proxy, proxy.bus, model


async def put_route(proxy: Proxy, bus: Bus, endpoint: str | None) -> None:
    """``m1`` Ready at ``endpoint``, or with none Loading (Active, not Ready yet); until the proxy holds it."""
    phase = ModelPhase.READY if endpoint else ModelPhase.LOADING
    await publish_route(proxy, make_route("m1", endpoint=endpoint, phase=phase, state=SharedState.ACTIVE), bus=bus)


async def test_a_waiting_stream_gets_comment_lines_so_a_client_read_timeout_does_not_fire(nats_url: str) -> None:
    from openai import APITimeoutError, AsyncOpenAI

    for interval, survives in (("0s", False), ("0.3s", True)):
        async with proxy_with_a_loading_model(nats_url, proxy_stream_keepalive_interval=interval) as (proxy, bus, url):
            client = AsyncOpenAI(
                base_url=f"http://127.0.0.1:{proxy.port}/v1",
                api_key="unused",
                max_retries=0,
                timeout=1.0,  # (connect, read, write: a read timeout shorter than the load)
            )

            async def ready_later() -> None:
                await asyncio.sleep(2.0)  # a load longer than the client's read timeout
                await put_route(proxy, bus, url)

            loading = asyncio.create_task(ready_later())
            try:
                if not survives:
                    with pytest.raises(APITimeoutError):
                        stream = await client.chat.completions.create(
                            model="m1", messages=[{"role": "user", "content": "a b"}], stream=True
                        )
                    continue
                stream = await client.chat.completions.create(
                    model="m1", messages=[{"role": "user", "content": "a b"}], stream=True
                )
                pieces = [chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices]
                assert "".join(pieces).split() == ["[m1]", "a", "b"], "only the real answer is seen"
            finally:
                await loading
                await client.close()


async def test_the_comment_lines_say_what_is_awaited_and_the_wait_comes_before_the_answer(nats_url: str) -> None:
    async with (
        proxy_with_a_loading_model(nats_url, proxy_stream_keepalive_interval="0.3s") as (proxy, bus, url),
        aiohttp.ClientSession() as http,
    ):
        body = {"model": "m1", "messages": [{"role": "user", "content": "hi"}], "stream": True}
        async with http.post(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", json=body) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"] == "text/event-stream"
            assert resp.headers["X-FlexInfer-Cold-Start"] == "true"
            first = await resp.content.readline()
            assert first == b": waiting for m1, loading, 0 s\n"
            await put_route(proxy, bus, url)
            text = (await resp.content.read()).decode()
        lines = [line for line in text.splitlines() if line]
        assert lines[-1] == "data: [DONE]"
        wait_comment = next(i for i, line in enumerate(lines) if line.startswith(": queue-wait-ms "))
        assert all(line.startswith(":") for line in lines[:wait_comment])
        assert all(line.startswith("data: ") for line in lines[wait_comment + 1 :])
        # A request that is not a stream still gets the model's own head after its wait.
        await put_route(proxy, bus, None)
        plain = asyncio.create_task(http.post(f"http://127.0.0.1:{proxy.port}/v1/chat/completions", json=CHAT))
        await asyncio.sleep(1.0)
        await put_route(proxy, bus, url)
        async with await plain as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("application/json")
            assert int(resp.headers["X-FlexInfer-Queue-Wait-Ms"]) >= 900


async def test_a_wait_that_times_out_after_the_head_ends_the_stream_with_an_error_event(nats_url: str) -> None:
    import anthropic
    from openai import APIError, AsyncOpenAI

    async with proxy_with_a_loading_model(nats_url, proxy_stream_keepalive_interval="0.2s", queue_timeout=1) as (
        proxy,
        _,
        _,
    ):
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="unused", max_retries=0)
        claude = anthropic.AsyncAnthropic(base_url=f"http://127.0.0.1:{proxy.port}", api_key="x", max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model="m1", messages=[{"role": "user", "content": "hi"}], stream=True
            )
            with pytest.raises(APIError) as caught:
                async for _ in stream:
                    pass
            assert "did not become ready" in caught.value.message
            assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "queue_timeout"
            with pytest.raises(anthropic.APIStatusError) as refused:
                async with claude.messages.stream(
                    model="m1", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
                ) as events:
                    async for _ in events:
                        pass
            assert "did not become ready" in str(refused.value)
        finally:
            await client.close()
            await claude.close()


async def test_a_model_error_after_the_early_head_is_an_error_event_with_the_models_message(nats_url: str) -> None:
    from openai import APIError, AsyncOpenAI

    async with proxy_with_a_loading_model(nats_url, proxy_stream_keepalive_interval="0.2s") as (proxy, bus, url):
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="unused", max_retries=0)
        try:
            stream = await client.chat.completions.create(
                model="m1", messages=[{"role": "system", "content": "no user turn"}], stream=True
            )
            await put_route(proxy, bus, url)
            with pytest.raises(APIError) as caught:
                async for _ in stream:
                    pass
            assert "no message with role 'user' (HTTP 400)" in caught.value.message
        finally:
            await client.close()


async def test_a_multipart_upload_that_waits_for_its_model_is_streamed_once_it_is_ready(nats_url: str) -> None:
    import hashlib

    from openai import AsyncOpenAI

    audio = bytes(range(256)) * (12 * 1024)  # 3 MiB: more than the proxy holds for a waiting request
    async with proxy_with_a_loading_model(nats_url) as (proxy, bus, url):
        client = AsyncOpenAI(base_url=f"http://127.0.0.1:{proxy.port}/v1", api_key="unused", max_retries=0)
        try:
            upload = asyncio.create_task(client.audio.transcriptions.create(model="m1", file=("a.wav", audio)))
            await wait_for(lambda: proxy.queues.total() == 1, what="the upload to wait")
            held = proxy.queues.held_bytes
            await put_route(proxy, bus, url)
            reply = await upload
        finally:
            await client.close()
    assert reply.text == f"[m1] transcribed {len(audio)} bytes sha256:{hashlib.sha256(audio).hexdigest()} model=m1"
    assert held < len(audio) // 4, f"the waiting upload held {held} bytes"
