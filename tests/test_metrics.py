"""Metric definitions (docs/metrics.md) against cases computed by hand."""

import pytest

from harness.metrics.latencies import concurrency_profile, describe, meets_slo, request_latency, summarize
from harness.results.folder import RequestRecord


def _rec(index=0, intended=0.0, actual=None, times=(), per_chunk=(), out=None, **kw):
    times = list(times)
    return RequestRecord(
        index=index,
        intended_send_s=intended,
        actual_send_s=intended if actual is None else actual,
        token_times_s=times,
        tokens_per_chunk=list(per_chunk) or [1] * len(times),
        end_s=times[-1] if times else intended + 1.0,
        output_tokens=len(times) if out is None else out,
        **kw,
    )


def test_ttft_e2e_tpot_itl_one_token_per_chunk():
    # sent (intended) at 1.0; tokens at 1.1, 1.12, 1.15, 1.16
    lat = request_latency(_rec(intended=1.0, times=[1.1, 1.12, 1.15, 1.16]))
    assert lat.ttft_s == pytest.approx(0.1)
    assert lat.e2e_s == pytest.approx(0.16)
    assert lat.tpot_s == pytest.approx(0.06 / 3)
    assert lat.itl_chunk_s == pytest.approx([0.02, 0.03, 0.01])
    assert lat.itl_token_s == pytest.approx([0.02, 0.03, 0.01])


def test_latency_counts_from_intended_not_actual_send():
    # the client was 50 ms late: a slow server cannot hide that queueing
    lat = request_latency(_rec(intended=0.0, actual=0.05, times=[0.2, 0.3]))
    assert lat.ttft_s == pytest.approx(0.2)


def test_multi_token_chunks_split_gaps_per_token():
    # chunks at 0.1 (2 tokens), 0.16 (3 tokens), 0.18 (1 token) -> 6 tokens
    lat = request_latency(_rec(times=[0.1, 0.16, 0.18], per_chunk=[2, 3, 1], out=6))
    assert lat.itl_chunk_s == pytest.approx([0.06, 0.02])
    assert lat.itl_token_s == pytest.approx([0.02, 0.02, 0.02, 0.02])
    assert lat.tpot_s == pytest.approx((0.18 - 0.1) / 5)


def test_single_token_has_no_tpot_and_failed_has_no_latency():
    assert request_latency(_rec(times=[0.3])).tpot_s is None
    failed = _rec(times=[0.1, 0.2])
    failed.fail("stream_cut")
    assert request_latency(failed) is None


def test_describe_percentiles():
    stats = describe([0.001 * v for v in range(1, 101)])  # 1..100 ms
    assert stats.min == pytest.approx(1) and stats.max == pytest.approx(100)
    assert stats.mean == pytest.approx(50.5)
    assert stats.p50 == pytest.approx(50.5)
    assert stats.p99 == pytest.approx(99.01)
    assert stats.p999 == pytest.approx(99.901)
    assert describe([]).p99 is None


def test_summary_itl_of_one_token_and_of_several_token_chunks():
    one = summarize([_rec(times=[0.1, 0.2, 0.4, 0.7])])
    assert one.itl_ms == one.itl_chunk_ms and one.itl_ms.max == pytest.approx(300)
    # a chunk of 4 tokens after a 0.2 s gap: 4 token gaps of 50 ms, one chunk gap of 200 ms
    several = summarize([_rec(times=[0.1, 0.3], per_chunk=[1, 4], out=5)])
    assert several.itl_ms.max == pytest.approx(50) and several.itl_chunk_ms.max == pytest.approx(200)


def test_slo_checks_each_metric():
    lat = request_latency(_rec(times=[0.1, 0.12, 0.17]))  # ttft 100, itl 20/50, tpot 35, e2e 170 ms
    assert meets_slo(lat, {"ttft_ms": 100.001, "tpot_ms": 35.001, "e2e_ms": 170.001})
    assert not meets_slo(lat, {"ttft_ms": 99})
    assert not meets_slo(lat, {"tpot_ms": 34})
    assert not meets_slo(lat, {"e2e_ms": 169})
    assert meets_slo(lat, {"itl_ms": 50.001}) and not meets_slo(lat, {"itl_ms": 49.999})


def test_summary_goodput_throughput_and_failures():
    recs = [
        _rec(0, intended=0.0, times=[0.1, 0.2], prompt_tokens=10),  # good
        _rec(1, intended=0.5, times=[0.9, 1.0], prompt_tokens=10),  # ttft 400 ms: not good
        _rec(2, intended=1.0, times=[1.1, 1.2, 1.3, 2.0], prompt_tokens=10),  # good for ttft only
        _rec(3, intended=1.5),
        _rec(4, intended=-5.0, times=[-4.9], is_warmup=True),
    ]
    recs[3].fail("http_500")
    recs[3].end_s = 1.6
    s = summarize(recs, slo={"ttft_ms": 150, "e2e_ms": None})
    assert s.requests.model_dump() == {"measured": 4, "completed": 3, "failed": 1, "warmup": 1}
    assert s.failures == {"http_500": 1}
    assert s.window_s == pytest.approx(2.0)  # intended 0.0 .. last token 2.0
    assert s.throughput.requests_per_s == pytest.approx(1.5)
    assert s.throughput.output_tokens_per_s == pytest.approx(8 / 2.0)
    assert s.throughput.total_tokens_per_s == pytest.approx(38 / 2.0)
    assert s.goodput.requests_per_s == pytest.approx(1.0)
    assert s.goodput.fraction == pytest.approx(0.5)
    assert s.ttft_ms.max == pytest.approx(400)
    s2 = summarize(recs, slo={"ttft_ms": 150, "e2e_ms": 250})
    assert s2.goodput.fraction == pytest.approx(0.25)


def test_concurrency_profile():
    recs = [_rec(0, intended=0.0, times=[1.0]), _rec(1, intended=0.5, times=[1.5]), _rec(2, intended=2.0, times=[3.0])]
    prof = concurrency_profile(recs)
    assert prof.max == 2
    assert prof.mean == pytest.approx(3.0 / 3.0)
