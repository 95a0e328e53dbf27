"""`bench export`: a real run folder (against tests/groundtruth_server.py) as a flat table read back with pandas,
and as an llm-d Benchmark Report v0.2 holding what that report's schema requires."""

import json

import pandas as pd
import pytest
from bench_process import bench
from groundtruth_server import GroundTruthConfig, GroundTruthProcess

from harness.metrics.export import PARQUET_FIX, export, records_table
from harness.results.folder import ResultsError, read_records
from harness.runs.run import Reporter, run_scenario
from harness.scenario.scenario import load_scenario

# what llm-d-benchmark's br_v0_2_json_schema.json (llmdbenchmark/analysis/benchmark_report/) requires and allows
LLMD_UNITS = {"count", "percent", "fraction", "ms", "s", "ms/token", "s/token", "tokens/s", "queries/s"}
LLMD_STATISTICS = {"units", "mean", "mode", "stddev", "min", "p0p1", "p1", "p5", "p10", "p25", "p50", "p75", "p90"}
LLMD_STATISTICS |= {"p95", "p99", "p99p9", "max"}
LLMD_LATENCIES = {"time_to_first_token", "normalized_time_per_output_token", "time_per_output_token"}
LLMD_LATENCIES |= {"inter_token_latency", "request_latency"}
LLMD_ENGINE_REQUIRED = {"kind", "tool", "tool_version", "role", "replicas", "model", "accelerator"}
LLMD_LOAD_REQUIRED = {"tool", "tool_version", "source", "input_seq_len"}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=2)) as gt:
        path = tmp / "s.yaml"
        path.write_text(
            f"name: exp\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            "workload: {kind: random, input_tokens: 16, output_tokens: 6}\n"
            "load: {arrival: constant, rate: 40, num_requests: 10, warmup_requests: 1}\n"
        )
        run_scenario(load_scenario(path), tmp / "run", workers="1", reporter=Reporter())
    return tmp / "run"


def test_the_records_come_back_from_csv_and_parquet_as_one_row_each(run_dir, tmp_path):
    records = read_records(run_dir)
    for fmt in ("csv", "parquet"):
        out = export(run_dir, fmt, tmp_path / f"records.{fmt}")
        table = pd.read_csv(out) if fmt == "csv" else pd.read_parquet(out)
        assert len(table) == len(records) == 11
        assert list(table["index"]) == [r.index for r in records]
        assert list(table["is_warmup"]) == [r.is_warmup for r in records]
        # each row's TTFT is its first token's arrival less its intended send; GroundTruth streams 6 tokens
        first = [json.loads(t)[0] - r.intended_send_s for t, r in zip(table["token_times_s"], records)]
        assert table["ttft_ms"].tolist() == pytest.approx([1e3 * f for f in first])
        assert (table["ttft_ms"] >= 20).all() and (table["output_tokens"] == 6).all()


def test_parquet_without_pyarrow_names_the_fix(run_dir, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_pyarrow(name, *args, **kwargs):
        if name == "pyarrow":
            raise ImportError("No module named 'pyarrow'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_pyarrow)
    with pytest.raises(ResultsError, match="pip install pyarrow") as e:
        export(run_dir, "parquet", tmp_path / "r.parquet")
    assert PARQUET_FIX in str(e.value) and not (tmp_path / "r.parquet").exists()


def test_the_llmd_report_holds_what_its_schema_requires(run_dir, tmp_path):
    out = export(run_dir, "llm-d", tmp_path / "br.json")
    report = json.loads(out.read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert report["version"] == "0.2" and report["run"]["uid"]
    engine, load = report["scenario"]["stack"][0], report["scenario"]["load"]
    assert {"metadata", "standardized", "native"} <= set(engine) and {"label", "cfg_id"} <= set(engine["metadata"])
    assert LLMD_ENGINE_REQUIRED <= set(engine["standardized"]) and engine["standardized"]["role"] == "replica"
    assert LLMD_LOAD_REQUIRED <= set(load["standardized"])
    assert load["standardized"]["input_seq_len"] == {"distribution": "fixed", "value": 16}
    aggregate = report["results"]["request_performance"]["aggregate"]
    assert aggregate["requests"]["total"] == 10 and aggregate["requests"]["failures"] == 0
    assert set(aggregate["latency"]) == LLMD_LATENCIES
    for section in ("latency", "throughput"):
        for stats in aggregate[section].values():
            assert {"units", "mean"} <= set(stats) <= LLMD_STATISTICS and stats["units"] in LLMD_UNITS
    ttft = aggregate["latency"]["time_to_first_token"]
    assert ttft["units"] == "s" and ttft["p50"] == pytest.approx(summary["ttft_ms"]["p50"] / 1e3)
    assert aggregate["requests"]["output_length"]["mean"] == 6


def test_export_from_the_command_line_and_a_bad_format(run_dir, tmp_path):
    out = tmp_path / "r.csv"
    done = bench("export", str(run_dir), "--format", "csv", "-o", str(out))
    assert done.returncode == 0 and len(records_table(run_dir)) == len(pd.read_csv(out))
    bad = bench("export", str(run_dir), "--format", "xlsx")
    assert bad.returncode == 2 and "--format" in bad.stderr and "llm-d" in bad.stderr
