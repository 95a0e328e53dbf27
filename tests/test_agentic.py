"""workload.kind agentic: agent sessions with tool-result turns and a fan-out of sub-agents, against the built-in
engine on loopback (a tiny GGUF with SmolLM2's tokenizer and chat template), and the replay of a WEKA agentic trace
(the kv-cache-tester format AIPerf reads) of 120 sessions with its timing kept."""

import json
import socket
from collections import Counter

import numpy as np
import pytest
from bench_process import bench

from harness.client.runner import Runner, Target, run_blocking
from harness.scenario.scenario import Scenario, ScenarioError
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.workload import build_schedule
from native_engine.tiny_gguf import write_tiny_llama_gguf
from reports.report import write_report

TURNS = ["user", "tool_result", "subagent", "merge", "tool_result"]
FAN_OUT, SUBAGENT_TURNS, TOOL_DELAY_S = 4, 2, 0.05


def records_of(out) -> list[dict]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


def launched(tmp_path, workload: str, load: str) -> str:
    model = write_tiny_llama_gguf(tmp_path / "tiny.gguf", tokenizer="smollm2")
    return (
        f'name: agentic\nbackend: {{kind: native, api: chat, launch: {{args: ["--model", "{model}"], '
        "ready_timeout_s: 60}}\n"
        f"workload: {workload}\nload: {load}\ntelemetry: {{interval_ms: 200, gpu: false}}\n"
    )


def test_agent_sessions_with_tool_turns_and_a_fan_out_of_four_against_the_built_in_engine(tmp_path):
    sessions = 3
    per_session = len(TURNS) + TURNS.count("subagent") * FAN_OUT * SUBAGENT_TURNS
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        launched(
            tmp_path,
            "{kind: agentic, input_tokens: 12, output_tokens: 4, ignore_eos: true, agentic: "
            f"{{system_prompt_tokens: 64, turns: [{', '.join(TURNS)}], tool_result_tokens: 8, "
            f"tool_delay_s: {TOOL_DELAY_S}, fan_out: {FAN_OUT}, subagent_turns: {SUBAGENT_TURNS}}}}}",
            f"{{arrival: poisson, rate: 2, num_requests: {sessions * per_session}, warmup_requests: 0}}",
        )
    )
    out = tmp_path / "out"
    res = bench("run", scenario, "--output", out, "--no-trim", "--allow-client-bound", timeout_s=240)
    assert res.returncode == 0, res.stderr
    records = records_of(out)
    assert all(r["status"] == "ok" for r in records), [r["error_detail"] for r in records if r["status"] != "ok"]
    kinds = Counter(r["turn_kind"] for r in records)
    children = FAN_OUT * TURNS.count("subagent")
    assert kinds == {
        "user": sessions * TURNS.count("user"),
        "tool_result": sessions * (TURNS.count("tool_result") + children * (SUBAGENT_TURNS - 1)),
        "subagent": sessions * TURNS.count("subagent"),
        "merge": sessions * TURNS.count("merge"),
        "subagent_task": sessions * children,
    }
    turn = {(r["session_id"], r["turn_index"]): r for r in records}
    for fan in (r for r in records if r["turn_kind"] == "subagent"):
        mine = [r for r in records if r["parent_session_id"] == fan["session_id"]]
        assert len({r["session_id"] for r in mine}) == FAN_OUT
        # each child is due when the fan-out answer ended, its later turns the tool's delay after its previous answer
        for r in mine:
            before = fan if r["turn_index"] == 0 else turn[(r["session_id"], r["turn_index"] - 1)]
            wait_s = 0.0 if r["turn_index"] == 0 else TOOL_DELAY_S
            assert r["intended_send_s"] == pytest.approx(before["end_s"] + wait_s, abs=1e-6)
        merge = turn[(fan["session_id"], fan["turn_index"] + 1)]
        assert merge["turn_kind"] == "merge"  # after all children ended, the tool's delay later
        assert merge["intended_send_s"] == pytest.approx(max(r["end_s"] for r in mine) + TOOL_DELAY_S, abs=1e-6)
        assert merge["prompt_tokens"] > fan["prompt_tokens"] + FAN_OUT * 4  # the children's answers went in
    summary = json.loads((out / "summary.json").read_text())
    by_kind = summary["by_turn_kind"]
    assert set(by_kind) == set(kinds)
    for kind, figures in by_kind.items():  # the whole run is the window (--no-trim): every turn of the kind
        mine = [r for r in records if r["turn_kind"] == kind]
        ttft_ms = [(r["token_times_s"][0] - r["intended_send_s"]) * 1e3 for r in mine]
        e2e_ms = [(r["token_times_s"][-1] - r["intended_send_s"]) * 1e3 for r in mine]
        assert (figures["requests"], figures["completed"]) == (len(mine), len(mine))
        assert figures["ttft_ms"]["p50"] == pytest.approx(float(np.percentile(ttft_ms, 50)))
        assert figures["ttft_ms"]["p90"] == pytest.approx(float(np.percentile(ttft_ms, 90)))
        assert figures["e2e_ms"]["p99"] == pytest.approx(float(np.percentile(e2e_ms, 99)))
    # every session opens with the same 64-token system prompt: the engine's prefix cache serves it
    assert summary["prefix_cache"]["hit_rate"] > 0
    rows = {row[1]: row for row in write_report([out], tmp_path / "report.html").turn_kind_rows}
    assert rows["merge"][2] == str(kinds["merge"]) and rows["user"][5] == f"{by_kind['user']['ttft_ms']['p50']:,.1f}"
    assert "## By turn kind" in (tmp_path / "report.md").read_text()


