"""Tests for the fake OpenAI-compatible model server (tools/fake-model)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import math
import os
import signal
import struct
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from flexinfer_common.tcp import free_port
from flexinfer_fake_model.server import STATE_KEY, FakeModelConfig, build_app, parse_args, split_words

MODEL = "test-model"
CLI = Path(sys.executable).parent / "flexinfer-fake-model"


@contextlib.asynccontextmanager
async def serve(**overrides: Any) -> AsyncIterator[tuple[str, web.AppRunner]]:
    """Run the app in-process on a free port; yield (base_url, runner)."""
    params: dict[str, Any] = {"model": MODEL, "token_delay": 0.001, "wake_delay": 0.1}
    params.update(overrides)
    runner = web.AppRunner(build_app(FakeModelConfig(**params)), shutdown_timeout=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        host, port = runner.addresses[0][:2]
        yield f"http://{host}:{port}", runner
    finally:
        if runner.server is not None:  # a test may already have cleaned up
            await runner.cleanup()


async def wait_healthy(http: aiohttp.ClientSession, base: str, within: float = 3.0) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientConnectionError):
            async with http.get(f"{base}/health") as resp:
                if resp.status == 200:
                    return
        await asyncio.sleep(0.02)
    raise AssertionError(f"{base} did not become healthy within {within}s")


@pytest.fixture(scope="session")
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session:
        yield session


@pytest.fixture
async def server(http: aiohttp.ClientSession) -> AsyncIterator[str]:
    async with serve() as (base, _runner):
        await wait_healthy(http, base)
        yield base


async def post(http: aiohttp.ClientSession, url: str, body: Any) -> tuple[int, dict[str, Any]]:
    async with http.post(url, json=body) as resp:
        return resp.status, await resp.json()


async def sse_events(resp: aiohttp.ClientResponse) -> list[str]:
    """Return the `data:` payloads of an SSE response, in order."""
    events: list[str] = []
    async for raw in resp.content:
        line = raw.decode().rstrip("\r\n")
        if line.startswith("data: "):
            events.append(line[len("data: ") :])
        else:
            assert line == "", f"unexpected SSE line {line!r}"
    return events


CHAT = {"model": MODEL, "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]}


# --------------------------------------------------------------------------- loading / health


async def test_health_is_503_while_loading_then_200(http: aiohttp.ClientSession) -> None:
    started = time.monotonic()
    async with serve(startup_delay=0.3) as (base, _):
        async with http.get(f"{base}/health") as resp:
            assert resp.status == 503
            assert await resp.json() == {"status": "loading"}
        status, body = await post(http, f"{base}/v1/chat/completions", CHAT)
        assert status == 503
        assert body == {
            "error": {"message": "model is loading", "type": "unavailable", "param": None, "code": "model_loading"}
        }
        await wait_healthy(http, base)
        assert time.monotonic() - started >= 0.25
        async with http.get(f"{base}/health") as resp:
            assert await resp.json() == {"status": "ok"}


# --------------------------------------------------------------------------- chat completions


async def test_chat_completion_content_and_header(http: aiohttp.ClientSession, server: str) -> None:
    body = {
        "model": MODEL,
        "messages": [
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "an answer"},
            {"role": "user", "content": "hello  there world"},
        ],
    }
    async with http.post(f"{server}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        assert resp.headers["X-Fake-Model"] == MODEL
        data = await resp.json()
    assert data["object"] == "chat.completion"
    assert data["id"].startswith("chatcmpl-")
    assert isinstance(data["created"], int)
    assert data["model"] == MODEL
    choice = data["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": f"[{MODEL}] hello  there world"}
    assert choice["finish_reason"] == "stop"
    # usage counts whitespace-split words: prompt 2 + 2 + 3, answer 4
    assert data["usage"] == {"prompt_tokens": 7, "completion_tokens": 4, "total_tokens": 11}


async def test_chat_content_parts_are_joined(http: aiohttp.ClientSession, server: str) -> None:
    parts = [
        {"type": "text", "text": "describe"},
        {"type": "image_url", "image_url": {"url": "http://x/y.png"}},
        {"type": "text", "text": "this"},
    ]
    status, data = await post(http, f"{server}/v1/chat/completions", {"messages": [{"role": "user", "content": parts}]})
    assert status == 200
    assert data["choices"][0]["message"]["content"] == f"[{MODEL}] describe this"


async def test_chat_streaming_matches_non_streamed(http: aiohttp.ClientSession, server: str) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "one two  three\nfour"}]}
    _, plain = await post(http, f"{server}/v1/chat/completions", body)
    expected = plain["choices"][0]["message"]["content"]

    stream_body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with http.post(f"{server}/v1/chat/completions", json=stream_body) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["X-Fake-Model"] == MODEL
        events = await sse_events(resp)

    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == MODEL for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    usage_chunk = chunks.pop()
    assert usage_chunk["choices"] == []
    assert usage_chunk["usage"] == plain["usage"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    deltas = [c["choices"][0]["delta"].get("content") or "" for c in chunks]
    assert len([d for d in deltas if d]) == len(expected.split())  # one chunk per word
    assert "".join(deltas) == expected


def test_split_words_round_trips() -> None:
    for text in ["", " ", "a", " a  b\n", "[m] x\ty  z "]:
        pieces = split_words(text)
        assert "".join(pieces) == text
        assert len(pieces) == max(len(text.split()), 1 if text else 0)


# --------------------------------------------------------------------------- completions / embeddings


async def test_completions_plain_list_and_stream(http: aiohttp.ClientSession, server: str) -> None:
    status, data = await post(http, f"{server}/v1/completions", {"model": MODEL, "prompt": "say hi"})
    assert status == 200
    assert data["object"] == "text_completion"
    assert data["choices"][0]["text"] == f"[{MODEL}] say hi"
    assert data["choices"][0]["finish_reason"] == "stop"

    _, multi = await post(http, f"{server}/v1/completions", {"prompt": ["a", "b c"]})
    assert [c["text"] for c in multi["choices"]] == [f"[{MODEL}] a", f"[{MODEL}] b c"]
    assert [c["index"] for c in multi["choices"]] == [0, 1]

    async with http.post(f"{server}/v1/completions", json={"prompt": "say hi", "stream": True}) as resp:
        events = await sse_events(resp)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert len(chunks) == 4  # three words + the stop chunk
    assert "".join(c["choices"][0]["text"] for c in chunks) == f"[{MODEL}] say hi"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


async def test_embeddings_deterministic_and_normalized(http: aiohttp.ClientSession, server: str) -> None:
    body = {"model": MODEL, "input": ["alpha", "beta", "alpha"]}
    status, first = await post(http, f"{server}/v1/embeddings", body)
    assert status == 200
    _, second = await post(http, f"{server}/v1/embeddings", body)
    assert first == second
    assert first["object"] == "list"
    assert first["model"] == MODEL
    vectors = [d["embedding"] for d in first["data"]]
    assert [d["index"] for d in first["data"]] == [0, 1, 2]
    assert all(len(v) == 8 for v in vectors)
    assert all(math.isclose(math.sqrt(sum(x * x for x in v)), 1.0, rel_tol=1e-9) for v in vectors)
    assert vectors[0] == vectors[2] != vectors[1]

    _, single = await post(http, f"{server}/v1/embeddings", {"input": "alpha"})
    assert single["data"][0]["embedding"] == vectors[0]

    _, b64 = await post(http, f"{server}/v1/embeddings", {"input": "alpha", "encoding_format": "base64"})
    decoded = struct.unpack("<8f", base64.b64decode(b64["data"][0]["embedding"]))
    assert all(math.isclose(a, b, abs_tol=1e-6) for a, b in zip(decoded, vectors[0], strict=True))


# --------------------------------------------------------------------------- sleep mode


async def test_sleep_and_wake_up(http: aiohttp.ClientSession, server: str) -> None:
    async with http.post(f"{server}/sleep", params={"level": "1"}) as resp:
        assert resp.status == 200
    async with http.get(f"{server}/is_sleeping") as resp:
        assert await resp.json() == {"is_sleeping": True}
    async with http.get(f"{server}/health") as resp:
        assert resp.status == 200  # vLLM: sleeping is still healthy
    status, body = await post(http, f"{server}/v1/chat/completions", CHAT)
    assert status == 503
    assert body["error"]["code"] == "model_sleeping"

    async def wake() -> int:
        async with http.post(f"{server}/wake_up") as resp:
            return resp.status

    wake_task = asyncio.create_task(wake())
    seen: list[tuple[int, str]] = []  # /health while wake_up runs (wake_delay is 0.1 s)
    while not wake_task.done():
        async with http.get(f"{server}/health") as resp:
            seen.append((resp.status, (await resp.json())["status"]))
        await asyncio.sleep(0.01)
    assert (503, "waking") in seen
    assert await wake_task == 200

    async with http.get(f"{server}/health") as resp:
        assert resp.status == 200
    async with http.get(f"{server}/is_sleeping") as resp:
        assert await resp.json() == {"is_sleeping": False}
    status, _ = await post(http, f"{server}/v1/chat/completions", CHAT)
    assert status == 200


# --------------------------------------------------------------------------- errors


async def test_bad_json_is_400_naming_the_problem(http: aiohttp.ClientSession, server: str) -> None:
    async with http.post(
        f"{server}/v1/chat/completions", data=b'{"messages": [', headers={"Content-Type": "application/json"}
    ) as resp:
        assert resp.status == 400
        assert resp.headers["X-Fake-Model"] == MODEL
        err = (await resp.json())["error"]
    assert "not valid JSON" in err["message"]
    assert err["type"] == "invalid_request_error"
    assert err["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/chat/completions", {"model": MODEL}, "messages"),
        ("/v1/chat/completions", {"messages": "hi"}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "system", "content": "x"}]}, "messages"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "stream": "yes"}, "stream"),
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"prompt": [1, 2, 3]}, "prompt"),
        ("/v1/embeddings", {"model": MODEL}, "input"),
        ("/v1/embeddings", {"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ],
)
async def test_invalid_requests_are_400(
    http: aiohttp.ClientSession, server: str, path: str, body: dict[str, Any], param: str
) -> None:
    status, data = await post(http, f"{server}{path}", body)
    assert status == 400
    assert data["error"]["param"] == param
    assert param.split("[")[0] in data["error"]["message"]


async def test_array_body_and_unknown_route(http: aiohttp.ClientSession, server: str) -> None:
    status, data = await post(http, f"{server}/v1/chat/completions", [1, 2])
    assert status == 400
    assert "JSON object" in data["error"]["message"]
    async with http.get(f"{server}/v2/nothing") as resp:
        assert resp.status == 404
        assert resp.headers["X-Fake-Model"] == MODEL
        assert (await resp.json())["error"]["code"] == "not_found"
    async with http.post(f"{server}/sleep", params={"level": "7"}) as resp:
        assert resp.status == 400


# --------------------------------------------------------------------------- models / stats / shutdown


async def test_models_and_stats(http: aiohttp.ClientSession) -> None:
    async with serve(response_delay=0.2) as (base, _):
        await wait_healthy(http, base)
        async with http.get(f"{base}/v1/models") as resp:
            models = await resp.json()
        assert models["object"] == "list"
        assert [m["id"] for m in models["data"]] == [MODEL]
        assert models["data"][0]["object"] == "model"

        slow = asyncio.create_task(post(http, f"{base}/v1/chat/completions", CHAT))
        for _ in range(100):  # until the slow request has arrived
            async with http.get(f"{base}/stats") as resp:
                stats = await resp.json()
            if stats["in_flight"] or slow.done():
                break
            await asyncio.sleep(0.005)
        assert stats["model"] == MODEL
        assert stats["pid"] == os.getpid()
        assert stats["requests"] == 1
        assert stats["in_flight"] == 1
        assert (await slow)[0] == 200
        async with http.get(f"{base}/stats") as resp:
            stats = await resp.json()
        assert (stats["requests"], stats["in_flight"]) == (1, 0)


async def test_cleanup_lets_in_flight_stream_finish(http: aiohttp.ClientSession) -> None:
    body = {"messages": [{"role": "user", "content": "a b c d e"}], "stream": True}
    async with serve(token_delay=0.05) as (base, runner):
        await wait_healthy(http, base)
        assert runner.app[STATE_KEY].loaded
        async with http.post(f"{base}/v1/chat/completions", json=body) as resp:
            first = await resp.content.readline()
            assert first.startswith(b"data: ")
            cleanup = asyncio.create_task(runner.cleanup())
            events = await sse_events(resp)
        await cleanup
    assert events[-1] == "[DONE]"


# --------------------------------------------------------------------------- CLI


def test_parse_args_env_fallback_and_cli_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_MODEL_PORT", "9001")
    monkeypatch.setenv("FAKE_MODEL_NAME", "from-env")
    monkeypatch.setenv("FAKE_MODEL_STARTUP_DELAY", "1.5")
    monkeypatch.setenv("FAKE_MODEL_TOKEN_DELAY", "0.2")
    monkeypatch.setenv("FAKE_MODEL_RESPONSE_DELAY", "0.3")
    config, level = parse_args(["--model", "from-cli", "--startup-delay", "0"])
    assert config == FakeModelConfig(
        model="from-cli", port=9001, startup_delay=0.0, token_delay=0.2, response_delay=0.3
    )
    assert level == "info"

    monkeypatch.delenv("FAKE_MODEL_PORT")
    with pytest.raises(SystemExit):
        parse_args([])


async def test_cli_subprocess_sigterm_exits_zero(http: aiohttp.ClientSession) -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        str(CLI), "--port", str(port), "--startup-delay", "0.3", "--model", "cli-model", stderr=asyncio.subprocess.PIPE
    )
    try:
        base = f"http://127.0.0.1:{port}"
        await wait_healthy(http, base, within=5.0)
        async with http.get(f"{base}/v1/models") as resp:
            assert resp.headers["X-Fake-Model"] == "cli-model"
        proc.send_signal(signal.SIGTERM)
        _, stderr = await asyncio.wait_for(proc.communicate(), 5.0)
        assert proc.returncode == 0
        lines = [json.loads(line) for line in stderr.decode().splitlines() if line.strip()]
        assert all({"ts", "level", "msg"} <= set(line) for line in lines)
        assert {"listening", "model loaded", "stopped"} <= {line["msg"] for line in lines}
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_cli_fail_load_exits_one() -> None:
    port = free_port()
    proc = await asyncio.create_subprocess_exec(
        str(CLI), "--port", str(port), "--startup-delay", "0.1", "--fail-load", stderr=asyncio.subprocess.PIPE
    )
    try:
        _, stderr = await asyncio.wait_for(proc.communicate(), 5.0)
        assert proc.returncode == 1
        assert "load failed" in stderr.decode()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
