"""The results folder under faults: a disk that fills mid-run, a read-only folder, two runs (or `--overwrite`) on
one folder, a background job's ignored SIGINT. Each ends with its exit code and a message, never a hang, and
keeps what was written."""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from bench_process import BENCH, bench, bench_started, wait_until_written
from groundtruth_server import GroundTruthConfig, GroundTruthProcess

from harness.results.folder import ResultsError, ResultWriter, lock_folder, read_records
from harness.results.folder_lock import LOCK_NAME

pytestmark = pytest.mark.faults
WIDE = {**os.environ, "COLUMNS": "400"}  # long paths in a message stay on one line


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs: a results disk that fills after a few dozen records. Mounting needs root (CI runs as root)."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(disk)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {mounted.stderr.decode().strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=True)


def gt_scenario(tmp_path: Path, url: str, num_requests: int, output_tokens: int) -> Path:
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: disk\nbackend: {{kind: openai, url: '{url}', model: gt}}\n"
        f"workload: {{kind: random, input_tokens: 8, output_tokens: {output_tokens}}}\n"
        f"load: {{arrival: constant, rate: 40, num_requests: {num_requests}}}\n"
        "telemetry: {enabled: true, interval_ms: 100}\n"
    )
    return path


def disk_full(disk: Path) -> bool:
    stat = os.statvfs(disk)
    return stat.f_bavail * stat.f_frsize < 4096


def test_a_disk_that_fills_mid_run_ends_it_with_exit_4_and_the_records_that_fit(tmp_path, small_disk):
    out = small_disk / "r"
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=2)) as gt:
        scenario = gt_scenario(tmp_path, gt.url, 2000, 40)
        res = bench("run", scenario, "--output", out, "--workers", "1", timeout_s=120, env=WIDE)
    said = " ".join(res.stderr.split()) + " ".join(res.stdout.split())
    assert res.returncode == 4, res.stderr
    assert "Traceback" not in res.stderr + res.stdout
    assert f"writing {out / 'requests.jsonl'} failed: No space left on device" in said
    assert "the disk is full: free space or choose another --output" in said
    records = read_records(out)  # a torn last line is skipped
    assert 0 < len(records) < 2000 and all(r.ok for r in records)
    # the summary did not fit either: said, and printed on the console instead
    assert not (out / "summary.json").exists() and "summary.json failed" in said
    assert not (out / ".summary.json.tmp").exists() and not (out / LOCK_NAME).exists()


def test_sigterm_is_honoured_once_the_disk_is_full(tmp_path, small_disk):
    """Long streams are still in flight when the disk fills (the load has stopped, they get their grace): a SIGTERM
    then ends bench like any other SIGTERM. Before, the task that records requests died and bench ignored signals."""
    out = small_disk / "r"
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=20)) as gt:
        proc = bench_started("run", gt_scenario(tmp_path, gt.url, 2000, 150), "--output", out, "--workers", "1")
        deadline = time.monotonic() + 90
        while not disk_full(small_disk) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=60)
    # 143 when the signal came during the streams' grace, 4 when the run had already ended by itself: either way
    # bench ended within the timeout with a message, where it once hung until SIGKILL
    assert proc.returncode in (143, 4), stderr
    assert "Traceback" not in stderr + stdout
    assert "No space left on device" in stderr + stdout
    print(f"exit {proc.returncode}")


def test_a_read_only_results_folder_exits_2_with_a_message(tmp_path, small_disk):
    (small_disk / "existing").mkdir()
    subprocess.run(["mount", "-o", "remount,ro", str(small_disk)], check=True)
    scenario = gt_scenario(tmp_path, "http://127.0.0.1:9", 4, 4)
    for out, said in ((small_disk / "new", "Read-only file system"), (small_disk / "existing", "is not writable")):
        res = bench("run", scenario, "--output", out, "--workers", "1", env=WIDE)
        assert res.returncode == 2, res.stderr
        assert "--output: " in res.stderr and str(out) in res.stderr
        assert said in res.stdout + res.stderr and "Traceback" not in res.stdout + res.stderr


def test_a_folder_is_written_by_one_run_at_a_time(tmp_path):
    first = ResultWriter(tmp_path / "r")
    with pytest.raises(ResultsError, match=r"being written by a run in progress \(pid \d+"):
        ResultWriter(tmp_path / "r", overwrite=True)
    with pytest.raises(ResultsError, match="being written by a run in progress"):
        lock_folder(tmp_path / "r")
    first.close()
    assert not (tmp_path / "r" / LOCK_NAME).exists()
    ResultWriter(tmp_path / "r", overwrite=True).close()  # free again once the first is done


def test_overwrite_of_a_live_runs_folder_is_refused_and_the_live_run_keeps_its_records(tmp_path):
    out = tmp_path / "r"
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=2)) as gt:
        scenario = gt_scenario(tmp_path, gt.url, 4000, 8)  # 100 s at 40 req/s: live through the second's start
        live = bench_started("run", scenario, "--output", out, "--workers", "1")
        assert wait_until_written(out / "requests.jsonl", 3)
        second = bench("run", scenario, "--output", out, "--overwrite", "--workers", "1", env=WIDE)
        assert live.poll() is None
        written = len(read_records(out))
        live.send_signal(signal.SIGINT)
        stderr = live.communicate(timeout=60)[1]
    said = " ".join(second.stdout.split() + second.stderr.split())
    assert second.returncode == 2 and f"--output: {out} is being written by a run in progress (pid {live.pid}" in said
    assert live.returncode == 130, stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["requests"]["measured"] == len(read_records(out)) >= written > 3


def test_a_sweep_overwrite_does_not_delete_a_point_a_live_run_writes(tmp_path):
    point = tmp_path / "sweep" / "point-000-rate-1"
    live = ResultWriter(point)  # as a sweep's running point holds it
    (tmp_path / "sweep" / "sweep.json").write_text("{}")
    from harness.results.folder import prepare_sweep_dir

    with pytest.raises(ResultsError, match="being written by a run in progress"):
        prepare_sweep_dir(tmp_path / "sweep", overwrite=True)
    assert point.is_dir() and (point / "requests.jsonl").exists()
    live.close()
    prepare_sweep_dir(tmp_path / "sweep", overwrite=True).release()
    assert not point.exists()


def test_a_background_jobs_ignored_sigint_stays_ignored_and_sigterm_still_stops_the_run(tmp_path):
    """`bench run ... &` in a script: the shell leaves SIGINT ignored, and bench keeps it so through its load (as
    Python does before it); SIGTERM is what stops it (docs/faults.md)."""
    out = tmp_path / "r"
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=5, itl_ms=20)) as gt:
        scenario = gt_scenario(tmp_path, gt.url, 400, 8)
        proc = subprocess.Popen(
            [*BENCH, "run", str(scenario), "--output", str(out), "--workers", "1"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
        assert wait_until_written(out / "requests.jsonl", 3)
        proc.send_signal(signal.SIGINT)
        seen = len(read_records(out))
        assert wait_until_written(out / "requests.jsonl", seen + 5), "the ignored SIGINT stopped the load"
        proc.send_signal(signal.SIGTERM)
        stderr = proc.communicate(timeout=60)[1]
    assert proc.returncode == 143, stderr
    assert json.loads((out / "summary.json").read_text())["interrupted_by"] == "SIGTERM"
