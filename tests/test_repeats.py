"""`bench run --repeats N [--until-ci P]` (harness/runs/repeats.py, across_runs.py): repeats against the ground-truth
server that agree stop early, repeats of a server whose speed changes between runs run to N, the intervals are
the hand-computed t-intervals, a cut-short folder stays usable and `bench report` draws it."""

import json
import math

import numpy as np
import pytest
from bench_process import bench, bench_started, interrupt_once_written
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from scipy.stats import t as student_t
from typer.testing import CliRunner

from harness.cli.app import app
from harness.metrics.across_runs import HEADLINE_METRICS, converged, mean_interval, metric_value
from harness.results.schema import Summary
from harness.results.schema_files import validate_folder
from harness.runs.repeats import run_repeats
from harness.scenario.scenario import load_scenario
from reports.report import write_report


def _scenario(tmp_path, url: str, load: str) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: rep\nbackend: {{kind: openai, url: '{url}', model: gt}}\n"
        "workload: {kind: random, input_tokens: 8, output_tokens: 8}\n"
        f"load: {load}\nslo: {{ttft_ms: 1000}}\n"
    )
    return path


def _by_hand(out, dirs, confidence=0.95) -> dict:
    """Each headline metric's mean and t-interval half-width, from the repeats' own summary.json files."""
    summaries = [Summary.model_validate_json((out / d / "summary.json").read_text()) for d in dirs]
    got = {}
    for path in HEADLINE_METRICS:
        values = np.array([metric_value(s, path) for s in summaries])
        half = student_t.ppf(1 - (1 - confidence) / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values))
        got[path] = (values.mean(), half)
    return got


def test_the_interval_is_students_t_and_until_ci_waits_for_three_runs_within_it():
    # mean 100, s = 2, t(0.975, 2) = 4.3027: half-width 4.3027 * 2 / sqrt(3) = 4.968, 4.97% of the mean
    m = mean_interval([100.0, 102.0, 98.0], 0.95, "ms")
    assert m.mean == 100.0 and m.std == pytest.approx(2.0) and m.t_critical == pytest.approx(4.3027, abs=1e-4)
    assert m.half_width == pytest.approx(4.968, abs=1e-3) and (m.low, m.high) == pytest.approx(
        (95.03, 104.97), abs=1e-2
    )
    intervals = {"a": m}
    assert converged(intervals, 0.05) and not converged(intervals, 0.049)
    two = mean_interval([100.0, 100.0], 0.95, "ms")
    assert two.relative_half_width == 0.0 and not converged({"a": two}, 0.05)  # two runs are never enough
    assert mean_interval([5.0], 0.95, "ms").half_width is None


def _converged_by_hand(out, dirs, until: float) -> bool:
    return all(half <= until * abs(mean) for mean, half in _by_hand(out, dirs).values())


def test_repeats_that_agree_stop_at_the_first_count_within_the_interval_and_the_folder_is_reported(tmp_path):
    """Every request takes 200 ms + 7 x 10 ms: runs of 60 requests at 40/s differ by client noise only, so they agree
    within 10% after three (a quiet machine) or a few more (a busy one): the run stops at the first count whose
    hand-computed intervals are all within 10%, and not before."""
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=200, itl_ms=10)) as gt:
        scenario = _scenario(tmp_path, gt.url, "{arrival: constant, rate: 40, num_requests: 60}")
        out = tmp_path / "out"
        # --keep-invalid: on a shared machine a repeat may be client-bound (invalid); they are counted all the same
        res = bench(
            "run",
            scenario,
            "--output",
            out,
            "--repeats",
            5,
            "--until-ci",
            "10%",
            "--keep-invalid",
            "--allow-client-bound",
        )
    assert res.returncode == 0, res.stderr
    manifest = json.loads((out / "repeats.json").read_text())
    assert str(out / "repeats.json") in validate_folder(out)  # with each repeat's files, each fits its model
    ran = sum(r["status"] == "completed" for r in manifest["repeats"])
    dirs = [f"repeat-{k}" for k in range(1, ran + 1)]
    assert [r["status"] for r in manifest["repeats"]] == ["completed"] * ran + ["pending"] * (5 - ran)
    assert [r["seed"] for r in manifest["repeats"][:ran]] == list(range(ran)) and not (
        out / f"repeat-{ran + 1}"
    ).exists()
    assert not any(_converged_by_hand(out, dirs[:k], 0.10) for k in range(3, ran))  # it went on only while it had to
    if _converged_by_hand(out, dirs, 0.10):
        assert manifest["stopped"] == "converged" and f"stopped: converged after {ran}" in res.stderr
    else:
        assert ran == 5 and manifest["stopped"] == "all repeats ran"
    for path, (mean, half) in _by_hand(out, dirs).items():
        m = manifest["metrics"][path]
        assert m["n"] == ran and m["mean"] == pytest.approx(mean) and m["half_width"] == pytest.approx(half)
    assert f"across {ran} of {ran} completed repeats" in res.stderr
    write_report([out], tmp_path / "report.html")
    md = (tmp_path / "report.md").read_text()
    ttft = manifest["metrics"]["ttft_ms.p50"]
    assert "## Across repeats" in md and f"| out | ttft_ms.p50 | ms | {ttft['mean']:,.2f} |" in md
    assert f"| out/repeat-{ran} |" in md and f"{ran} of up to 5 repeats completed, stopped: {manifest['stopped']}" in md
    print(f"stopped after {ran} repeats: {manifest['stopped']}")


