"""`bench run` with load.sweep: one engine for every point, a run folder per point, sweep.json, Ctrl-C."""

import json
import sys
from pathlib import Path

import pytest
from bench_process import bench, bench_started, interrupt_once_written
from groundtruth_server import GroundTruthConfig, GroundTruthProcess

from harness.engine.launcher import BackendUnreachable, check_ready
from harness.results.folder import POINT_DIR, point_dir_name, read_records
from harness.results.schema_files import validate_folder
from harness.scenario.scenario import ScenarioError, load_scenario

GT_SERVER = Path(__file__).parent / "groundtruth_server.py"
WORKLOAD = "workload: {kind: random, input_tokens: 16, output_tokens: 8}\n"


def test_sweep_runs_every_point_against_one_launched_engine(tmp_path):
    # One request in flight at a time and ~45 ms per request (TTFT 10 ms + 7 gaps of 5 ms): 4 and 8 req/s
    # keep up, 200 req/s queues behind the cap, so TTFT (from the intended send) passes the SLO there.
    launch = f"{{command: '{sys.executable} {GT_SERVER} --port {{port}} --ttft-ms 10 --itl-ms 5', ready_timeout_s: 30}}"
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: sweep\nbackend: {{kind: openai, model: gt, launch: {launch}}}\n"
        + WORKLOAD
        + "load: {arrival: constant, num_requests: 12, warmup_requests: 1, concurrency: 1}\n"
        "slo: {ttft_ms: 300}\n"
    )
    out = tmp_path / "out"
    res = bench("run", scenario, "--output", out, "--set", "load.sweep=[4, 8, 200]", "--allow-client-bound")
    assert res.returncode == 0, res.stderr
    dirs = ["point-000-rate-4", "point-001-rate-8", "point-002-rate-200"]
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == dirs
    pids = set()
    for name, rate in zip(dirs, (4.0, 8.0, 200.0)):
        run_info = json.loads((out / name / "run.json").read_text())
        assert run_info["scenario"]["load"]["rate"] == rate and run_info["scenario"]["load"]["sweep"] is None
        pids.add(run_info["backend"]["engine_pid"])
        summary = json.loads((out / name / "summary.json").read_text())
        assert summary["requests"]["completed"] == 12 and summary["requests"]["warmup"] == 1
        assert len(read_records(out / name)) == 13
    # started once: one command line in the one log, one process for every point, stopped at the end
    log = (out / "engine.log").read_text()
    assert log.count("groundtruth_server.py --port") == 1 and len(pids) == 1 and None not in pids
    with pytest.raises(BackendUnreachable):
        check_ready(run_info["backend"]["url"], timeout_s=1)
    manifest = json.loads((out / "sweep.json").read_text())
    assert sum(name.endswith("requests.jsonl") for name in validate_folder(out)) == 3  # every file fits its model
    assert manifest["kind"] == "rate" and [p["status"] for p in manifest["points"]] == ["completed"] * 3
    assert res.stderr.count("offered ") == 3 and "highest rate meeting TTFT ≤ 300 ms" in res.stderr
    report = bench("report", out, "-o", tmp_path / "report.html")
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "report.md").read_text()
    stated = md.split("**Highest rate meeting the SLOs for 90% of requests: ")[1].split("**")[0]
    assert "interpolated between the last passing and the first failing point" in stated
    assert 8 < float(stated.split()[0]) < 200


def test_ctrl_c_mid_sweep_keeps_finished_points_and_marks_the_cut_one(tmp_path):
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=10, itl_ms=2)) as gt:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: cut\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            + WORKLOAD
            + "load: {arrival: constant, num_requests: 40, sweep: [10, 20, 40]}\n"
            "slo: {ttft_ms: 500}\n"
        )
        out = tmp_path / "out"
        proc = bench_started("run", scenario, "--output", out, "--allow-client-bound")
        # Ctrl-C once the second point is under way
        stderr = interrupt_once_written(proc, out / "point-001-rate-20" / "requests.jsonl", 5)
    assert proc.returncode == 130, stderr
    manifest = json.loads((out / "sweep.json").read_text())
    assert [p["status"] for p in manifest["points"]] == ["completed", "interrupted", "pending"]
    first = json.loads((out / "point-000-rate-10" / "summary.json").read_text())
    assert first["interrupted"] is False and first["requests"]["completed"] == 40
    assert json.loads((out / "point-001-rate-20" / "summary.json").read_text())["interrupted"] is True
    assert not (out / "point-002-rate-40").exists()
    # the report keeps the cut point out of the capacity and says so
    report = bench("report", out, "-o", tmp_path / "report.html")
    assert report.returncode == 0, report.stderr
    md = (tmp_path / "report.md").read_text()
    assert "left out, not completed: point-001-rate-20 (interrupted)" in md
    assert "| rate 10 |" in md and "| rate 20 |" not in md


def _scenario(tmp_path, load: str) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(f"name: s\nbackend: {{kind: openai, url: 'http://127.0.0.1:9'}}\nload: {load}\n")
    return path


@pytest.mark.parametrize(
    "sweep, message",
    [
        ("[]", "give at least one load"),
        ("[2, 1]", "increasing order"),
        ("[1, 1]", "increasing order"),
        ("[0, 1]", "must be > 0"),
        ("4", "must be a list of loads"),
    ],
)
def test_bad_sweep_names_the_field_and_the_fix(tmp_path, sweep, message):
    with pytest.raises(ScenarioError, match=f"^load.sweep: .*{message}"):
        load_scenario(_scenario(tmp_path, "{arrival: poisson}"), [f"load.sweep={sweep}"])


def test_sweep_fits_the_arrival(tmp_path):
    trace = Path(__file__).parents[1] / "scenarios/traces/mooncake_tiny.jsonl"
    with pytest.raises(ScenarioError, match="^load.sweep: a trace sets its own pace"):
        load_scenario(_scenario(tmp_path, f"{{arrival: trace, trace: '{trace}', sweep: [1, 2]}}"))
    with pytest.raises(ScenarioError, match="^load.sweep: .*whole number"):
        load_scenario(_scenario(tmp_path, "{arrival: closed, sweep: [1, 2.5]}"))
    # a closed sweep sets each point's concurrency; an open one each point's rate (over a given load.rate)
    closed = load_scenario(_scenario(tmp_path, "{arrival: closed, sweep: [1, 4]}"))
    assert [(p.load.concurrency, p.load.sweep) for p in closed.sweep_points()] == [(1, None), (4, None)]
    res = bench("validate", _scenario(tmp_path, "{arrival: poisson, rate: 3}"), "--set", "load.sweep=[1,2,4]")
    assert res.returncode == 0 and json.loads(res.stdout)["load"]["sweep"] == [1, 2, 4]
    opened = load_scenario(_scenario(tmp_path, "{arrival: poisson, rate: 3}"), ["load.sweep=[1,2,4]"])
    assert [p.load.rate for p in opened.sweep_points()] == [1.0, 2.0, 4.0]


@pytest.mark.parametrize("value", [0.5, 1e-5, 2.0, 1e6, 12.25])
def test_point_folder_names_are_read_back_as_their_load(value):
    kind = "rate"
    match = POINT_DIR.match(point_dir_name(3, kind, value))
    assert match and match.groups() == ("003", kind, match.group(3)) and float(match.group(3)) == value
