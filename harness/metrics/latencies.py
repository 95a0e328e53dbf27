"""Latency and throughput metrics. Definitions live in docs/metrics.md; this is the one implementation."""

from __future__ import annotations

import itertools
import operator
from collections import Counter
from dataclasses import dataclass

import numpy as np

from harness.metrics.confidence import DEFAULT_CONFIDENCE, percentile_intervals, share_lower_bound
from harness.metrics.steady_window import steady_window, whole_run
from harness.results.folder import RequestRecord
from harness.results.schema import (
    Concurrency,
    Goodput,
    Intervals,
    ModalityFigures,
    ModelFigures,
    Partial,
    PercentileCI,
    RequestFigures,
    Requests,
    Stats,
    Throughput,
)

STAT_KEYS = ("mean", "std", "min", "p50", "p90", "p95", "p99", "p999", "max")
SLO_LIMIT_KEYS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
INTERVAL_METRICS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")  # the latencies whose percentiles get intervals
_PERCENTILES = {"p50": 50, "p90": 90, "p95": 95, "p99": 99, "p999": 99.9}


def describe(values_s, scale: float = 1e3) -> Stats:
    """mean/std/min/percentiles/max of values given in seconds, reported in ms by default."""
    arr = np.asarray(values_s, dtype=np.float64) * scale
    if arr.size == 0:
        return Stats(**dict.fromkeys(STAT_KEYS))
    # one partition for all of them (12.8 M token gaps in a 100k-request plan); each the value one call gives
    percentiles = np.percentile(arr, list(_PERCENTILES.values()))
    return Stats(
        mean=float(arr.mean()),
        std=float(arr.std()),
        min=float(arr.min()),
        **{key: float(value) for key, value in zip(_PERCENTILES, percentiles)},
        max=float(arr.max()),
    )


@dataclass
class RequestLatency:
    """The latencies of one completed request, in seconds, all measured from the intended send time."""

    ttft_s: float | None  # to the first token of either kind, a reasoning model's thinking included; None: an
    # answer that streams no tokens (backend.api: embeddings), whose only latency is its E2E
    e2e_s: float
    tpot_s: float | None  # None with a single output token
    itl_chunk_s: list[float]
    itl_token_s: list[float]
    ttft_answer_s: float | None = None  # to the first answer token (after the thinking); None: no answer came


def request_latency(rec: RequestRecord) -> RequestLatency | None:
    if rec.ok and rec.embedded_items is not None and rec.end_s is not None:
        return RequestLatency(None, rec.end_s - rec.intended_send_s, None, [], [])
    if not rec.ok or not rec.token_times_s:
        return None
    times = rec.token_times_s
    ttft = times[0] - rec.intended_send_s
    e2e = times[-1] - rec.intended_send_s
    tpot = (e2e - ttft) / (rec.output_tokens - 1) if rec.output_tokens > 1 else None
    itl_chunk = list(map(operator.sub, times[1:], times))  # b - a of each pair, at C speed (100k records a plan)
    per_chunk = rec.tokens_per_chunk or [1] * len(times)
    if len(per_chunk) == len(times) and per_chunk.count(1) == len(per_chunk):
        itl_token = itl_chunk  # a token a chunk: the same gaps (the lists are only read)
    else:
        itl_token = []
        for gap, k in zip(itl_chunk, per_chunk[1:]):
            # a gap that delivered k tokens counts as k gaps of gap/k
            itl_token.extend([gap / k] * k)
    answer_s = rec.first_answer_token_s
    if answer_s is None and not rec.reasoning_tokens:  # a record written before first_answer_token_s existed
        answer_s = times[0]
    ttft_answer = answer_s - rec.intended_send_s if answer_s is not None else None
    return RequestLatency(ttft, e2e, tpot, itl_chunk, itl_token, ttft_answer)


def items_per_s(finished: list[RequestRecord], per_s) -> dict:
    """{"items_per_s": inputs embedded or documents scored per second over the window}; {} where no answer counted
    items (a generating API: the key is left out of summary.json, as a figure the run did not reach)."""
    items = [r.embedded_items for r in finished if r.embedded_items is not None]
    return {"items_per_s": per_s(sum(items))} if items else {}


def active_slo(slo: dict | None) -> dict:
    """The SLO limits (ms) that are set; a scenario's unset ones are None (slo.confidence is no limit)."""
    return {k: v for k, v in (slo or {}).items() if v is not None and k in SLO_LIMIT_KEYS}


