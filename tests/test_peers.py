"""Peer tools' result files (reports/peers): each real fixture (tests/fixtures/peers/<tool>/, recorded here against
llama-server, see its README) reproduces every figure the tool printed on its console, parsed independently from
the saved console text; and they load into bench report, select and gate beside a run of ours."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from harness.results.folder import ResultsError
from reports.cli import gate as gate_command
from reports.peers import find_peer_file, load_peer
from reports.report import build_report
from reports.select import write_selection

FIXTURES = Path(__file__).parent / "fixtures" / "peers"
VLLM = FIXTURES / "vllm" / "vllm-bench-serve.json"
SGLANG = FIXTURES / "sglang" / "sglang-bench-serving.jsonl"
AIPERF = FIXTURES / "aiperf" / "artifacts"
GUIDELLM = FIXTURES / "guidellm" / "benchmarks.json"
BENCH_RUN = FIXTURES / "bench-run"


def console_values(path: Path) -> dict[str, str]:
    """`Label: value` lines of a tool's console (vLLM's and SGLang's result block) as label -> printed text."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        match = re.match(r"^([A-Za-z][^:]*):\s+([-0-9.]+)\s*$", line)
        if match:
            out[match[1].strip()] = match[2]
    return out


def figure(summary: dict, key: str):
    value = summary
    for part in key.split("."):
        value = value[part]
    return value


def assert_printed(summary: dict, printed: dict[str, str], mapping: dict[str, tuple[str, str]]) -> None:
    """Every console label of `mapping` is printed and our summary's figure, formatted as the tool does, matches it."""
    missing = sorted(set(mapping) - set(printed))
    assert not missing, f"not on the console: {missing}"
    for label, (key, fmt) in mapping.items():
        assert format(figure(summary, key), fmt) == printed[label], (label, key)


def latency_rows(name: str, ours: str, stats) -> dict[str, tuple[str, str]]:
    words = {"Mean": "mean", "Median": "p50", "P50": "p50", "P90": "p90", "P95": "p95", "P99": "p99", "Max": "max"}
    return {f"{w} {name} (ms)": (f"{ours}.{words[w]}", ".2f") for w in stats}


def test_vllm_file_reproduces_its_console():
    run = load_peer(VLLM)
    mapping = {
        "Successful requests": ("requests.completed", "d"),
        "Failed requests": ("requests.failed", "d"),
        "Benchmark duration (s)": ("window_s", ".2f"),
        "Total generated tokens": ("output_tokens", "d"),
        "Request throughput (req/s)": ("throughput.requests_per_s", ".2f"),
        "Output token throughput (tok/s)": ("throughput.output_tokens_per_s", ".2f"),
        "Total token throughput (tok/s)": ("throughput.total_tokens_per_s", ".2f"),
    }
    every = ("Mean", "Median", "P50", "P90", "P95", "P99")
    for name, ours in (("TTFT", "ttft_ms"), ("TPOT", "tpot_ms"), ("ITL", "itl_chunk_ms"), ("E2EL", "e2e_ms")):
        mapping |= latency_rows(name, ours, every)
    assert_printed(run.summary, console_values(VLLM.parent / "console.txt"), mapping)
    assert len(run.records) == run.summary["requests"]["measured"]
    assert any("per streamed chunk" in d for d in run.differences)


def test_sglang_file_reproduces_its_console():
    run = load_peer(SGLANG)
    mapping = {
        "Successful requests": ("requests.completed", "d"),
        "Benchmark duration (s)": ("window_s", ".2f"),
        "Total generated tokens": ("output_tokens", "d"),
        "Request throughput (req/s)": ("throughput.requests_per_s", ".2f"),
        "Output token throughput (tok/s)": ("throughput.output_tokens_per_s", ".2f"),
        "Total token throughput (tok/s)": ("throughput.total_tokens_per_s", ".2f"),
    }
    mapping |= latency_rows("E2E Latency", "e2e_ms", ("Mean", "Median", "P90", "P99"))
    mapping |= latency_rows("TTFT", "ttft_ms", ("Mean", "Median", "P99"))
    mapping |= latency_rows("TPOT", "tpot_ms", ("Mean", "Median", "P99"))
    mapping |= latency_rows("ITL", "itl_chunk_ms", ("Mean", "Median", "P95", "P99", "Max"))
    assert_printed(run.summary, console_values(SGLANG.parent / "console.txt"), mapping)
    assert any("no send times" in d for d in run.differences)


