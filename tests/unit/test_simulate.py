"""``flexinfer simulate``: traces in, the real planner on a virtual clock, per-policy figures and a timeline out."""

from __future__ import annotations

import json
import math
import runpy
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flexinfer_cli.main import app
from flexinfer_cli.simulation import (
    POLICIES,
    Outcome,
    Settings,
    Simulation,
    Trace,
    TraceError,
    as_json,
    load_trace,
    offline_lower_bound,
    read_trace,
    render_svg,
    render_table,
    simulate,
)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traces"


def trace(*lines: object) -> list[str]:
    return [json.dumps(line) if not isinstance(line, str) else line for line in lines]


def busy_a_and_one_request_for_b() -> list[str]:
    """a gets a request every 5 s for 10 minutes; one request for b (same priority) at 60 s."""
    lines: list[object] = [
        {"model": "a", "priority": 10, "loadSeconds": 20, "concurrency": 2},
        {"model": "b", "priority": 10, "loadSeconds": 20, "maxWait": "90s"},
        {"at": 60, "model": "b", "serviceSeconds": 1},
    ]
    lines += [{"at": 5 * i, "model": "a", "serviceSeconds": 2} for i in range(120)]
    return trace(*lines)


def test_flexinfer_serves_a_model_waiting_behind_a_busy_one_within_its_bound() -> None:
    outcome = Simulation(read_trace(busy_a_and_one_request_for_b()), POLICIES["flexinfer"], Settings()).run()
    (waited,) = outcome.waits["b"]
    assert 90 <= waited <= 90 + 3 + 2 + 4 + 20  # maxWait, a reconcile period, the drain, the park, the load
    assert outcome.killed == 0  # a drained: its requests in flight finished
    assert outcome.over_bound is not None and outcome.over_bound <= 3  # elected within a reconcile of the bound


def test_a_short_queue_timeout_shortens_the_bounded_wait_so_the_waiting_request_is_served() -> None:
    """b sets no maxWait: its bound is what the queue timeout leaves after a's drain (60 s) and a load (40 s), at
    least half of it, so with a 90 s timeout b is loaded after 45 s of waiting instead of timing out behind the busy
    a."""
    lines = [line for line in busy_a_and_one_request_for_b() if '"maxWait"' not in line]
    lines.insert(1, json.dumps({"model": "b", "priority": 10, "loadSeconds": 5}))
    outcome = simulate(read_trace(lines), ["flexinfer"], Settings(queue_timeout=90)).outcomes["flexinfer"]
    (waited,) = outcome.waits["b"]
    assert outcome.timed_out == 0 and 45 <= waited < 90


def test_the_bounded_wait_leaves_room_for_a_holder_that_drains_a_backlog() -> None:
    """a serves one request at a time and is asked faster than it answers: its backlog grows, so when b (same
    priority, no maxWait) takes the GPU a drains for the whole 60 s. b's bound (5 min - 60 s - 40 s = 200 s) leaves
    room for that drain and b's load: its request is answered before the queue timeout. With a bound of four fifths
    of the timeout (240 s) the drain and the load ended past it and b's request timed out."""
    lines: list[object] = [
        {"model": "a", "priority": 10, "loadSeconds": 28, "concurrency": 1},
        {"model": "b", "priority": 10, "loadSeconds": 28},
        {"at": 30, "model": "b", "serviceSeconds": 1},
    ]
    lines += [{"at": 5 * i, "model": "a", "serviceSeconds": 8} for i in range(120)]
    outcome = simulate(read_trace(trace(*lines)), ["flexinfer"]).outcomes["flexinfer"]
    (waited,) = outcome.waits["b"]
    assert outcome.killed > 0  # a drained for the whole drain timeout: its backlog was still in flight
    assert 200 <= waited < 300 and outcome.timed_out == 0


