"""workload.mix: traffic split over two model names by weight, against the built-in engine serving one model under
two names (--served-model-aliases, as vLLM's --served-model-name takes several); each side's latencies apart in
summary.json and the report, worked out here from requests.jsonl."""

import json

import numpy as np
import pytest
from bench_process import bench

from harness.scenario.scenario import Scenario
from harness.scenario.workload import RequestSpec, assign_models
from native_engine.tiny_gguf import write_tiny_llama_gguf
from reports.report import write_report

MIX = "[{model: chat-a, weight: 0.7}, {model: chat-b, weight: 0.3}]"


def test_a_70_30_mix_reports_each_sides_latencies(tmp_path):
    model = write_tiny_llama_gguf(tmp_path / "tiny.gguf", tokenizer="smollm2")
    args = f'["--model", "{model}", "--served-model-name", "chat-a", "--served-model-aliases", "chat-b"]'
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: mix\nbackend: {{kind: native, model: chat-a, launch: {{args: {args}, ready_timeout_s: 60}}}}\n"
        f"workload: {{kind: random, input_tokens: 16, output_tokens: 6, ignore_eos: true, mix: {MIX}}}\n"
        "load: {arrival: poisson, rate: 20, num_requests: 40, warmup_requests: 0}\n"
        "telemetry: {interval_ms: 200, gpu: false}\n"
    )
    out = tmp_path / "out"
    res = bench("run", scenario, "--output", out, "--no-trim", "--allow-client-bound", timeout_s=240)
    assert res.returncode == 0, res.stderr
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert all(r["status"] == "ok" for r in records), [r["error_detail"] for r in records if r["status"] != "ok"]
    counts = {name: sum(r["model"] == name for r in records) for name in ("chat-a", "chat-b")}
    assert sum(counts.values()) == 40 and 20 <= counts["chat-a"] <= 36  # 70/30 of 40 draws
    # one engine answering both names is no model switch (a busy machine may still make the run client-bound)
    assert not any(reason.startswith("model switch") for reason in summary["validity"]["reasons"])
    by_model = summary["by_model"]
    assert set(by_model) == {"chat-a", "chat-b"}
    for name, figures in by_model.items():  # the whole run is the window (--no-trim): every request of the side
        mine = [r for r in records if r["model"] == name]
        ttft_ms = [(r["token_times_s"][0] - r["intended_send_s"]) * 1e3 for r in mine]
        e2e_ms = [(r["token_times_s"][-1] - r["intended_send_s"]) * 1e3 for r in mine]
        assert (figures["requests"], figures["completed"], figures["failed"]) == (len(mine), len(mine), 0)
        assert figures["ttft_ms"]["p50"] == pytest.approx(float(np.percentile(ttft_ms, 50)))
        assert figures["e2e_ms"]["p99"] == pytest.approx(float(np.percentile(e2e_ms, 99)))
    rows = {row[1]: row for row in write_report([out], tmp_path / "report.html").mix_rows}
    assert (
        rows["chat-b"][2] == str(counts["chat-b"])
        and rows["chat-a"][5] == f"{by_model['chat-a']['ttft_ms']['p50']:,.1f}"
    )
    assert "## By model (workload.mix)" in (tmp_path / "report.md").read_text()


def test_a_session_stays_on_one_model_and_the_mix_needs_two_distinct_names():
    specs = [RequestSpec(i, "p", None, 4, 4, None, session_id=i // 3, turn_index=i % 3) for i in range(30)]
    shares = Scenario.model_validate(
        {"name": "s", "backend": {"kind": "native", "url": "http://127.0.0.1:9"}, "load": {"rate": 1}}
        | {"workload": {"mix": [{"model": "a", "weight": 1}, {"model": "b", "weight": 1}]}}
    ).workload.mix
    assign_models(specs, shares, seed=0)
    for session in range(10):
        assert len({s.model for s in specs if s.session_id == session}) == 1
    assert {s.model for s in specs} == {"a", "b"}
    with pytest.raises(ValueError, match="workload.mix: give two or more distinct models"):
        Scenario.model_validate(
            {"name": "s", "backend": {"kind": "native", "url": "http://127.0.0.1:9"}, "load": {"rate": 1}}
            | {"workload": {"mix": [{"model": "a", "weight": 1}, {"model": "a", "weight": 2}]}}
        )
