"""The corpus of other tools' result files as found in public repositories (tests/fixtures/peers/manifest.yaml: each
file's source, its shape, and headline figures copied from the file itself): each is known by its content, read by
the reader the manifest names, and shows the file's own figures; a truncated or foreign file is refused with exit 2
naming the closest tool and what it lacks; a summary-only or failed run gives no latency it does not have."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from reports.cli import gate as gate_command
from reports.cli import report as report_command
from reports.peers import format_of, load_peer

FIXTURES = Path(__file__).parent / "fixtures" / "peers"
MANIFEST = yaml.safe_load((FIXTURES / "manifest.yaml").read_text(encoding="utf-8"))
FOUND = [entry for entry in MANIFEST if entry["commit"]]  # from public repositories, not recorded here


def ours(summary: dict, key: str) -> float | int | None:
    """Our figure for a manifest key: `ttft_s.p50` is the file's seconds, our `ttft_ms.p50` in ms."""
    path = key.replace("_s.", "_ms.") if key.split(".")[0].endswith("_s") and key != "window_s" else key
    value = summary
    for part in path.split("."):
        value = value[part]
    return value


def test_the_corpus_has_what_the_issue_asks():
    per_tool: dict[str, set[str]] = {}
    for entry in FOUND:
        per_tool.setdefault(entry["tool"], set()).add(entry["reader"])
    assert len(FOUND) >= 24  # 35 found in public repositories (4 more recorded here)
    assert all(len(per_tool[t]) >= 2 for t in ("vLLM bench serve", "SGLang bench_serving", "AIPerf", "GuideLLM"))
    assert {"AiperfRecordsJsonl2025", "AiperfRecordsWrapper"} <= per_tool["AIPerf"]  # late 2025: figures and records
    assert {"GuidellmCsv", "GuidellmBenchmarks"} <= per_tool["GuideLLM"]
    assert {"genai-bench", "inference-perf", "LLMPerf", "llm-d Benchmark Report"} <= set(per_tool)
    assert all((FIXTURES / e["file"]).stat().st_size < 300_000 for e in MANIFEST)


@pytest.mark.parametrize("entry", MANIFEST, ids=[e["file"] for e in MANIFEST])
def test_each_file_is_read_by_its_reader_with_its_own_figures(entry):
    path = FIXTURES / entry["file"]
    assert type(format_of(path)).__name__ == entry["reader"]
    run = load_peer(path)
    assert run.tool == entry["tool"]
    for key, theirs in entry["figures"].items():
        # the file's seconds are our ms: x1000, equal to float rounding (1e-9 relative)
        want = theirs * 1e3 if key.split(".")[0].endswith("_s") and key != "window_s" else theirs
        assert ours(run.summary, key) == pytest.approx(want, rel=1e-9), key


def test_a_run_where_every_request_failed_has_no_latency_of_zero():
    # vLLM writes mean/median/p99 TTFT 0.0 for 0 completed of 8: that is no sample, not 0 ms
    run = load_peer(FIXTURES / "vllm" / "v0.25.1" / "bench_serve_all_requests_failed_v0.25.1.json")
    assert run.summary["requests"] == {"measured": 8, "completed": 0, "failed": 8}
    assert "ttft_ms" not in run.summary and "tpot_ms" not in run.summary
    assert run.records == []


def test_a_summary_only_file_keeps_its_percentiles_and_says_it_has_no_samples():
    run = load_peer(FIXTURES / "vllm" / "v0.25.1" / "bench_serve_v0.25.1.json")
    assert run.records == []
    assert run.summary["ttft_ms"]["p99"] == pytest.approx(734.4049174101428)  # the file's p99_ttft_ms
    assert run.summary["e2e_ms"]["p50"] is None  # --percentile-metrics left E2EL out of this file
    assert any("not established: no samples" in line for line in run.differences)


def cli(*args):
    app = typer.Typer()
    app.command("report")(report_command)
    app.command("gate")(gate_command)
    return CliRunner().invoke(app, [*map(str, args)])


