"""`bench report`: results folders (synthetic, and real ones from the ground-truth server) -> HTML + Markdown."""

import json
from pathlib import Path

import numpy as np
import pytest
from helpers import synthetic_records, write_run, write_sweep
from plotly.offline import get_plotlyjs

from reports.load import ResultsError, load_results, load_run
from reports.report import write_report
from reports.sweep import max_rate_meeting_slo


def test_report_of_two_runs_overlays_them_and_reports_server_metrics(tmp_path):
    a = write_run(tmp_path / "a", synthetic_records(seed=1), server_metrics=True, telemetry=True)
    b = write_run(tmp_path / "b", synthetic_records(seed=2, ttft_s=0.1, fail_every=10))
    content = write_report([a, b], tmp_path / "out" / "report.html")
    html = (tmp_path / "out" / "report.html").read_text()
    md = (tmp_path / "out" / "report.md").read_text()
    headings = [h for h, _ in content.figures]
    assert headings[:4] == ["Latency distributions", "Over time", "Server metrics", "Device telemetry"]
    assert headings[4:] == ["Timeline: a", "Timeline: b"]
    assert html.count("Plotly.newPlot") == len(headings)
    # plotly.js is inlined exactly once and nothing is fetched from the network
    assert html.count(get_plotlyjs()[:300]) == 1 and "<script src" not in html
    # the summary table: b failed 6 of 60 requests, and its TTFT p50 is about twice a's
    rows = {r[0]: r for r in content.summary_rows}
    assert rows["a"][1:3] == ["60", "0"] and rows["b"][1:3] == ["54", "6"]
    assert 1.7 < float(rows["b"][7]) / float(rows["a"][7]) < 2.3
    assert "| a | 60 | 0 |" in md and "| b | 54 | 6 |" in md
    # the CDF of run a holds its own TTFTs: its largest x is the run's max TTFT
    cdf = content.figures[0][1]
    first = next(t for t in cdf.data if t.name == "a")
    assert max(first.x) == pytest.approx(load_run(a).requests["ttft_s"].max() * 1e3)
    server = content.figures[2][1]
    assert {t.name for t in server.data} == {"a model=smollm2", "a"}
    assert [a.text for a in server.layout.annotations] == [
        "num_requests_running",
        "kv_cache_usage_perc",
        "prefix cache hit rate",
    ]
    assert set(np.round(server.data[2].y, 6)) == {0.75}  # derived from the counters' increase
    device = content.figures[3][1]
    assert [a.text for a in device.layout.annotations] == ["cpu_percent", "read_bytes_per_s", "memory_used_bytes"]
    assert [t.name for t in device.data] == ["a engine_process", "a engine_metrics", "a host"]


def test_report_without_optional_csvs_skips_those_plots(tmp_path):
    a = write_run(tmp_path / "only", synthetic_records())
    content = write_report([a], tmp_path / "r.html")
    assert [h for h, _ in content.figures] == ["Latency distributions", "Over time", "Timeline: only"]


def test_sweep_report_states_interpolated_capacity(tmp_path):
    sweep = write_sweep(tmp_path / "sweep")
    content = write_report([sweep], tmp_path / "s.html")
    (section,) = content.sweeps
    assert [p.offered_load for p in section.sweep.points] == [1, 2, 4, 8]
    cap = section.capacity
    assert cap.status == "bracketed" and 4 < cap.offered_load < 8
    fractions = [p.run.summary.goodput.fraction for p in section.sweep.points]
    assert fractions[2] >= 0.9 > fractions[3]
    # linear interpolation between the last passing and first failing point
    expected = 4 + (fractions[2] - 0.9) / (fractions[2] - fractions[3]) * 4
    assert cap.offered_load == pytest.approx(expected)
    md = (tmp_path / "s.md").read_text()
    assert f"{cap.offered_load:.3g} req/s" in md
    assert [h for h, _ in content.figures] == [
        "Goodput against offered load",
        "Throughput against latency",
        "Latency distributions per point: sweep",
    ]
    assert [t.name for t in content.figures[2][1].data][::4] == ["rate 1", "rate 2", "rate 4", "rate 8"]


def test_max_rate_meeting_slo_edges(tmp_path):
    sweep = load_results([write_sweep(tmp_path / "sw", rates=(1, 2), capacity_rps=10)])[1][0]
    cap = max_rate_meeting_slo(sweep.points)
    assert cap.status == "at_least" and cap.offered_load == 2
    assert max_rate_meeting_slo(sweep.points, slo={"ttft_ms": 1.0}).status == "none"
    with pytest.raises(ValueError, match="attainment"):
        max_rate_meeting_slo(sweep.points, attainment=1.5)


def test_killed_run_without_summary_is_still_reported(tmp_path):
    a = write_run(tmp_path / "cut", synthetic_records(n=20))
    (a / "summary.json").unlink()
    run = load_run(a)
    assert run.summary.requests.completed == 20