def test_repeats_of_a_server_whose_speed_changes_between_runs_run_to_the_end(tmp_path):
    # the server's TTFT is 50 ms for the first 60 requests, 400 ms for the next 60, and so on: one value a run
    n = 60
    with GroundTruthProcess(GroundTruthConfig(itl_ms=5, ttft_cycle_ms=(50.0, 400.0), cycle_every=n)) as gt:
        scenario = load_scenario(_scenario(tmp_path, gt.url, f"{{arrival: constant, rate: 40, num_requests: {n}}}"))
        state = run_repeats(scenario, tmp_path / "out", 4, until_ci=0.10, workers="1", keep_invalid=True)
    assert state.stopped == "all repeats ran" and [s.status for s in state.statuses] == ["completed"] * 4
    ttft = state.intervals["ttft_ms.p50"]
    assert [v > 300 for v in ttft.values] == [False, True, False, True], ttft.values
    assert ttft.relative_half_width > 0.5
    manifest = json.loads((tmp_path / "out" / "repeats.json").read_text())
    for path, (mean, half) in _by_hand(tmp_path / "out", [f"repeat-{k}" for k in range(1, 5)]).items():
        assert manifest["metrics"][path]["mean"] == pytest.approx(mean)
        assert manifest["metrics"][path]["half_width"] == pytest.approx(half)


def test_a_cut_short_repeats_folder_keeps_its_finished_repeats(tmp_path):
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=5)) as gt:
        scenario = _scenario(tmp_path, gt.url, "{arrival: constant, rate: 40, num_requests: 50}")
        out = tmp_path / "out"
        proc = bench_started("run", scenario, "--output", out, "--repeats", 3, "--keep-invalid", "--allow-client-bound")
        stderr = interrupt_once_written(proc, out / "repeat-2" / "requests.jsonl", 5)
    assert proc.returncode == 130, stderr
    manifest = json.loads((out / "repeats.json").read_text())
    assert [r["status"] for r in manifest["repeats"]] == ["completed", "interrupted", "pending"]
    assert manifest["stopped"] == "interrupted" and manifest["metrics"]["ttft_ms.p50"]["n"] == 1
    first = json.loads((out / "repeat-1" / "summary.json").read_text())
    assert manifest["metrics"]["ttft_ms.p50"]["mean"] == first["ttft_ms"]["p50"]
    write_report([out], tmp_path / "report.html")
    md = (tmp_path / "report.md").read_text()
    assert "| out/repeat-1 |" in md and "out/repeat-2 |" not in md and "not completed: repeat-2 (interrupted)" in md


@pytest.mark.parametrize(
    "args, message",
    [
        (["--repeats", "5", "--until-ci", "five"], "--until-ci: 'five' is not a percentage"),
        (["--repeats", "2", "--until-ci", "5%"], "--until-ci needs --repeats 3 or more"),
        (["--repeats", "3", "--set", "load.sweep=[1, 2]"], "--repeats: not with candidates or load.sweep"),
    ],
)
def test_bad_repeat_options_name_the_option_and_the_fix(tmp_path, args, message):
    scenario = _scenario(tmp_path, "http://127.0.0.1:9", "{arrival: constant, rate: 20, num_requests: 4}")
    res = CliRunner().invoke(app, ["run", str(scenario), "--output", str(tmp_path / "out"), *args])
    assert res.exit_code == 2 and message in " ".join(res.output.split()), res.output
