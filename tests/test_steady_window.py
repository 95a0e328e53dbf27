"""The measured window (harness/metrics/steady_window.py): ramp-up and drain found from the requests in flight and cut,
end to end against the ground-truth server, and left alone when the load never settled."""

import json

import pytest
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from helpers import synthetic_records

from harness.metrics.latencies import summarize
from harness.metrics.steady_window import steady_window
from harness.results.folder import read_records
from harness.runs.run import run_scenario, trims
from harness.scenario.scenario import load_scenario


def test_a_runs_ramp_up_and_drain_are_cut_and_its_throughput_is_the_offered_rate(tmp_path):
    """Every request takes 1 s (TTFT 500 ms + 19 gaps of 25 ms) at 20 requests/s: the requests in flight climb
    from 0 to 20 over the first second, hold there, and fall after the last send at 4.95 s. The window must
    start once 20 are in flight (about 1 s in) and end at the last send; the requests sent in the ramp-up
    (about 20) and in the last second (about 20) are left out of the latencies, and the window's throughput is
    the offered 20 requests/s, where the whole run's (100 requests over ~6 s) is about 17."""
    rate, n = 20.0, 100
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=500, itl_ms=25)) as gt:
        path = tmp_path / "ramp.yaml"
        path.write_text(
            f"name: ramp\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            "workload: {kind: random, input_tokens: 8, output_tokens: 20}\n"
            f"load: {{arrival: constant, rate: {rate}, num_requests: {n}}}\n"
        )
        result = run_scenario(load_scenario(path), tmp_path / "out", workers="1")
    window = json.loads((tmp_path / "out" / "summary.json").read_text())["window"]
    first_send_s = min(r.intended_send_s for r in read_records(tmp_path / "out"))
    assert window["trimmed"] and window["steady_in_flight"] == pytest.approx(20, abs=1)
    assert 0.8 <= window["start_s"] - first_send_s <= 1.2, window
    assert window["end_s"] - first_send_s == pytest.approx((n - 1) / rate, abs=0.1)
    assert 15 <= window["excluded"]["ramp_up"] <= 21 and 17 <= window["excluded"]["drain"] <= 22, window
    assert window["latency_requests"] == n - window["excluded"]["ramp_up"] - window["excluded"]["drain"]
    summary = result.summary
    assert summary.ttft_ms.p50 >= 500 and summary.window_s == pytest.approx(window["duration_s"])
    assert summary.throughput.requests_per_s == pytest.approx(rate, rel=0.06)
    whole = summarize(read_records(tmp_path / "out"), trim=False)
    assert not whole.window.trimmed and whole.window.latency_requests == n
    assert whole.throughput.requests_per_s < 0.9 * rate
    assert summary.run_span_s == pytest.approx(whole.window_s) and summary.requests.completed == n


def test_an_over_saturated_load_has_no_steady_level_so_nothing_is_cut():
    # every request waits 0.2 s longer than the one before: the requests in flight grow for the whole run
    records = synthetic_records(n=60, rate=10.0, ttft_sigma=0.0)
    for i, r in enumerate(records):
        shift = 0.2 * i
        r.token_times_s = [t + shift for t in r.token_times_s]
        r.end_s += shift
    window = steady_window(records)
    assert not window.trimmed and "never settled" in window.note
    assert window.start_s == records[0].intended_send_s and window.end_s == records[-1].end_s


def test_one_request_at_a_time_is_not_cut_and_load_trim_false_keeps_everything(tmp_path):
    # 60 ms requests every 250 ms: at most one in flight, no batch to fill or to empty
    records = synthetic_records(n=40, rate=4.0)
    window = steady_window(records)
    assert not window.trimmed and "no ramp-up or drain" in window.note
    assert window.summary(records).latency_requests == 40
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nbackend: {kind: openai, url: 'http://127.0.0.1:9'}\nload: {rate: 1, num_requests: 2}\n")
    assert trims(load_scenario(path)) and not trims(load_scenario(path, ["load.trim=false"]))
