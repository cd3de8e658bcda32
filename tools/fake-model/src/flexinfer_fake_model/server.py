"""A fake OpenAI-compatible model server (aiohttp).

It behaves enough like a vLLM server for demos and tests of FlexInfer:

* binds its port immediately and "loads weights" in the background
  (``/health`` answers 503 until loaded);
* answers ``/v1/chat/completions``, ``/v1/completions`` and ``/v1/embeddings``
  deterministically (the answer echoes the prompt), streaming supported;
* supports vLLM sleep mode (``POST /sleep``, ``POST /wake_up``, ``GET /is_sleeping``);
* exposes test hooks: an ``X-Fake-Model`` header on every response and ``GET /stats``.

Use :func:`build_app` to run it in-process, or the ``flexinfer-fake-model`` CLI (:func:`main`).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import itertools
import json
import logging
import math
import os
import re
import signal
import struct
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NoReturn, TypeVar

from aiohttp import BodyPartReader, web
from aiohttp.typedefs import Handler

__all__ = ["STATE_KEY", "FakeModelConfig", "FakeModelState", "build_app", "embed_text", "main", "run"]

logger = logging.getLogger("flexinfer_fake_model")

EMBEDDING_DIM = 8
SHUTDOWN_TIMEOUT_S = 5.0
MODEL_HEADER = "X-Fake-Model"
# Endpoints that count as "requests" in /stats and are gated on the model being loaded and awake.
INFERENCE_PATHS = frozenset(
    {
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
        "/v1/audio/transcriptions",
        "/v1/audio/translations",
        "/v1/audio/speech",
        "/v1/images/generations",
        "/v1/rerank",
        "/v1/responses",
        "/v1/messages",
    }
)
# Endpoints polled by probers: logged at DEBUG so they do not flood the log.
QUIET_PATHS = frozenset({"/health", "/is_sleeping", "/stats"})

_T = TypeVar("_T")


# --------------------------------------------------------------------------- config and state


@dataclass(frozen=True)
class FakeModelConfig:
    """Everything that shapes the fake server's behaviour."""

    model: str = "fake"
    host: str = "127.0.0.1"
    port: int = 0
    startup_delay: float = 0.0
    token_delay: float = 0.01
    response_delay: float = 0.0
    wake_delay: float = 0.2
    fail_load: bool = False
    sleep_mode: bool = True  # False: like a server started without vLLM's --enable-sleep-mode (404 on /sleep)


@dataclass
class FakeModelState:
    """Mutable runtime state of one server (one per application)."""

    config: FakeModelConfig
    loaded: bool = False
    load_failed: bool = False
    sleeping: bool = False
    sleep_level: int = 0
    waking: bool = False
    requests: int = 0
    in_flight: int = 0
    started_at: int = field(default_factory=lambda: int(time.time()))
    loaded_at: float | None = None  # epoch seconds
    load_done: asyncio.Event = field(default_factory=asyncio.Event)
    sleep_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def next_id(self, prefix: str) -> str:
        return f"{prefix}-{os.getpid()}-{next(self._ids)}"

    @property
    def status(self) -> str:
        """One of: loading, failed, waking, sleeping, ok."""
        if self.load_failed:
            return "failed"
        if not self.loaded:
            return "loading"
        if self.waking:
            return "waking"
        if self.sleeping:
            return "sleeping"
        return "ok"


STATE_KEY = web.AppKey("fake_model_state", FakeModelState)


# --------------------------------------------------------------------------- errors


