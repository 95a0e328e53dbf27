"""`bench gate`: verdicts per metric from bootstrap intervals, exit 1 only on a real regression."""
import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from reports.cli import gate as gate_command, report as report_command
from reports.gate import GateRulesError, compare, exit_code, load_rules
from reports.load import load_run
from reports.stats import bootstrap_relative_change, window_rates
from test_report import synthetic_records, write_run

RULES = load_rules(None)


def _pair(tmp_path, base_kw, cur_kw, n=600):
    base = load_run(write_run(tmp_path / "base", synthetic_records(n=n, seed=1, **base_kw)))
    cur = load_run(write_run(tmp_path / "cur", synthetic_records(n=n, seed=2, **cur_kw)))
    return base, cur


def _verdicts(base, cur, rules=RULES):
    return {v.name: v for v in compare(base, cur, rules)}


def test_a_a_passes(tmp_path):
    v = _verdicts(*_pair(tmp_path, {}, {}))
    assert {k: x.verdict for k, x in v.items()} == {k: "pass" for k in v}
    assert exit_code(list(v.values())) == 0
    assert v["ttft_p50"].ci_low < 0 < v["ttft_p50"].ci_high


def test_20_percent_slowdown_is_a_regression_and_fails_the_cli(tmp_path):
    base, cur = _pair(tmp_path, {}, {"ttft_s": 0.06, "itl_s": 0.012})
    v = _verdicts(base, cur)
    assert v["ttft_p50"].verdict == "regression" and v["tpot_p50"].verdict == "regression"
    assert v["ttft_p50"].change == pytest.approx(0.2, abs=0.06)
    assert v["ttft_p50"].ci_low > 0  # the interval excludes "no change"
    assert v["output_tokens_per_s"].verdict == "pass"  # open loop: same offered load, same throughput

    app = typer.Typer()
    app.command("gate")(gate_command)
    app.command("report")(report_command)
    result = CliRunner().invoke(app, ["gate", str(base.path), str(cur.path), "--summary-md", str(tmp_path / "g.md")])
    assert result.exit_code == 1, result.output
    assert "Benchmark gate: FAILED" in result.output and "❌ regression" in result.output
    assert (tmp_path / "g.md").read_text() in result.output
    # the same comparison the other way round is an improvement, and the gate passes
    back = CliRunner().invoke(app, ["gate", str(cur.path), str(base.path)])
    assert back.exit_code == 0 and "🚀 improvement" in back.output


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
    # 20% lower offered rate: throughput drops; one request in five failing: goodput drops
    base, cur = _pair(tmp_path, {"rate": 4.0}, {"rate": 3.2, "fail_every": 5})
    v = _verdicts(base, cur)
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
    bad.write_text("metrics:\n  x: {source: ttft, statistic: median, better: lower, threshold: 0.1}\n")
    with pytest.raises(GateRulesError, match=r"metrics.x.statistic: 'median'"):
        load_rules(bad)
    with pytest.raises(GateRulesError, match="not found"):
        load_rules(tmp_path / "none.yaml")


def test_ci_rules_file_is_valid():
    from pathlib import Path
    rules = load_rules(Path(__file__).parent.parent / "ci" / "gate.yaml")
    assert {"ttft_p50", "ttft_p99", "tpot_p50", "output_tokens_per_s", "goodput"} <= set(rules.metrics)


def test_real_runs_against_the_ground_truth_server(tmp_path):
    """A/A through the real runner passes; the same server 20% slower fails."""
    from groundtruth_server import GroundTruthConfig, GroundTruthProcess, gt_request
    from harness.runner import Runner, Target, run_blocking

    def real_run(name, ttft_ms, itl_ms):
        with GroundTruthProcess(GroundTruthConfig(ttft_ms=ttft_ms, itl_ms=itl_ms)) as gt:
            reqs = [gt_request(i, i * 0.02, 10) for i in range(60)]
            out = run_blocking(lambda: Runner(Target(gt.url), reqs))
        return load_run(write_run(tmp_path / name, out.records, slo={"ttft_ms": 500.0}))

    a1, a2, slow = real_run("a1", 40, 5), real_run("a2", 40, 5), real_run("slow", 48, 6)
    assert exit_code(compare(a1, a2, RULES)) == 0
    v = _verdicts(a1, slow)
    assert v["ttft_p50"].verdict == "regression" and v["tpot_p50"].verdict == "regression"


def test_false_alarm_rate_of_synthetic_a_a_pairs_is_low(tmp_path):
    """Twenty A/A pairs of independent draws from one distribution: at most one may fail the gate."""
    failed = []
    for k in range(20):
        base = load_run(write_run(tmp_path / f"b{k}", synthetic_records(n=200, seed=100 + 2 * k)))
        cur = load_run(write_run(tmp_path / f"c{k}", synthetic_records(n=200, seed=101 + 2 * k)))
        failed += [f"{k}:{v.name}" for v in compare(base, cur, RULES) if v.verdict == "regression"]
    assert len(failed) <= 1, failed
