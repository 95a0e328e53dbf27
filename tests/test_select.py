"""`bench select`: capacity within SLOs per engine, cost per million tokens, a recommendation with caveats."""
import json

import pytest
import typer
from typer.testing import CliRunner

from reports.cli import report as report_command, select as select_command
from reports.select import parse_slo, select, write_selection
from test_report import synthetic_records, write_run, write_sweep

SLO = {"ttft_ms": 200.0, "tpot_ms": 50.0}


def test_cheaper_engine_is_recommended_with_its_numbers(tmp_path):
    fast = write_sweep(tmp_path / "fast", rates=(1, 2, 4, 8), capacity_rps=6)
    slow = write_sweep(tmp_path / "slow", rates=(1, 2, 4, 8), capacity_rps=2, seed=5)
    sel = write_selection([slow, fast], tmp_path / "sel.html", slo=SLO, gpu_cost_per_hour=3.0, accelerators=2)
    by = {e.label: e for e in sel.engines}
    assert by["fast"].capacity.offered_load > by["slow"].capacity.offered_load
    for e in sel.engines:
        assert e.capacity.status == "bracketed"
        assert e.tokens_per_s_per_accelerator == pytest.approx(e.capacity.output_tokens_per_s / 2)
        assert e.cost_per_million_tokens == pytest.approx(3.0 / (e.tokens_per_s_per_accelerator * 3600) * 1e6)
    assert sel.recommendation.startswith("Choose fast:")
    ratio = by["slow"].cost_per_million_tokens / by["fast"].cost_per_million_tokens
    assert f"{ratio:.1f}× cheaper per token than slow" in sel.recommendation
    md = (tmp_path / "sel.md").read_text()
    assert sel.recommendation in md and "## Caveats" in md and "this hardware" in md
    html = (tmp_path / "sel.html").read_text()
    assert html.count("Plotly.newPlot") == 3 and "Choose fast" in html


def test_stricter_slo_lowers_capacity_and_can_rule_an_engine_out(tmp_path):
    fast = write_sweep(tmp_path / "fast", capacity_rps=6)
    loose = select([fast], slo=SLO, gpu_cost_per_hour=1.0).engines[0]
    strict = select([fast], slo={"ttft_ms": 70.0}, gpu_cost_per_hour=1.0).engines[0]
    assert strict.capacity.offered_load is None or strict.capacity.offered_load < loose.capacity.offered_load
    none = select([fast], slo={"ttft_ms": 1.0}, gpu_cost_per_hour=1.0)
    assert none.engines[0].cost_per_million_tokens is None
    assert none.recommendation.startswith("No engine met the SLOs")


def test_single_runs_and_different_workloads(tmp_path):
    a = write_run(tmp_path / "a", synthetic_records(rate=4.0), rate=4.0, kind="vllm")
    b = write_run(tmp_path / "b", synthetic_records(rate=4.0), rate=4.0, kind="llamacpp")
    run_json = json.loads((b / "run.json").read_text())
    run_json["scenario"]["workload"] = {"input_tokens": 1024}
    (b / "run.json").write_text(json.dumps(run_json))
    sel = select([a, b], slo=SLO, gpu_cost_per_hour=1.0, labels=["vLLM", "llama.cpp"])
    assert [e.capacity.offered_load for e in sel.engines] == [4.0, 4.0]
    assert all(e.capacity.status == "at_least" for e in sel.engines)
    assert [e.backend for e in sel.engines] == ["vllm (smollm2)", "llamacpp (smollm2)"]
    assert sel.caveats[0].startswith("WARNING: the engines were run with different workloads")


def test_parse_slo():
    assert parse_slo("ttft_ms=500, tpot_ms=50") == {"ttft_ms": 500.0, "tpot_ms": 50.0}
    for bad, message in (("ttft=500", "KEY one of"), ("ttft_ms=fast", "not a number"), ("ttft_ms=0", "> 0"),
                         ("", "empty")):
        with pytest.raises(ValueError, match=message):
            parse_slo(bad)


def test_cli(tmp_path):
    app = typer.Typer()
    app.command("select")(select_command)
    app.command("report")(report_command)
    fast = write_sweep(tmp_path / "fast", capacity_rps=6)
    out = tmp_path / "o" / "choice.html"
    ok = CliRunner().invoke(app, ["select", str(fast), "--slo", "ttft_ms=200,tpot_ms=50",
                                  "--gpu-cost-per-hour", "2", "-o", str(out)])
    assert ok.exit_code == 0, ok.output
    assert ok.output.startswith("Choose fast") and out.is_file() and out.with_suffix(".md").is_file()
    bad = CliRunner().invoke(app, ["select", str(fast), "--slo", "ttft_ms=200", "--gpu-cost-per-hour", "0"])
    assert bad.exit_code == 2 and "--gpu-cost-per-hour" in bad.output
    missing = CliRunner().invoke(app, ["report", str(tmp_path / "nope")])
    assert missing.exit_code == 2 and "not a folder" in missing.output


def test_concurrency_sweep_reports_requests_in_flight(tmp_path):
    root = tmp_path / "closed"
    for i, c in enumerate((1, 2, 8)):
        write_run(root / f"point-{i:03d}-concurrency-{c}", synthetic_records(n=30, ttft_s=0.05 * c, seed=i))
    sel = select([root], slo=SLO, gpu_cost_per_hour=1.0)
    (engine,) = sel.engines
    assert engine.load_kind == "concurrency" and engine.capacity.status == "bracketed"
    assert engine.capacity_text().endswith(f"in flight ({engine.capacity.requests_per_s:.3g} req/s)")
    assert "requests in flight" in sel.recommendation