class ApiError(Exception):
    """An error answered with an OpenAI-style body: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, type_: str, code: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type_
        self.code = code
        self.param = param

    def response(self) -> web.Response:
        return web.json_response(
            {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}},
            status=self.status,
        )


def _bad_request(message: str, *, param: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, message, type_="invalid_request_error", code=code, param=param)


def _unavailable(state: FakeModelState) -> ApiError | None:
    """The 503 to answer an inference request with, or None if the model can serve."""
    status = state.status
    if status == "ok":
        return None
    if status == "failed":
        return ApiError(503, "model failed to load", type_="unavailable", code="model_load_failed")
    if status == "loading":
        return ApiError(503, "model is loading", type_="unavailable", code="model_loading")
    return ApiError(503, "model is sleeping", type_="unavailable", code="model_sleeping")


def _check_serving(state: FakeModelState) -> None:
    """Raise the 503 of :func:`_unavailable` unless the model can serve."""
    if (err := _unavailable(state)) is not None:
        raise err


# --------------------------------------------------------------------------- deterministic "model"


def count_tokens(text: str) -> int:
    """Fake tokenizer: one token per whitespace-separated word."""
    return len(text.split())


def split_words(text: str) -> list[str]:
    """Split into one piece per word such that ``"".join(pieces) == text``."""
    pieces = re.findall(r"\s*\S+", text)
    tail = text[len("".join(pieces)) :]
    if tail:
        if pieces:
            pieces[-1] += tail
        else:
            pieces = [tail]
    return pieces


def embed_text(text: str) -> list[float]:
    """Deterministic unit-length vector (EMBEDDING_DIM = 8 floats, from the 32 bytes of sha256(text))."""
    digest = hashlib.sha256(text.encode("utf-8")).digest()
    raw = [(v / 0xFFFFFFFF) * 2.0 - 1.0 for v in struct.unpack(f">{EMBEDDING_DIM}I", digest)]
    norm = math.sqrt(sum(x * x for x in raw)) or 1.0
    return [x / norm for x in raw]


def _message_text(content: Any, index: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts: list[str] = []
        for part in content:
            if not isinstance(part, dict):
                raise _bad_request(
                    f"'messages[{index}].content' parts must be objects", param=f"messages[{index}].content"
                )
            if part.get("type", "text") == "text":
                text = part.get("text")
                if not isinstance(text, str):
                    raise _bad_request(
                        f"text part of 'messages[{index}].content' is missing a string 'text'",
                        param=f"messages[{index}].content",
                    )
                texts.append(text)
        return " ".join(texts)
    raise _bad_request(
        f"'messages[{index}].content' must be a string, a list of content parts or null",
        param=f"messages[{index}].content",
    )


# --------------------------------------------------------------------------- request parsing


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        raise _bad_request("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _bad_request(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise _bad_request("request body must be a JSON object", code="invalid_json")
    return body


def _missing(field: str) -> ApiError:
    return _bad_request(f"missing required field '{field}'", param=field, code="missing_field")


def _opt(body: dict[str, Any], name: str, kind: type[_T], default: _T) -> _T:
    value = body.get(name)
    if value is None:
        return default
    # bool is a subclass of int: do not accept true/false where numbers are expected and vice versa.
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise _bad_request(f"'{name}' must be of type {kind.__name__}", param=name, code="invalid_type")
    return value


def _required_text(body: dict[str, Any], name: str) -> str:
    """A string field the request must give, not empty."""
    text = _opt(body, name, str, "")
    if not text:
        raise _missing(name)
    return text


def _check_common(body: dict[str, Any]) -> tuple[bool, bool]:
    """Validate fields shared by the generation endpoints; return (stream, include_usage)."""
    _opt(body, "model", str, "")
    stream = _opt(body, "stream", bool, False)
    stream_options = _opt(body, "stream_options", dict, {})
    include_usage = bool(stream_options.get("include_usage", False))
    return stream, include_usage


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


# --------------------------------------------------------------------------- SSE helpers


async def _start_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(
        status=200,
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        },
    )
    await resp.prepare(request)
    return resp


async def _sse(resp: web.StreamResponse, payload: dict[str, Any] | str) -> None:
    data = payload if isinstance(payload, str) else json.dumps(payload, separators=(",", ":"))
    await resp.write(f"data: {data}\n\n".encode())


# --------------------------------------------------------------------------- handlers


def _state(request: web.Request) -> FakeModelState:
    return request.app[STATE_KEY]


async def health(request: web.Request) -> web.Response:
    state = _state(request)
    status = state.status
    if status in ("ok", "sleeping"):  # vLLM: a sleeping server is still healthy
        return web.json_response({"status": "ok"})
    return web.json_response({"status": status}, status=503)


async def is_sleeping(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response({"is_sleeping": state.sleeping})


async def stats(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response(
        {
            "model": state.config.model,
            "requests": state.requests,
            "in_flight": state.in_flight,
            "pid": os.getpid(),
            "status": state.status,
            # when the process was created and when it finished loading (epoch seconds): its own spawn-to-healthy
            # time, which the swap benchmark subtracts from a cold request's time to tell what orchestration cost
            "process_started_at": _process_started_at(),
            "loaded_at": state.loaded_at,
        }
    )


def _process_started_at() -> float | None:
    """This process's creation time (Linux: /proc, to the kernel's clock tick), else None."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        age = uptime - int(fields[19]) / os.sysconf("SC_CLK_TCK")  # both count from boot, to the clock tick
        return time.time() - age
    except (OSError, ValueError, IndexError):
        return None


