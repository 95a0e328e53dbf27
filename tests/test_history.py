"""`bench history` and `bench gate --history` over nightly series of run folders with known values.

Each night is one run folder as `bench run` writes it (8 requests of 8 tokens), its records built from a known ITL:
20 nights at 20 ms, then 10 more nights for each of three futures: a 15% step (23 ms), a 1%-per-night drift,
and 20 ms again (A/A). Each series is gated night by night as the nightly job does it: tonight against the
history so far, then tonight added. The gate's metrics are the ones the server's ITL sets (ITL, TPOT, tokens/s).

The nights are built, not measured: these tests are about the history and its detectors, and a live night on a
shared 2-core machine measures the neighbours as much as the server (beside four busy processes, a 1%-a-night
drift of a live ground-truth server was found 3 nights late, and flat nights raised alarms). Each night carries
the spread of live ones, seeded: its ITL a factor off the server's (NIGHT_SPREAD) and each gap jittered
(GAP_JITTER). What a live run's records hold is tested against the ground-truth server in test_runner.py and
test_stamped_http.py; the one live run here is the interrupted `bench run` the history must refuse.
"""

import json
import re
import shutil
import sqlite3

import numpy as np
import pytest
import yaml
from bench_process import bench_started, interrupt_once_written
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from helpers import write_run
from typer.testing import CliRunner

from harness.cli.app import app
from harness.results.folder import RequestRecord
from reports.gate import load_rules
from reports.history import add_runs, nights
from reports.history_gate import gate_history

ITL_MS, FLAT, AFTER = 20.0, 20, 10
# The spread of live nights, measured: 20 runs of 8 requests of 8 tokens against the ground-truth server at 20 ms
# (tests/groundtruth_server.py; run as this file ran its nights before they were built) on the 2-core machine at
# load average 8: ITL p50 19.69-20.62 ms, a coefficient of variation of 1.0%; TPOT p50 0.2%.
NIGHT_SPREAD = 0.01  # sigma of a night's log ITL around the server's
GAP_JITTER = 0.02  # sigma of each gap's log around its night's ITL
FUTURES = {
    "step": [ITL_MS * 1.15] * AFTER,
    "drift": [ITL_MS * 1.01**k for k in range(1, AFTER + 1)],
    "aa": [ITL_MS] * AFTER,
}
COMMITS = [f"{k:02d}" + "c0ffee" * 6 for k in range(FLAT + AFTER)]  # night k was built from commit COMMITS[k]
RULES_YAML = {
    "min_samples": 8,
    "metrics": {
        "itl_p50": {"source": "itl", "statistic": "p50", "better": "lower", "threshold": 0.10},
        "tpot_p50": {"source": "tpot", "statistic": "p50", "better": "lower", "threshold": 0.10},
        "output_tokens_per_s": {
            "source": "output_tokens_per_s",
            "statistic": "mean",
            "better": "higher",
            "threshold": 0.10,
        },
    },
}


@pytest.fixture(autouse=True)
def _not_in_github_actions(monkeypatch):
    """The identity options read GitHub's variables; a test run inside Actions must not take its run's."""
    for name in ("GITHUB_RUN_ID", "GITHUB_SHA", "GITHUB_REF_NAME", "BENCH_RUNNER_KIND"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="module")
def rules_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("rules") / "rules.yaml"
    path.write_text(yaml.safe_dump(RULES_YAML))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"flat": 20 run folders, "step" / "drift" / "aa": 10 each}, in the order they ran."""
    root = tmp_path_factory.mktemp("nights")
    plan = {"flat": [ITL_MS] * FLAT, **FUTURES}
    return {
        name: [
            write_run(root / f"{name}-{k:02d}", _night(itl, seed=100 * series + k), slo={"ttft_ms": 500.0})
            for k, itl in enumerate(itls)
        ]
        for series, (name, itls) in enumerate(plan.items())
    }


def _night(itl_ms: float, seed: int, requests: int = 8, tokens: int = 8) -> list[RequestRecord]:
    """One night's records: `requests` sent 10 ms apart, each answered 20 ms after it was sent, then a token every
    ITL: the night's ITL is itl_ms off by a factor (NIGHT_SPREAD), each gap jittered (GAP_JITTER)."""
    rng = np.random.default_rng(seed)
    night_itl_s = itl_ms / 1e3 * rng.lognormal(0, NIGHT_SPREAD)
    records = []
    for i in range(requests):
        send_s = i * 0.01
        gaps_s = night_itl_s * rng.lognormal(0, GAP_JITTER, tokens - 1)
        rec = RequestRecord(index=i, intended_send_s=send_s, actual_send_s=send_s + 1e-4, prompt_tokens=4)
        rec.token_times_s = [float(t) for t in send_s + 0.02 + np.concatenate([[0], np.cumsum(gaps_s)])]
        rec.tokens_per_chunk = [1] * tokens
        rec.output_tokens = rec.output_tokens_counted = tokens
        rec.end_s = rec.token_times_s[-1] + 1e-4
        rec.finish_reason = "length"
        records.append(rec)
    return records