def weka_session(i: int) -> dict:
    """Session i in the kv-cache-tester (WEKA) format: a call that ends in a tool call, the tool's result; every
    third session's second call spawns two sub-agents of two calls each, and a third call follows them."""
    first = {"t": 0.0, "type": "s", "model": "m", "in": 40, "out": 2, "stop": "tool_use", "api_time": 0.4}
    second = {"t": 0.45 + 0.01 * (i % 5), "type": "n", "model": "m", "in": 60, "out": 2, "input_types": ["tool_result"]}
    session = {"id": f"s{i}", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "system_tokens": 24}
    session |= {"start_s": round(0.08 * i + 0.03 * (i % 3), 3), "requests": [first, second | {"api_time": 0.3}]}
    if i % 3 == 0:
        children = [
            {"t": 1.0, "type": "subagent", "agent_id": f"a{k}", "subagent_type": "Explore", "status": "completed"}
            | {
                "duration_ms": 600,
                "requests": [
                    {"t": 1.05 + 0.02 * k, "type": "n", "in": 30, "out": 2, "stop": "tool_use", "api_time": 0.2},
                    {"t": 1.3 + 0.02 * k, "type": "n", "in": 40, "out": 2, "think_time": 0.02},
                ],
            }  # fmt: skip
            for k in range(2)
        ]
        session["requests"] += children + [{"t": 2.0, "type": "n", "in": 120, "out": 2}]
    return session


