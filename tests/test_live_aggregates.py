"""The live figures of a run (harness/metrics/live.py) from hand-made records: what is due and in flight in open and
closed loops and sessions, the rolling window's rates and percentiles, SLO attainment so far, send lag and the
client-bound warning; and the Prometheus histograms' buckets and text (harness/runs/live_metrics.py)."""

import io
import time
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from harness.metrics.latencies import request_latency
from harness.metrics.live import LiveAggregates, engine_state, gap_bins, lag_reasons
from harness.results.folder import RequestRecord
from harness.runs.live import LiveRun, LiveSettings
from harness.runs.live_metrics import HISTOGRAMS, LABELS, LAG_HELP, Histogram, RunSeries, exposition
from harness.scenario.workload import RequestSpec


def spec(index, offset_s, session_id=None, turn_index=0):
    return RequestSpec(index, "p", None, 4, 4, offset_s, session_id=session_id, turn_index=turn_index)


def record(index, intended_s, token_times_s, actual_s=None, failed=None, session_id=None, turn_index=0):
    rec = RequestRecord(index=index, intended_send_s=intended_s, session_id=session_id, turn_index=turn_index)
    rec.actual_send_s = intended_s if actual_s is None else actual_s
    rec.token_times_s = list(token_times_s)
    rec.output_tokens = len(token_times_s)
    rec.end_s = token_times_s[-1] if token_times_s else intended_s + 0.05
    if failed:
        rec.fail(failed, "test")
    return rec


def open_loop_run():
    """Four requests due at 0, 1, 2 and 3 s; three finished:
    r0: TTFT 0.1 s, tokens 0.1 s apart (ITL 100 ms, TPOT (0.3 - 0.1) / 2 = 100 ms), sent 1 ms late;
    r1: TTFT 0.5 s, one gap of 100 ms; r2: failed (HTTP 500) at 2.05 s."""
    live = LiveAggregates([spec(i, float(i)) for i in range(4)], None, {"ttft_ms": 200.0}, window_s=10.0)
    live.observe(record(0, 0.0, [0.1, 0.2, 0.3], actual_s=0.001))
    live.observe(record(1, 1.0, [1.5, 1.6]))
    live.observe(record(2, 2.0, [], failed="http_5xx"))
    return live


def test_an_open_loop_frame_counts_what_is_due_in_flight_and_finished():
    live = open_loop_run()
    at_2_5 = live.frame(2.5)  # offsets 0, 1, 2 are due, all three finished
    assert (at_2_5.due, at_2_5.in_flight, at_2_5.completed, at_2_5.failed) == (3, 0, 2, 1)
    at_3_2 = live.frame(3.2)  # r3 due at 3 s, not finished: in flight
    assert (at_3_2.due, at_3_2.in_flight) == (4, 1)
    # TTFT p50 of [100, 500] ms = 300 ms; ITL of [100, 100, 100] ms; TPOT [100, 100] ms
    assert at_3_2.ttft_ms.p50 == pytest.approx(300.0)
    assert at_3_2.itl_ms.p99 == pytest.approx(100.0, rel=0.005)  # read off bins 1% wide: their middle
    assert at_3_2.tpot_ms.p50 == pytest.approx(100.0)
    # completions (not the failure) over min(window, elapsed) = 3.2 s: 2 / 3.2; tokens 3 + 2 = 5 / 3.2
    assert at_3_2.requests_per_s == pytest.approx(2 / 3.2)
    assert at_3_2.output_tokens_per_s == pytest.approx(5 / 3.2)
    # TTFT <= 200 ms: r0 only, of three finished (a failure is not within the SLOs)
    assert at_3_2.slo_attainment == pytest.approx(1 / 3)
    # send lags [1, 0, 0] ms; numpy's p99 of 3 sorted values: 0 + 0.98 * (1 - 0)
    assert at_3_2.send_lag_p99_ms == pytest.approx(0.98)


def test_the_rolling_window_drops_what_ended_before_it():
    live = open_loop_run()
    frame = live.frame(11.0)  # window (1.0, 11.0]: r0 ended at 0.3 s and is out, r1 (1.6 s) and r2 in
    assert frame.ttft_ms.p50 == pytest.approx(500.0)
    assert frame.requests_per_s == pytest.approx(1 / 10.0)
    assert frame.completed == 2  # counts so far are the whole run's
    # the window moves a second at a time: at 11.5 s it holds the seconds from floor(11.5 - 10) = 1 on, r1 (1.6 s)
    # still in, and the rate is over that span, 11.5 - 1 = 10.5 s
    later = live.frame(11.5)
    assert later.ttft_ms.p50 == pytest.approx(500.0) and later.requests_per_s == pytest.approx(1 / 10.5)
    # at 12 s second 1 is out: no TTFT left, no completion in the window
    assert live.frame(12.0).ttft_ms.p50 is None and live.frame(12.0).requests_per_s == 0.0