async def list_models(request: web.Request) -> web.Response:
    state = _state(request)
    return web.json_response(
        {
            "object": "list",
            "data": [
                {
                    "id": state.config.model,
                    "object": "model",
                    "created": state.started_at,
                    "owned_by": "flexinfer-fake-model",
                }
            ],
        }
    )


async def sleep(request: web.Request) -> web.Response:
    state = _state(request)
    level_raw = request.query.get("level", "1")
    if not state.config.sleep_mode:
        raise web.HTTPNotFound(text="sleep mode is not enabled")
    if level_raw not in ("1", "2"):
        raise _bad_request(f"'level' must be 1 or 2, got {level_raw!r}", param="level")
    if not state.loaded:
        raise _unavailable(state) or _bad_request("model is not loaded")
    async with state.sleep_lock:
        if not state.sleeping:
            state.sleeping = True
            state.sleep_level = int(level_raw)
            _log(logging.INFO, "sleeping", sleep_level=state.sleep_level)
    return web.json_response({"status": "sleeping", "level": state.sleep_level})


async def wake_up(request: web.Request) -> web.Response:
    state = _state(request)
    if not state.loaded:
        raise _unavailable(state) or _bad_request("model is not loaded")
    async with state.sleep_lock:
        if state.sleeping:
            state.waking = True
            _log(logging.INFO, "waking up", delay_s=state.config.wake_delay)
            try:
                await asyncio.sleep(state.config.wake_delay)
                state.sleeping = False
                state.sleep_level = 0
            finally:
                state.waking = False
            _log(logging.INFO, "awake")
    return web.json_response({"status": "ok"})


async def chat_completions(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    # Numbered as the request reaches its handler, before its body is read: concurrent handlers finish reading
    # their bodies in any order, so a number taken later would not say the order the requests arrived in.
    completion_id = state.next_id("chatcmpl")
    body = await _json_body(request)
    stream, include_usage = _check_common(body)
    messages = body.get("messages")
    if messages is None:
        raise _missing("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad_request("'messages' must be a non-empty list", param="messages", code="invalid_type")
    prompt_tokens = 0
    last_user: str | None = None
    for i, msg in enumerate(messages):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise _bad_request(f"'messages[{i}]' must be an object with a string 'role'", param=f"messages[{i}]")
        text = _message_text(msg.get("content"), i)
        prompt_tokens += count_tokens(text)
        if msg["role"] == "user":
            last_user = text
    if last_user is None:
        raise _bad_request("'messages' contains no message with role 'user'", param="messages")
    # Check readiness only once the request is known to be well-formed.
    _check_serving(state)

    model = state.config.model
    content = f"[{model}] {last_user}"
    usage = _usage(prompt_tokens, count_tokens(content))
    created = int(time.time())

    if not stream:
        await asyncio.sleep(state.config.response_delay)
        return web.json_response(
            {
                "id": completion_id,
                "object": "chat.completion",
                "created": created,
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "logprobs": None,
                        "finish_reason": "stop",
                    }
                ],
                "usage": usage,
            }
        )

    def chunk(delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}],
        }

    resp = await _start_sse(request)
    with contextlib.suppress(ConnectionResetError):
        await _sse(resp, chunk({"role": "assistant", "content": ""}))
        for word in split_words(content):
            await asyncio.sleep(state.config.token_delay)
            await _sse(resp, chunk({"content": word}))
        await _sse(resp, chunk({}, "stop"))
        if include_usage:
            final = chunk({})
            final["choices"] = []
            final["usage"] = usage
            await _sse(resp, final)
        await _sse(resp, "[DONE]")
        await resp.write_eof()
    return resp


def _strings(body: dict[str, Any], field: str) -> list[str]:
    """``field`` of a request: a string or a non-empty list of strings, as a list."""
    value = body.get(field)
    if value is None:
        raise _missing(field)
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(item, str) for item in value):
        return list(value)
    raise _bad_request(
        f"'{field}' must be a string or a non-empty list of strings (token ids are not supported)",
        param=field,
        code="invalid_type",
    )