def test_a_weka_trace_of_120_sessions_replays_with_its_timing_kept(tmp_path):
    trace = [weka_session(i) for i in range(120)]
    path = tmp_path / "agents.jsonl"
    path.write_text("".join(json.dumps(s) + "\n" for s in trace))
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        launched(
            tmp_path,
            "{kind: agentic, output_tokens: 2, ignore_eos: true}",
            f"{{arrival: trace, trace: {path}, trace_format: weka, warmup_requests: 0}}",
        )
    )
    out = tmp_path / "out"
    res = bench("run", scenario, "--output", out, "--no-trim", "--allow-client-bound", timeout_s=300)
    assert res.returncode == 0, res.stderr
    records = records_of(out)
    assert all(r["status"] == "ok" for r in records), [r["error_detail"] for r in records if r["status"] != "ok"]
    spawning = [s for s in trace if len(s["requests"]) > 2]
    assert len(records) == 2 * len(trace) + 5 * len(spawning)
    roots = {r["session_id"] for r in records if r["parent_session_id"] is None}
    assert len(roots) == 120 and len({r["session_id"] for r in records}) == 120 + 2 * len(spawning)
    assert Counter(r["turn_kind"] for r in records) == {
        "user": 120,
        "tool_result": 120 - len(spawning) + 2 * len(spawning),  # the tool's results, and each sub-agent's
        "subagent": len(spawning),
        "merge": len(spawning),
        "subagent_task": 2 * len(spawning),
    }
    turn = {(r["session_id"], r["turn_index"]): r for r in records}
    by_start = sorted(range(120), key=lambda i: trace[i]["start_s"])
    for sid, i in enumerate(by_start):  # session ids follow the trace's starts
        first, second = trace[i]["requests"][0], trace[i]["requests"][1]
        # a session's first turn at its start; a later one at its recorded idle gap after the previous answer ended
        assert turn[(sid, 0)]["intended_send_s"] == pytest.approx(trace[i]["start_s"], abs=1e-6)
        gap_s = second["t"] - (first["t"] + first["api_time"])
        assert turn[(sid, 1)]["intended_send_s"] == pytest.approx(turn[(sid, 0)]["end_s"] + gap_s, abs=1e-6)
        if len(trace[i]["requests"]) == 2:
            continue
        children = sorted({r["session_id"] for r in records if r["parent_session_id"] == sid})
        markers = trace[i]["requests"][2:4]
        for child, marker in zip(children, markers):
            calls = marker["requests"]
            offset_s = calls[0]["t"] - (second["t"] + second["api_time"])  # after the spawning answer ended
            assert turn[(child, 0)]["intended_send_s"] == pytest.approx(turn[(sid, 1)]["end_s"] + offset_s, abs=1e-6)
            assert turn[(child, 1)]["intended_send_s"] == pytest.approx(
                turn[(child, 0)]["end_s"] + calls[1]["think_time"], abs=1e-6
            )
        ended_s = max(turn[(child, 1)]["end_s"] for child in children)
        recorded_end_s = max(m["t"] + m["duration_ms"] / 1000 for m in markers)
        merge_gap_s = trace[i]["requests"][4]["t"] - recorded_end_s
        assert turn[(sid, 2)]["intended_send_s"] == pytest.approx(ended_s + merge_gap_s, abs=1e-6)


@pytest.fixture(scope="module")
def smollm2():
    return LocalTokenizer("smollm2")


def scenario_of(workload: dict, load: dict | None = None, api: str = "chat") -> Scenario:
    return Scenario.model_validate(
        {
            "name": "t",
            "backend": {"kind": "openai", "url": "http://127.0.0.1:9", "api": api, "model": "smollm2"},
            "workload": workload,
            "load": load or {"arrival": "poisson", "rate": 4.0, "num_requests": 13, "warmup_requests": 0},
        }
    )


def test_the_schedule_shares_one_system_prompt_and_keeps_each_turns_delay(smollm2):
    agentic = {"system_prompt_tokens": 48, "tool_delay_s": 0.25, "think_time_s": 1.5, "fan_out": 3}
    plan = build_schedule(scenario_of({"kind": "agentic", "input_tokens": 10, "agentic": agentic}), smollm2)
    firsts = [r for r in plan.requests if r.turn_index == 0]
    systems = {r.messages[0]["content"] for r in firsts}
    assert len(systems) == 1 and all(r.messages[0]["role"] == "system" for r in firsts)  # one prompt for all
    delays = {r.turn_kind: r.think_time_s for r in plan.requests if r.turn_index > 0}
    assert delays == {"tool_result": 0.25, "subagent": 1.5, "merge": 0.25}
    assert {r.think_time_s for r in plan.requests if r.turn_kind == "subagent_task"} == {0.0}
    assert len({r.session_id for r in plan.requests if r.parent_session_id == 0}) == 3  # fan_out sub-agents