def test_a_truncated_vllm_file_exits_2_naming_vllm_and_what_is_missing(tmp_path):
    text = (FIXTURES / "vllm" / "v0.25.1" / "bench_serve_v0.25.1.json").read_text(encoding="utf-8")
    cut = tmp_path / "cut.json"
    cut.write_text(text[:400], encoding="utf-8")  # the first 400 characters: up to mean_ttft_ms, no median_ttft_ms
    result = cli("report", cut, "-o", tmp_path / "r.html")
    assert result.exit_code == 2, result.output  # bad input: never 1 (a regression), never a traceback
    message = " ".join(result.output.split())  # the console wraps long lines
    assert "closest to vLLM bench serve" in message and "median_ttft_ms" in message and "does not parse" in message


def test_a_foreign_json_exits_2_naming_the_closest_shape(tmp_path):
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"benchmarks": [{"name": "x"}], "version": 3}))  # GuideLLM's top key, no metrics
    result = cli("report", odd, "-o", tmp_path / "r.html")
    assert result.exit_code == 2, result.output
    assert "closest to GuideLLM" in " ".join(result.output.split()) and "lacks" not in result.output


def test_gate_on_a_file_without_samples_states_no_verdict():
    # a summary-only file has no per-request samples: every metric inconclusive on "0 vs 0", never a regression
    summary_only = FIXTURES / "vllm" / "v0.25.1" / "bench_serve_v0.25.1.json"
    result = cli("gate", summary_only, summary_only)
    assert result.exit_code == 0, result.output
    assert "5 of 5 metrics undecided" in result.output and result.output.count("(0 vs 0; need 20)") == 5


AIPERF_2025_RECORDS = FIXTURES / "aiperf" / "2025-10-records-jsonl" / "profile_export.jsonl"
GUIDELLM_CSV = FIXTURES / "guidellm" / "2026-06-csv" / "benchmarks.csv"


def test_aiperf_late_2025_records_are_timed_from_their_timestamp_ns():
    # read here with json alone: each request starts at metadata.timestamp_ns, its first token `ttft` ms later, then
    # a token per inter_chunk_latency gap; a line with an `error` is a failed request
    lines = [json.loads(line) for line in AIPERF_2025_RECORDS.read_text(encoding="utf-8").splitlines()]
    t0_ns = min(line["metadata"]["timestamp_ns"] for line in lines)
    run = load_peer(AIPERF_2025_RECORDS)
    assert len(run.records) == len(lines)
    failed = sum(1 for line in lines if line.get("error"))
    assert run.summary["requests"] == {"measured": len(lines), "completed": len(lines) - failed, "failed": failed}
    for line, rec in zip(lines, run.records, strict=True):
        send_s = (line["metadata"]["timestamp_ns"] - t0_ns) / 1e9
        assert rec.intended_send_s == pytest.approx(send_s, abs=1e-9)
        if line.get("error"):
            assert not rec.ok and rec.token_times_s == []
            continue
        m = line["metrics"]
        assert rec.ok
        assert rec.token_times_s[0] - send_s == pytest.approx(m["ttft"]["value"] / 1e3, rel=1e-9)
        assert len(rec.token_times_s) == len(m["inter_chunk_latency"]["value"]) + 1
        assert rec.output_tokens == m["output_sequence_length"]["value"]
        # its request latency is TTFT plus every gap: our last token lands where its request ended
        assert rec.token_times_s[-1] - send_s == pytest.approx(m["request_latency"]["value"] / 1e3, rel=1e-9)


def guidellm_csv_cells(path: Path) -> dict[tuple[str, str, str], str]:
    """The last benchmark's cells keyed by its three header rows, read with the csv module alone."""
    rows = list(csv.reader(io.StringIO(path.read_text(encoding="utf-8"))))
    return dict(zip(zip(rows[0], rows[1], rows[2]), rows[-1]))


