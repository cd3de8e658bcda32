"""Writes the example traces of `flexinfer simulate` (deterministic: the same files every run).

python examples/traces/generate.py        # rewrites the three .jsonl files beside this script
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).parent


def write(name: str, models: list[dict[str, object]], requests: list[dict[str, object]], about: str) -> None:
    requests.sort(key=lambda r: float(r["at"]))  # type: ignore[arg-type]
    lines = [f"# {about}"] + [json.dumps(m) for m in models]
    lines += [json.dumps({**r, "at": round(float(r["at"]), 3)}) for r in requests]  # type: ignore[arg-type]
    (HERE / name).write_text("\n".join(lines) + "\n")


def homelab_day(rng: random.Random) -> None:
    """24 hours on one GPU: chat through the day and evening, a code assistant in working hours, embedding
    batches a few times a day, an image model now and then."""
    models = [
        {
            "model": "chat",
            "priority": 100,
            "loadSeconds": 28,
            "tokensPerSecond": 45,
            "concurrency": 4,
            "idleTimeout": "3m",
        },
        {
            "model": "code",
            "priority": 100,
            "loadSeconds": 35,
            "tokensPerSecond": 35,
            "concurrency": 2,
            "idleTimeout": "3m",
        },
        {"model": "embed", "priority": 50, "loadSeconds": 8, "tokensPerSecond": 2000, "concurrency": 8},
        {"model": "image", "priority": 10, "loadSeconds": 60, "concurrency": 1},
    ]
    requests: list[dict[str, object]] = []

    def sessions(model: str, start_h: float, end_h: float, count: int, turns: tuple[int, int], tokens: int) -> None:
        for _ in range(count):
            t = rng.uniform(start_h, end_h) * 3600
            for _ in range(rng.randint(*turns)):
                requests.append({"at": t, "model": model, "tokens": int(rng.expovariate(1 / tokens)) + 20})
                t += rng.uniform(15, 90)

    sessions("chat", 7, 23, 40, (3, 12), 300)
    sessions("code", 9, 18, 30, (4, 20), 250)
    for _ in range(4):  # embedding batches
        t = rng.uniform(8, 22) * 3600
        for i in range(60):
            requests.append({"at": t + i * 0.5, "model": "embed", "tokens": 400})
    for _ in range(6):
        requests.append({"at": rng.uniform(10, 22) * 3600, "model": "image", "serviceSeconds": 8})
    write("homelab-day.jsonl", models, requests, "A homelab day: chat, code, embeddings and images share one GPU")


def bursty_two_models(rng: random.Random) -> None:
    """Two hours, two equal-priority models, each used in bursts that often overlap."""
    models = [
        {"model": "a", "priority": 10, "loadSeconds": 28, "tokensPerSecond": 40, "concurrency": 4},
        {"model": "b", "priority": 10, "loadSeconds": 28, "tokensPerSecond": 40, "concurrency": 4},
    ]
    requests: list[dict[str, object]] = []
    for model in ("a", "b"):
        for _ in range(25):
            t = rng.uniform(0, 7200)
            for _ in range(rng.randint(5, 25)):
                requests.append({"at": t, "model": model, "tokens": rng.randint(50, 400)})
                t += rng.expovariate(1 / 3)
    write("bursty-two-models.jsonl", models, requests, "Two equal-priority models in overlapping bursts")


def adversarial_alternation() -> None:
    """One hour of steady traffic on two equal-priority models at once: neither is ever idle. A policy that
    never preempts a busy model starves one of them; one that preempts at every request thrashes."""
    models = [
        {"model": "a", "priority": 10, "loadSeconds": 28, "tokensPerSecond": 40, "concurrency": 2},
        {"model": "b", "priority": 10, "loadSeconds": 28, "tokensPerSecond": 40, "concurrency": 2},
    ]
    requests: list[dict[str, object]] = []
    for i in range(360):
        requests.append({"at": i * 10.0, "model": "a", "tokens": 120})
        requests.append({"at": i * 10.0 + 5, "model": "b", "tokens": 120})
    write("adversarial-alternation.jsonl", models, requests, "Steady, interleaved traffic on two busy models")


if __name__ == "__main__":
    homelab_day(random.Random(11))
    bursty_two_models(random.Random(7))
    adversarial_alternation()
