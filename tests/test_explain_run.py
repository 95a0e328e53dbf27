"""`bench run` of the built-in engine (a tiny GGUF) with backend.trace: per-request engine timings,
phases_ms, the step trace as Chrome trace JSON, roofline and diagnosis in summary.json."""

import json

import pytest
from bench_process import bench

from harness.results.folder import read_records
from native_engine.tiny_gguf import write_tiny_llama_gguf


@pytest.fixture(scope="module")
def traced_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("explain")
    model = write_tiny_llama_gguf(tmp / "tiny.gguf", tokenizer="smollm2")
    scenario = tmp / "s.yaml"
    scenario.write_text(
        f'name: explain\nbackend: {{kind: native, trace: true, launch: {{args: ["--model", "{model}", '
        f'"--max-num-seqs", "2"], ready_timeout_s: 60}}}}\n'
        "workload: {kind: random, input_tokens: 48, output_tokens: 32}\n"
        "load: {arrival: poisson, rate: 100, num_requests: 12}\n"
        "telemetry: {interval_ms: 100, gpu: false}\n"
    )
    out = tmp / "out"
    res = bench("run", scenario, "--output", out, "--allow-client-bound", timeout_s=180)
    assert res.returncode == 0, res.stderr
    return out


def test_engine_trace_is_valid_chrome_trace_json(traced_run):
    trace = json.loads((traced_run / "engine_trace.json").read_text())
    events = trace["traceEvents"]
    timed = [e for e in events if e["ph"] != "M"]
    assert timed
    assert [e["ts"] for e in timed] == sorted(e["ts"] for e in timed)  # sorted
    complete = [e for e in timed if e["ph"] == "X"]
    assert complete
    assert all(e["dur"] > 0 for e in complete)  # durations positive
    names = {e["args"]["name"]: e["tid"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert set(names) == {"steps", "forward", "scheduler"}
    assert len(set(names.values())) == 3
    kinds_per_track = {}
    for e in timed:
        if "tid" in e:
            kinds_per_track.setdefault(e["tid"], set()).add(
                e["ph"] if e["ph"] != "X" or e["tid"] != names["steps"] else "step"
            )
    assert all(len(kinds) == 1 for kinds in kinds_per_track.values())  # one track per kind of event
    steps = [e for e in complete if e["tid"] == names["steps"]]
    assert {e["name"] for e in steps} <= {"prefill", "decode", "mixed"} and "decode" in {e["name"] for e in steps}
    assert sum(e["args"]["prefill_tokens"] for e in steps) >= 12 * 40  # every prompt was prefilled in a traced step
    assert all(e["args"]["bytes_read"] > 0 and e["args"]["flops"] > 0 for e in steps)
    # on the requests' clock: the engine's steps run between the first send and the last token
    records = read_records(traced_run)
    first_send = min(r.actual_send_s for r in records)
    last_token = max(r.token_times_s[-1] for r in records)
    assert all(first_send * 1e6 <= e["ts"] <= last_token * 1e6 for e in steps)
    assert steps[0]["ts"] < min(r.token_times_s[0] for r in records) * 1e6


def test_requests_carry_the_engines_own_timings(traced_run):
    records = read_records(traced_run)
    assert len(records) == 12 and all(r.ok for r in records)
    for r in records:
        t = r.server_timings
        assert {"queue_ms", "prefill_ms", "decode_ms", "cache_n", "preemptions"} <= set(t)
        ttft_ms = (r.token_times_s[0] - r.intended_send_s) * 1e3
        assert 0 <= t["queue_ms"] + t["prefill_ms"] <= ttft_ms  # the engine's part fits inside the client's TTFT
        # as llama.cpp's: prompt_n counts the tokens computed, cache_n the ones reused; together the whole prompt
        assert t["prompt_n"] + t["cache_n"] == r.prompt_tokens


def test_summary_explains_the_run(traced_run):
    summary = json.loads((traced_run / "summary.json").read_text())
    phases = summary["phases_ms"]
    assert phases["source"] == "per request: native" and phases["requests_with_engine_timings"] == 12
    assert sum(phases["ttft_share"].values()) == pytest.approx(1.0, abs=0.02)
    assert summary["roofline"]["basis"].startswith("step trace")
    assert "decode" in summary["roofline"]["points"]
    assert all({"rule", "severity", "message", "evidence"} <= set(f) for f in summary["diagnosis"])
    # 12 requests of 32 tokens at 100/s into a batch of 2: they queue (on any machine: 6 rounds of decode)
    assert any(f["rule"] == "saturation" for f in summary["diagnosis"])