async def completions(request: web.Request) -> web.StreamResponse:
    state = _state(request)
    body = await _json_body(request)
    stream, include_usage = _check_common(body)
    prompts = _strings(body, "prompt")
    _check_serving(state)

    model = state.config.model
    texts = [f"[{model}] {p}" for p in prompts]
    usage = _usage(sum(count_tokens(p) for p in prompts), sum(count_tokens(t) for t in texts))
    completion_id = state.next_id("cmpl")
    created = int(time.time())

    def envelope(choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": completion_id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": choices,
        }

    def choice(index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
        return {"index": index, "text": text, "logprobs": None, "finish_reason": finish_reason}

    if not stream:
        await asyncio.sleep(state.config.response_delay)
        result = envelope([choice(i, t, "stop") for i, t in enumerate(texts)])
        result["usage"] = usage
        return web.json_response(result)

    resp = await _start_sse(request)
    with contextlib.suppress(ConnectionResetError):
        first = True
        for i, text in enumerate(texts):
            for word in split_words(text):
                if not first:
                    await asyncio.sleep(state.config.token_delay)
                first = False
                await _sse(resp, envelope([choice(i, word, None)]))
            await _sse(resp, envelope([choice(i, "", "stop")]))
        if include_usage:
            final = envelope([])
            final["usage"] = usage
            await _sse(resp, final)
        await _sse(resp, "[DONE]")
        await resp.write_eof()
    return resp


async def embeddings(request: web.Request) -> web.Response:
    state = _state(request)
    body = await _json_body(request)
    _opt(body, "model", str, "")
    inputs = _strings(body, "input")
    encoding_format = _opt(body, "encoding_format", str, "float")
    if encoding_format not in ("float", "base64"):
        raise _bad_request(
            "'encoding_format' must be 'float' or 'base64'", param="encoding_format", code="invalid_value"
        )
    _check_serving(state)

    data: list[dict[str, Any]] = []
    for i, text in enumerate(inputs):
        vec = embed_text(text)
        encoded: list[float] | str = vec
        if encoding_format == "base64":  # the openai client asks for this by default
            encoded = base64.b64encode(struct.pack(f"<{len(vec)}f", *vec)).decode("ascii")
        data.append({"object": "embedding", "index": i, "embedding": encoded})
    prompt_tokens = sum(count_tokens(t) for t in inputs)
    return web.json_response(
        {
            "object": "list",
            "data": data,
            "model": state.config.model,
            "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
        }
    )


# --------------------------------------------------------------------------- the rest of the OpenAI surface
# (and Anthropic's messages): deterministic answers in each API's own shape, enough for the SDKs to parse.


async def audio_text(request: web.Request) -> web.Response:
    """``/v1/audio/transcriptions`` and ``/translations``: multipart, read as a stream; the text names the file's
    size and SHA-256 (so a test sees the upload arrived whole) and the other form fields."""
    state = _state(request)
    if not request.content_type.startswith("multipart/"):
        raise _bad_request("expected a multipart/form-data body", code="invalid_body")
    reader = await request.multipart()
    fields: dict[str, str] = {}
    size, digest = 0, hashlib.sha256()
    async for part in reader:
        if not isinstance(part, BodyPartReader):
            continue
        if part.filename is not None:
            while chunk := await part.read_chunk(64 * 1024):
                size += len(chunk)
                digest.update(chunk)
        elif part.name:
            fields[part.name] = await part.text()
    if not size:
        raise _missing("file")
    _check_serving(state)
    verb = "translated" if request.path.endswith("translations") else "transcribed"
    text = f"[{state.config.model}] {verb} {size} bytes sha256:{digest.hexdigest()} model={fields.get('model', '')}"
    if fields.get("response_format") == "text":
        return web.Response(text=text)
    return web.json_response({"text": text})


async def speech(request: web.Request) -> web.Response:
    state = _state(request)
    body = await _json_body(request)
    text = _required_text(body, "input")
    _check_serving(state)
    return web.Response(body=f"FAKE-AUDIO[{state.config.model}] {text}".encode(), content_type="audio/mpeg")


async def image_generations(request: web.Request) -> web.Response:
    state = _state(request)
    body = await _json_body(request)
    prompt = _required_text(body, "prompt")
    _check_serving(state)
    image = base64.b64encode(f"FAKE-IMAGE[{state.config.model}] {prompt}".encode()).decode()
    count = _opt(body, "n", int, 1)
    return web.json_response({"created": int(time.time()), "data": [{"b64_json": image}] * count})


async def rerank(request: web.Request) -> web.Response:
    """``/v1/rerank`` (the Jina/Cohere shape vLLM and infinity serve): documents by words shared with the query."""
    state = _state(request)
    body = await _json_body(request)
    query = _opt(body, "query", str, "")
    documents = body.get("documents")
    if not query or not isinstance(documents, list) or not all(isinstance(d, str) for d in documents):
        raise _bad_request("'query' (a string) and 'documents' (a list of strings) are required", param="documents")
    _check_serving(state)
    words = set(query.lower().split())
    scores = [len(words & set(d.lower().split())) / (len(words) or 1) for d in documents]
    order = sorted(range(len(documents)), key=lambda i: (-scores[i], i))
    results = [{"index": i, "relevance_score": scores[i], "document": {"text": documents[i]}} for i in order]
    return web.json_response({"id": state.next_id("rerank"), "model": state.config.model, "results": results})


async def responses(request: web.Request) -> web.Response:
    """``/v1/responses``: the answer echoes the (last) input text, as chat completions do."""
    state = _state(request)
    body = await _json_body(request)
    given = body.get("input")
    if isinstance(given, str):
        text = given
    elif isinstance(given, list) and given and isinstance(given[-1], dict):
        text = _message_text(given[-1].get("content"), len(given) - 1)
    else:
        raise _bad_request("'input' must be a string or a list of messages", param="input", code="invalid_type")
    _check_serving(state)
    content = f"[{state.config.model}] {text}"
    return web.json_response(
        {
            "id": state.next_id("resp"),
            "object": "response",
            "created_at": int(time.time()),
            "model": state.config.model,
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": state.next_id("msg"),
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": content, "annotations": []}],
                }
            ],
            "parallel_tool_calls": False,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": count_tokens(text),
                "output_tokens": count_tokens(content),
                "total_tokens": count_tokens(text) + count_tokens(content),
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
    )