def test_a_closed_loop_keeps_its_concurrency_in_flight_until_fewer_are_left():
    live = LiveAggregates([spec(i, None) for i in range(5)], 2, None)
    live.observe(record(0, 0.0, [0.1]))
    frame = live.frame(0.5)  # 4 left, 2 streams: 2 in flight, 1 + 2 due
    assert (frame.in_flight, frame.due, frame.slo_attainment) == (2, 3, None)  # no SLO set: no attainment
    for i in range(1, 4):
        live.observe(record(i, 0.1 * i, [0.1 * i + 0.1]))
    assert live.frame(0.9).in_flight == 1  # one left


def test_a_later_turn_is_due_once_the_turn_before_it_ended():
    live = LiveAggregates([spec(0, 0.0, session_id=7), spec(1, None, session_id=7, turn_index=1)], None, None)
    assert (live.frame(0.05).due, live.frame(0.05).in_flight) == (1, 1)
    live.observe(record(0, 0.0, [0.1], session_id=7))
    assert (live.frame(0.2).due, live.frame(0.2).in_flight) == (2, 1)


def test_the_client_bound_warning_follows_the_summarys_rule():
    # a 50 ms send lag p99 is over 5 ms and over 5% of a 100 ms TTFT p50 (5 ms): client-bound
    assert len(lag_reasons(100.0, 50.0)) == 1
    # beside a 2 s TTFT p50 the bar is 5% of it, 100 ms: a 50 ms lag is not
    assert lag_reasons(2000.0, 50.0) == []
    assert lag_reasons(None, None) == []


def test_histogram_buckets_are_le_and_cumulative():
    histogram = Histogram.of((0.1, 1.0))
    histogram.add([0.05, 0.1, 0.5, 1.0, 3.0])  # 0.1 falls in le=0.1, 1.0 in le=1.0, 3.0 in +Inf only
    assert histogram.cumulative() == [("0.1", 2), ("1.0", 4), ("+Inf", 5)]
    assert histogram.sum_s == pytest.approx(4.65)


def test_gap_bins_are_one_percent_wide_from_a_microsecond():
    # bin = floor(ln(gap / 1 µs) / ln(1.01)): 0.1 s -> floor(11.5129 / 0.0099503) = 1157; under 1 µs and 0 -> bin 0;
    # 1e9 s is past the last bin (2399)
    assert gap_bins([0.0, 1e-6, 0.1, 1e9]).tolist() == [0, 0, 1157, 2399]


def test_the_itl_window_drops_the_seconds_before_it():
    live = LiveAggregates([spec(0, 0.0), spec(1, 5.0)], None, None, window_s=10.0)
    live.observe(record(0, 0.0, [0.4, 0.45]))  # one 50 ms gap, ended in second 0
    live.observe(record(1, 5.0, [5.3, 5.5]))  # one 200 ms gap, ended in second 5
    # at 9 s both seconds are in the window: p50 is the first bin the rank 0.5 x 2 = 1 reaches, the 50 ms one
    assert live.frame(9.0).itl_ms.p50 == pytest.approx(50.0, rel=0.005)
    # at 12 s the window starts in second floor(12 - 10) = 2: second 0 is dropped, the 200 ms gap is left
    assert live.frame(12.0).itl_ms.p50 == pytest.approx(200.0, rel=0.005)


