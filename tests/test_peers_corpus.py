"""The corpus of other tools' result files as found in public repositories (tests/fixtures/peers/manifest.yaml: each
file's source, its shape, and headline figures copied from the file itself): each is known by its content, read by
the reader the manifest names, and shows the file's own figures; a truncated or foreign file is refused with exit 2
naming the closest tool and what it lacks; a summary-only or failed run gives no latency it does not have."""

from __future__ import annotations

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
    assert len(FOUND) >= 24  # 30 found in public repositories (4 more recorded here)
    assert all(len(per_tool[t]) >= 2 for t in ("vLLM bench serve", "SGLang bench_serving", "AIPerf", "GuideLLM"))
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