def a_request_just_after_a_swap() -> list[str]:
    """a, then b (a swap to b and its 3-minute cooldown), then a again at 140 s."""
    gpu = {"priority": 10, "loadSeconds": 20, "parkSeconds": 4, "swapCooldown": "3m"}
    return trace(
        {"model": "a", **gpu},
        {"model": "b", **gpu},
        {"at": 0, "model": "a", "serviceSeconds": 1},
        {"at": 10, "model": "b", "serviceSeconds": 1},
        {"at": 140, "model": "a", "serviceSeconds": 1},
    )


def test_the_seed_policy_drops_a_request_whose_one_demand_signal_expired() -> None:
    """The seed's trouble "Demand Signal Not Being Detected": a's request arrives just after a swap to b; its one
    signal expires after 2 minutes, before the 3-minute cooldown ends, so the seed never loads a and the request
    times out. FlexInfer renews the demand while the request waits and serves it once the cooldown is over."""
    lines = a_request_just_after_a_swap()
    outcomes = simulate(read_trace(lines), ["seed", "flexinfer"], Settings(queue_timeout=300)).outcomes
    assert outcomes["seed"].timed_out == 1 and max(outcomes["seed"].waits["a"]) == 300
    assert outcomes["flexinfer"].timed_out == 0 and max(outcomes["flexinfer"].waits["a"]) < 300


def test_the_table_shows_how_long_a_model_waited_past_its_bound() -> None:
    """The same trace: a's bound is the later of its request + 2 min (260 s) and the end of the cooldown the swap to
    b started (about 300 s); the seed never elects a (its request times out at 440 s), FlexInfer elects it within a
    reconcile period of the bound."""
    lines = a_request_just_after_a_swap()
    comparison = simulate(read_trace(lines), ["seed", "flexinfer", "v1alpha1"], Settings(queue_timeout=300))
    seed, flexinfer = comparison.outcomes["seed"], comparison.outcomes["flexinfer"]
    assert seed.over_bound is not None and seed.over_bound >= 120
    assert flexinfer.over_bound is not None and flexinfer.over_bound <= 3
    assert comparison.outcomes["v1alpha1"].over_bound is None  # a GPUGroup has no bound
    header, _, _, v1alpha1_row = render_table(comparison).splitlines()[:4]
    assert header.split()[-2:] == ["OVER", "BOUND"] and v1alpha1_row.split()[-1] == "-"
    assert as_json(comparison)["policies"]["flexinfer"]["overBoundSeconds"] <= 3


def test_a_lower_priority_batch_gets_a_quiet_gpu_and_the_higher_priority_model_gets_it_back() -> None:
    """chat (100, idle timeout 10 min) answers a session until 60 s; an embedding batch (50) arrives at 40 s. The
    seed's embed waits for chat's idle timeout; FlexInfer's gets the GPU once chat has been quiet for its quiet
    period (10 s; ``--quiet-yield`` sets it), and a chat request during the batch waits only until embed is quiet
    in turn (a guest yields to a higher priority at once; no cooldown: chat was not preempted)."""
    lines = trace(
        {"model": "chat", "priority": 100, "loadSeconds": 20, "parkSeconds": 4, "idleTimeout": "10m"},
        {"model": "embed", "priority": 50, "loadSeconds": 8, "parkSeconds": 4, "concurrency": 8},
        *[{"at": 10 * i, "model": "chat", "serviceSeconds": 2} for i in range(7)],
        *[{"at": 40 + i, "model": "embed", "serviceSeconds": 0.2} for i in range(10)],
        {"at": 120, "model": "chat", "serviceSeconds": 2},
    )
    outcomes = simulate(read_trace(lines), ["seed", "flexinfer"], Settings(queue_timeout=900)).outcomes
    flexinfer, seed = outcomes["flexinfer"], outcomes["seed"]
    # after chat's idle timeout (10 min from its load at 20 s: the seed's proxy reports no served request)
    assert min(seed.waits["embed"]) >= 20 + 10 * 60 - 40
    # chat's last request at 60 s answered by 62 s; quiet 10 s later (a reconcile), then a park (4 s), a load (8 s)
    assert max(flexinfer.waits["embed"]) <= 62 + 10 + 3 + 4 + 8 - 40
    assert max(flexinfer.waits["chat"]) <= 10 + 3 + 4 + 20  # embed quiet, a reconcile, the park, chat's load
    assert flexinfer.timed_out == 0 and flexinfer.killed == 0
    slower = simulate(read_trace(lines), ["flexinfer"], Settings(queue_timeout=900, quiet_yield=30)).outcomes
    assert max(slower["flexinfer"].waits["embed"]) > max(flexinfer.waits["embed"]) + 15  # a 30 s quiet period