@pytest.mark.parametrize("name", ["benchmarks.csv", "gemma4-31b-dense.csv"])
def test_guidellm_csv_statistics_are_its_cells(name):
    path = GUIDELLM_CSV.parent / name
    cells, run = guidellm_csv_cells(path), load_peer(path)
    for ours, group, unit, to_ms in (
        ("e2e_ms", "Request Latency", "Successful Sec", 1e3),
        ("ttft_ms", "Time to First Token", "Successful ms", 1.0),
        ("tpot_ms", "Inter Token Latency", "Successful ms", 1.0),  # its ITL: our TPOT
    ):
        listed = json.loads(cells[(group, unit, "Percentiles")])  # min, p0.1, p1, p5, p10, p25, p75, p90, p95, p99, max
        want = {"mean": float(cells[(group, unit, "Mean")]), "p50": float(cells[(group, unit, "Median")])}
        want |= {"std": float(cells[(group, unit, "Std Dev")]), "min": listed[0], "max": listed[-1]}
        want |= {"p90": listed[7], "p95": listed[8], "p99": listed[9]}
        for stat, value in want.items():
            assert run.summary[ours][stat] == pytest.approx(value * to_ms, rel=1e-12), (ours, stat)
        assert run.summary[ours]["p999"] is None  # the CSV lists no p99.9
    mean_tpot = float(cells[("Time per Output Token", "Successful ms", "Mean")])
    assert run.summary["peer_figures"]["time_per_output_token_ms"]["mean"] == pytest.approx(mean_tpot)
    assert run.summary["throughput"]["output_tokens_per_s"] == float(
        cells[("Token Throughput", "Successful Output Tokens/Sec", "Mean")]
    )
    assert run.version == json.loads(cells[("Runtime Info", "Metadata", "")])["guidellm_version"]
    assert run.records == [] and any("not established: no samples" in line for line in run.differences)


def test_guidellm_csv_shows_what_its_json_twin_shows():
    # the same run saved both ways (--outputs json,csv): every figure the CSV has equals the JSON reader's
    from_csv, from_json = load_peer(GUIDELLM_CSV).summary, load_peer(GUIDELLM_CSV.with_suffix(".json")).summary
    for key in ("requests", "window_s", "throughput"):
        assert from_csv[key] == from_json[key], key
    for key in ("ttft_ms", "tpot_ms", "e2e_ms"):
        given = {stat: value for stat, value in from_csv[key].items() if value is not None}
        assert given == pytest.approx({stat: from_json[key][stat] for stat in given}, rel=1e-12), key


def test_a_guidellm_csv_cut_in_its_benchmark_row_exits_2_naming_guidellm(tmp_path):
    text = GUIDELLM_CSV.read_text(encoding="utf-8")
    cut = tmp_path / "benchmarks.csv"
    cut.write_text(text[: len(text) - 2000], encoding="utf-8")  # the row loses its last columns
    result = cli("report", cut, "-o", tmp_path / "r.html")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "GuideLLM benchmarks.csv" in message and "columns (cut short?)" in message


def test_a_guidellm_csv_cut_in_its_header_exits_2_naming_the_missing_group(tmp_path):
    text = GUIDELLM_CSV.read_text(encoding="utf-8")
    cut = tmp_path / "benchmarks.csv"
    cut.write_text(text[: text.index("Server Throughput")], encoding="utf-8")
    result = cli("report", cut, "-o", tmp_path / "r.html")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "closest to GuideLLM" in message and "lacks Server Throughput" in message


def test_a_late_2025_aiperf_record_without_its_start_is_refused_naming_the_field(tmp_path):
    lines = AIPERF_2025_RECORDS.read_text(encoding="utf-8").splitlines()
    first = json.loads(lines[0])
    del first["metadata"]["timestamp_ns"]
    edited = tmp_path / "profile_export.jsonl"
    edited.write_text("\n".join([json.dumps(first), *lines[1:]]) + "\n", encoding="utf-8")
    result = cli("report", edited, "-o", tmp_path / "r.html")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "not a AIPerf result file" in message and "metadata.timestamp_ns" in message


def test_a_late_2025_aiperf_records_file_cut_short_exits_2_naming_its_shape(tmp_path):
    text = AIPERF_2025_RECORDS.read_text(encoding="utf-8")
    cut = tmp_path / "profile_export.jsonl"
    cut.write_text(text[: len(text) - 500], encoding="utf-8")  # the last line cut in the middle
    result = cli("report", cut, "-o", tmp_path / "r.html")
    assert result.exit_code == 2, result.output
    message = " ".join(result.output.split())
    assert "closest to AIPerf" in message and "timestamp_ns (late 2025" in message and "does not parse" in message
