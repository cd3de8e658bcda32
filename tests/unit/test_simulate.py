"""``flexinfer simulate``: traces in, the real planner on a virtual clock, per-policy figures and a timeline out."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flexinfer_cli.main import app
from flexinfer_cli.simulate import (
    POLICIES,
    Settings,
    Simulation,
    TraceError,
    as_json,
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


def test_with_the_quiet_yield_a_lower_priority_batch_gets_a_quiet_gpu_and_the_higher_priority_model_gets_it_back() -> (
    None
):
    """chat (100, idle timeout 10 min) answers a session until 60 s; an embedding batch (50) arrives at 40 s. The
    seed's embed, and FlexInfer's by default, wait for chat's idle timeout; with ``--quiet-yield 30s`` embed gets the
    GPU once chat has been quiet for 30 s, and a chat request during the batch waits only until embed is quiet in
    turn (no cooldown: chat was not preempted)."""
    lines = trace(
        {"model": "chat", "priority": 100, "loadSeconds": 20, "parkSeconds": 4, "idleTimeout": "10m"},
        {"model": "embed", "priority": 50, "loadSeconds": 8, "parkSeconds": 4, "concurrency": 8},
        *[{"at": 10 * i, "model": "chat", "serviceSeconds": 2} for i in range(7)],
        *[{"at": 40 + i, "model": "embed", "serviceSeconds": 0.2} for i in range(10)],
        {"at": 120, "model": "chat", "serviceSeconds": 2},
    )
    default = simulate(read_trace(lines), ["flexinfer"], Settings(queue_timeout=900)).outcomes["flexinfer"]
    assert min(default.waits["embed"]) >= 62 + 10 * 60 - 40 - 3  # after chat's idle timeout (10 min), as the seed
    outcomes = simulate(read_trace(lines), ["seed", "flexinfer"], Settings(queue_timeout=900, quiet_yield=30)).outcomes
    flexinfer = outcomes["flexinfer"]
    # chat's last request at 60 s answered by 62 s; quiet 30 s later, then a park (4 s) and a load (8 s)
    assert max(flexinfer.waits["embed"]) <= 62 + 30 + 3 + 4 + 8 - 40
    assert max(flexinfer.waits["chat"]) <= 30 + 3 + 4 + 20  # embed quiet, a reconcile, the park, chat's load
    assert flexinfer.timed_out == 0 and flexinfer.killed == 0
    assert min(outcomes["seed"].waits["embed"]) > max(flexinfer.waits["embed"])


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
    """``--quiet-yield`` plays FLEXINFER_QUIET_YIELD: on the homelab day the embedding batches (priority 50) get
    the GPU in the chat and code models' quiet moments instead of waiting for their idle timeout."""
    runner = CliRunner()
    homelab = str(EXAMPLES / "homelab-day.jsonl")
    runs = {
        flag: json.loads(runner.invoke(app, ["simulate", homelab, "-p", "flexinfer", "-o", "json", *flag]).output)
        for flag in ((), ("--quiet-yield", "30s"))
    }
    default, yielding = (runs[f]["policies"]["flexinfer"] for f in ((), ("--quiet-yield", "30s")))
    assert yielding["waitSeconds"]["embed"]["p95"] < default["waitSeconds"]["embed"]["p95"] / 2
    refused = runner.invoke(app, ["simulate", homelab, "--quiet-yield", "soon"])
    assert refused.exit_code == 2 and "soon" in refused.output