def test_bad_folders_get_clear_errors(tmp_path):
    with pytest.raises(ResultsError, match="not a folder"):
        load_results([tmp_path / "missing"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(ResultsError, match="point-NNN-rate"):
        load_results([tmp_path / "empty"])
    a = write_run(tmp_path / "a", synthetic_records(n=5))
    with pytest.raises(ResultsError, match="--label: got 2 labels for 1"):
        load_results([a], labels=["x", "y"])
    (a / "run.json").write_text("{broken")
    with pytest.raises(ResultsError, match="run.json: not valid JSON"):
        load_run(a)


def test_report_of_a_real_run_against_the_ground_truth_server(tmp_path):
    """A run through the real runner and results writer; the report's ITL CDF sits on the server's ITL."""
    from groundtruth_server import GroundTruthConfig, GroundTruthProcess, gt_request

    from harness.client.runner import Runner, Target, run_blocking

    with GroundTruthProcess(GroundTruthConfig(ttft_ms=40.0, itl_ms=8.0)) as gt:
        reqs = [gt_request(i, i * 0.05, 12) for i in range(30)]
        out = run_blocking(lambda: Runner(Target(url=gt.url), reqs))
    write_run(tmp_path / "gt", out.records, slo={"ttft_ms": 500.0})
    content = write_report([tmp_path / "gt"], tmp_path / "gt.html")
    run = content.runs[0]
    assert np.median(run.itl_s) * 1e3 == pytest.approx(8.0, abs=1.5)
    assert json.loads((tmp_path / "gt" / "summary.json").read_text())["requests"]["completed"] == 30
    assert content.summary_rows[0][1:3] == ["30", "0"]


def test_concurrency_sweep_and_mixed_sweeps_are_told_apart(tmp_path):
    root = tmp_path / "conc"
    for i, c in enumerate((1, 4, 16)):
        write_run(root / f"point-{i:03d}-concurrency-{c}", synthetic_records(n=30, ttft_s=0.05 * c, seed=i))
    content = write_report([root], tmp_path / "c.html")
    sweep = content.sweeps[0].sweep
    assert sweep.load_kind == "concurrency" and [p.offered_load for p in sweep.points] == [1, 4, 16]
    assert "in flight" in (tmp_path / "c.md").read_text()
    assert content.figures[0][1].layout.xaxis.title.text == "requests in flight"
    write_run(root / "point-003-rate-2", synthetic_records(n=5))
    with pytest.raises(ResultsError, match="mixes rate and concurrency"):
        load_results([root])


def test_server_metrics_in_the_harness_schema(tmp_path):
    """harness/engine/server_metrics.py also writes `bench:` names; those are what the report plots."""
    a = write_run(tmp_path / "a", synthetic_records())
    rows = ["t_s,name,value,labels"]
    for k, t in enumerate(np.arange(0, 10, 0.5)):
        rows += [
            f"{t},native:num_requests_running,{k % 4},model_name=x",
            f"{t},bench:running,{k % 4},",
            f"{t},bench:waiting,{k % 3},",
            f"{t},bench:kv_usage_fraction,0.5,",
            f"{t},bench:generation_tokens,{100 + 40 * k},",
            f"{t},bench:prefix_cache_hit_rate,0.1,",
        ]
    (a / "server_metrics.csv").write_text("\n".join(rows) + "\n")
    content = write_report([a], tmp_path / "r.html")
    fig = dict(content.figures)["Server metrics"]
    assert [x.text for x in fig.layout.annotations] == [
        "requests running",
        "requests waiting",
        "KV cache in use (fraction)",
        "generation tokens/s (engine's count)",
        "prefix cache hit rate",
    ]
    assert set(fig.data[3].y) == {80.0}  # 40 tokens per 0.5 s scrape


def test_the_offered_load_is_said_for_each_kind_of_load():
    from reports.report import offered_text
    from reports.run_files import LoadView

    assert offered_text(LoadView(arrival="poisson", rate=4)) == "poisson rate 4/s"
    assert offered_text(LoadView(arrival="closed", concurrency=8)) == "closed concurrency 8"
    # an offline run sets neither a rate nor a concurrency: the count sent at once, never "concurrency None"
    assert offered_text(LoadView(arrival="offline", num_requests=3000)) == "offline, 3,000 requests"
    assert offered_text(None) == "-"


def test_the_devices_table_reads_back_each_runs_telemetry_figures(tmp_path):
    # a measured run of the built-in engine (a fixture folder): its summary's telemetry as the report's row, the
    # figures read from the file here; a run without telemetry figures gets no row, a report of none no table
    measured = Path(__file__).parent / "fixtures" / "results_v0" / "run"
    figures = json.loads((measured / "summary.json").read_text())["telemetry"]
    plain = write_run(tmp_path / "plain", synthetic_records())
    content = write_report([measured, plain], tmp_path / "out" / "report.html", labels=["measured", "plain"])
    assert content.telemetry_rows == [
        [
            "measured",
            "-",  # no GPU sampled: no energy, no DRAM or tensor activity
            "-",
            "-",
            "-",
            f"{figures['mbu']:.1%}",
            f"{figures['engine_cpu_percent_mean']:,.0f}",
            f"{figures['engine_rss_bytes_max'] / 1024**3:,.2f}",
        ]
    ]
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## Devices" in md and f"| measured | - | - | - | - | {figures['mbu']:.1%} |" in md
    assert "<h2>Devices</h2>" in (tmp_path / "out" / "report.html").read_text()
    assert write_report([plain], tmp_path / "none" / "report.html").telemetry_rows == []
