"""Every file of the peer corpus (tests/fixtures/peers/manifest.yaml) through the commands: `bench report` builds a
row for it, `bench gate` judges it against itself without a regression, `bench history add` records it, `bench
select` ranks every one and states no SLO verdict for a file with no per-request samples, and `bench import` writes
it as a results folder of ours."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from reports.cli import gate as gate_command
from reports.gate import load_rules
from reports.history import add_runs
from reports.history_gate import gate_history
from reports.peers.import_cli import PEER_FILE, import_command, import_peer
from reports.report import build_report
from reports.select import write_selection

FIXTURES = Path(__file__).parent / "fixtures" / "peers"
MANIFEST = yaml.safe_load((FIXTURES / "manifest.yaml").read_text(encoding="utf-8"))
FILES = [FIXTURES / e["file"] for e in MANIFEST]
VLLM_SUMMARY_ONLY = FIXTURES / "vllm" / "v0.25.1" / "bench_serve_v0.25.1.json"
VLLM_FAILED = FIXTURES / "vllm" / "v0.25.1" / "bench_serve_all_requests_failed_v0.25.1.json"


def cli(command, name: str, *args):
    app = typer.Typer()
    app.command(name)(command)
    app.command("other")(lambda: None)  # two commands: typer keeps the command's name on the line
    return CliRunner().invoke(app, [name, *map(str, args)])


def test_report_builds_a_row_for_every_file():
    content = build_report(FILES)
    assert len(content.summary_rows) == len(FILES)  # one row each
    notes = " ".join(content.notes)
    assert "not established: no samples" in notes  # said of the summary-only files


@pytest.mark.parametrize("path", FILES, ids=[e["file"] for e in MANIFEST])
def test_gate_judges_each_file_against_itself_without_a_regression(path):
    result = cli(gate_command, "gate", path, path)
    assert result.exit_code == 0, result.output  # the same file: never a regression (1), never bad input (2)


def test_history_add_records_every_file_once(tmp_path):
    db = tmp_path / "history.db"
    first = add_runs(db, FILES, batch="night-1", commit="c1", branch="main")
    again = add_runs(db, FILES, batch="night-2", commit="c1", branch="main")
    # one run per distinct file of the corpus; the same bytes again are the same run
    assert len(first.added) == len(FILES) and len(again.already) == len(FILES)


def test_select_states_no_slo_verdict_from_zero_samples(tmp_path):
    detailed = FIXTURES / "vllm" / "vllm-bench-serve.json"
    write_selection([VLLM_SUMMARY_ONLY, VLLM_FAILED, detailed], tmp_path / "sel.html", slo={"ttft_ms": 1000.0})
    text = (tmp_path / "sel.md").read_text(encoding="utf-8")
    assert "0 of 0 requests" not in text and "did not meet the SLOs" not in text
    assert "not established: the file holds the tool's figures only" in text
    assert "its own TTFT p99 734 ms" in text  # the file's p99_ttft_ms, 734.40
    assert "not established: no request completed" in text


def test_select_ranks_every_file_and_never_judges_zero_samples(tmp_path):
    # the whole corpus at once: a ranked row per file, and where a file has no per-request sample (summary only, or
    # none completed) its row says so instead of a verdict
    selection = write_selection(FILES, tmp_path / "sel.html", slo={"ttft_ms": 1000.0})
    assert len(selection.engines) == len(FILES)
    text = (tmp_path / "sel.md").read_text(encoding="utf-8")
    assert "0 of 0 requests" not in text
    table = [line for line in text.splitlines() if line.startswith("| ") and line[2:3].isdigit()]
    assert len(table) == len(FILES)
    no_samples = [line for line in table if "the file holds the tool's figures only" in line]
    assert no_samples and all("| none |" in line for line in no_samples)  # no capacity claimed from no samples


def test_import_writes_a_results_folder_with_the_tools_figures_and_its_source(tmp_path):
    out = tmp_path / "run"
    import_peer(FIXTURES / "vllm" / "vllm-bench-serve.json", out)
    summary = json.loads((out / "summary.json").read_text())
    note = json.loads((out / PEER_FILE).read_text())
    assert summary["ttft_ms"]["p50"] == pytest.approx(221.30703699986043)  # the file's median_ttft_ms
    assert len((out / "requests.jsonl").read_text().splitlines()) == 16  # its 16 detailed requests
    assert note["tool"] == "vLLM bench serve" and len(note["source_sha256"]) == 64
    assert any("per streamed chunk" in d for d in note["differences"])


def test_import_of_a_foreign_file_exits_2(tmp_path):
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"benchmarks": [{"name": "x"}]}))
    result = cli(import_command, "import", odd, "--output", tmp_path / "run")
    assert result.exit_code == 2 and "closest to GuideLLM" in result.output
    assert not (tmp_path / "run").exists()


def test_gate_against_history_of_peer_files_states_no_verdict_on_no_samples(tmp_path):
    # three nights of vLLM's sweep runs (summary only), tonight a fourth: every metric inconclusive on 0 samples
    sweep = FIXTURES / "vllm" / "sweep_v0.25.1"
    four, eight = (
        sweep / "SERVE--max_num_seqs=4-BENCH--max_concurrency=2-num_prompts=8",
        sweep / ("SERVE--max_num_seqs=8-BENCH--max_concurrency=2-num_prompts=8"),
    )
    db = tmp_path / "history.db"
    for night, path in enumerate((four / "run=0.json", four / "run=1.json", eight / "run=0.json")):
        add_runs(db, [path], batch=f"night-{night}", commit="c", branch="main")
    result = gate_history(db, eight / "run=1.json", load_rules(None), last=14, min_history=2)
    assert result is not None and not result.failed
    assert [m.verdict.verdict for m in result.metrics] == ["inconclusive"] * 5  # the 5 built-in rules