def slo_confidence(slo: dict | None) -> float | None:
    """slo.confidence: when set, SLO verdicts judge the lower bound of the share within the SLOs."""
    return (slo or {}).get("confidence")


def meets_slo(lat: RequestLatency, slo: dict) -> bool:
    """All SLOs given (ms) must hold; the ITL SLO bounds the worst gap of the request."""
    checks = (
        ("ttft_ms", lat.ttft_s),
        ("e2e_ms", lat.e2e_s),
        ("tpot_ms", lat.tpot_s),
        ("itl_ms", max(lat.itl_token_s) if lat.itl_token_s else None),
    )
    for key, value_s in checks:
        limit_ms = slo.get(key)
        if limit_ms is not None and value_s is not None and value_s * 1e3 > limit_ms:
            return False
    return True


def concurrency_profile(records: list[RequestRecord]) -> Concurrency:
    """Requests in flight (actual send to stream end): time-weighted mean and max."""
    events = []
    for r in records:
        if r.actual_send_s is not None and r.end_s is not None:
            events += [(r.actual_send_s, 1), (r.end_s, -1)]
    if not events:
        return Concurrency(mean=0.0, max=0)
    events.sort(key=lambda e: (e[0], e[1]))
    level = peak = 0
    area = 0.0
    prev_t = events[0][0]
    for t, step in events:
        area += level * (t - prev_t)
        level += step
        peak = max(peak, level)
        prev_t = t
    span = events[-1][0] - events[0][0]
    return Concurrency(mean=area / span if span > 0 else float(peak), max=peak)


def summarize(
    records: list[RequestRecord], slo: dict | None = None, loop_lag_s: list[float] | None = None, trim: bool = False
) -> RequestFigures:
    """The summary of the measured (non-warm-up) requests. `trim`: latencies, throughput and goodput over the
    steady-state window (harness/metrics/steady_window.py, what `bench run` does unless load.trim is false); else over
    the whole run. `requests`, failures and token counts are always the whole run's."""
    confidence = slo_confidence(slo)
    slo = active_slo(slo)
    measured = [r for r in records if not r.is_warmup]
    window = steady_window(measured) if trim else whole_run(measured)
    done = [r for r in measured if r.ok]
    sampled = [r for r in measured if window.sent_inside(r)]  # the requests whose latencies count
    latency_of = {id(r): request_latency(r) for r in done}  # built once: a plan's summary has 100k of them
    lats = [lat for lat in (latency_of[id(r)] for r in sampled if r.ok) if lat is not None]
    samples_s = latency_samples_s(lats)
    finished = [r for r in done if window.ended_inside(r)]  # the completions the window's throughput counts
    per_s = (lambda n: n / window.duration_s) if window.duration_s > 0 else (lambda n: 0.0)
    # uncut, every token lies in the window (and a 100k-request plan would walk 12.8 M token times to learn it)
    window_tokens = (
        tokens_between(done, window.start_s, window.end_s) if window.trimmed else sum(r.output_tokens for r in done)
    )
    good = [meets_slo(lat, slo) for lat in (latency_of[id(r)] for r in finished) if lat is not None]
    partial = [r for r in measured if not r.ok and r.partial]  # their tokens count in no figure above this key

    return RequestFigures(
        requests=Requests(
            measured=len(measured),
            completed=len(done),
            failed=len(measured) - len(done),
            warmup=len(records) - len(measured),
        ),
        failures=dict(Counter(r.error_reason for r in measured if not r.ok)),
        window_s=window.duration_s,
        window=window.summary(measured),
        run_span_s=whole_run(measured).duration_s,  # first intended send to last end: the client's whole run
        throughput=Throughput(
            requests_per_s=per_s(len(finished)),
            output_tokens_per_s=per_s(window_tokens),
            total_tokens_per_s=per_s(window_tokens + sum(r.prompt_tokens for r in finished)),
            **items_per_s(finished, per_s),
        ),
        goodput=goodput_figures(
            sum(meets_slo(lat, slo) for lat in lats), len(sampled), per_s(sum(good)), slo, confidence
        ),
        output_tokens=sum(r.output_tokens for r in done),
        partial=Partial(requests=len(partial), output_tokens=sum(r.output_tokens for r in partial)),
        token_count_mismatches=sum(r.token_count_mismatch for r in done),
        # the tokens the chunks counted missed (or added): what shifts ITL and TPOT
        token_count_mismatch_tokens=sum(
            abs(r.output_tokens_usage - r.output_tokens_counted) for r in done if r.token_count_mismatch
        ),
        **_latencies(lats, samples_s, done),
        **_by_model(measured, window, latency_of, per_s),
        **_by_turn_kind(measured, window, latency_of, per_s),
        **_by_modality(measured, window, latency_of, per_s),
        **_client_lags(measured, loop_lag_s),
        concurrency=concurrency_profile(measured),
        percentile_ci=latency_intervals(samples_s, confidence or DEFAULT_CONFIDENCE),
    )


