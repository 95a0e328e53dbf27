"""Phase breakdown: per request from the engine's own timings, per run from histogram deltas."""

import csv

import pytest

from harness.engine.server_metrics import COLUMNS, parse_page
from harness.metrics.phases import phases
from harness.results.folder import RequestRecord


def record(i, send, ttft_s, timings=None, prompt=16, written_after_s=0.002, lag_s=0.0, cap_s=0.0):
    actual = send + lag_s + cap_s
    first = send + ttft_s
    return RequestRecord(
        index=i,
        intended_send_s=send,
        actual_send_s=actual,
        request_written_s=actual + written_after_s,
        token_times_s=[first, first + 0.05, first + 0.1],
        tokens_per_chunk=[1, 1, 1],
        end_s=first + 0.1,
        prompt_tokens=prompt,
        output_tokens=3,
        server_timings=timings or {},
        cap_wait_s=cap_s,
    )


def test_native_timings_split_ttft_into_queue_prefill_client_and_other():
    recs = [
        record(i, i * 1.0, 1.0, {"queue_ms": 800.0, "prefill_ms": 150.0, "decode_ms": 100.0}, lag_s=0.01)
        for i in range(4)
    ]
    p = phases(recs)
    assert p.source == "per request: native"
    assert p.queue.mean == pytest.approx(800) and p.prefill.mean == pytest.approx(150)
    share = p.ttft_share
    assert share.queue == pytest.approx(0.8) and share.prefill == pytest.approx(0.15)
    assert share.client_lag == pytest.approx(0.01) and share.connect_send == pytest.approx(0.002)
    assert share.other == pytest.approx(1 - 0.8 - 0.15 - 0.01 - 0.002)
    assert p.main_ttft_part == "queue"


def test_llamacpp_timings_derive_queue_from_what_ttft_leaves():
    recs = [record(0, 0.0, 0.5, {"prompt_ms": 100.0, "predicted_ms": 90.0, "cache_n": 0})]
    p = phases(recs)
    assert "queue_derived" in p.source and p.prefill.mean == pytest.approx(100)
    assert p.queue.mean == pytest.approx(500 - 2 - 100)  # TTFT minus connect+send minus prefill


def _write_scrapes(path, pages):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(COLUMNS)
        for t_s, text in pages:
            raw, schema = parse_page(text)
            w.writerows((t_s, n, v, labels) for n, v, labels in raw + schema)


def vllm_page(count, queue_sum, prefill_sum, decode_sum):
    lines = []
    for name, total in (
        ("request_queue_time_seconds", queue_sum),
        ("request_prefill_time_seconds", prefill_sum),
        ("request_decode_time_seconds", decode_sum),
    ):
        lines += [f'vllm:{name}_sum{{model_name="m"}} {total}', f'vllm:{name}_count{{model_name="m"}} {count}']
    return "\n".join(lines) + "\n"


def test_histogram_deltas_over_the_window_for_vllm(tmp_path):
    # before the window: 10 requests already counted (a warm-up); inside it 4 more
    _write_scrapes(
        tmp_path / "sm.csv",
        [(0.0, vllm_page(10, 1.0, 1.0, 1.0)), (1.5, vllm_page(10, 1.0, 1.0, 1.0)), (5.0, vllm_page(14, 3.0, 1.4, 2.2))],
    )
    recs = [record(i, 2.0 + i * 0.5, 0.7) for i in range(4)]
    p = phases(recs, tmp_path / "sm.csv")
    assert p.source == "per run: engine histograms over the window"
    assert p.queue.mean == pytest.approx(500) and p.prefill.mean == pytest.approx(100)
    assert p.decode.mean == pytest.approx(300)
    assert p.ttft_share.queue == pytest.approx(500 / 700)


def test_sglang_prefill_is_ttft_minus_queue(tmp_path):
    def page(n, q, ttft, e2e):
        return (
            f'sglang:queue_time_seconds_sum{{m="x"}} {q}\nsglang:queue_time_seconds_count{{m="x"}} {n}\n'
            f'sglang:time_to_first_token_seconds_sum{{m="x"}} {ttft}\n'
            f'sglang:time_to_first_token_seconds_count{{m="x"}} {n}\n'
            f'sglang:e2e_request_latency_seconds_sum{{m="x"}} {e2e}\n'
            f'sglang:e2e_request_latency_seconds_count{{m="x"}} {n}\n'
        )

    _write_scrapes(tmp_path / "sm.csv", [(0.0, page(0, 0, 0, 0)), (9.0, page(2, 0.2, 0.6, 1.6))])
    p = phases([record(0, 1.0, 0.4), record(1, 2.0, 0.4)], tmp_path / "sm.csv")
    assert p.queue.mean == pytest.approx(100) and p.prefill.mean == pytest.approx(200)
    assert p.decode.mean == pytest.approx(500)


def test_no_engine_account_says_why(tmp_path):
    p = phases([record(0, 0.0, 0.3)], None)
    assert p.source is None and "no engine timings" in p.reason
    assert p.ttft_share.connect_send == pytest.approx(0.002 / 0.3)
