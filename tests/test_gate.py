"""`bench gate`: verdicts per metric from intervals over runs (or within one run a side); exit 1 only on a
regression."""

import json

import numpy as np
import pytest
import typer
from helpers import synthetic_records, write_run
from typer.testing import CliRunner

from reports.cli import gate as gate_command
from reports.cli import report as report_command
from reports.gate import GateRulesError, compare, exit_code, load_rules
from reports.repeats import load_run_set
from reports.stats import bootstrap_relative_change, run_level_change, window_rates

RULES = load_rules(None)


def _pair(tmp_path, base_kw, cur_kw, n=600):
    """One run per side."""
    base = load_run_set(write_run(tmp_path / "base", synthetic_records(n=n, seed=1, **base_kw)))
    cur = load_run_set(write_run(tmp_path / "cur", synthetic_records(n=n, seed=2, **cur_kw)))
    return base, cur


def write_side(root, factors, seed=0, rate=4.0, **kw):
    """Repeats of one scenario in run-1/, run-2/ ...: run k's latencies scaled by factors[k], as a machine that
    was slower or faster during that whole run."""
    for k, f in enumerate(factors):
        records = synthetic_records(seed=seed + k, rate=rate, ttft_s=0.05 * f, itl_s=0.01 * f, **kw)
        write_run(root / f"run-{k + 1}", records, rate=rate)
    return root


def _sides(tmp_path, base_factors, cur_factors, **kw):
    return (
        load_run_set(write_side(tmp_path / "base", base_factors, seed=10, **kw)),
        load_run_set(write_side(tmp_path / "cur", cur_factors, seed=20, **kw)),
    )


def _gate_cli(*args):
    app = typer.Typer()
    app.command("gate")(gate_command)
    app.command("report")(report_command)
    return CliRunner().invoke(app, ["gate", *map(str, args)])


def _verdicts(base, cur, rules=RULES):
    return {v.name: v for v in compare(base, cur, rules)}


def test_a_a_passes(tmp_path):
    v = _verdicts(*_pair(tmp_path, {}, {}))
    assert {k: x.verdict for k, x in v.items()} == {k: "pass" for k in v}
    assert exit_code(list(v.values())) == 0
    assert v["ttft_p50"].ci_low < 0 < v["ttft_p50"].ci_high


def test_clear_slowdown_over_repeats_is_a_regression_and_fails_the_cli(tmp_path):
    # three runs a side, runs within +-3% of each other; the current runs are 30% slower
    base, cur = _sides(tmp_path, [0.97, 1.0, 1.03], [1.27, 1.3, 1.33])
    v = _verdicts(base, cur)
    assert v["ttft_p50"].verdict == "regression" and v["tpot_p50"].verdict == "regression"
    assert v["ttft_p50"].change == pytest.approx(0.3, abs=0.08)
    assert v["ttft_p50"].ci_low > 0  # the interval excludes "no change"
    assert (v["ttft_p50"].baseline_runs, v["ttft_p50"].current_runs) == (3, 3)
    assert v["output_tokens_per_s"].verdict == "pass"  # open loop: same offered load, same throughput

    result = _gate_cli(base.path, cur.path, "--summary-md", tmp_path / "g.md")
    assert result.exit_code == 1, result.output
    assert "Benchmark gate: FAILED" in result.output and "❌ regression" in result.output
    assert (tmp_path / "g.md").read_text() in result.output
    # the same comparison the other way round is an improvement, and the gate passes
    back = _gate_cli(cur.path, base.path)
    assert back.exit_code == 0 and "🚀 improvement" in back.output


