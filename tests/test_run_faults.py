"""`bench run` as a process, hit by faults: SIGTERM, kill -9 of bench, the launched engine dying, most
requests failing. Each must end with a message and its exit code, and never leave an engine running."""

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest
from bench_process import bench, bench_started, wait_until_written
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from typer.testing import CliRunner

from harness.cli.app import app
from harness.results.folder import read_records

pytestmark = pytest.mark.faults
GT_SERVER = Path(__file__).parent / "groundtruth_server.py"


def launched_scenario(tmp_path, num_requests=400) -> Path:
    path = tmp_path / "s.yaml"
    launch = (
        f"{{command: '{sys.executable} {GT_SERVER} --port {{port}} --ttft-ms 20 --itl-ms 10', ready_timeout_s: 30}}"
    )
    path.write_text(
        f"name: faults\nbackend: {{kind: openai, model: gt, launch: {launch}}}\n"
        "workload: {kind: random, input_tokens: 8, output_tokens: 20}\n"
        f"load: {{arrival: constant, rate: 20, num_requests: {num_requests}}}\n"
    )
    return path


def wait_for_records(out: Path, n: int, timeout_s: float = 60) -> None:
    if not wait_until_written(out / "requests.jsonl", n, timeout_s):
        raise AssertionError(f"fewer than {n} records after {timeout_s} s")


def engine_pid(out: Path) -> int:
    return json.loads((out / "run.json").read_text())["backend"]["engine_pid"]


def gone_within(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def test_sigterm_is_handled_like_ctrl_c_and_stops_the_engine(tmp_path):
    out = tmp_path / "r"
    proc = bench_started("run", launched_scenario(tmp_path), "--output", out, "--workers", "1")
    wait_for_records(out, 5)
    pid = engine_pid(out)
    proc.send_signal(signal.SIGTERM)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["interrupted_by"] == "SIGTERM"
    assert summary["requests"]["measured"] == len(read_records(out)) < 400
    assert "interrupted by SIGTERM" in stderr
    assert gone_within(pid, 5)


def test_kill_9_of_bench_leaves_no_engine_behind(tmp_path):
    out = tmp_path / "r"
    proc = bench_started("run", launched_scenario(tmp_path), "--output", out, "--workers", "1")
    wait_for_records(out, 3)
    pid = engine_pid(out)
    proc.kill()
    proc.communicate(timeout=30)
    started = time.monotonic()
    assert gone_within(pid, 5), "the engine outlived bench by 5 s"
    print(f"engine gone {time.monotonic() - started:.2f} s after kill -9 of bench")


def test_an_engine_that_dies_mid_run_stops_the_load_and_fails_the_run(tmp_path):
    out = tmp_path / "r"
    proc = bench_started("run", launched_scenario(tmp_path), "--output", out, "--workers", "1")
    wait_for_records(out, 5)
    os.kill(engine_pid(out), signal.SIGKILL)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 4, stderr
    said = " ".join(stderr.split())
    assert f"the engine exited with signal SIGKILL (log: {out / 'engine.log'})" in said
    summary = json.loads((out / "summary.json").read_text())
    assert summary["engine_exited"].startswith("the engine exited with signal SIGKILL")
    # the load stopped: not hundreds of connection errors to a dead port
    assert sum(r.error_reason == "connect_error" for r in read_records(out)) < 20


def test_a_run_where_most_requests_failed_exits_4_and_states_the_share(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"[gt fail=http_500 id={i}] hi"}) + "\n" for i in range(6)))
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=1)) as gt:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: failing\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            f"workload: {{kind: file, path: '{prompts}', output_tokens: 4}}\n"
            "load: {arrival: constant, rate: 50, num_requests: 6}\n"
        )
        res = bench("run", scenario, "--output", tmp_path / "r", "--workers", "1")
    assert res.returncode == 4, res.stderr
    said = " ".join(res.stderr.split())
    assert "0 of 6 measured requests completed (0%; at least 50% must)" in said and "http_5xx" in said
    assert "Traceback" not in res.stderr


def test_validate_refuses_a_launch_command_without_port(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(
        "name: noport\nbackend: {kind: llamacpp, model: m.gguf, launch: {command: "
        "'/opt/llama-server -m m.gguf -c 4096'}}\nload: {arrival: constant, rate: 1}\n"
    )
    res = CliRunner().invoke(app, ["validate", str(path)])
    said = " ".join(res.output.split())
    assert res.exit_code == 2 and "backend.launch.command" in said and "{port}, {host}, {model}" in said


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_while_the_engine_starts_still_writes_an_interrupted_summary(tmp_path, sig, code):
    path = tmp_path / "s.yaml"
    never_ready = f"{sys.executable} -c 'import time; time.sleep(120)' {{port}}"  # listens on nothing
    path.write_text(
        f'name: starting\nbackend: {{kind: openai, model: gt, launch: {{command: "{never_ready}", '
        "ready_timeout_s: 60}}\nworkload: {kind: random, input_tokens: 8, output_tokens: 4}\n"
        "load: {arrival: constant, rate: 20, num_requests: 10}\n"
    )
    out = tmp_path / "r"
    proc = bench_started("run", path, "--output", out, "--workers", "1")
    log = out / "engine.log"
    deadline = time.monotonic() + 60
    while not (log.exists() and log.read_text().startswith("$ ")) and time.monotonic() < deadline:
        time.sleep(0.05)
    engine = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
    proc.send_signal(sig)
    stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == code, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["interrupted"] is True and summary["interrupted_by"] == sig.name
    assert summary["requests"] == {"measured": 0, "completed": 0, "failed": 0, "warmup": 0}
    assert f"{out / 'summary.json'} says interrupted: true" in " ".join(stderr.split())
    assert engine and all(gone_within(pid, 5) for pid in engine)
