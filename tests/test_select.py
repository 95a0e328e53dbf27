"""`bench select`: capacity within SLOs per engine, cost per million tokens, a recommendation with caveats."""

import json

import pytest
import typer
from helpers import synthetic_records, write_run, write_sweep
from typer.testing import CliRunner

from reports.cli import report as report_command
from reports.cli import select as select_command
from reports.select import parse_slo, rows, select, write_selection

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
    for bad, message in (
        ("ttft=500", "KEY one of"),
        ("ttft_ms=fast", "not a number"),
        ("ttft_ms=0", "> 0"),
        ("", "empty"),
    ):
        with pytest.raises(ValueError, match=message):
            parse_slo(bad)


def test_cli(tmp_path):
    app = typer.Typer()
    app.command("select")(select_command)
    app.command("report")(report_command)
    fast = write_sweep(tmp_path / "fast", capacity_rps=6)
    out = tmp_path / "o" / "choice.html"
    ok = CliRunner().invoke(
        app, ["select", str(fast), "--slo", "ttft_ms=200,tpot_ms=50", "--gpu-cost-per-hour", "2", "-o", str(out)]
    )
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


def _as_launched_on_cpu(sweep, version: str, args: list[str], model: str) -> None:
    """Give a synthetic sweep's run.json what a launched CPU-only run records."""
    for run_json in sweep.glob("point-*/run.json"):
        info = json.loads(run_json.read_text())
        info["backend"].update(engine_version=version, model=model)
        info["scenario"]["backend"]["launch"] = {"args": args}
        sampled, not_sampled = ["engine_process", "host"], {"gpu": "NVML did not start"}
        info["telemetry"] = {"sampled": sampled, "not_sampled": not_sampled, "errors": {}}
        run_json.write_text(json.dumps(info))


def test_caveats_name_engine_versions_flags_and_cpu_only(tmp_path):
    fast = write_sweep(tmp_path / "fast", capacity_rps=6)
    slow = write_sweep(tmp_path / "slow", capacity_rps=2, seed=5)
    _as_launched_on_cpu(fast, "b1-0c1e570", ["-t", "2", "--parallel", "16"], "/models/SmolLM2.Q4_1.gguf")
    _as_launched_on_cpu(slow, None, [], "smollm2")
    sel = select([fast, slow], slo=SLO, gpu_cost_per_hour=0.085)
    assert [e.backend for e in sel.engines] == ["native (SmolLM2.Q4_1.gguf)", "native (smollm2)"]
    where = next(c for c in sel.caveats if c.startswith("Measured on this hardware"))
    assert "fast: native b1-0c1e570 started with `-t 2 --parallel 16`, on test (2 CPUs, CPU only" in where
    assert "slow: native (version not reported), on test" in where and "CPU only" in where
    assert any(c.startswith("No GPU was seen in these runs (CPU only)") for c in sel.caveats)
    assert sel.price_text() == "Machine price $0.085/hour (CPU only, no accelerator), 1 machine per engine."
    # a GPU seen in one run: no CPU-only caveat
    info = json.loads((slow / "point-000-rate-1" / "run.json").read_text())
    info["telemetry"]["sampled"].append("gpu")
    (slow / "point-000-rate-1" / "run.json").write_text(json.dumps(info))
    assert not any("No GPU" in c for c in select([fast, slow], slo=SLO, gpu_cost_per_hour=1.0).caveats)


def test_runner_up_that_never_missed_its_slos_gets_a_bounded_ratio(tmp_path):
    fast = write_sweep(tmp_path / "fast", rates=(1, 2, 4, 8), capacity_rps=6)
    short = write_sweep(tmp_path / "short", rates=(1, 2), capacity_rps=10, seed=3)  # passed every point
    sel = select([fast, short], slo=SLO, gpu_cost_per_hour=1.0)
    by = {e.label: e for e in sel.engines}
    assert by["short"].capacity.status == "at_least"
    ratio = by["short"].cost_per_million_tokens / by["fast"].cost_per_million_tokens
    assert f"up to {ratio:.1f}× cheaper per token than short (which never missed the SLOs" in sel.recommendation


def test_client_bound_note_says_whether_the_capacity_rests_on_those_points(tmp_path):
    fast = write_sweep(tmp_path / "fast", rates=(1, 2, 4, 8, 16), capacity_rps=6)

    def mark(rate):
        path = next(fast.glob(f"point-*-rate-{rate}/summary.json"))
        summary = json.loads(path.read_text())
        summary.update(client_bound=True, workers=1)
        path.write_text(json.dumps(summary))
        run_json = path.with_name("run.json")  # a 2-core client machine: no core spare for a second process
        info = json.loads(run_json.read_text())
        run_json.write_text(json.dumps({**info, "host": {**info["host"], "cpu_count": 2}}))

    mark(16)  # past the first failing point (8): the capacity does not use it
    (engine,) = select([fast], slo=SLO, gpu_cost_per_hour=1.0).engines
    assert engine.capacity.status == "bracketed" and 4 < engine.capacity.offered_load < 8
    assert engine.notes == ["the client fell behind at rate 16, past the capacity (those points do not move it)"]
    mark(1)
    (engine,) = select([fast], slo=SLO, gpu_cost_per_hour=1.0).engines
    (note,) = engine.notes
    assert note.startswith(
        "the client fell behind at rate 1, 16, which the capacity rests on: rerun on a quieter machine, or "
    )
    assert "more client processes cannot help" in note and "--workers" not in note and "--ray" in note