def table_rows(path: Path, sep: str) -> list[list[str]]:
    """The cells of each row of a console table drawn with `sep` between cells."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip(sep).split(sep)]
        if len(cells) > 2:
            rows.append(cells)
    return rows


def test_aiperf_artifacts_reproduce_its_console():
    run = load_peer(AIPERF)  # the artifact folder, as `aiperf profile --artifact-dir` left it
    columns = ("mean", "min", "max", "p99", "p90", "p50", "std")  # its avg, min, max, p99, p90, p50, std
    rows = {r[0]: r[1:] for r in table_rows(AIPERF.parent / "console.txt", "│")}
    for label, ours in (
        ("Time to First Token (ms)", "ttft_ms"),
        ("Request Latency (ms)", "e2e_ms"),
        ("Inter Token Latency (ms)", "tpot_ms"),  # AIPerf's ITL is per request: our TPOT
    ):
        printed = rows[label]
        assert [f"{run.summary[ours][c]:,.2f}" for c in columns] == printed, label
    assert f"{run.summary['throughput']['requests_per_s']:.2f}" == rows["Request Throughput (requests/sec)"][0]
    assert f"{run.summary['throughput']['output_tokens_per_s']:.2f}" == rows["Output Token Throughput (tokens/sec)"][0]
    assert f"{run.summary['requests']['completed']:.2f}" == rows["Request Count (requests)"][0]
    assert len(run.records) == 16 and all(r.ok for r in run.records)


def test_guidellm_file_reproduces_its_console():
    run = load_peer(GUIDELLM)
    rows = [r for r in table_rows(GUIDELLM.parent / "console.txt", "|") if r[0].startswith("poisson@")]
    latency, throughput = rows[0][1:], rows[1][1:]

    def printed(cell: str) -> str:  # "4.0 ± 0.4" (mean and its interval), "4.8*" (no interval)
        return cell.split(" ± ")[0].rstrip("*")

    s = run.summary
    tpot = s["peer_figures"]["time_per_output_token_ms"]
    ours = [s["e2e_ms"][k] / 1e3 for k in ("mean", "p50", "p95")]  # its request latency is in seconds
    ours += [s["ttft_ms"][k] for k in ("mean", "p50", "p95")] * 2  # TTFT, then TTFOT (the same without reasoning)
    ours += [s["tpot_ms"][k] for k in ("mean", "p50", "p95")]  # its ITL: our TPOT
    ours += [tpot[k] for k in ("mean", "p50", "p95")]  # its TPOT: none of ours
    assert [f"{v:.1f}" for v in ours] == [printed(c) for c in latency]
    assert f"{s['throughput']['requests_per_s']:.1f}" == throughput[2]
    assert f"{s['throughput']['output_tokens_per_s']:.1f}" == throughput[4]
    assert f"{s['throughput']['total_tokens_per_s']:.1f}" == throughput[5]
    assert any("includes the first token" in d for d in run.differences)


def test_a_file_of_no_known_tool_is_refused_by_name(tmp_path):
    odd = tmp_path / "result.json"
    odd.write_text(json.dumps({"duration": 3.0}))
    assert find_peer_file(odd) is None
    with pytest.raises(ResultsError, match="result.json: not a result file of a known tool"):
        load_peer(odd)


def test_report_shows_a_peer_file_beside_a_bench_run_with_the_differences_named():
    content = build_report([BENCH_RUN, VLLM, SGLANG, AIPERF, GUIDELLM])
    labels = [row[0] for row in content.summary_rows]
    assert labels == ["bench-run", VLLM.name, SGLANG.name, AIPERF.name, GUIDELLM.name]
    vllm_row = content.summary_rows[1]
    run = load_peer(VLLM)
    assert vllm_row[7] == f"{run.summary['ttft_ms']['p50']:,.1f}"  # TTFT p50 as vLLM printed it
    notes = " ".join(content.notes)
    assert f"{VLLM.name} (vLLM bench serve, read from its own file): ITL is per streamed chunk" in notes
    assert "intended send" in notes and "no send times" in notes
    assert "Inter Token Latency is per request" in notes and "includes the first token's wait" in notes
    assert not any(n.startswith("bench-run") for n in content.notes)  # our own run carries no such note


def gate(*args):
    app = typer.Typer()
    app.command("gate")(gate_command)
    app.command("other")(lambda: None)
    return CliRunner().invoke(app, ["gate", *map(str, args)])


def test_gate_judges_a_peer_file_and_finds_a_slower_copy(tmp_path):
    rules = tmp_path / "rules.yaml"  # the fixture has 16 requests: the built-in rules want 20 a run
    rules.write_text(
        "min_samples: 10\nmetrics:\n  ttft_p50: {source: ttft, statistic: p50, better: lower, threshold: 0.1}\n"
    )
    same = gate(VLLM, VLLM, "--rules", rules)
    assert same.exit_code == 0, same.output
    assert "ttft_p50" in same.output
    slower = tmp_path / "slower.json"
    obj = json.loads(VLLM.read_text())
    obj["ttfts"] = [3 * t for t in obj["ttfts"]]  # every first token three times later
    slower.write_text(json.dumps(obj))
    worse = gate(VLLM, slower, "--rules", rules)
    assert worse.exit_code == 1, worse.output
    assert "regress" in worse.output.lower()


def test_select_ranks_peer_files(tmp_path):
    sel = write_selection([VLLM, SGLANG], tmp_path / "sel.html", slo={"ttft_ms": 60_000.0})
    assert set(sel.ranking) == {VLLM.name, SGLANG.name}
    assert (tmp_path / "sel.md").read_text().count("|") > 0


def test_a_folder_holding_one_peer_file_is_read_as_it(tmp_path):
    shutil.copy(VLLM, tmp_path / VLLM.name)
    assert find_peer_file(tmp_path) == tmp_path / VLLM.name
    shutil.copy(VLLM, tmp_path / "again.json")
    with pytest.raises(ResultsError, match="several peer result files"):
        find_peer_file(tmp_path)


def test_a_peer_file_of_another_shape_is_refused_naming_the_field(tmp_path):
    obj = json.loads(VLLM.read_text())
    obj["completed"] = "sixteen"
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(obj))
    with pytest.raises(
        ResultsError, match=r"bad.json: not a vLLM bench serve result file this reader knows \(completed"
    ):
        load_peer(bad)


def test_a_null_in_a_peer_file_reads_as_absent(tmp_path):
    obj = json.loads(GUIDELLM.read_text())
    request = obj["benchmarks"][-1]["requests"]["successful"][0]
    request["output_metrics"], request["output_tokens"] = None, 16  # the count from before output_metrics
    obj["metadata"] = None
    edited = tmp_path / "benchmarks.json"
    edited.write_text(json.dumps(obj))
    run, original = load_peer(edited), load_peer(GUIDELLM)
    assert run.version == "unknown" and run.summary == original.summary
    assert [r.output_tokens for r in run.records] == [r.output_tokens for r in original.records]