def test_a_drain_lets_requests_in_flight_finish_and_no_drain_kills_them() -> None:
    lines = trace(
        {"model": "a", "priority": 10, "loadSeconds": 5, "parkSeconds": 1, "concurrency": 20},
        {"model": "b", "priority": 10, "loadSeconds": 5, "maxWait": "10s"},
        {"at": 0, "model": "a", "serviceSeconds": 1},
        *[{"at": 10 + 3 * i, "model": "a", "serviceSeconds": 30} for i in range(60)],
        {"at": 12, "model": "b", "serviceSeconds": 1},
    )
    outcomes = simulate(read_trace(lines), ["seed", "flexinfer"]).outcomes
    assert outcomes["flexinfer"].killed == 0
    assert outcomes["seed"].killed > 0


def test_a_saturated_model_yields_at_the_bound_and_its_drain_is_bounded() -> None:
    """As through the real proxy, every request for the loaded model is forwarded; what it cannot start yet waits in
    its own queue, so the proxy's queue for it stays empty and the bounded wait holds even for a holder that never
    catches up. Its drain then lasts at most the drain timeout (60 s); what is left is killed by the park."""
    lines = trace(
        {"model": "a", "priority": 10, "loadSeconds": 5, "parkSeconds": 1},
        {"model": "b", "priority": 10, "loadSeconds": 5, "maxWait": "10s"},
        *[{"at": 3 * i, "model": "a", "serviceSeconds": 30} for i in range(20)],
        {"at": 12, "model": "b", "serviceSeconds": 1},
    )
    outcome = simulate(read_trace(lines), ["flexinfer"]).outcomes["flexinfer"]
    (waited,) = outcome.waits["b"]
    assert waited <= 10 + 3 + 60 + 1 + 5  # maxWait, a reconcile, the drain timeout, the park, the load
    assert outcome.over_bound is not None and outcome.over_bound <= 3
    # a served one request at a time: 30 s each from its load at 5 s, and the drain ended 60 s after the swap
    assert 0 < outcome.killed < 20
    assert len(outcome.waits["a"]) == 20  # every request counted: served, or waited until its model was parked
    # the picture shows the backlog in a's own queue while a serves (its queue at the proxy is empty then)
    assert max(depth for at, depth in outcome.depths["a"] if 10 <= at < 22) >= 3


def test_offline_lower_bound() -> None:
    alternating = read_trace(trace(*[{"at": 700 * i, "model": "ab"[i % 2], "serviceSeconds": 1} for i in range(6)]))
    assert offline_lower_bound(alternating, queue_timeout=300) == 6  # waits never overlap: a, b, a, b, a, b
    together = read_trace(trace({"at": 0, "model": "a"}, {"at": 1, "model": "b"}, {"at": 2, "model": "a"}))
    assert offline_lower_bound(together, queue_timeout=300) == 2


