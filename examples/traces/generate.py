"""Writes the example traces of `flexinfer simulate` (deterministic: the same files every run).

python examples/traces/generate.py        # rewrites the .jsonl files beside this script
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).parent

Requests = list[dict[str, object]]  # one trace's requests: {"at", "model", "tokens" or "serviceSeconds"}

#: where ``write`` puts a trace: this folder, or (for bench/policy_comparison.py's variants) a list of lines
OUT: dict[str, list[str]] | None = None

#: the card most traces run on (``capacity``)
ONE_24GI_CARD: dict[str, object] = {"devices": 1, "memoryPerDevice": "24Gi"}


def write(
    name: str,
    models: list[dict[str, object]],
    requests: Requests,
    about: str,
    capacity: dict[str, object] | None = None,
) -> None:
    requests.sort(key=lambda r: float(r["at"]))  # type: ignore[arg-type]
    lines = [f"# {about}"] + ([json.dumps({"capacity": capacity})] if capacity is not None else [])
    lines += [json.dumps(m) for m in models]
    lines += [json.dumps({**r, "at": round(float(r["at"]), 3)}) for r in requests]  # type: ignore[arg-type]
    if OUT is not None:
        OUT[name] = lines
    else:
        (HERE / name).write_text("\n".join(lines) + "\n")


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


def homelab_day(rng: random.Random) -> None:
    """24 hours on one 24 GB GPU: chat through the day and evening, a code assistant in working hours, embedding
    batches a few times a day, an image model now and then. The memory each holds when loaded (weights and KV
    cache), as measured for common models: chat an 8B instruct model at 4 bits (~6 GiB), code a 7B coder at 4 bits
    (~5 GiB), embed a small embedding model (<1 GiB), image a 12B image model (FLUX.1-dev class) at 8 bits with its
    text encoders (~16 GiB): chat, code and embed fit side by side; image fits beside chat or code, not both."""
    models = [
        {
            "model": "chat",
            "priority": 100,
            "loadSeconds": 28,
            "tokensPerSecond": 45,
            "concurrency": 4,
            "idleTimeout": "3m",
            "memory": "6Gi",
        },
        {
            "model": "code",
            "priority": 100,
            "loadSeconds": 35,
            "tokensPerSecond": 35,
            "concurrency": 2,
            "idleTimeout": "3m",
            "memory": "5Gi",
        },
        {
            "model": "embed",
            "priority": 50,
            "loadSeconds": 8,
            "tokensPerSecond": 2000,
            "concurrency": 8,
            "memory": "768Mi",
        },
        {"model": "image", "priority": 10, "loadSeconds": 60, "concurrency": 1, "memory": "16Gi"},
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
    write(
        "homelab-day.jsonl",
        models,
        requests,
        "A homelab day: chat, code, embeddings and images share one 24 GB GPU",
        capacity=ONE_24GI_CARD,
    )


def bursty_two_models(rng: random.Random) -> None:
    """Two hours, two equal-priority models, each used in bursts that often overlap."""
    models = [
        {"model": "a", "priority": 10, "loadSeconds": 28, "tokensPerSecond": 40, "concurrency": 4, "memory": "6Gi"},
        {"model": "b", "priority": 10, "loadSeconds": 28, "tokensPerSecond": 40, "concurrency": 4, "memory": "6Gi"},
    ]
    requests: Requests = []
    for model in ("a", "b"):
        for _ in range(25):
            at = rng.uniform(0, 7200)
            session(
                requests, model, at, rng.randint(5, 25), lambda: rng.randint(50, 400), lambda: rng.expovariate(1 / 3)
            )
    write(
        "bursty-two-models.jsonl",
        models,
        requests,
        "Two equal-priority models in overlapping bursts (two 7B models at 4 bits on a 16 GB card)",
        capacity={"devices": 1, "memoryPerDevice": "16Gi"},
    )


def adversarial_alternation() -> None:
    """One hour of steady traffic on two equal-priority models at once: neither is ever idle. A policy that
    never preempts a busy model starves one of them; one that preempts at every request thrashes."""
    models = [
        {"model": "a", "priority": 10, "loadSeconds": 28, "tokensPerSecond": 40, "concurrency": 2, "memory": "14Gi"},
        {"model": "b", "priority": 10, "loadSeconds": 28, "tokensPerSecond": 40, "concurrency": 2, "memory": "14Gi"},
    ]
    requests: Requests = []
    for i in range(360):
        requests.append({"at": i * 10.0, "model": "a", "tokens": 120})
        requests.append({"at": i * 10.0 + 5, "model": "b", "tokens": 120})
    write(
        "adversarial-alternation.jsonl",
        models,
        requests,
        "Steady, interleaved traffic on two busy models (14 GiB each on a 24 GiB card: they never fit together)",
        capacity=ONE_24GI_CARD,
    )


def team_working_day(rng: random.Random) -> None:
    """Eight working hours of a team: two equal-priority assistants (a code assistant and a chat assistant) used in
    interleaved sessions all day, and a lower-priority summarizer that digests documents in the afternoon."""
    models = [
        {"model": "code", "priority": 50, "loadSeconds": 32, "tokensPerSecond": 40, "concurrency": 4, "memory": "9Gi"},
        {"model": "chat", "priority": 50, "loadSeconds": 26, "tokensPerSecond": 45, "concurrency": 4, "memory": "7Gi"},
        {
            "model": "summarize",
            "priority": 10,
            "loadSeconds": 20,
            "tokensPerSecond": 60,
            "concurrency": 2,
            "memory": "10Gi",
        },
    ]
    requests: Requests = []
    sessions(rng, requests, "code", (0, 8), 30, (8, 25), 260, gap=(10, 60))
    sessions(rng, requests, "chat", (0, 8), 30, (8, 25), 220, gap=(10, 60))
    for _ in range(10):  # documents of 10-25 pages, a request a page
        at = rng.uniform(4, 7.5) * 3600
        session(
            requests, "summarize", at, rng.randint(10, 25), lambda: rng.randint(200, 500), lambda: rng.uniform(0.5, 4)
        )
    write(
        "team-working-day.jsonl",
        models,
        requests,
        "A team's working day: two equal-priority assistants, a summarizer after lunch (24 GiB: any two fit)",
        capacity=ONE_24GI_CARD,
    )


def chat_beside_batch(rng: random.Random) -> None:
    """Six hours: a high-priority chat used steadily all day, a low-priority batch job of 150 requests every 40
    minutes, and a middle-priority model asked a few times."""
    models = [
        {
            "model": "chat",
            "priority": 100,
            "loadSeconds": 28,
            "tokensPerSecond": 45,
            "concurrency": 4,
            "memory": "10Gi",
        },
        {"model": "batch", "priority": 10, "loadSeconds": 22, "tokensPerSecond": 80, "concurrency": 8, "memory": "9Gi"},
        {
            "model": "vision",
            "priority": 50,
            "loadSeconds": 40,
            "tokensPerSecond": 30,
            "concurrency": 1,
            "memory": "12Gi",
        },
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
    write(
        "chat-beside-batch.jsonl",
        models,
        requests,
        "Steady high-priority chat, a low-priority batch every 40 min, a rare vision model (24 GiB: chat and one more)",
        capacity=ONE_24GI_CARD,
    )


def many_models(rng: random.Random) -> None:
    """Four hours, eight equal-priority models of Zipf-like popularity, each used in short sessions."""
    names = [f"m{i}" for i in range(1, 9)]
    models = [
        {
            "model": n,
            "priority": 10,
            "loadSeconds": rng.choice([12, 20, 28, 35, 45]),
            "tokensPerSecond": 40,
            "concurrency": 2,
            "memory": f"{size}Gi",
        }
        for n, size in zip(names, (8, 6, 10, 5, 12, 7, 9, 4), strict=True)
    ]
    weights = [1 / (i + 1) for i in range(len(names))]
    requests: Requests = []
    for _ in range(80):
        model = rng.choices(names, weights)[0]
        at = rng.uniform(0, 4) * 3600
        session(requests, model, at, rng.randint(2, 8), exponential_tokens(rng, 200), lambda: rng.uniform(5, 60))
    write(
        "many-models.jsonl",
        models,
        requests,
        "Eight equal-priority models of Zipf-like popularity, short sessions (4-12 GiB each on a 24 GiB card)",
        capacity=ONE_24GI_CARD,
    )


if __name__ == "__main__":
    homelab_day(random.Random(11))
    bursty_two_models(random.Random(7))
    adversarial_alternation()
    team_working_day(random.Random(23))
    chat_beside_batch(random.Random(29))
    many_models(random.Random(31))