def _latencies(lats: list, samples_s: dict, done: list[RequestRecord]) -> dict[str, Stats | int]:
    """The latency figures of summary.json by field name (reasoning_tokens sits among them)."""
    one_token_chunks = all(lat.itl_chunk_s is lat.itl_token_s for lat in lats)  # then the chunks' gaps are those
    return {
        "ttft_ms": describe(samples_s["ttft_ms"]),
        # a reasoning model's: to the first answer token, past the thinking (the requests that got an answer)
        "ttft_answer_ms": describe([lat.ttft_answer_s for lat in lats if lat.ttft_answer_s is not None]),
        "reasoning_tokens": sum(r.reasoning_tokens for r in done),
        "itl_ms": describe(samples_s["itl_ms"]),
        "itl_chunk_ms": describe(samples_s["itl_ms"] if one_token_chunks else flat([lat.itl_chunk_s for lat in lats])),
        "tpot_ms": describe(samples_s["tpot_ms"]),
        "e2e_ms": describe(samples_s["e2e_ms"]),
    }


def _by_model(measured: list[RequestRecord], window, latency_of: dict, per_s) -> dict:
    """{"by_model": each model's figures} for a run whose requests named their model (workload.mix); {} otherwise."""
    figures = _by_group(measured, window, latency_of, per_s, lambda r: r.model)
    return {"by_model": figures} if figures else {}


def _by_turn_kind(measured: list[RequestRecord], window, latency_of: dict, per_s) -> dict:
    """{"by_turn_kind": each kind's figures} for an agentic run (user, tool_result, subagent, merge,
    subagent_task turns); {} otherwise."""
    figures = _by_group(measured, window, latency_of, per_s, lambda r: getattr(r, "turn_kind", None))
    return {"by_turn_kind": figures} if figures else {}


def modality(rec: RequestRecord) -> str | None:
    """A record's modality: image where it sent images, text where it sent none; None for a run without images."""
    count = getattr(rec, "image_count", None)
    return None if count is None else ("image" if count else "text")


def _by_modality(measured: list[RequestRecord], window, latency_of: dict, per_s) -> dict:
    """{"by_modality": the text and the image requests' figures} for a run where some request sent images
    (workload.images); {} otherwise. Each adds its mean prompt tokens as the server's usage counted them."""
    groups = _by_group(measured, window, latency_of, per_s, modality)
    if "image" not in groups:
        return {}
    figures = {}
    for name, group in groups.items():
        mine = [r for r in measured if modality(r) == name]
        prompts = [r.prompt_tokens for r in mine if r.ok]
        figures[name] = ModalityFigures(
            **group.model_dump(),
            prompt_tokens_mean=sum(prompts) / len(prompts) if prompts else None,
            images=sum(r.image_count for r in mine),
            image_bytes=sum(r.image_bytes or 0 for r in mine),
        )
    return {"by_modality": figures}


def _by_group(measured: list[RequestRecord], window, latency_of: dict, per_s, key) -> dict[str, ModelFigures]:
    """Each group's figures by name (`key` of a record: its group, or None for none), over the run's window."""
    names = sorted({name for r in measured if (name := key(r)) is not None})
    figures = {}
    for name in names:
        mine = [r for r in measured if key(r) == name]
        done = [r for r in mine if r.ok]
        lats = [lat for r in done if window.sent_inside(r) and (lat := latency_of[id(r)]) is not None]
        samples_s = latency_samples_s(lats)
        figures[name] = ModelFigures(
            requests=len(mine),
            completed=len(done),
            failed=len(mine) - len(done),
            requests_per_s=per_s(sum(window.ended_inside(r) for r in done)),
            **{metric: describe(samples_s[metric]) for metric in INTERVAL_METRICS},
        )
    return figures