@pytest.mark.parametrize(
    ("load", "park", "loads"),
    [
        pytest.param(28, 4, 3, id="a-load-and-a-park-do-not-fit-in-the-overlap"),
        pytest.param(0, 0, 2, id="instant-swaps-could-answer-b-first"),
        pytest.param(10, 4, 2, id="they-fit-in-the-overlap"),
    ],
)
def test_the_offline_bound_counts_the_park_and_load_a_change_takes(load: float, park: float, loads: int) -> None:
    """a's first request waits until 300 s, b's from 280 s: answering b first leaves a to be loaded after b's park,
    which ends after 300 s when a load and a park take longer than the 20 s the waits share. Then a, b, a is
    forced (b at 280 s and a at 560 s are further apart than the timeout less a's load and b's park): three loads,
    where waits alone (instant swaps) force two."""
    model = {"loadSeconds": load, "parkSeconds": park}
    requests = [{"at": at, "model": m, "serviceSeconds": 1} for at, m in ((0, "a"), (280, "b"), (560, "a"))]
    parsed = read_trace(trace({"model": "a", **model}, {"model": "b", **model}, *requests))
    assert offline_lower_bound(parsed, queue_timeout=300) == loads


def test_the_offline_bound_adds_up_each_models_own_reloads() -> None:
    """a and c are asked at the start and again half an hour later, b in between: a and c must each be loaded twice
    and b once (five loads), where the most changes along one chain of requests answered in order is two (a or c,
    then b, then a or c: three loads)."""
    requests = [(0, "a"), (1, "c"), (1000, "b"), (2000, "a"), (2001, "c")]
    parsed = read_trace(trace(*[{"at": at, "model": m, "serviceSeconds": 1} for at, m in requests]))
    assert offline_lower_bound(parsed, queue_timeout=300) == 5
    assert offline_lower_bound(Trace({}, [], None), queue_timeout=300) == 0  # nothing asked, nothing loaded


@pytest.mark.parametrize("name", ["bursty-two-models", "chat-beside-batch", "team-working-day", "many-models"])
def test_no_policy_that_answers_every_request_loads_less_than_the_offline_bound(name: str) -> None:
    parsed = load_trace(EXAMPLES / f"{name}.jsonl")
    comparison = simulate(parsed, ["flexinfer", "offline"], Settings(one_at_a_time=True))
    ours = comparison.outcomes["flexinfer"]
    assert ours.timed_out == 0 and comparison.offline is not None
    assert len(parsed.models) < comparison.offline <= ours.loads


@pytest.mark.parametrize(
    ("line", "message"),
    [
        pytest.param("{not json", "line 1: not JSON", id="not-json"),
        pytest.param('{"at": 1}', "line 1: expected an object with a 'model' name", id="no-model"),
        pytest.param('{"model": "a", "loadSecs": 3}', "unknown model field 'loadSecs'", id="unknown-field"),
        pytest.param('{"model": "a", "maxWait": "soon"}', "line 1: maxWait:", id="bad-duration"),
        pytest.param('{"at": -1, "model": "a"}', "must be finite and >= 0", id="negative-time"),
    ],
)
def test_a_bad_trace_line_is_named(line: str, message: str) -> None:
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_trace([line, '{"at": 0, "model": "a"}'])


def test_the_timeline_is_an_svg_with_the_gpu_holders() -> None:
    comparison = simulate(read_trace(busy_a_and_one_request_for_b()), ["seed", "flexinfer"])
    root = ET.fromstring(render_svg(comparison))
    assert root.tag.endswith("svg")
    rects = [e for e in root.iter() if e.tag.endswith("rect")]
    segments = sum(len(o.segments) for o in comparison.outcomes.values())
    assert len(rects) >= segments > 0