async def messages(request: web.Request) -> web.StreamResponse:
    """Anthropic's ``/v1/messages``: the answer echoes the last user message; ``stream: true`` gives its events."""
    state = _state(request)
    body = await _json_body(request)
    stream = _opt(body, "stream", bool, False)
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns or not isinstance(turns[-1], dict):
        raise _bad_request("'messages' must be a non-empty list", param="messages", code="invalid_type")
    text = _message_text(turns[-1].get("content"), len(turns) - 1)
    _check_serving(state)
    content = f"[{state.config.model}] {text}"
    usage = {"input_tokens": count_tokens(text), "output_tokens": count_tokens(content)}
    message: dict[str, Any] = {
        "id": state.next_id("msg"),
        "type": "message",
        "role": "assistant",
        "model": state.config.model,
        "content": [{"type": "text", "text": content}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": usage,
    }
    if not stream:
        return web.json_response(message)
    resp = await _start_sse(request)

    async def event(kind: str, payload: dict[str, Any]) -> None:
        await resp.write(f"event: {kind}\ndata: {json.dumps({'type': kind, **payload})}\n\n".encode())

    with contextlib.suppress(ConnectionResetError):
        await event("message_start", {"message": {**message, "content": [], "stop_reason": None}})
        await event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
        for word in split_words(content):
            await asyncio.sleep(state.config.token_delay)
            await event("content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": word}})
        await event("content_block_stop", {"index": 0})
        await event("message_delta", {"delta": {"stop_reason": "end_turn", "stop_sequence": None}, "usage": usage})
        await event("message_stop", {})
        await resp.write_eof()
    return resp


# --------------------------------------------------------------------------- app wiring


@web.middleware
async def _middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    state = _state(request)
    counted = request.path in INFERENCE_PATHS
    if counted:
        state.requests += 1
        state.in_flight += 1
    started = time.monotonic()
    try:
        try:
            resp = await handler(request)
        except ApiError as exc:
            resp = exc.response()
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            kind = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status, "http_error")
            resp = ApiError(exc.status, exc.reason, type_="invalid_request_error", code=kind).response()
    finally:
        if counted:
            state.in_flight -= 1
    _log(
        logging.DEBUG if request.path in QUIET_PATHS else logging.INFO,
        "request",
        method=request.method,
        path=request.path,
        status=resp.status,
        duration_ms=round((time.monotonic() - started) * 1000, 1),
    )
    return resp