def test_the_engine_row_reads_an_sglang_page_and_reaches_the_logged_line():
    # SGLang's page as recorded (tests/fixtures/engines/sglang_metrics.txt): the figures worked out here from its
    # lines by the engine's own definitions (waiting: the queue plus the grammar queue; the hit rate: cached tokens
    # of every cache source over all prompt tokens), then seen by LiveRun as the scraper's thread would hand it over
    page = (Path(__file__).parent / "fixtures/engines/sglang_metrics.txt").read_text()

    def total(name: str) -> float:
        return sum(float(line.rsplit(" ", 1)[1]) for line in page.splitlines() if line.startswith(name + "{"))

    state = engine_state(page, 1.5)
    assert (state.t_s, state.running, state.kv_usage_fraction) == (1.5, total("sglang:num_running_reqs"), 0.25)
    assert state.waiting == total("sglang:num_queue_reqs") + total("sglang:num_grammar_queue_reqs") == 3.0
    hits = total("sglang:cached_tokens_total") / total("sglang:prompt_tokens_total")
    assert state.prefix_cache_hit_rate == pytest.approx(hits) and 0 < hits < 1
    out = io.StringIO()
    live = LiveRun(
        LiveSettings(display="lines", console=Console(file=out, width=400)),
        LiveAggregates([spec(0, 0.0)], None, None),
        "out",
        "s",
    )
    live.begin(time.perf_counter_ns())
    assert live.refresh().engine is None  # no page yet: no engine figures, not zeros
    live.engine_page(live.t0_ns + 1_500_000_000, page)
    live.engine_page(live.t0_ns + 2_000_000_000, "not a prometheus page {")  # a broken page keeps the last state
    assert live.refresh().engine == state
    live.view.show(live.last_frame)
    assert f"engine run 3 wait 3 kv 25.0% prefix hits {100 * hits:.1f}%" in out.getvalue()


def test_the_endpoints_text_reads_as_prometheus_clients_own_rendering_of_the_same_series():
    """exposition() writes the text by hand (generate_latest was the endpoint's largest cost): parsed by
    prometheus_client, it gives the families, samples and values that prometheus_client's own metric families and
    generate_latest give for the same two runs, labels that need escaping included."""
    two = {('run "a"', "s\\1"): RunSeries(), ("b\nc", "s2"): RunSeries()}
    for i, series in enumerate(two.values()):
        for n in range(3 + i):
            rec = record(n, 0.0, [0.05 * (n + 1), 0.2, 0.2 + 0.01 * n], failed="timeout" if n == 2 else None)
            series.add(rec, None if n == 2 else request_latency(rec))
        series.in_flight, series.send_lag_p99_s = 4 + i, 0.002
        series.fold()

    class Reference:
        def collect(self):
            requests = CounterMetricFamily(
                "bench_requests", "Measured requests finished, by status.", labels=(*LABELS, "status")
            )
            tokens = CounterMetricFamily(
                "bench_output_tokens", "Output tokens of the completed requests.", labels=LABELS
            )
            in_flight = GaugeMetricFamily("bench_requests_in_flight", "Requests due and not finished.", labels=LABELS)
            lag = GaugeMetricFamily("bench_send_lag_seconds", LAG_HELP, labels=LABELS)
            hists = {name: HistogramMetricFamily(name, text, labels=LABELS) for name, (_, text) in HISTOGRAMS.items()}
            for labels, series in two.items():
                for status, count in series.by_status.items():
                    requests.add_metric([*labels, status], count)
                tokens.add_metric(list(labels), series.output_tokens)
                in_flight.add_metric(list(labels), series.in_flight)
                lag.add_metric(list(labels), series.send_lag_p99_s)
                for name, h in series.histograms.items():
                    running = np.cumsum(h.counts)
                    buckets = [(str(b), float(c)) for b, c in zip(h.bounds_s, running)] + [("+Inf", float(running[-1]))]
                    hists[name].add_metric(list(labels), buckets, h.sum_s)
            yield from (requests, tokens, in_flight, lag, *hists.values())

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Reference())

    def parsed(text: str) -> dict:
        return {
            (family.name, family.type, family.documentation): sorted(
                (s.name, tuple(sorted(s.labels.items())), s.value) for s in family.samples
            )
            for family in text_string_to_metric_families(text)
        }

    ours, theirs = parsed(exposition(two)), parsed(generate_latest(registry).decode())
    assert ours == theirs
    # statuses ok and timeout for each run, three one-sample families, (buckets + count + sum) per histogram, per run
    histogram_samples = sum(len(bounds) + 1 + 2 for bounds, _ in HISTOGRAMS.values())
    assert len(ours) == 8 and sum(map(len, ours.values())) == 2 * 2 + 2 * 3 + 2 * histogram_samples
    samples = ours[("bench_requests", "counter", "Measured requests finished, by status.")]
    assert (("bench_requests_total", (("run", 'run "a"'), ("scenario", "s\\1"), ("status", "timeout")), 1.0)) in samples