def test_cli_prints_the_table_writes_the_picture_and_refuses_a_bad_trace(tmp_path: Path) -> None:
    runner = CliRunner()
    svg = tmp_path / "timeline.svg"
    result = runner.invoke(app, ["simulate", str(EXAMPLES / "adversarial-alternation.jsonl"), "--svg", str(svg)])
    assert result.exit_code == 0, result.output
    for word in ("seed", "flexinfer", "v1alpha1", "offline (lower bound)", "queue wait p50 / p95 / p99"):
        assert word in result.output
    assert svg.read_text().startswith("<svg")
    as_json = runner.invoke(app, ["simulate", str(EXAMPLES / "adversarial-alternation.jsonl"), "-o", "json"])
    assert set(json.loads(as_json.output)["policies"]) == {"seed", "flexinfer", "v1alpha1", "offline"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"at": "soon", "model": "a"}\n')
    refused = runner.invoke(app, ["simulate", str(bad)])
    assert refused.exit_code == 2 and "bad.jsonl line 1" in refused.output
    unknown = runner.invoke(app, ["simulate", str(bad), "--policy", "magic"])
    assert unknown.exit_code == 2 and "unknown policy magic" in unknown.output


def test_cli_quiet_yield_is_the_schedulers_setting_for_the_flexinfer_policy(tmp_path: Path) -> None:
    """``--quiet-yield`` plays FLEXINFER_QUIET_YIELD (the flexinfer policy's quiet period, 10 s by default): on the
    homelab day the embedding batches (priority 50) get the GPU in the chat and code models' quiet moments, later
    when those must be 30 s long (one model at a time: with the trace's 24 GB card embed loads beside them)."""
    runner = CliRunner()
    homelab = str(EXAMPLES / "homelab-day.jsonl")
    command = ["simulate", homelab, "-p", "flexinfer", "-o", "json", "--one-at-a-time"]
    runs = {flag: json.loads(runner.invoke(app, [*command, *flag]).output) for flag in ((), ("--quiet-yield", "30s"))}
    default, slower = (runs[f]["policies"]["flexinfer"] for f in ((), ("--quiet-yield", "30s")))
    assert slower["waitSeconds"]["embed"]["p95"] > default["waitSeconds"]["embed"]["p95"]
    refused = runner.invoke(app, ["simulate", homelab, "--quiet-yield", "soon"])
    assert refused.exit_code == 2 and "soon" in refused.output


def test_json_and_table_give_the_waits_over_all_requests() -> None:
    comparison = simulate(load_trace(EXAMPLES / "bursty-two-models.jsonl"), ["flexinfer"])
    outcome = comparison.outcomes["flexinfer"]
    every = sorted(w for waits in outcome.waits.values() for w in waits)
    overall = as_json(comparison)["policies"]["flexinfer"]["allRequestsWaitSeconds"]
    assert len(every) == len(comparison.trace.requests)
    assert overall["p95"] == every[math.ceil(0.95 * len(every)) - 1]
    assert overall["p50"] <= overall["p95"] <= overall["p99"] <= max(every)
    assert "(all requests)  799" in render_table(comparison)


# ---- memory: several models loaded side by side on a card with a capacity ---------------------------------------

GIB = 1024**3