async def _add_model_header(request: web.Request, response: web.StreamResponse) -> None:
    response.headers[MODEL_HEADER] = request.app[STATE_KEY].config.model


async def _load(state: FakeModelState) -> None:
    cfg = state.config
    _log(logging.INFO, "loading model", model=cfg.model, startup_delay_s=cfg.startup_delay)
    await asyncio.sleep(cfg.startup_delay)
    if cfg.fail_load:
        state.load_failed = True
        _log(logging.ERROR, "load failed", model=cfg.model)
    else:
        state.loaded = True
        state.loaded_at = time.time()
        _log(logging.INFO, "model loaded", model=cfg.model)
    state.load_done.set()


def build_app(config: FakeModelConfig | None = None) -> web.Application:
    """Build the aiohttp application; loading starts when the app starts (runner.setup())."""
    cfg = config or FakeModelConfig()
    app = web.Application(middlewares=[_middleware])
    state = FakeModelState(config=cfg)
    app[STATE_KEY] = state

    async def loader_ctx(_app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(_load(state), name="fake-model-load")
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    app.cleanup_ctx.append(loader_ctx)
    app.on_response_prepare.append(_add_model_header)
    app.router.add_get("/health", health)
    app.router.add_get("/is_sleeping", is_sleeping)
    app.router.add_get("/stats", stats)
    app.router.add_get("/v1/models", list_models)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/embeddings", embeddings)
    app.router.add_post("/v1/audio/transcriptions", audio_text)
    app.router.add_post("/v1/audio/translations", audio_text)
    app.router.add_post("/v1/audio/speech", speech)
    app.router.add_post("/v1/images/generations", image_generations)
    app.router.add_post("/v1/rerank", rerank)
    app.router.add_post("/v1/responses", responses)
    app.router.add_post("/v1/messages", messages)
    app.router.add_post("/sleep", sleep)
    app.router.add_post("/wake_up", wake_up)
    return app


# --------------------------------------------------------------------------- logging


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, msg, then the record's extra ``fields``."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "msg": record.getMessage(),
        }
        if record.name != logger.name:
            out["logger"] = record.name
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            for key, value in fields.items():
                out[f"{key}_" if key in out else key] = value
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _log(level: int, msg: str, /, **fields: Any) -> None:
    logger.log(level, msg, extra={"fields": fields})


def _setup_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(logging.WARNING)  # library chatter (aiohttp) only when it matters
    logger.setLevel(level.upper())


# --------------------------------------------------------------------------- process entry points


