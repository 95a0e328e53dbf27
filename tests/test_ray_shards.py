"""Distributed load generation on a real two-node Ray cluster on loopback (harness.client.ray.shards).

The module starts the cluster once (Ray takes 10-30 s to start on two busy cores): a head and a second
node, each `ray start --block` with --num-cpus 1 in a session of its own, on free ports and a temp dir of
its own, so stopping it (SIGTERM, then SIGKILL for what is left of that session) touches nothing else.
Ray binds the host's own address even when given 127.0.0.1 (ray/_private/services.py
resolve_ip_for_localhost; its loopback-only switch refuses a second node), so its control ports listen
there; the load itself goes to the ground-truth server on 127.0.0.1.
Skipped with its reason when the ray extra is not installed. The clock estimator's own tests need no Ray.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from bench_process import bench_started, interrupt_once_written
from groundtruth_server import GroundTruthConfig, GroundTruthProcess

from harness.client.clock_offset import measure_offset
from harness.client.ray.shards import DistributedError
from harness.runs.run import run_scenario
from harness.scenario.scenario import load_scenario

START_TIMEOUT_S = 90


def test_clock_offset_brackets_a_known_offset_with_half_the_shortest_round_trip():
    true_offset_ns = 7_000_000
    delays = iter([3e-3, 1e-4, 2e-3] * 4)  # the remote side answers after varying delays

    def remote_clock_ns() -> int:
        time.sleep(next(delays) / 2)
        reading = time.time_ns() + true_offset_ns
        time.sleep(next(delays) / 2)
        return reading

    est = measure_offset(remote_clock_ns, exchanges=6)
    assert abs(est.offset_s - true_offset_ns / 1e9) <= est.uncertainty_s + 1e-6
    assert est.uncertainty_s == pytest.approx(est.round_trip_min_s / 2)
    # the 0.1 ms exchanges are kept: their bound is tighter than the 2-3 ms ones would give
    assert est.round_trip_min_s < 2e-3 and est.exchanges == 6


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _session_pids(sid: int) -> list[int]:
    """The processes of the session a `ray start --block` of ours leads (Ray's daemons and workers)."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:  # field 6 of /proc/PID/stat: the session id
            pids.append(int(stat.parent.name))
    return pids


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    for pid in _session_pids(proc.pid):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(timeout=10)


def _ray_start(args: list[str], log: Path) -> subprocess.Popen:
    ray_cli = str(Path(sys.executable).parent / "ray")
    proc = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--block",
            "--disable-usage-stats",
            "--node-ip-address",
            "127.0.0.1",
            "--object-store-memory",
            str(80 * 1024 * 1024),
            "--dashboard-agent-listen-port",
            str(_free_port()),
            *args,
        ],
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + START_TIMEOUT_S
    while "Ray runtime started" not in log.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            _stop(proc) if proc.poll() is None else None
            pytest.fail(f"ray start did not come up: {log.read_text()[-2000:]}")
        time.sleep(0.2)
    return proc


@pytest.fixture(scope="module")
def ray_cluster():
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    temp_dir = tempfile.mkdtemp(prefix="rayt", dir="/tmp")  # short: Ray's socket paths must stay under 108 bytes
    port = _free_port()
    started = []
    try:
        started.append(
            _ray_start(
                ["--head", "--port", str(port), "--num-cpus", "1", "--include-dashboard=false", "--temp-dir", temp_dir],
                Path(temp_dir) / "head.log",
            )
        )
        started.append(
            _ray_start(
                ["--address", f"127.0.0.1:{port}", "--num-cpus", "1", "--resources", '{"node_b": 1}'],
                Path(temp_dir) / "node_b.log",
            )
        )
        yield f"127.0.0.1:{port}"
    finally:
        for proc in reversed(started):
            _stop(proc)
        shutil.rmtree(temp_dir, ignore_errors=True)


def _scenario(tmp_path: Path, url: str, address: str, load: str, extra: str = ""):
    """The runs below set ray_max_clock_uncertainty_ms: 5: a Ray round trip here is ~0.7 ms (±0.4 ms, inside the
    default 1 ms), but other tests and helpers load these 2 cores, and a spike must not fail a test of counting."""
    path = tmp_path / "s.yaml"
    path.write_text(
        f"name: ray\nbackend: {{kind: openai, url: '{url}', model: gt}}\n"
        "workload: {kind: random, input_tokens: 8, output_tokens: 8}\n"
        f"load: {{{load}, ray: '{address}'{extra}}}\n"
        "telemetry: {interval_ms: 500, gpu: false}\n"
    )
    return load_scenario(path, [])