def test_without_a_price_the_ranking_follows_goodput_per_accelerator_at_the_runs_slos(tmp_path):
    """Sweeps whose TTFT passes the SLO up to 6, 4 and 2 req/s: ranked by what they sustain within it,
    at the SLOs the runs were made with; a second accelerator halves a candidate's per-accelerator figure."""
    sweeps = [
        write_sweep(tmp_path / name, rates=(1, 3, 5, 7, 9), capacity_rps=cap, seed=i)
        for i, (name, cap) in enumerate((("two", 2), ("six", 6), ("four", 4)))
    ]
    sel = select(sweeps)
    assert sel.slo == SLO and sel.gpu_cost_per_hour is None
    assert sel.ranking == ["six", "four", "two"]
    by = {e.label: e for e in sel.engines}
    assert by["six"].capacity.offered_load > by["four"].capacity.offered_load > by["two"].capacity.offered_load
    assert all(e.cost_per_million_tokens is None for e in sel.engines)
    assert (
        sel.recommendation.startswith("Choose six:")
        and "the output tokens/s within the SLOs of four" in sel.recommendation
    )
    assert "first missed at 7 req/s, on TTFT" in by["six"].why and "at 5 req/s: TTFT p90" in by["six"].why
    assert [row[:2] for row in rows(sel)] == [["1", "six"], ["2", "four"], ["3", "two"]]
    assert not any(c.startswith("Cost assumes") for c in sel.caveats)
    # the same runs judged at another SLO than they were made with
    assert select(sweeps, slo={"ttft_ms": 1.0}).recommendation.startswith("No engine met the SLOs")


def test_runs_made_at_different_slos_need_one_given(tmp_path):
    a = write_run(tmp_path / "a", synthetic_records(rate=4.0), rate=4.0)
    b = write_run(tmp_path / "b", synthetic_records(rate=4.0), slo={"ttft_ms": 100.0}, rate=4.0)
    with pytest.raises(ValueError, match="--slo: missing, and the runs do not share one set of SLOs"):
        select([a, b])
    assert select([a, b], slo=SLO).slo == SLO


def test_a_candidates_folder_stands_for_its_deployments_each_with_its_accelerators(tmp_path):
    """candidates.json (harness/runs/candidates.py): completed candidates by name, per-accelerator figures with
    the accelerators each declared, a failed one named in the caveats."""
    from harness.results.folder import write_candidates
    from harness.results.schema import Candidate

    def candidate(name: str, accelerators: int, status: str = "completed", reason: str = "") -> Candidate:
        return Candidate(
            name=name,
            dir=name,
            launch_args=[],
            accelerators=accelerators,
            status=status,
            reason=reason,
            client_bound=False,
        )

    out = tmp_path / "shapes"
    write_sweep(out / "two-replicas", rates=(1, 3, 5, 7, 9), capacity_rps=6)
    write_sweep(out / "one-engine", rates=(1, 3, 5, 7, 9), capacity_rps=4, seed=3)
    write_candidates(
        out,
        {},
        [
            candidate("two-replicas", 2),
            candidate("one-engine", 1),
            candidate("1P1D", 1, "failed", "No such option: --disaggregate"),
        ],
    )
    sel = select([out])
    by = {e.label: e for e in sel.engines}
    # two replicas sustain more in all, but less per accelerator than one engine
    assert by["two-replicas"].capacity.output_tokens_per_s > by["one-engine"].capacity.output_tokens_per_s
    assert by["two-replicas"].tokens_per_s_per_accelerator == pytest.approx(
        by["two-replicas"].capacity.output_tokens_per_s / 2
    )
    assert sel.ranking == ["one-engine", "two-replicas"] and "2 accelerators" in by["two-replicas"].notes
    assert sel.left_out == ["1P1D: failed (No such option: --disaggregate)"]
    assert sel.caveats[0] == "Not compared, as they did not complete: 1P1D: failed (No such option: --disaggregate)."


def test_engines_that_never_met_the_slos_rank_by_their_share_within_them_at_the_lowest_load(tmp_path):
    worse = write_run(tmp_path / "worse", synthetic_records(rate=4.0, ttft_s=0.25, seed=1), rate=4.0)
    better = write_run(tmp_path / "better", synthetic_records(rate=4.0, ttft_s=0.2, seed=2), rate=4.0)
    sel = select([worse, better], slo={"ttft_ms": 220.0})
    by = {e.label: e for e in sel.engines}
    assert by["better"].lowest_load_goodput > by["worse"].lowest_load_goodput
    assert all(e.capacity.status == "none" for e in sel.engines) and sel.ranking == ["better", "worse"]
