"""Failures never stop a run or lose data: each kind comes from a server that really produces it."""

import asyncio
import json

import pytest
from bench_process import bench, bench_started, interrupt_once_written
from groundtruth_server import GroundTruthConfig, GroundTruthProcess, GroundTruthServer, gt_request

from harness.client.runner import Runner, Target
from harness.engine.launcher import BackendUnreachable, check_ready, free_port
from harness.metrics.latencies import summarize
from harness.results.folder import ResultWriter, read_records

FAILURES = {  # server directive -> the reason the runner must record
    "http_500": "http_5xx",
    "http_503": "http_5xx",
    "http_429": "http_429",
    "http_400": "http_4xx",
    "cut_after_3": "stream_cut",
    "malformed_json": "malformed_json",
    "malformed_sse": "malformed_sse",
    "stall": "timeout",
}


async def test_every_failure_kind_is_recorded_and_the_run_goes_on(tmp_path):
    server = GroundTruthServer(GroundTruthConfig(ttft_ms=5, itl_ms=2))
    port = await server.start()
    reqs = []
    for n, fail in enumerate(FAILURES):
        reqs.append(gt_request(2 * n, 0.01 * n, 8, fail=fail))
        reqs.append(gt_request(2 * n + 1, 0.01 * n + 0.005, 8))  # a good request after each bad one
    writer = ResultWriter(tmp_path)
    out = await Runner(
        Target(url=f"http://127.0.0.1:{port}", request_timeout_s=0.5), reqs, on_record=writer.append
    ).run()
    writer.close()
    await server.stop_listening()

    by_index = {r.index: r for r in out.records}
    for n, (fail, reason) in enumerate(FAILURES.items()):
        assert by_index[2 * n].error_reason == reason, (fail, by_index[2 * n])
        assert by_index[2 * n + 1].ok and by_index[2 * n + 1].output_tokens == 8
    summary = summarize(out.records)
    expected = {}
    for reason in FAILURES.values():
        expected[reason] = expected.get(reason, 0) + 1
    assert summary.failures == expected
    assert summary.requests.completed == len(FAILURES)
    # every record, failed or not, is on disk
    on_disk = read_records(tmp_path)
    assert sorted(r.index for r in on_disk) == sorted(by_index)
    assert [r.to_json() for r in sorted(on_disk, key=lambda r: r.index)] == [
        by_index[i].to_json() for i in sorted(by_index)
    ]


async def test_refused_connections_mid_run_are_failures():
    server = GroundTruthServer(GroundTruthConfig(ttft_ms=5, itl_ms=2, keep_alive=False))
    port = await server.start()
    reqs = [gt_request(0, 0.0, 4), gt_request(1, 0.0, 4), gt_request(2, 0.4, 4), gt_request(3, 0.45, 4)]

    async def close_listener():
        await asyncio.sleep(0.2)
        await server.stop_listening()

    closer = asyncio.create_task(close_listener())
    out = await Runner(Target(url=f"http://127.0.0.1:{port}"), reqs).run()
    await closer
    by_index = {r.index: r for r in out.records}
    assert by_index[0].ok and by_index[1].ok
    assert by_index[2].error_reason == by_index[3].error_reason == "connect_error"
    assert summarize(out.records).failures == {"connect_error": 2}


def test_unreachable_server_is_one_clear_error_before_any_load(tmp_path):
    port = free_port()
    with pytest.raises(BackendUnreachable, match=f"backend.url: cannot reach http://127.0.0.1:{port}"):
        check_ready(f"http://127.0.0.1:{port}")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f"name: down\nbackend: {{kind: openai, url: 'http://127.0.0.1:{port}', model: gt}}\n"
        "load: {arrival: constant, rate: 10, num_requests: 5}\n"
    )
    res = bench("run", scenario, "--output", tmp_path / "r", timeout_s=60)
    assert res.returncode == 4  # the run failed
    assert "cannot reach" in res.stderr and "backend.launch" in res.stderr
    assert not (tmp_path / "r" / "requests.jsonl").read_text()  # no load was sent


@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_keeps_every_completed_record_and_marks_the_summary(tmp_path, workers):
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=10)) as gt:
        scenario = tmp_path / "s.yaml"
        scenario.write_text(
            f"name: cut\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            "workload: {kind: random, input_tokens: 8, output_tokens: 20}\n"
            "load: {arrival: constant, rate: 20, num_requests: 400}\n"
        )
        out_dir = tmp_path / "r"
        proc = bench_started("run", scenario, "--output", out_dir, "--workers", workers)
        stderr = interrupt_once_written(proc, out_dir / "requests.jsonl", 10)  # some requests have finished
    assert proc.returncode == 130, stderr
    summary = json.loads((out_dir / "summary.json").read_text())
    assert summary["interrupted"] is True
    records = read_records(out_dir)
    completed = [r for r in records if r.ok]
    assert len(completed) >= 10 and len(records) < 400
    assert summary["requests"]["completed"] == len(completed)
    assert summary["requests"]["measured"] == len(records)
    assert set(summary["failures"]) <= {"interrupted"}
