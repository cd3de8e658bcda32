"""Writes the example traces of `flexinfer simulate` (deterministic: the same files every run).

python examples/traces/generate.py        # rewrites the .jsonl files beside this script

``KINDS`` names each kind of day, how it is drawn and the random seed of its shipped file;
bench/policy_comparison.py draws fresh days of the same kinds with other seeds (``trace_lines``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).parent

Requests = list[dict[str, object]]  # one trace's requests: {"at", "model", "tokens" or "serviceSeconds"}
Trace = tuple[list[dict[str, object]], Requests]  # its models and its requests

#: the card most traces run on (``capacity``)
ONE_24GI_CARD: dict[str, object] = {"devices": 1, "memoryPerDevice": "24Gi"}


def model_line(
    name: str,
    priority: int,
    load: float,
    tokens_per_second: float | None,
    concurrency: int,
    memory: str,
    idle_timeout: str | None = None,
) -> dict[str, object]:
    """A model line: its priority, load time (s), speed (None: each request says its ``serviceSeconds``), the
    requests it serves at once, the memory it holds when loaded, and its idle timeout."""
    line: dict[str, object] = {"model": name, "priority": priority, "loadSeconds": load}
    if tokens_per_second is not None:
        line["tokensPerSecond"] = tokens_per_second
    line["concurrency"] = concurrency
    if idle_timeout is not None:
        line["idleTimeout"] = idle_timeout
    line["memory"] = memory
    return line


def session(
    requests: Requests, model: str, at: float, turns: int, tokens: Callable[[], int], gap: Callable[[], float]
) -> None:
    """``turns`` requests to ``model``, the first at ``at`` seconds, each asking ``tokens()`` tokens and the next
    ``gap()`` seconds later (drawn in that order: the shipped traces depend on it)."""
    for _ in range(turns):
        requests.append({"at": at, "model": model, "tokens": tokens()})
        at += gap()


def exponential_tokens(rng: random.Random, scale: int) -> Callable[[], int]:
    """Tokens a chat-like request asks: exponential of mean ``scale``, plus 20."""
    return lambda: int(rng.expovariate(1 / scale)) + 20


def sessions(
    rng: random.Random,
    requests: Requests,
    model: str,
    hours: tuple[float, float],
    count: int,
    turns: tuple[int, int],
    tokens: int,
    gap: tuple[float, float],
) -> None:
    """``count`` chat-like sessions of ``model``, each starting in ``hours`` with ``turns`` requests ``gap`` seconds
    apart."""
    for _ in range(count):
        at = rng.uniform(*hours) * 3600
        session(requests, model, at, rng.randint(*turns), exponential_tokens(rng, tokens), lambda: rng.uniform(*gap))


def homelab_day(rng: random.Random) -> Trace:
    """24 hours on one 24 GB GPU: chat through the day and evening, a code assistant in working hours, embedding
    batches a few times a day, an image model now and then. The memory each holds when loaded (weights and KV
    cache), as measured for common models: chat an 8B instruct model at 4 bits (~6 GiB), code a 7B coder at 4 bits
    (~5 GiB), embed a small embedding model (<1 GiB), image a 12B image model (FLUX.1-dev class) at 8 bits with its
    text encoders (~16 GiB): chat, code and embed fit side by side; image fits beside chat or code, not both."""
    models = [
        model_line("chat", 100, 28, 45, 4, "6Gi", idle_timeout="3m"),
        model_line("code", 100, 35, 35, 2, "5Gi", idle_timeout="3m"),
        model_line("embed", 50, 8, 2000, 8, "768Mi"),
        model_line("image", 10, 60, None, 1, "16Gi"),
    ]
    requests: Requests = []
    sessions(rng, requests, "chat", (7, 23), 40, (3, 12), 300, gap=(15, 90))
    sessions(rng, requests, "code", (9, 18), 30, (4, 20), 250, gap=(15, 90))
    for _ in range(4):  # embedding batches
        t = rng.uniform(8, 22) * 3600
        for i in range(60):
            requests.append({"at": t + i * 0.5, "model": "embed", "tokens": 400})
    for _ in range(6):
        requests.append({"at": rng.uniform(10, 22) * 3600, "model": "image", "serviceSeconds": 8})
    return models, requests


def bursty_two_models(rng: random.Random) -> Trace:
    """Two hours, two equal-priority models, each used in bursts that often overlap."""
    models = [
        model_line("a", 10, 28, 40, 4, "6Gi"),
        model_line("b", 10, 28, 40, 4, "6Gi"),
    ]
    requests: Requests = []
    for model in ("a", "b"):
        for _ in range(25):
            at = rng.uniform(0, 7200)
            session(
                requests, model, at, rng.randint(5, 25), lambda: rng.randint(50, 400), lambda: rng.expovariate(1 / 3)
            )
    return models, requests


def adversarial_alternation(_: random.Random) -> Trace:
    """One hour of steady traffic on two equal-priority models at once: neither is ever idle. A policy that
    never preempts a busy model starves one of them; one that preempts at every request thrashes."""
    models = [
        model_line("a", 10, 28, 40, 2, "14Gi"),
        model_line("b", 10, 28, 40, 2, "14Gi"),
    ]
    requests: Requests = []
    for i in range(360):
        requests.append({"at": i * 10.0, "model": "a", "tokens": 120})
        requests.append({"at": i * 10.0 + 5, "model": "b", "tokens": 120})
    return models, requests


def team_working_day(rng: random.Random) -> Trace:
    """Eight working hours of a team: two equal-priority assistants (a code assistant and a chat assistant) used in
    interleaved sessions all day, and a lower-priority summarizer that digests documents in the afternoon."""
    models = [
        model_line("code", 50, 32, 40, 4, "9Gi"),
        model_line("chat", 50, 26, 45, 4, "7Gi"),
        model_line("summarize", 10, 20, 60, 2, "10Gi"),
    ]
    requests: Requests = []
    sessions(rng, requests, "code", (0, 8), 30, (8, 25), 260, gap=(10, 60))
    sessions(rng, requests, "chat", (0, 8), 30, (8, 25), 220, gap=(10, 60))
    for _ in range(10):  # documents of 10-25 pages, a request a page
        at = rng.uniform(4, 7.5) * 3600
        session(
            requests, "summarize", at, rng.randint(10, 25), lambda: rng.randint(200, 500), lambda: rng.uniform(0.5, 4)
        )
    return models, requests


def chat_beside_batch(rng: random.Random) -> Trace:
    """Six hours: a high-priority chat used steadily all day, a low-priority batch job of 150 requests every 40
    minutes, and a middle-priority model asked a few times."""
    models = [
        model_line("chat", 100, 28, 45, 4, "10Gi"),
        model_line("batch", 10, 22, 80, 8, "9Gi"),
        model_line("vision", 50, 40, 30, 1, "12Gi"),
    ]
    requests: Requests = []
    chat_tokens = exponential_tokens(rng, 250)
    t = 0.0
    while t < 6 * 3600:
        requests.append({"at": t, "model": "chat", "tokens": chat_tokens()})
        t += rng.expovariate(1 / 55)
    for k in range(9):
        start = 600 + k * 2400 + rng.uniform(0, 60)
        for i in range(150):
            requests.append({"at": start + i * 0.2, "model": "batch", "tokens": rng.randint(100, 400)})
    for _ in range(rng.randint(3, 8)):
        at = rng.uniform(0, 6) * 3600
        session(requests, "vision", at, rng.randint(1, 4), lambda: rng.randint(80, 300), lambda: rng.uniform(10, 60))
    return models, requests


def many_models(rng: random.Random) -> Trace:
    """Four hours, eight equal-priority models of Zipf-like popularity, each used in short sessions."""
    names = [f"m{i}" for i in range(1, 9)]
    models = [
        model_line(n, 10, rng.choice([12, 20, 28, 35, 45]), 40, 2, f"{size}Gi")
        for n, size in zip(names, (8, 6, 10, 5, 12, 7, 9, 4), strict=True)
    ]
    weights = [1 / (i + 1) for i in range(len(names))]
    requests: Requests = []
    for _ in range(80):
        model = rng.choices(names, weights)[0]
        at = rng.uniform(0, 4) * 3600
        session(requests, model, at, rng.randint(2, 8), exponential_tokens(rng, 200), lambda: rng.uniform(5, 60))
    return models, requests


@dataclass(frozen=True)
class Kind:
    """One kind of day: how it is drawn, the first line of its file, the card it runs on, and the random seed of
    the shipped file (None: the kind draws nothing at random)."""

    draw: Callable[[random.Random], Trace]
    about: str
    capacity: dict[str, object]
    seed: int | None


KINDS: dict[str, Kind] = {
    "homelab-day": Kind(
        homelab_day, "A homelab day: chat, code, embeddings and images share one 24 GB GPU", ONE_24GI_CARD, 11
    ),
    "bursty-two-models": Kind(
        bursty_two_models,
        "Two equal-priority models in overlapping bursts (two 7B models at 4 bits on a 16 GB card)",
        {"devices": 1, "memoryPerDevice": "16Gi"},
        7,
    ),
    "adversarial-alternation": Kind(
        adversarial_alternation,
        "Steady, interleaved traffic on two busy models (14 GiB each on a 24 GiB card: they never fit together)",
        ONE_24GI_CARD,
        None,
    ),
    "team-working-day": Kind(
        team_working_day,
        "A team's working day: two equal-priority assistants, a summarizer after lunch (24 GiB: any two fit)",
        ONE_24GI_CARD,
        23,
    ),
    "chat-beside-batch": Kind(
        chat_beside_batch,
        "Steady high-priority chat, a low-priority batch every 40 min, a rare vision model (24 GiB: chat and one more)",
        ONE_24GI_CARD,
        29,
    ),
    "many-models": Kind(
        many_models,
        "Eight equal-priority models of Zipf-like popularity, short sessions (4-12 GiB each on a 24 GiB card)",
        ONE_24GI_CARD,
        31,
    ),
}


def trace_lines(name: str, seed: int | None = None) -> list[str]:
    """The lines of a trace of kind ``name``, drawn with ``seed`` (default: the shipped file's)."""
    kind = KINDS[name]
    models, requests = kind.draw(random.Random(kind.seed if seed is None else seed))
    requests.sort(key=lambda r: float(r["at"]))  # type: ignore[arg-type]
    lines = [f"# {kind.about}", json.dumps({"capacity": kind.capacity})]
    lines += [json.dumps(m) for m in models]
    lines += [json.dumps({**r, "at": round(float(r["at"]), 3)}) for r in requests]  # type: ignore[arg-type]
    return lines


if __name__ == "__main__":
    for kind in KINDS:
        (HERE / f"{kind}.jsonl").write_text("\n".join(trace_lines(kind)) + "\n")