def replay(db, paths, rules, monkeypatch):
    """Night by night: gate the night's run against the history so far, then add it. Returns each night's
    HistoryGate (None while the history is shorter than 10 nights)."""
    results = []
    for k, path in enumerate(paths):
        monkeypatch.setenv("GITHUB_SHA", COMMITS[k])  # as in CI: tonight's commit
        results.append(gate_history(db, path, rules, last=20, min_history=10) if k else None)
        add_runs(db, [path], branch="main", rules=rules)
    return results


def _findings(result, metric):
    return next(m for m in result.metrics if m.verdict.name == metric)


def test_a_step_is_reported_once_at_its_commit_and_a_a_nights_raise_nothing(runs, rules_file, tmp_path, monkeypatch):
    rules = load_rules(rules_file)
    results = replay(tmp_path / "step.db", runs["flat"] + runs["step"], rules, monkeypatch)
    assert results[:10] == [None] * 10  # fewer than 10 nights of history: no verdict
    for k in range(10, FLAT):  # no alarm before the step: no regression, no change point, on any metric
        assert not results[k].failed, k
        assert all(not m.findings for m in results[k].metrics), (k, [m.findings for m in results[k].metrics])
    assert results[FLAT].failed  # the night of the step
    first_new = [k for k in range(FLAT, FLAT + AFTER) if _findings(results[k], "itl_p50").new]
    assert len(first_new) == 1, first_new  # reported once, on one night
    final = _findings(results[-1], "itl_p50")
    assert [f.kind for f in final.findings] == ["step"]
    step = final.findings[0]
    assert abs(step.index - FLAT) <= 1 and step.change == pytest.approx(0.15, abs=0.04)
    assert final.nights[step.index].commit == COMMITS[step.index]  # the first commit after the step
    assert not results[-1].failed  # nights after it are compared with the new level: no alarm every night
    assert final.verdict.baseline_runs < 10 and final.verdict.verdict == "pass"


def test_slow_drift_is_reported_as_drift_within_ten_nights(runs, rules_file, tmp_path, monkeypatch):
    rules = load_rules(rules_file)
    results = replay(tmp_path / "drift.db", runs["flat"] + runs["drift"], rules, monkeypatch)
    assert not any(results[k].failed for k in range(10, FLAT))
    itl = [_findings(results[k], "itl_p50") for k in range(FLAT, FLAT + AFTER)]
    found = [k for k, m in enumerate(itl) if m.findings]
    assert found, "no drift reported in 10 nights"
    assert all(f.kind == "drift" for m in itl for f in m.findings)  # never called a step
    first = itl[found[0]]
    assert first.new and results[FLAT + found[0]].failed  # the night it is found, the gate fails
    assert sum(bool(m.new) for m in itl) == 1  # and only then: later nights list it as seen
    drift = first.findings[0]
    # it starts at the first 1% night, give or take one (the nights' 1% spread blurs where a 1% step up begins;
    # seen: found 3-6 nights in, its start fitted at night 19 or 20 over five seeds of the nights), upward, past 4%
    assert abs(drift.index - FLAT) <= 1 and drift.change > 0.04


def test_a_a_series_of_thirty_nights_raises_no_alarm(runs, rules_file, tmp_path, monkeypatch):
    rules = load_rules(rules_file)
    results = replay(tmp_path / "aa.db", runs["flat"] + runs["aa"], rules, monkeypatch)
    for k in range(10, FLAT + AFTER):
        assert not results[k].failed, (k, [(m.verdict.name, m.verdict.verdict, m.new) for m in results[k].metrics])
        assert all(not m.findings for m in results[k].metrics), k
    verdicts = {m.verdict.name: m.verdict for m in results[-1].metrics}
    assert verdicts["itl_p50"].verdict == "pass" and verdicts["itl_p50"].baseline_runs == 20
    assert verdicts["itl_p50"].baseline == pytest.approx(ITL_MS, rel=0.05)


class _Output:
    """A CLI result whose output has its line wrapping (rich wraps at 80 columns in tests) undone."""

    def __init__(self, result):
        self.exit_code, self.raw = result.exit_code, result.output
        self.output = " ".join(result.output.split())


def _cli(*args):
    return _Output(CliRunner().invoke(app, [*map(str, args)]))