def test_model_lines_take_memory_devices_and_pinned_and_a_capacity_line_sets_the_card() -> None:
    parsed = read_trace(
        trace(
            {"capacity": {"devices": 2, "memoryPerDevice": "24Gi"}},
            {"model": "chat", "memory": "6Gi", "devices": 1, "pinned": True},
            {"model": "big", "memory": 20 * GIB, "devices": 2},
            {"model": "plain"},
            {"at": 0, "model": "chat"},
        )
    )
    assert parsed.capacity is not None
    assert (parsed.capacity.devices, parsed.capacity.memory_per_device) == (2, 24 * GIB)
    chat, big, plain = (parsed.models[n] for n in ("chat", "big", "plain"))
    assert (chat.memory, chat.devices, chat.pinned) == (6 * GIB, 1, True)
    assert (big.memory, big.devices, big.pinned) == (20 * GIB, 2, False)
    assert (plain.memory, plain.devices, plain.pinned) == (None, 1, False)  # a whole device
    assert read_trace(trace({"at": 0, "model": "a"})).capacity is None  # no capacity: one model at a time


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        pytest.param([{"model": "a", "memory": "lots"}], "line 1: memory: 'lots' is not a memory", id="memory-word"),
        pytest.param([{"model": "a", "memory": 0}], "line 1: memory: 0 is not a positive", id="memory-zero"),
        pytest.param([{"model": "a", "devices": 0}], "line 1: devices: 0 is not a whole number", id="devices-zero"),
        pytest.param([{"model": "a", "devices": 1.5}], "line 1: devices: 1.5 is not a whole", id="devices-fraction"),
        pytest.param([{"model": "a", "devices": True}], "line 1: devices: True is not a whole", id="devices-bool"),
        pytest.param([{"model": "a", "pinned": "yes"}], "line 1: pinned: 'yes' is not true or false", id="pinned"),
        pytest.param(
            [{"capacity": {"devices": 0, "memoryPerDevice": "24Gi"}}],
            "line 1: capacity.devices: 0 is not a whole number",
            id="capacity-devices",
        ),
        pytest.param(
            [{"capacity": {"memoryPerDevice": "big"}}],
            "line 1: capacity.memoryPerDevice: 'big' is not a memory",
            id="capacity-memory",
        ),
        pytest.param(
            [{"capacity": {"devices": 1}}], "line 1: capacity.memoryPerDevice: required", id="capacity-no-memory"
        ),
        pytest.param(
            [{"capacity": {"memoryPerDevice": "24Gi", "gpus": 2}}],
            "line 1: unknown capacity field 'gpus'",
            id="capacity-unknown-field",
        ),
        pytest.param([{"capacity": "24Gi"}], "line 1: capacity: expected an object", id="capacity-not-object"),
        pytest.param(
            [{"capacity": {"memoryPerDevice": "24Gi"}, "at": 3}],
            "line 1: a capacity line has only 'capacity'",
            id="capacity-with-more",
        ),
        pytest.param(
            [{"capacity": {"memoryPerDevice": "24Gi"}}, {"capacity": {"memoryPerDevice": "24Gi"}}],
            "line 2: capacity: given twice",
            id="capacity-twice",
        ),
        pytest.param(
            [{"model": "a", "memory": "30Gi"}, {"capacity": {"memoryPerDevice": "24Gi"}}],
            "line 1: memory: a needs 1 x 32212254720 bytes, more than the capacity's 1 x 25769803776",
            id="model-larger-than-the-card",
        ),
        pytest.param(
            [{"model": "a", "devices": 2, "memory": "1Gi"}, {"capacity": {"memoryPerDevice": "24Gi"}}],
            "line 1: devices: a needs 2 x",
            id="model-on-more-devices-than-the-card",
        ),
    ],
)
def test_a_bad_memory_or_capacity_value_is_named(lines: list[object], message: str) -> None:
    with pytest.raises(TraceError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_trace([*trace(*lines), '{"at": 0, "model": "a"}'])


def two_models_taking_turns(capacity: str = "24Gi") -> list[str]:
    """a and b (8 GiB each), each asked every minute for an hour, half a minute apart: one at a time, a swap
    every few minutes; on a 24 GiB card both stay loaded."""
    model = {"priority": 10, "loadSeconds": 20, "parkSeconds": 4, "memory": "8Gi", "concurrency": 2}
    return trace(
        {"capacity": {"devices": 1, "memoryPerDevice": capacity}},
        {"model": "a", **model},
        {"model": "b", **model},
        *[{"at": 60 * i + 30 * (m == "b"), "model": m, "serviceSeconds": 5} for i in range(60) for m in "ab"],
    )


@pytest.mark.parametrize("policy", ["flexinfer", "seed"])
def test_two_models_that_fit_are_never_swapped_while_one_at_a_time_swaps(policy: str) -> None:
    lines = read_trace(two_models_taking_turns())
    side_by_side = simulate(lines, [policy]).outcomes[policy]
    alone = simulate(lines, [policy], Settings(one_at_a_time=True)).outcomes[policy]
    assert side_by_side.loads == 2  # the two first loads, nothing more
    assert side_by_side.timed_out == 0 and side_by_side.killed == 0
    assert max(w for waits in side_by_side.waits.values() for w in waits) <= 20  # the first load only
    assert side_by_side.peak_memory == 16 * GIB
    assert side_by_side.over_bound is not None and side_by_side.over_bound <= 3  # loaded models are not waiting
    assert alone.loads > 4 and alone.peak_memory is None
    # the GPU's time: busy while either serves, loading only while neither does and one loads, never both counted
    whole = side_by_side.busy + side_by_side.loading + side_by_side.idle  # until the last reconcile after the trace
    assert lines.duration + 300 - 3 <= whole <= lines.duration + 300
    assert side_by_side.loading == pytest.approx(40)  # a from 0 s, b from its first request at 30 s (a idle)
    assert side_by_side.busy == pytest.approx(120 * 5, abs=1)  # 120 requests of 5 s, never two at once here


def memory_held(outcome: Outcome, sizes: dict[str, int]) -> int:
    """The most memory the models on the GPU held at once, from the timeline's segments alone."""
    edges = sorted([(s.start, 1, s.model) for s in outcome.segments] + [(s.end, 0, s.model) for s in outcome.segments])
    held, most = 0, 0
    for _, starts, model in edges:  # at equal times a segment ends before the next starts
        held += sizes[model] if starts else -sizes[model]
        most = max(most, held)
    return most


def three_models_that_fit_two_by_two() -> list[str]:
    """Three 10 GiB models on a 24 GiB card, in overlapping sessions: two fit, never three."""
    lines: list[object] = [{"capacity": {"devices": 1, "memoryPerDevice": "24Gi"}}]
    lines += [{"model": m, "priority": 10, "loadSeconds": 15, "memory": "10Gi"} for m in "abc"]
    for k in range(12):
        model = "abc"[k % 3]
        lines += [{"at": 200 * k + 20 * i, "model": model, "serviceSeconds": 3} for i in range(15)]
    return trace(*lines)


@pytest.mark.parametrize("policy", ["flexinfer", "seed"])
@pytest.mark.parametrize(
    "lines", [pytest.param(three_models_that_fit_two_by_two(), id="three-of-10Gi"), pytest.param(None, id="homelab")]
)
def test_the_simulator_never_holds_more_memory_than_the_capacity(policy: str, lines: list[str] | None) -> None:
    parsed = read_trace(lines) if lines is not None else load_trace(EXAMPLES / "homelab-day.jsonl")
    assert parsed.capacity is not None
    outcome = simulate(parsed, [policy]).outcomes[policy]
    sizes = {n: m.memory or parsed.capacity.memory_per_device for n, m in parsed.models.items()}
    assert outcome.peak_memory is not None
    assert memory_held(outcome, sizes) == outcome.peak_memory <= parsed.capacity.memory_per_device
    assert outcome.peak_memory > max(sizes.values())  # models did share the card
    assert outcome.loads > len(sizes)  # and models were evicted to make room (or parked idle) and came back
    assert outcome.timed_out <= (1 if policy == "seed" else 0)
    assert policy == "seed" or outcome.killed == 0  # an evicted model drains before it is parked


def test_the_offline_bound_counts_only_changes_between_models_that_cannot_share_the_card() -> None:
    parsed = read_trace(two_models_taking_turns())
    assert offline_lower_bound(parsed, 300, parsed.capacity) == 2
    assert offline_lower_bound(parsed, 300) > 2  # one at a time every other request is a change
    too_small = read_trace(two_models_taking_turns(capacity="12Gi"))
    assert offline_lower_bound(too_small, 300, too_small.capacity) == offline_lower_bound(too_small, 300)


def test_the_timeline_shows_models_loaded_side_by_side_in_lanes_of_their_own() -> None:
    comparison = simulate(read_trace(two_models_taking_turns()), ["flexinfer"])
    side = ET.fromstring(render_svg(comparison))
    alone = ET.fromstring(
        render_svg(simulate(read_trace(two_models_taking_turns()), ["flexinfer"], Settings(one_at_a_time=True)))
    )

    def lanes(root: ET.Element) -> set[str]:
        """The heights at which a's and b's segments are drawn (not the legend's squares at the top)."""
        colours = {"#4e79a7", "#f28e2b"}
        return {e.get("y", "") for e in root.iter() if e.tag.endswith("rect") and e.get("fill") in colours} - {"26"}

    assert len(lanes(side)) == 2 and len(lanes(alone)) == 1  # a and b each in a lane of its own; one lane for both
    assert "models loaded side by side" in ET.tostring(side, encoding="unicode")
    assert "models loaded side by side" not in ET.tostring(alone, encoding="unicode")


def test_cli_one_at_a_time_ignores_the_capacity() -> None:
    runner = CliRunner()
    homelab = str(EXAMPLES / "homelab-day.jsonl")
    runs = {
        flag: json.loads(runner.invoke(app, ["simulate", homelab, "-p", "flexinfer", "-o", "json", *flag]).output)
        for flag in ((), ("--one-at-a-time",))
    }
    side, alone = (runs[f]["policies"]["flexinfer"] for f in ((), ("--one-at-a-time",)))
    assert side["swaps"] < alone["swaps"]
    assert side["peakMemoryPerDeviceBytes"] <= 24 * GIB and alone["peakMemoryPerDeviceBytes"] is None
    table = runner.invoke(app, ["simulate", homelab, "-p", "flexinfer"]).output
    assert "capacity 1 x 24.0Gi: the most loaded on one device at once: flexinfer" in table


@pytest.mark.parametrize(("pinned", "served"), [pytest.param(True, 0, id="pinned-stays"), (False, 3)])
def test_a_pinned_model_keeps_the_card_against_an_equal_priority(pinned: bool, served: int) -> None:
    """a (16 GiB) answers one request and is then quiet; b (16 GiB, the same priority) is asked three times later:
    both do not fit on the 24 GiB card. Unpinned, quiet a is evicted for b; pinned, a stays and b's requests time
    out."""
    lines = trace(
        {"capacity": {"memoryPerDevice": "24Gi"}},
        {"model": "a", "priority": 10, "loadSeconds": 10, "memory": "16Gi", "pinned": pinned},
        {"model": "b", "priority": 10, "loadSeconds": 10, "memory": "16Gi"},
        {"at": 0, "model": "a", "serviceSeconds": 1},
        *[{"at": 100 + i, "model": "b", "serviceSeconds": 1} for i in range(3)],
    )
    outcome = simulate(read_trace(lines), ["flexinfer"]).outcomes["flexinfer"]
    assert outcome.timed_out == 3 - served
    assert outcome.peak_memory == 16 * GIB  # never both


def test_the_shipped_example_traces_are_what_their_generator_writes() -> None:
    """examples/traces/generate.py names every kind of day once (KINDS); each shipped file is its kind drawn with
    the seed it names, so rerunning the generator changes nothing, and a new kind is a new file."""
    generator = runpy.run_path(str(EXAMPLES / "generate.py"))
    kinds, trace_lines = generator["KINDS"], generator["trace_lines"]
    assert {p.stem for p in EXAMPLES.glob("*.jsonl")} == set(kinds)
    for kind in kinds:
        assert (EXAMPLES / f"{kind}.jsonl").read_text() == "\n".join(trace_lines(kind)) + "\n", kind
    # another seed draws another day of the same models
    shipped = load_trace(EXAMPLES / "team-working-day.jsonl")
    other = read_trace(trace_lines("team-working-day", 1000))
    assert set(other.models) == set(shipped.models) and other.requests != shipped.requests