def _client_lags(measured: list[RequestRecord], loop_lag_s: list[float] | None) -> dict[str, Stats]:
    """How late the client sent (schedule lag; client lag: less a concurrency cap's wait) and its loop's lag."""
    sent = [r for r in measured if r.actual_send_s is not None]
    return {
        "schedule_lag_ms": describe([r.actual_send_s - r.intended_send_s for r in sent]),
        "client_lag_ms": describe([r.actual_send_s - r.intended_send_s - r.cap_wait_s for r in sent]),
        "event_loop_lag_ms": describe(loop_lag_s or []),
    }


def tokens_between(records: list[RequestRecord], start_s: float, end_s: float) -> float:
    """The output tokens that arrived in [start_s, end_s]: each request's count (the server's, as everywhere)
    times the share of its streamed tokens that arrived then."""
    total = 0.0
    for r in records:
        times = r.token_times_s
        per_chunk = r.tokens_per_chunk or [1] * len(times)
        streamed = sum(per_chunk)
        if times and start_s <= min(times) and max(times) <= end_s:  # most requests: all inside, found at C speed
            inside = streamed
        else:
            inside = sum(k for t, k in zip(times, per_chunk) if start_s <= t <= end_s)
        total += r.output_tokens * inside / streamed if streamed else 0.0
    return total


def goodput_figures(good: int, measured: int, good_per_s: float, slo: dict, confidence: float | None) -> Goodput:
    """With slo.confidence, `fraction_low`: the share within the SLOs is at least this, with that confidence;
    verdicts (capacity, select, tune's attainment) then judge it instead of `fraction`."""
    goodput = Goodput(requests_per_s=good_per_s, fraction=good / measured if measured else 0.0, slo=slo)
    if confidence is not None:
        goodput.confidence = confidence
        goodput.fraction_low = share_lower_bound(good, measured, confidence)
    return goodput


def latency_samples_s(lats: list[RequestLatency]) -> dict[str, list[float]]:
    """The samples (s) of each latency with intervals, built once for both its summary and its intervals."""
    return {
        "ttft_ms": [lat.ttft_s for lat in lats if lat.ttft_s is not None],
        "itl_ms": flat([lat.itl_token_s for lat in lats]),
        "tpot_ms": [lat.tpot_s for lat in lats if lat.tpot_s is not None],
        "e2e_ms": [lat.e2e_s for lat in lats],
    }


def flat(lists: list[list[float]]) -> np.ndarray:
    """The lists' values in order, as one array (without a Python list of them all in between)."""
    return np.fromiter(itertools.chain.from_iterable(lists), dtype=np.float64, count=sum(map(len, lists)))


def latency_intervals(samples_s: dict[str, list[float]], confidence: float) -> PercentileCI:
    """Each latency's p50/p90/p99/p999 with its confidence interval in ms (harness/metrics/confidence.py)."""
    intervals: dict[str, Intervals] = {
        metric: percentile_intervals(np.asarray(samples_s[metric], dtype=np.float64) * 1e3, confidence)
        for metric in INTERVAL_METRICS
    }
    return PercentileCI(confidence=confidence, method="order statistics (binomial ranks, equal tails)", **intervals)


MAX_LAG_SHARE_OF_TTFT = 0.05  # a lag under 5% of the median TTFT moves no percentile by more than that


def client_bound_reasons(
    figures: RequestFigures, max_client_lag_p99_ms: float = 5.0, max_loop_lag_p99_ms: float = 10.0
) -> list[str]:
    """Why the client could not keep to its own schedule (empty when it did). A lag counts when it passes its
    limit in ms and is not small next to what is measured: on a 2-core machine whose engine takes both cores
    the send lag p99 reads 10-25 ms beside a TTFT p50 of ~1 s, which a 5 ms limit alone called client-bound."""
    floor_ms = MAX_LAG_SHARE_OF_TTFT * (figures.ttft_ms.p50 or 0.0)
    reasons = []
    for stats, name, limit_ms in (
        (figures.client_lag_ms, "send lag", max_client_lag_p99_ms),
        (figures.event_loop_lag_ms, "event-loop lag", max_loop_lag_p99_ms),
    ):
        lag = stats.p99
        if lag is not None and lag > max(limit_ms, floor_ms):
            share = f" and > {MAX_LAG_SHARE_OF_TTFT:.0%} of TTFT p50" if floor_ms > limit_ms else ""
            reasons.append(f"{name} p99 {lag:.1f} ms > {limit_ms:g} ms{share}")
    return reasons
