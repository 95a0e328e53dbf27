"""`bench` end to end: validate, run (against the ground-truth server), results layout, launching."""

import json
import sys
from pathlib import Path

import pytest
from bench_process import bench
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from typer.testing import CliRunner

from harness.cli.app import app
from harness.metrics.latencies import client_bound_reasons, summarize
from harness.results.folder import read_records

GT_SERVER = Path(__file__).parent / "groundtruth_server.py"
STAT_KEYS = {"mean", "std", "min", "p50", "p90", "p95", "p99", "p999", "max"}


@pytest.fixture(scope="module")
def gt():
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=10, itl_ms=2)) as server:
        yield server


def _scenario(
    tmp_path,
    backend: str,
    load: str = "{arrival: poisson, rate: 40, num_requests: 30}",
    slo: str = "{ttft_ms: 500, tpot_ms: 50}",
) -> Path:
    path = tmp_path / "scenario.yaml"
    path.write_text(
        f"name: clitest\nbackend: {backend}\n"
        "workload: {kind: random, input_tokens: 16, output_tokens: 8}\n"
        f"load: {load}\nslo: {slo}\n"
    )
    return path


def test_version_and_validate(tmp_path):
    runner = CliRunner()
    assert runner.invoke(app, ["--version"]).output.startswith("bench ")
    good = _scenario(tmp_path, "{kind: openai, url: 'http://127.0.0.1:9', model: gt}")
    res = runner.invoke(app, ["validate", str(good), "--set", "load.rate=7"])
    assert res.exit_code == 0
    assert json.loads(res.output)["load"]["rate"] == 7
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nbackend: {kind: openai, url: 'http://127.0.0.1:9'}\nload: {arrival: poisson, rat: 3}\n")
    res = runner.invoke(app, ["validate", str(bad)])
    assert res.exit_code == 2
    assert "load.rat" in res.output


def test_run_writes_results(gt, tmp_path):
    scenario = _scenario(tmp_path, f"{{kind: openai, url: '{gt.url}', model: gt}}")
    out = tmp_path / "out"
    # --allow-client-bound: on a shared machine the client may be starved; that has its own test
    res = bench(
        "run",
        scenario,
        "--output",
        out,
        "--set",
        "load.num_requests=12",
        "--set",
        "load.warmup_requests=2",
        "--allow-client-bound",
    )
    assert res.returncode == 0, res.stderr
    run_info = json.loads((out / "run.json").read_text())
    assert run_info["scenario"]["load"]["num_requests"] == 12
    assert {"versions", "host", "backend", "token_count_method"} <= set(run_info)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["completed"] == 12 and summary["requests"]["warmup"] == 2
    assert summary["interrupted"] is False and isinstance(summary["client_bound"], bool)
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "schedule_lag_ms"):
        assert set(summary[key]) == STAT_KEYS
    assert summary["ttft_ms"]["min"] >= 10.0  # the server's TTFT is a floor
    assert summary["goodput"]["fraction"] == 1.0
    assert set(summary["throughput"]) == {"requests_per_s", "output_tokens_per_s", "total_tokens_per_s"}
    records = read_records(out)
    assert len(records) == 14 and all(r.output_tokens == 8 for r in records)
    assert "ttft" in res.stderr  # the summary table


def test_client_bound_run_fails_loudly_unless_allowed(gt, tmp_path):
    # far more requests per second than one Python process can send on time
    scenario = _scenario(
        tmp_path,
        f"{{kind: openai, url: '{gt.url}', model: gt}}",
        load="{arrival: constant, rate: 20000, num_requests: 600}",
    )
    res = bench("run", scenario, "--output", tmp_path / "a", "--workers", "1")
    assert res.returncode == 3, res.stderr
    assert "CLIENT-BOUND" in res.stderr
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["client_bound"] is True
    res = bench("run", scenario, "--output", tmp_path / "b", "--workers", "1", "--allow-client-bound")
    assert res.returncode == 0


def test_client_bound_reasons():
    def lags(client_p99_ms: float, loop_p99_ms: float, ttft_p50_ms: float | None = None):
        figures = summarize([])  # what no request measured, then the lags given
        figures.client_lag_ms.p99, figures.event_loop_lag_ms.p99 = client_p99_ms, loop_p99_ms
        figures.ttft_ms.p50 = ttft_p50_ms
        return figures

    assert client_bound_reasons(lags(1.0, 2.0)) == []
    reasons = client_bound_reasons(lags(12.0, 30.0))
    assert reasons == ["send lag p99 12.0 ms > 5 ms", "event-loop lag p99 30.0 ms > 10 ms"]
    # beside a TTFT p50 of 1 s, 12 ms of send lag moves no percentile by 5%; 60 ms does
    assert client_bound_reasons(lags(12.0, 30.0, 1000.0)) == []
    assert client_bound_reasons(lags(60.0, 30.0, 1000.0)) == ["send lag p99 60.0 ms > 5 ms and > 5% of TTFT p50"]


def test_launch_starts_and_stops_the_engine(tmp_path):
    backend = (
        "{kind: openai, model: gt, launch: {command: '"
        + sys.executable
        + " "
        + str(GT_SERVER)
        + " --port {port} --ttft-ms 5 --itl-ms 1', ready_timeout_s: 30}}"
    )
    scenario = _scenario(tmp_path, backend, load="{arrival: constant, rate: 50, num_requests: 5}")
    out = tmp_path / "out"
    res = bench("run", scenario, "--output", out, "--allow-client-bound")
    assert res.returncode == 0, res.stderr
    assert len(read_records(out)) == 5
    log = (out / "engine.log").read_text()
    assert "groundtruth_server.py --port" in log and "PORT " in log
    url = json.loads((out / "run.json").read_text())["backend"]["url"]
    from harness.engine.launcher import BackendUnreachable, check_ready

    with pytest.raises(BackendUnreachable):
        check_ready(url, timeout_s=1)  # stopped after the run


def test_workers_share_one_schedule(gt, tmp_path):
    scenario = _scenario(
        tmp_path,
        f"{{kind: openai, url: '{gt.url}', model: gt}}",
        load="{arrival: constant, rate: 50, num_requests: 20}",
    )
    out = tmp_path / "out"
    res = bench("run", scenario, "--output", out, "--workers", "2", "--allow-client-bound")
    assert res.returncode == 0, res.stderr
    records = sorted(read_records(out), key=lambda r: r.index)
    assert [r.index for r in records] == list(range(20))
    assert [round(r.intended_send_s, 6) for r in records] == [round(i / 50, 6) for i in range(20)]
    assert max(r.actual_send_s - r.intended_send_s for r in records) < 0.05
    assert json.loads((out / "summary.json").read_text())["workers"] == 2


def test_workers_option():
    from groundtruth_server import gt_request

    from harness.client.workers import resolve_workers

    reqs = [gt_request(i, i * 0.01, 99) for i in range(101)]  # 9,999 output tokens over 1 s
    assert resolve_workers("auto", reqs, None, None, cpu_count=16) == 2
    assert resolve_workers("auto", reqs, None, None, cpu_count=2) == 1  # one core stays free
    assert resolve_workers("3", reqs, None, None, cpu_count=2) == 3
    for bad in ("0", "many"):
        with pytest.raises(ValueError, match="load.workers: .* use auto or a whole number"):
            resolve_workers(bad, reqs, None, None, cpu_count=2)