def _records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_two_nodes_run_256_streams_with_per_node_counts_adding_up(ray_cluster, tmp_path):
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=10)) as gt:
        # 512 requests, 256 in flight at once: each node's actor holds 128 streams
        scn = _scenario(
            tmp_path,
            gt.url,
            ray_cluster,
            "arrival: closed, concurrency: 256, num_requests: 512",
            ", ray_max_clock_uncertainty_ms: 5",
        )
        result = run_scenario(scn, tmp_path / "out")
    run = json.loads((tmp_path / "out" / "run.json").read_text())
    nodes = run["ray"]["nodes"]
    assert len(nodes) == 2 and len({n["node_id"] for n in nodes}) == 2 and result.summary.workers == 2
    assert [n["planned"] for n in nodes] == [256, 256]
    assert all(n["recorded"] == n["completed"] == 256 and n["lost"] is None for n in nodes)
    for n in nodes:  # each offset measured, within the bound the scenario set
        assert n["clock_uncertainty_s"] <= 0.005 and n["round_trip_min_s"] == pytest.approx(
            2 * n["clock_uncertainty_s"]
        )
    records = _records(tmp_path / "out")
    assert len(records) == 512 == len({r["index"] for r in records})
    assert result.summary.requests.completed == 512 and not result.summary.incomplete
    # one timeline: no node sent a request before its due time by more than its clock's uncertainty (how many
    # streams overlapped depends on how soon each actor gets a core on this busy machine, so it is not asserted)
    slack_s = max(n["clock_uncertainty_s"] for n in nodes) + 1e-3
    assert all(r["actual_send_s"] >= r["intended_send_s"] - slack_s for r in records)
    assert result.summary.concurrency.max <= 256
    assert sum(n.recorded for n in result.summary.ray_nodes) == 512


@pytest.mark.slow
def test_a_killed_node_actor_leaves_a_complete_correctly_counted_run(ray_cluster, tmp_path):
    out = tmp_path / "out"
    killed: list[int] = []

    def kill_one_actor_mid_run() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # run.json names each actor's pid before the load starts
            lines = (out / "requests.jsonl").read_text().count("\n") if (out / "requests.jsonl").exists() else 0
            if lines >= 40 and (out / "run.json").exists():
                pid = json.loads((out / "run.json").read_text())["ray"]["nodes"][1]["pid"]
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                return
            time.sleep(0.05)

    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=10)) as gt:
        # 200 requests over ~5 s: the kill lands after ~40 records, long before either node is done
        scn = _scenario(
            tmp_path,
            gt.url,
            ray_cluster,
            "arrival: constant, rate: 40, num_requests: 200",
            ", ray_max_clock_uncertainty_ms: 5",
        )
        killer = threading.Thread(target=kill_one_actor_mid_run)
        killer.start()
        result = run_scenario(scn, out)
        killer.join()
    assert killed, "the actor was never killed"
    alive, dead = result.summary.ray_nodes
    assert alive.lost is None and alive.completed == alive.planned == 100
    assert "ActorDiedError" in dead.lost or "RayActorError" in dead.lost
    assert 0 < dead.recorded - dead.actor_lost_failures < 100  # some recorded before the kill, not all
    assert dead.completed + dead.failed == dead.planned == 100
    records = _records(out)
    assert len(records) == 200 == len({r["index"] for r in records})  # planned = completed + failed, none twice
    lost = [r for r in records if r["error_reason"] == "actor_lost"]
    assert len(lost) == dead.actor_lost_failures > 0
    summary = result.summary
    assert summary.requests.completed + summary.requests.failed == 200
    assert summary.failures.get("actor_lost") == len(lost) and not summary.incomplete
    assert any("was lost" in w for w in result.warnings)