def test_history_add_is_idempotent_and_show_prints_the_series(runs, tmp_path):
    db = tmp_path / "h.db"
    first = _cli("history", "add", *runs["flat"][:5], "--db", db, "--commit", COMMITS[0], "--branch", "main")
    assert first.exit_code == 0, first.output
    again = _cli("history", "add", *runs["flat"][:5], "--db", db)
    assert again.exit_code == 0 and "added 0 run(s), 5 already there" in again.output
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 5
        assert conn.execute("SELECT COUNT(DISTINCT batch) FROM runs").fetchone()[0] == 1  # one call: one night
        row = conn.execute("SELECT commit_sha, branch, scenario_name, engine, model FROM runs").fetchone()
    assert row == (COMMITS[0], "main", "synthetic", "native", "smollm2")
    series = nights(db, *_only_series(db), ["itl_p50", "summary.ttft_ms.p50"])
    assert len(series) == 1 and len(series[0].run_ids) == 5
    assert series[0].values["itl_p50"] == pytest.approx(ITL_MS, rel=0.05)
    shown = _cli("history", "show", db, "--metric", "itl_p50", "--metric", "summary.ttft_ms.p50")
    assert shown.exit_code == 0, shown.output
    line = shown.raw.splitlines()[2].split()
    assert line[0] == "1" and line[3] == COMMITS[0][:10] and line[5] == "5"  # night, ..., commit, branch, runs
    assert float(line[6]) == pytest.approx(series[0].values["itl_p50"], rel=1e-3)
    bad = _cli("history", "show", db, "--metric", "itl_p51")
    assert bad.exit_code == 2 and "itl_p51 not recorded" in bad.output


def _only_series(db):
    from reports.history import series_keys

    ((_, scenario, runner, _),) = series_keys(db)
    return scenario, runner


def test_incomplete_runs_are_refused_with_the_reason(runs, tmp_path):
    """A run cut by Ctrl-C (a real `bench run`, interrupted), and one killed before its summary."""
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=10)) as gt:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: cut\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            "workload: {kind: random, input_tokens: 8, output_tokens: 20}\n"
            "load: {arrival: constant, rate: 20, num_requests: 400}\n"
        )
        proc = bench_started("run", scenario, "--output", tmp_path / "cut")
        interrupt_once_written(proc, tmp_path / "cut" / "requests.jsonl", 5)
    assert json.loads((tmp_path / "cut" / "summary.json").read_text())["interrupted"] is True
    db = tmp_path / "h.db"
    result = _cli("history", "add", runs["flat"][0], tmp_path / "cut", "--db", db)
    assert result.exit_code == 2
    assert "cut: interrupted (Ctrl-C)" in result.output and "nothing was added" in result.output
    assert not db.exists() or sqlite3.connect(db).execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 0

    killed = shutil.copytree(runs["flat"][0], tmp_path / "killed")
    (killed / "summary.json").unlink()
    result = _cli("history", "add", killed, "--db", db)
    assert result.exit_code == 2 and "no summary.json: the run did not finish" in result.output


def test_gate_cli_uses_history_when_long_enough_else_the_baseline(runs, rules_file, tmp_path):
    db = tmp_path / "h.db"
    first = _cli("gate", runs["flat"][6], "--history", db, "--rules", rules_file)  # the first night: no file yet
    assert first.exit_code == 0 and "fewer than 10 comparable nights" in first.output, first.output
    assert _cli("history", "add", *runs["flat"][:5], "--db", db).exit_code == 0
    # 1 night of history (5 runs added together): too short, so the committed baseline (two runs) decides
    short = _cli("gate", runs["flat"][5], runs["flat"][6], "--history", db, "--rules", rules_file)
    assert short.exit_code == 0, short.output
    # one run a side decides little (`bench gate` calls undecided metrics inconclusive), but the baseline gate ran
    assert "fewer than 10 comparable nights" in short.output
    assert re.search(r"Benchmark gate: (passed|inconclusive)", short.output), short.output
    alone = _cli("gate", runs["flat"][6], "--history", db, "--rules", rules_file)
    assert alone.exit_code == 0 and "no gate tonight" in alone.output
    for path in runs["flat"][5:]:
        assert _cli("history", "add", path, "--db", db).exit_code == 0
    # 16 nights now; tonight's run is one of them, and is left out of its own history
    judged = _cli(
        "gate",
        runs["flat"][-1],
        "--history",
        db,
        "--last",
        "8",
        "--rules",
        rules_file,
        "--summary-md",
        tmp_path / "g.md",
    )
    assert judged.exit_code == 0, judged.output
    assert "Benchmark gate against history: passed" in judged.output and "15 comparable nights" in judged.output
    row = next(line for line in judged.raw.splitlines() if line.startswith("| itl_p50"))
    assert row.split("|")[3].strip() == "8 / 1"
    assert (tmp_path / "g.md").read_text() in judged.raw
    slow = _cli("gate", runs["step"][0], "--history", db, "--rules", rules_file)
    assert slow.exit_code == 1 and "❌ regression" in slow.output