def test_a_shift_within_the_run_to_run_spread_is_not_a_regression(tmp_path):
    # whole runs differ by up to +-15%; the current runs sit 10% higher on average: noise, not a regression,
    # although each run's own samples are tight enough for a within-run bootstrap to call it significant
    base, cur = _sides(tmp_path, [0.85, 1.0, 1.15], [0.95, 1.1, 1.25], n=300)
    v = _verdicts(base, cur)
    assert v["ttft_p50"].verdict in ("pass", "inconclusive") and v["tpot_p50"].verdict in ("pass", "inconclusive")
    assert v["tpot_p50"].ci_low < 0 < v["tpot_p50"].ci_high
    assert exit_code(list(v.values())) == 0
    within = bootstrap_relative_change(*(s.runs[2].requests["tpot_s"].to_numpy() for s in (base, cur)), "p50")
    assert within.ci_low > 0.05  # run 3 against run 3 alone looks like a real 9% slowdown
    assert v["tpot_p50"].baseline_spread == pytest.approx(0.15 * v["tpot_p50"].baseline, rel=0.25)


def test_one_run_per_side_needs_the_large_single_run_threshold(tmp_path):
    base, cur = _pair(tmp_path, {}, {"ttft_s": 0.06, "itl_s": 0.012})  # 20% slower, 600 requests each
    v = _verdicts(base, cur)
    # significant within the runs, but one run per side cannot tell a slower engine from a slower machine
    assert v["tpot_p50"].ci_low > 0 and v["tpot_p50"].verdict == "inconclusive"
    assert "one run per side" in v["tpot_p50"].note and "±50%" in v["tpot_p50"].note
    assert exit_code(list(v.values())) == 0
    result = _gate_cli(base.path, cur.path)
    assert result.exit_code == 0 and "one run per side" in result.output and "| 1 / 1 |" in result.output

    base, cur = _pair(tmp_path / "2x", {}, {"ttft_s": 0.1, "itl_s": 0.02})  # twice as slow: beyond 50%
    v = _verdicts(base, cur)
    assert v["ttft_p50"].verdict == "regression" and v["tpot_p50"].verdict == "regression"
    assert _gate_cli(base.path, cur.path).exit_code == 1


def test_one_run_against_repeats_borrows_their_spread(tmp_path):
    base = load_run_set(write_side(tmp_path / "base", [0.95, 1.0, 1.05], seed=10))
    one = load_run_set(write_side(tmp_path / "cur", [1.5], seed=20) / "run-1")
    v = _verdicts(base, one)
    assert (v["tpot_p50"].baseline_runs, v["tpot_p50"].current_runs) == (3, 1)
    assert v["tpot_p50"].current_spread is None and v["tpot_p50"].baseline_spread > 0
    assert v["tpot_p50"].verdict == "regression"  # 50% against a 5% spread: clear even with 2 degrees of freedom
    pooled = run_level_change([1.0, 1.05, 0.95], [1.3])
    assert pooled.ci_low < run_level_change([1.0, 1.05, 0.95], [1.3, 1.3, 1.3]).ci_low  # one run: a wider interval
    with pytest.raises(ValueError, match="two on one side"):
        run_level_change([1.0], [1.2])


def test_runs_of_another_scenario_are_refused_by_name(tmp_path):
    base = write_side(tmp_path / "base", [1.0, 1.0])
    cur = write_side(tmp_path / "cur", [1.0, 1.0])
    # a run from a newer harness lists an option the older runs lack, unset: still the same scenario
    info = json.loads((cur / "run-2" / "run.json").read_text())
    info["scenario"]["load"]["sweep"] = None
    (cur / "run-2" / "run.json").write_text(json.dumps(info))
    assert _gate_cli(base, cur).exit_code == 0
    write_run(cur / "run-3", synthetic_records(rate=8.0), rate=8.0)  # another load
    result = _gate_cli(base, cur)
    assert result.exit_code == 2
    assert "run-3" in result.output and "load" in result.output and "rate" in result.output
    empty = tmp_path / "empty"
    (empty / "run-1").mkdir(parents=True)
    result = _gate_cli(base, empty)
    assert result.exit_code == 2 and "neither a run folder" in result.output