def test_a_weka_session_reads_as_its_turns_kinds_and_delays(tmp_path, smollm2):
    # the shape of AIPerf's WEKA fixture (tests/fixtures/weka_traces/one_subagent.json): a call ending in a tool
    # call, a sub-agent with sub-agent-relative times, the parent's next call after it with a recorded think_time
    session = {"id": "x", "models": ["m"], "block_size": 64, "hash_id_scope": "local", "system_tokens": 10}
    session["requests"] = [
        {"t": 0.0, "type": "n", "in": 200, "out": 30, "stop": "tool_use", "api_time": 1.0},
        {"t": 2.0, "type": "subagent", "agent_id": "a", "subagent_type": "Explore", "duration_ms": 3000}
        | {"status": "completed", "requests": [{"t": 0.5, "type": "n", "in": 100, "out": 50, "api_time": 0.5}]},
        {"t": 6.0, "type": "n", "in": 400, "out": 40, "input_types": ["tool_result"], "think_time": 0.5},
    ]
    path = tmp_path / "one.json"
    path.write_text(json.dumps(session))
    load = {"arrival": "trace", "trace": str(path), "trace_format": "weka", "warmup_requests": 0}
    plan = build_schedule(scenario_of({"kind": "agentic"}, load), smollm2).requests
    assert [(r.session_id, r.turn_kind, r.think_time_s, r.output_tokens) for r in plan] == [
        (0, "subagent", 0.0, 30),
        (0, "merge", 0.5, 40),
        (1, "subagent_task", pytest.approx(1.5), 50),  # spawned at 2.0 + 0.5, the parent's answer ended at 1.0
    ]
    assert plan[0].intended_offset_s == 0.0 and plan[2].parent_session_id == 0 and plan[2].parent_turn == 0


@pytest.mark.parametrize(
    ("workload", "api", "message"),
    [
        ({"agentic": {"turns": ["tool_result", "user"]}}, "chat", r"workload.agentic.turns\[0\]: .* make the first"),
        ({"agentic": {"turns": ["user", "merge"]}}, "chat", r"workload.agentic.turns\[1\]: merge .* subagent turn"),
        ({"agentic": {"turns": ["user", "subagent"]}}, "chat", r"turns\[1\]: .* follow it with a merge turn"),
        ({"agentic": {"fan_out": 0}}, "chat", r"workload.agentic.fan_out"),
        ({"agentic": {"tool_delay_s": -1}}, "chat", r"workload.agentic.tool_delay_s"),
        ({}, "completions", r"backend.api: workload.kind agentic sends chat messages.*set backend.api to chat"),
    ],
)
def test_bad_agentic_settings_are_refused_naming_the_field(workload, api, message):
    with pytest.raises((ScenarioError, ValueError), match=message):
        scenario_of({"kind": "agentic", **workload}, api=api)


def test_agentic_settings_belong_to_the_agentic_kind_and_weka_traces_to_it(tmp_path):
    with pytest.raises((ScenarioError, ValueError), match="workload.agentic: only used when workload.kind is agentic"):
        scenario_of({"kind": "random", "agentic": {"fan_out": 2}})
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(weka_session(0)) + "\n")
    with pytest.raises((ScenarioError, ValueError), match="load.trace_format: weka .* set workload.kind to agentic"):
        scenario_of({"kind": "random"}, {"arrival": "trace", "trace": str(path), "trace_format": "weka"})


def test_a_failed_turn_leaves_a_record_for_every_turn_and_sub_agent_it_cut_off(smollm2):
    # nothing listens on the port: the first turn fails to connect, and the session cannot go on without its answer
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    plan = build_schedule(scenario_of({"kind": "agentic", "input_tokens": 8, "output_tokens": 2}), smollm2)
    target = Target(url=f"http://127.0.0.1:{port}", api="chat", kind="openai")
    outcome = run_blocking(lambda: Runner(target, plan.requests))
    assert sorted(r.index for r in outcome.records) == [r.index for r in plan.requests]
    firsts = [r for r in outcome.records if r.turn_index == 0 and r.parent_session_id is None]
    assert firsts and all(r.error_reason == "connect_error" for r in firsts)
    rest = [r for r in outcome.records if r not in firsts]
    assert {r.error_reason for r in rest} == {"previous_turn_failed"}
    assert {r.turn_kind for r in rest} == {"tool_result", "subagent", "merge", "subagent_task"}


def test_bench_plan_refuses_an_agentic_workload_naming_what_it_cannot_simulate(tmp_path):
    """The planner's sessions are chains of turns; an agent's fan-out and tool-result turns are not simulated, and a
    plan must say so rather than fail on the turns whose text comes from answers."""
    result = bench(
        "plan",
        "scenarios/agentic.yaml",
        "--set",
        "plan={model: llama-3.1-8b, hardware: H100-SXM, step_model: roofline}",
        "--output",
        tmp_path / "plan",
    )
    assert result.returncode != 0
    assert "workload.kind: agentic is not simulated by bench plan" in " ".join((result.stdout + result.stderr).split())
    assert not (tmp_path / "plan" / "requests.jsonl").exists()