def test_nightly_workflow_names_options_bench_has():
    """ci/nightly.yml's bench commands use options that exist: a renamed flag fails here, not at 3 am."""
    import re
    from pathlib import Path

    workflow = yaml.safe_load((Path(__file__).parent.parent / "ci" / "nightly.yml").read_text())
    script = "\n".join(step.get("run", "") for step in workflow["jobs"]["benchmark"]["steps"]).replace("\\\n", " ")
    commands = [line.strip() for line in script.splitlines() if line.strip().startswith("bench ")]
    assert {"gate", "history", "report", "run"} <= {c.split()[1] for c in commands}
    assert any("--history" in c for c in commands if c.startswith("bench gate"))
    for command in commands:
        words = command.split()
        sub = words[1:3] if words[1] == "history" else words[1:2]
        usage = CliRunner().invoke(app, [*sub, "--help"], env={"COLUMNS": "200"}).output
        for option in re.findall(r"(?<!\S)--[a-z-]+", command):
            assert option in usage, (command, option)


def test_report_cli_draws_the_trends_of_a_history(runs, rules_file, tmp_path):
    db = tmp_path / "h.db"
    for path in runs["flat"][:12] + runs["step"]:
        add_runs(db, [path])
    result = _cli("report", "--history", db, "--rules", rules_file, "-o", tmp_path / "t.html")
    assert result.exit_code == 0, result.output
    assert "1 series, 2 findings" in result.output  # the ITL step, and the same step in TPOT (per-request ITL)
    md = (tmp_path / "t.md").read_text()
    for metric in ("itl_p50", "tpot_p50"):
        assert f"| {metric} | step +1" in md
    assert md.count("| #13 of 22 |") == 2  # night 13: the first step run after 12 flat ones
    html = (tmp_path / "t.html").read_text()
    assert html.count("Plotly.newPlot") == 1 and "itl_p50 (itl p50, lower is better)" in html
    both = _cli("report", runs["flat"][0], "--history", db)
    assert both.exit_code == 2 and "not both" in both.output


def test_the_trend_band_is_where_the_gate_sees_no_change():
    from reports.stats import run_level_change
    from reports.trends import gate_band

    values = list(np.exp(np.random.default_rng(1).normal(np.log(20), 0.02, 12)))
    band = gate_band(values, steps=[], last=8, confidence=0.95)
    assert band[:2] == [None, None]  # fewer than two nights before: no interval
    lo, hi = band[11]
    assert run_level_change(values[3:11], [hi]).ci_low == pytest.approx(0, abs=1e-12)  # the last 8 nights
    assert run_level_change(values[3:11], [lo]).ci_high == pytest.approx(0, abs=1e-12)
    after_step = gate_band(values, steps=[9], last=8, confidence=0.95)
    assert after_step[10] is None and after_step[11] != band[11]  # nights before a step are not compared with
    assert run_level_change(values[9:11], [after_step[11][1]]).ci_low == pytest.approx(0, abs=1e-12)


def test_repeats_of_one_scenario_share_a_hash_and_another_load_does_not(monkeypatch):
    from harness.results.schema import RunInfo
    from reports.run_identity import runner_kind, scenario_hash

    base = {
        "name": "nightly",
        "seed": 0,
        "backend": {"kind": "native", "url": "http://127.0.0.1:4001"},
        "load": {"arrival": "closed", "concurrency": 4, "sweep": None},
    }
    repeat = {
        **base,
        "seed": 7,
        "backend": {"kind": "native", "url": "http://127.0.0.1:5123"},
        "load": {"arrival": "closed", "concurrency": 4},
    }  # fresh seed and port; an older harness had no sweep
    assert scenario_hash(repeat) == scenario_hash(base)
    assert scenario_hash({**base, "load": {"arrival": "closed", "concurrency": 8}}) != scenario_hash(base)
    assert scenario_hash(
        {**base, "backend": {"kind": "native", "launch": {"args": ["--blas-threads", "2"]}}}
    ) != scenario_hash(base)
    host = {"hostname": "ci-1", "platform": "Linux-6.8.0-x86_64-with-glibc2.39", "machine": "x86_64", "cpu_count": 4}
    info = RunInfo.model_validate(
        {
            "scenario": base,
            "versions": {},
            "backend": {"kind": "native", "model": None},
            "token_count_method": "usage",
            "tokenizer": "smollm2",
            "time_unit": "seconds from t0 (perf_counter_ns)",
            "host": host,
        }
    )
    assert runner_kind(info) == "Linux-x86_64-4cpu"
    monkeypatch.setenv("BENCH_RUNNER_KIND", "ubuntu-24.04")
    assert runner_kind(info) == "ubuntu-24.04" and runner_kind(info, "gpu-h100") == "gpu-h100"