def test_a_clock_known_less_precisely_than_the_bound_refuses_the_run(ray_cluster, tmp_path):
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=10)) as gt:
        # a round trip through Ray takes far more than 2 microseconds, so no node can meet a ±1 µs bound
        scn = _scenario(
            tmp_path,
            gt.url,
            ray_cluster,
            "arrival: constant, rate: 40, num_requests: 20",
            ", ray_max_clock_uncertainty_ms: 0.001",
        )
        with pytest.raises(
            DistributedError,
            match=r"load.ray_max_clock_uncertainty_ms: the clock of node \S+ "
            r".* is known only to ±[0-9.]+ ms .* above the bound of 0.001 ms",
        ):
            run_scenario(scn, tmp_path / "out")
    assert (tmp_path / "out" / "requests.jsonl").read_text() == ""  # refused before any request was sent


@pytest.mark.slow
def test_ctrl_c_of_the_driver_keeps_every_record_received(ray_cluster, tmp_path):
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=10)) as gt:
        path = tmp_path / "s.yaml"
        path.write_text(
            f"name: ray\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            "workload: {kind: random, input_tokens: 8, output_tokens: 8}\n"
            "load: {arrival: constant, rate: 40, num_requests: 400, ray_max_clock_uncertainty_ms: 5}\n"
            "telemetry: {interval_ms: 500, gpu: false}\n"
        )
        out = tmp_path / "out"
        proc = bench_started("run", path, "--output", out, "--ray", ray_cluster, "--allow-client-bound")
        stderr = interrupt_once_written(proc, out / "requests.jsonl", 40, timeout_s=120)
    assert proc.returncode == 130, stderr
    summary = json.loads((out / "summary.json").read_text())
    records = _records(out)
    assert summary["interrupted"] and 40 <= len(records) < 400
    assert summary["requests"]["completed"] + summary["requests"]["failed"] == len(records)
    assert sum(n["recorded"] for n in summary["ray_nodes"]) == len(records)
    assert len(json.loads((out / "run.json").read_text())["ray"]["nodes"]) == 2


def test_an_address_where_no_cluster_answers_fails_fast_naming_the_field(tmp_path):
    pytest.importorskip("ray", reason="the ray extra is not installed (pip install -e '.[ray]')")
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=10)) as gt:
        scn = _scenario(tmp_path, gt.url, f"127.0.0.1:{_free_port()}", "arrival: constant, rate: 40, num_requests: 4")
        started = time.monotonic()
        with pytest.raises(DistributedError, match=r"load.ray: nothing answers at '127.0.0.1:\d+' .*auto"):
            run_scenario(scn, tmp_path / "out")
    assert time.monotonic() - started < 30  # Ray alone would retry the dead address for minutes


@pytest.mark.slow
def test_every_nodes_records_sit_on_the_drivers_timeline(ray_cluster):
    """Checked against the server's own clock (perf_counter, shared by the processes of one machine): if a node
    placed t0 δ later than the driver, its stamps would read δ early and some chunk would seem to arrive before
    the server wrote it; δ earlier, and a request would seem to reach the server before it was written."""
    import asyncio

    from groundtruth_server import fetch_stats, gt_request

    from harness.client.ray.shards import start_crew
    from harness.client.runner import Target, run_async, t0_ahead_ns

    requests = [gt_request(i, 0.01 * i, 8) for i in range(80)]
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=10)) as gt:
        crew = start_crew(ray_cluster, requests, None, max_uncertainty_ms=5)
        try:
            t0_ns = t0_ahead_ns(2, spawn=False, connect=True)
            outcome = run_async(
                crew.run(Target(url=gt.url, model="gt"), lambda rec: None, asyncio.Event(), None, t0_ns)
            )
        finally:
            crew.close()
        truth = fetch_stats(gt.url)["records"]
    assert [s.counts().recorded for s in crew.shards] == [40, 40]
    by_index = {r.index: r for r in outcome.records}
    assert len(by_index) == 80 and all(r.ok for r in by_index.values())
    slack_ns = max(s.clock.uncertainty_s for s in crew.shards) * 1e9 + 1e6
    for rid, srv in truth.items():
        rec = by_index[int(rid)]
        # the send's start, not its end: a node descheduled between its send and the stamp after it would read
        # late without any clock error (seen once in CI at load ~2)
        send_started_ns = outcome.t0_ns + rec.actual_send_s * 1e9
        first_token_ns = outcome.t0_ns + rec.token_times_s[0] * 1e9
        assert srv["recv_ns"] >= send_started_ns - slack_ns, (rid, srv["recv_ns"] - send_started_ns)
        assert first_token_ns >= srv["write_ns"][0] - slack_ns, (rid, first_token_ns - srv["write_ns"][0])