async def run(config: FakeModelConfig) -> int:
    """Serve until SIGTERM/SIGINT (exit code 0) or a simulated load failure (exit code 1)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    app = build_app(config)
    state = app[STATE_KEY]
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S)
    await runner.setup()
    code = 0
    try:
        site = web.TCPSite(runner, config.host, config.port)
        await site.start()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        bound = runner.addresses[0] if runner.addresses else (config.host, config.port)
        _log(logging.INFO, "listening", host=bound[0], port=bound[1], model=config.model, pid=os.getpid())

        stop_wait = asyncio.create_task(stop.wait())
        fail_wait = asyncio.create_task(_wait_failed(state))
        done, pending = await asyncio.wait({stop_wait, fail_wait}, return_when=asyncio.FIRST_COMPLETED)
        for t in pending:
            t.cancel()
        if fail_wait in done:
            code = 1
        else:
            _log(logging.INFO, "shutting down", in_flight=state.in_flight, timeout_s=SHUTDOWN_TIMEOUT_S)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        await runner.cleanup()
    _log(logging.INFO, "stopped", exit_code=code)
    return code


async def _wait_failed(state: FakeModelState) -> None:
    await state.load_done.wait()
    if not state.load_failed:
        await asyncio.Event().wait()  # loaded fine: never "fails"


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port must be in 0..65535, got {port}")
    return port


def _seconds(value: str) -> float:
    try:
        secs = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not math.isfinite(secs) or secs < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative number of seconds, got {value!r}")
    return secs


def _flag(value: str) -> bool:
    low = value.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (1/0, true/false, yes/no, on/off), got {value!r}")


def _log_level(value: str) -> str:
    low = value.strip().lower()
    if low not in ("debug", "info", "warning", "error"):
        raise argparse.ArgumentTypeError(f"expected debug, info, warning or error, got {value!r}")
    return low


# (dest, --option, env var, converter, fallback, help). CLI wins over env, env over the fallback.
_OPTIONS: list[tuple[str, str, str, Callable[[str], Any], Any, str]] = [
    ("host", "--host", "FAKE_MODEL_HOST", str, "127.0.0.1", "address to bind"),
    ("port", "--port", "FAKE_MODEL_PORT", _port, None, "port to bind, 0 for any free port"),
    ("model", "--model", "FAKE_MODEL_NAME", str, "fake", "model id served"),
    (
        "startup_delay",
        "--startup-delay",
        "FAKE_MODEL_STARTUP_DELAY",
        _seconds,
        0.0,
        "seconds before the model reports loaded (simulated weight loading)",
    ),
    (
        "token_delay",
        "--token-delay",
        "FAKE_MODEL_TOKEN_DELAY",
        _seconds,
        0.01,
        "seconds between streamed chunks",
    ),
    (
        "response_delay",
        "--response-delay",
        "FAKE_MODEL_RESPONSE_DELAY",
        _seconds,
        0.0,
        "extra seconds before a non-streamed answer",
    ),
    ("wake_delay", "--wake-delay", "FAKE_MODEL_WAKE_DELAY", _seconds, 0.2, "seconds POST /wake_up takes"),
    ("log_level", "--log-level", "FAKE_MODEL_LOG_LEVEL", _log_level, "info", "debug, info, warning or error"),
]


def parse_args(argv: Sequence[str] | None = None) -> tuple[FakeModelConfig, str]:
    """Parse CLI arguments (falling back to FAKE_MODEL_* env vars); return (config, log level)."""
    parser = argparse.ArgumentParser(
        prog="flexinfer-fake-model",
        description="Fake OpenAI-compatible model server (vLLM-like health, sleep mode) for demos and tests.",
    )
    for dest, opt, env, conv, fallback, help_ in _OPTIONS:
        shown = "required" if fallback is None else f"default {fallback}"
        parser.add_argument(opt, dest=dest, type=conv, default=None, help=f"{help_} (env {env}; {shown})")
    parser.add_argument(
        "--no-sleep-mode",
        dest="no_sleep_mode",
        action="store_true",
        default=None,
        help="answer 404 to POST /sleep, as a server without sleep mode (env FAKE_MODEL_NO_SLEEP_MODE=1)",
    )
    parser.add_argument(
        "--fail-load",
        action="store_true",
        default=None,
        help="never become healthy: log 'load failed' and exit 1 after the startup delay (env FAKE_MODEL_FAIL_LOAD=1)",
    )
    args = parser.parse_args(argv)

    values: dict[str, Any] = {}
    for dest, _opt_name, env, conv, fallback, _help in [
        *_OPTIONS,
        ("fail_load", "--fail-load", "FAKE_MODEL_FAIL_LOAD", _flag, False, ""),
        ("no_sleep_mode", "--no-sleep-mode", "FAKE_MODEL_NO_SLEEP_MODE", _flag, False, ""),
    ]:
        value = getattr(args, dest)
        if value is None:
            raw = os.environ.get(env, "")
            if raw != "":
                try:
                    value = conv(raw)
                except argparse.ArgumentTypeError as exc:
                    parser.error(f"invalid {env}: {exc}")
            else:
                value = fallback
        values[dest] = value
    if values["port"] is None:
        parser.error("--port is required (or set FAKE_MODEL_PORT)")
    log_level = values.pop("log_level")
    values["sleep_mode"] = not values.pop("no_sleep_mode")
    return FakeModelConfig(**values), log_level


def main(argv: Sequence[str] | None = None) -> NoReturn:
    config, log_level = parse_args(argv)
    _setup_logging(log_level)
    try:
        code = asyncio.run(run(config))
    except OSError as exc:  # e.g. port already in use
        _log(logging.ERROR, "cannot serve", error=str(exc), host=config.host, port=config.port)
        code = 2
    # The server has shut down (in-flight requests answered, connections closed): exit now rather than let the
    # interpreter tear down every module (50-60 ms here), which a parked model's GPU would wait for in a swap.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
