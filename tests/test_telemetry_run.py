"""`bench run` launching the built-in engine (a tiny GGUF) leaves telemetry and server metrics on
the requests' clock: CPU %, bandwidth utilisation, the engine's own counters, derived figures."""

import csv
import json
import os

import pytest
from bench_process import bench

from harness.engine.launcher import group_alive
from harness.results.folder import read_records
from native_engine.tiny_gguf import write_tiny_llama_gguf


@pytest.fixture(scope="module")
def native_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("native")
    model = write_tiny_llama_gguf(tmp / "tiny.gguf", tokenizer="smollm2")
    scenario = tmp / "s.yaml"
    scenario.write_text(
        f'name: native-telemetry\nbackend: {{kind: native, launch: {{args: ["--model", "{model}"], '
        "ready_timeout_s: 60}}\n"
        "workload: {kind: random, input_tokens: 16, output_tokens: 16}\n"
        "load: {arrival: poisson, rate: 8, num_requests: 12}\n"
        "telemetry: {interval_ms: 200, gpu: false}\n"
    )
    out = tmp / "out"
    res = bench("run", scenario, "--output", out, "--allow-client-bound", timeout_s=180)
    assert res.returncode == 0, res.stderr
    return out


def _csv(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_telemetry_series_and_derived_figures(native_run):
    rows = _csv(native_run / "telemetry.csv")
    series = {(r["source"], r["name"]) for r in rows}
    assert {
        ("engine_process", "cpu_percent"),
        ("engine_metrics", "bandwidth_util"),
        ("engine_metrics", "read_bytes_per_s"),
    } <= series
    cpu = [float(r["value"]) for r in rows if (r["source"], r["name"]) == ("engine_process", "cpu_percent")]
    assert max(cpu) > 0  # the engine did work while we sampled it
    derived = json.loads((native_run / "summary.json").read_text())["telemetry"]
    assert derived["engine_cpu_percent_mean"] > 0
    assert derived["engine_read_bytes_per_s"] > 0
    assert 0 < derived["mbu"] < 1
    assert derived["dram_bandwidth_util_source"] == "engine bytes read / memory ceiling"
    status = json.loads((native_run / "run.json").read_text())["telemetry"]
    assert {"host", "engine_process", "engine_metrics"} <= set(status["sampled"])
    assert status["not_sampled"]["gpu"] == "telemetry.gpu is false"


def test_engine_bytes_come_from_the_scraped_pages(native_run):
    """The engine's /metrics is asked once per interval: telemetry reads the scraper's pages."""
    scraped_at = {
        round(float(r["t_s"]), 3)
        for r in _csv(native_run / "server_metrics.csv")
        if r["name"] == "native:weight_bytes_read_total"
    }
    read_at = [
        round(float(r["t_s"]), 3)
        for r in _csv(native_run / "telemetry.csv")
        if (r["source"], r["name"]) == ("engine_metrics", "native:weight_bytes_read_total")
    ]
    assert len(read_at) >= 3 and set(read_at) <= scraped_at


def test_server_metrics_share_the_requests_clock(native_run):
    records = read_records(native_run)
    assert len(records) == 12 and all(r.ok for r in records)
    rows = _csv(native_run / "server_metrics.csv")
    generated = [(float(r["t_s"]), float(r["value"])) for r in rows if r["name"] == "bench:generation_tokens"]
    assert len(generated) >= 5
    end_s = max(r.end_s for r in records)
    # scrapes run from t0 until after the last request; the last one counts every generated token
    assert generated[0][0] < min(r.actual_send_s for r in records) and generated[-1][0] > end_s
    assert generated[-1][1] >= sum(r.output_tokens for r in records)
    assert any(0 < t < end_s and 0 < v < generated[-1][1] for t, v in generated)  # seen mid-run
    assert {"native:num_requests_running", "bench:running", "bench:kv_usage_fraction"} <= {r["name"] for r in rows}


def test_engine_stopped_after_the_run(native_run):
    run_info = json.loads((native_run / "run.json").read_text())
    assert run_info["backend"]["launched"] is True
    assert run_info["server_metrics"]["sampled"] is True
    assert not group_alive(run_info["backend"]["engine_pid"])
    assert os.path.getsize(native_run / "engine.log") > 0