def test_markdown_shows_runs_values_with_spread_and_the_method(tmp_path):
    base, cur = _sides(tmp_path, [0.97, 1.0, 1.03], [0.97, 1.0, 1.03, 1.0])
    result = _gate_cli(base.path, cur.path)
    assert result.exit_code == 0, result.output
    header = next(line for line in result.output.splitlines() if line.startswith("| metric"))
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "metric",
        "statistic",
        "runs (base / cur)",
        "baseline",
        "current",
        "change",
        "95% CI",
        "threshold",
        "verdict",
        "note",
    ]
    row = next(line for line in result.output.splitlines() if line.startswith("| ttft_p50"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[2] == "3 / 4" and " ± " in cells[3] and cells[3].endswith(" ms")
    assert "Welch t intervals over runs" in result.output and "(3 runs)" in result.output


def test_same_data_same_verdicts(tmp_path):
    base, cur = _sides(tmp_path, [0.9, 1.0, 1.1], [1.0, 1.1, 1.2])
    assert compare(base, cur, RULES) == compare(base, cur, RULES)
    one_b, one_c = _pair(tmp_path / "one", {}, {"ttft_s": 0.055})
    assert compare(one_b, one_c, RULES) == compare(one_b, one_c, RULES)


def test_noise_is_inconclusive_not_a_regression(tmp_path):
    # 25 requests with very spread TTFTs, 10% slower: too noisy to tell either way
    base, cur = _pair(tmp_path, {"ttft_sigma": 0.9}, {"ttft_sigma": 0.9, "ttft_s": 0.055}, n=25)
    v = _verdicts(base, cur)
    assert v["ttft_p50"].verdict == "inconclusive"
    # a p99 of 25 samples is not judged at all: its bootstrap would only reshuffle the top one or two
    assert v["ttft_p99"].verdict == "inconclusive" and "p99 needs >= 500 samples" in v["ttft_p99"].note
    assert v["ttft_p50"].ci_low < 0 < v["ttft_p50"].ci_high
    assert exit_code(list(v.values())) == 0


def test_throughput_and_goodput_regressions(tmp_path):
    # 20% lower offered rate: throughput drops; one request in five failing: goodput drops (three runs a side)
    base = load_run_set(write_side(tmp_path / "base", [1.0] * 3, seed=10))
    for k in range(3):
        write_run(tmp_path / "cur" / f"run-{k + 1}", synthetic_records(seed=30 + k, rate=3.2, fail_every=5), rate=4.0)
    v = _verdicts(base, load_run_set(tmp_path / "cur"))
    assert v["output_tokens_per_s"].verdict == "regression"
    assert v["output_tokens_per_s"].change == pytest.approx(-0.2 - 0.8 * 0.2, abs=0.06)
    assert v["goodput"].verdict == "regression" and v["goodput"].change == pytest.approx(-0.2, abs=0.02)


def test_a_current_run_that_lost_its_samples_is_a_regression(tmp_path):
    base, cur = _pair(tmp_path, {}, {"fail_every": 1}, n=40)
    v = _verdicts(base, cur)
    assert v["ttft_p50"].verdict == "regression" and "current run has 0 samples" in v["ttft_p50"].note
    assert exit_code(list(v.values())) == 1


def test_bootstrap_is_seeded_and_covers_the_truth():
    rng = np.random.default_rng(7)
    a, b = rng.exponential(10, 400), rng.exponential(12, 400)
    first = bootstrap_relative_change(a, b, "p50", seed=3)
    assert first == bootstrap_relative_change(a, b, "p50", seed=3)
    assert first.ci_low < 0.2 < first.ci_high
    assert window_rates(np.array([0.1, 0.2, 1.5]), None, 0, 2, 2).tolist() == [2.0, 1.0]
    with pytest.raises(ValueError, match="statistic: 'median'"):
        bootstrap_relative_change(a, b, "median")


def test_bad_rules_name_the_key(tmp_path):
    bad = tmp_path / "rules.yaml"
    bad.write_text("metrics:\n  ttft_p50: {source: ttft, statistic: p50, better: lower, threshold: -1}\n")
    with pytest.raises(GateRulesError, match=r"metrics.ttft_p50.threshold"):
        load_rules(bad)
    bad.write_text("metrics:\n  x: {source: ttft, better: lower, threshold: 0.3, single_run_threshold: 0.2}\n")
    with pytest.raises(GateRulesError, match=r"metrics.x: .*single_run_threshold \(0.2\) must be >= threshold"):
        load_rules(bad)
    bad.write_text("metrics:\n  x: {source: ttft, statistic: median, better: lower, threshold: 0.1}\n")
    with pytest.raises(GateRulesError, match=r"metrics.x.statistic: 'median'"):
        load_rules(bad)
    with pytest.raises(GateRulesError, match="not found"):
        load_rules(tmp_path / "none.yaml")


def test_ci_rules_file_is_valid():
    from pathlib import Path

    rules = load_rules(Path(__file__).parent.parent / "ci" / "gate.yaml")
    assert {"ttft_p50", "ttft_p99", "tpot_p50", "output_tokens_per_s", "goodput"} <= set(rules.metrics)


def test_committed_nightly_baseline_is_clean_repeats_of_the_nightly_scenario():
    """ci/nightly.yml gates scenarios/nightly.yaml against ci/baselines/nightly: a scenario change needs new runs."""
    from pathlib import Path

    from harness.scenario.scenario import load_scenario
    from reports.repeats import check_same_scenario, scenario_settings

    root = Path(__file__).parent.parent
    base = load_run_set(root / "ci" / "baselines" / "nightly")
    assert len(base.runs) >= 3
    check_same_scenario(base)
    assert scenario_settings(base.scenario) == scenario_settings(
        load_scenario(root / "scenarios" / "nightly.yaml").resolved_dict()
    )
    assert all(r.summary.requests.failed == 0 and not r.summary.client_bound for r in base.runs)


def test_real_runs_against_the_ground_truth_server(tmp_path):
    """A/A through the real runner passes; one run each of a server 60% slower (past the single-run threshold) fails."""
    from groundtruth_server import GroundTruthConfig, GroundTruthProcess, gt_request

    from harness.client.runner import Runner, Target, run_blocking

    def real_run(name, ttft_ms, itl_ms):
        with GroundTruthProcess(GroundTruthConfig(ttft_ms=ttft_ms, itl_ms=itl_ms)) as gt:
            reqs = [gt_request(i, i * 0.02, 10) for i in range(60)]
            out = run_blocking(lambda: Runner(Target(url=gt.url), reqs))
        return load_run_set(write_run(tmp_path / name, out.records, slo={"ttft_ms": 500.0}))

    a1, a2, slow = real_run("a1", 40, 5), real_run("a2", 40, 5), real_run("slow", 64, 8)
    assert exit_code(compare(a1, a2, RULES)) == 0
    v = _verdicts(a1, slow)
    assert v["ttft_p50"].verdict == "regression" and v["tpot_p50"].verdict == "regression"


def test_false_alarm_rate_of_synthetic_a_a_pairs_is_low(tmp_path):
    """Twenty A/A pairs, three runs a side, runs 10% apart (lognormal) as on a shared machine: at most one pair may
    fail (a 95% interval on each side of 0 leaves 2.5% per metric, less with the threshold on top)."""
    rng = np.random.default_rng(5)
    failed = []
    for k in range(20):
        factors = rng.lognormal(0, 0.1, size=(2, 3))
        base = load_run_set(write_side(tmp_path / f"b{k}", factors[0], seed=100 * k, n=40))
        cur = load_run_set(write_side(tmp_path / f"c{k}", factors[1], seed=100 * k + 50, n=40))
        if exit_code(compare(base, cur, RULES)):
            failed.append(k)
    assert len(failed) <= 1, failed


def test_headline_says_inconclusive_when_nothing_was_decided_and_strict_fails_on_it(tmp_path):
    # one run a side, TPOT +30%: within the single-run threshold, so no metric can be decided
    base, cur = _pair(tmp_path, {}, {"itl_s": 0.013})
    result = _gate_cli(base.path, cur.path)
    assert result.exit_code == 0, result.output
    assert "Benchmark gate: inconclusive" in result.output and "Benchmark gate: passed" not in result.output
    strict = _gate_cli(base.path, cur.path, "--strict")
    assert strict.exit_code == 5 and "inconclusive" in strict.output
    # three runs a side: the same +30% is decided, a regression (exit 1); an A/A pair of repeats exits 0

    def side(root, seed, itl_factor):
        for k, f in enumerate([0.97, 1.0, 1.03]):
            write_run(
                root / f"run-{k + 1}", synthetic_records(seed=seed + k, ttft_s=0.05 * f, itl_s=0.01 * f * itl_factor)
            )
        return root

    assert _gate_cli(side(tmp_path / "b", 10, 1.0), side(tmp_path / "c", 20, 1.3), "--strict").exit_code == 1
    assert _gate_cli(side(tmp_path / "aa1", 10, 1.0), side(tmp_path / "aa2", 30, 1.0)).exit_code == 0


def test_torn_last_line_and_unknown_keys_are_warnings_a_damaged_middle_line_an_error(tmp_path):
    base = write_run(tmp_path / "base", synthetic_records(n=40, seed=1))
    cur = write_run(tmp_path / "cur", synthetic_records(n=40, seed=2))
    lines = (cur / "requests.jsonl").read_text().splitlines()
    extra = json.loads(lines[0]) | {"index": 99, "from_a_newer_bench": 1}
    (cur / "requests.jsonl").write_text("\n".join(lines + [json.dumps(extra)]) + "\n" + lines[1][:40])
    result = _gate_cli(base, cur)
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())  # the console wraps long lines
    assert f"{cur / 'requests.jsonl'} line 42: skipped a torn last line" in said
    assert "ignored record keys this version does not know: from_a_newer_bench" in said
    (cur / "requests.jsonl").write_text("\n".join([lines[0], "{not json", lines[2]]) + "\n")
    damaged = _gate_cli(base, cur)
    assert damaged.exit_code == 2 and "line 2: not a request record" in " ".join(damaged.output.split())
    assert "Traceback" not in damaged.output


def test_report_names_its_markdown_after_the_html_and_refuses_an_empty_run(tmp_path):
    run = write_run(tmp_path / "run", synthetic_records(n=10))
    app = typer.Typer()
    app.command("report")(report_command)
    app.command("gate")(gate_command)
    ok = CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "X.html")])
    assert ok.exit_code == 0, ok.output
    assert (tmp_path / "X.md").is_file() and "X.md" in ok.output
    helped = CliRunner().invoke(app, ["report", "--help"])
    assert "same name with .md" in " ".join(helped.output.split())
    assert CliRunner().invoke(app, ["report", str(run), "-o", str(tmp_path / "X.md")]).exit_code == 2
    # the folder of a run that never sent a request (its engine did not start): a message, not a traceback
    from harness.results.folder import ResultWriter

    ResultWriter(tmp_path / "never").close()
    (tmp_path / "never" / "engine.log").write_text("$ llama-server ...\nerror: model not found\n")
    for args in (
        ["report", str(tmp_path / "never"), "-o", str(tmp_path / "n.html")],
        ["gate", str(tmp_path / "never"), str(run)],
    ):
        result = CliRunner().invoke(app, args)
        said = " ".join(result.output.split())
        assert result.exit_code == 2 and "holds no request: the run never sent one (see engine.log)" in said
