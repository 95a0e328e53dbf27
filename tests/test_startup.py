"""An engine's start-up cost (harness/engine/startup.py): a launched native engine's run.json has its launch-to-ready
seconds and first request, `bench report` and `bench select` show them; TensorRT-LLM's engine build is read
from its builder's log lines (the format of tensorrt_llm/builder.py; no GPU here to run it)."""

import json
import time

from bench_process import bench

from backends import load_backend
from harness.results.folder import read_records
from native_engine.tiny_gguf import write_tiny_llama_gguf


def test_a_launched_engine_records_its_start_up_and_reports_show_it(tmp_path):
    tiny_path = write_tiny_llama_gguf(tmp_path / "tiny.gguf", tokenizer="smollm2")  # words for random prompts
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: startup\nbackend: {{kind: native, launch: {{args: [--model, '{tiny_path}'], ready_timeout_s: 60}}}}\n"
        "workload: {kind: random, input_tokens: 8, output_tokens: 4}\n"
        "load: {arrival: closed, concurrency: 1, num_requests: 4, warmup_requests: 1}\n"
        "slo: {ttft_ms: 60000}\ntelemetry: {gpu: false}\n"
    )
    out = tmp_path / "out"
    started = time.monotonic()
    res = bench("run", scenario, "--output", out, "--allow-client-bound", timeout_s=180)
    wall_s = time.monotonic() - started
    assert res.returncode == 0, res.stderr
    startup = json.loads((out / "run.json").read_text())["startup"]
    # launch to ready is part of the bench process's own life, and takes a process start at least
    assert 0 < startup["launch_to_ready_s"] < wall_s
    assert "engine_build_s" not in startup  # the native engine builds no engine
    # the first request is the earliest sent (the warm-up one here), with its own latencies
    records = read_records(out)
    first = min(records, key=lambda r: r.actual_send_s)
    assert first.is_warmup
    block = startup["first_request"]
    assert block["run"] == "out" and block["ok"]
    assert block["ttft_ms"] == round(1000 * (first.token_times_s[0] - first.actual_send_s), 2)
    assert block["e2e_ms"] == round(1000 * (first.end_s - first.actual_send_s), 2) >= block["ttft_ms"]
    assert block["run_median_ttft_ms"] > 0

    selected = bench("select", out, "-o", tmp_path / "sel.html", timeout_s=120)
    assert selected.returncode == 0, selected.stderr
    line = f"start-up of out: ready {startup['launch_to_ready_s']:.1f} s after launch; first request TTFT"
    assert line in selected.stdout, selected.stdout
    assert "start-up" in (tmp_path / "sel.md").read_text()
    reported = bench("report", out, "-o", tmp_path / "r.html", timeout_s=120)
    assert reported.returncode == 0, reported.stderr
    assert f"ready {startup['launch_to_ready_s']:.1f} s after launch" in (tmp_path / "r.md").read_text()


def test_tensorrt_llm_engine_build_seconds_come_from_its_builder_log():
    trtllm = load_backend("trtllm")
    one = (
        "[03/12/2024-10:20:33] [TRT-LLM] [I] Build TensorRT engine Unnamed Network 0\n"
        "[03/12/2024-10:21:09] [TRT-LLM] [I] Total time of building Unnamed Network 0: 00:00:36\n"
        "[03/12/2024-10:21:11] [TRT-LLM] [I] Engine serialized. Total time: 00:00:02\n"
    )
    assert trtllm.engine_build_s(one) == 36.0
    two_ranks = one + one.replace("Network 0: 00:00:36", "Network 0: 00:01:05")
    assert trtllm.engine_build_s(two_ranks) == 36.0 + 65.0
    # the builder's own total, when it prints one, is the build (its per-network lines are within it)
    assert trtllm.engine_build_s(two_ranks + "[TRT-LLM] [I] Total time of building all engines: 00:02:03\n") == 123.0
    assert trtllm.engine_build_s("[TRT-LLM] [I] Loading the PyTorch backend\n") is None  # no build, no figure
    assert load_backend("native").engine_build_s(one) is None  # only TensorRT-LLM builds engines
