"""A run's figures while it goes (LiveFrame): counts, in-flight, rolling rates and percentiles, SLO attainment so far
and send lag, from the same completed records (and the same latency definitions) the summary is computed from; the
last frame is the summary's own figures (final_frame, of the RequestFigures summary.json is written from).

Nothing here touches the client's hot path: records come in as they complete (the run pipeline's on_record), what
was sent but not answered yet is read off the plan (a request is due at its intended send time, wrk2-style, so one
a concurrency cap holds back is in flight as the measured window counts it, harness/metrics/steady_window.py).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np

from harness.engine.server_metrics import parse_page
from harness.metrics.latencies import (
    STAT_KEYS,
    RequestLatency,
    active_slo,
    client_bound_reasons,
    flat,
    meets_slo,
    request_latency,
)
from harness.results.folder import RequestRecord
from harness.results.schema import RequestFigures, Stats

# The rolling figures cover the requests that ended in the last 10 s: at the quickstart's 4 req/s that is ~40 TTFTs,
# enough for a steady p50 and p90 (a p99 of 40 samples is the largest one, shown as such), and short enough that a
# step in the load shows within one window.
ROLLING_WINDOW_S = 10.0
# The frames' ITL percentiles are read off bins 1% wide (1 µs up), kept per second of the requests' ends: a window at
# 256 streams of 128 tokens holds ~250k token gaps, whose exact percentiles (np.concatenate + np.percentile) took
# 32 ms a frame on this 2-core machine, a stall of the client's event loop twice a second. The gaps are binned at
# frame time, a second's new ones in one numpy pass (binned record by record, numpy's per-call cost made the live view
# 3% of the client's CPU at 256 streams). The final frame's are exact (summarize).
GAP_BIN_RATIO = 1.01
GAP_MIN_S = 1e-6
GAP_BINS = 2400  # the last bin starts at 1e-6 * 1.01**2399, ~2.3e4 s: every gap a request_timeout_s allows
# The window moves a second at a time (its requests are kept by the second they ended in): it spans window_s to
# window_s + 1 s, and its rates are over exactly that span. Summed a second at a time, a frame at 256 streams took
# 0.65 ms where it took 0.9-1.0 ms adding up the window's ~500 records one by one (one process beside other
# work on this 2-core machine).
WINDOW_STEP_S = 1.0


@dataclass(frozen=True)
class Percentiles:
    """p50 / p90 / p99 in ms; None when no sample was there."""

    p50: float | None = None
    p90: float | None = None
    p99: float | None = None

    @classmethod
    def of_seconds(cls, values_s) -> Percentiles:
        values = np.asarray(values_s, dtype=np.float64)
        if values.size == 0:
            return cls()
        p50, p90, p99 = np.percentile(values * 1e3, [50, 90, 99])
        return cls(float(p50), float(p90), float(p99))

    @classmethod
    def of_stats(cls, stats: Stats) -> Percentiles:
        return cls(stats.p50, stats.p90, stats.p99)

    @classmethod
    def of_gap_bins(cls, counts: np.ndarray) -> Percentiles:
        """From gap_bins' counts: each percentile the middle of the first bin its rank reaches (within 0.5%)."""
        total = int(counts.sum())
        if not total:
            return cls()
        ranks = np.searchsorted(np.cumsum(counts), [0.5 * total, 0.9 * total, 0.99 * total], side="left")
        p50, p90, p99 = GAP_MIN_S * GAP_BIN_RATIO ** (ranks + 0.5) * 1e3
        return cls(float(p50), float(p90), float(p99))


def gap_bins(values_s) -> np.ndarray:
    """Each gap's bin: floor(log_1.01(gap / 1 µs)), a gap under 1 µs in the first bin, a huge one in the last."""
    logs = np.log(np.maximum(np.asarray(values_s, dtype=np.float64), GAP_MIN_S))
    return ((logs - _LOG_GAP_MIN) * _PER_LOG_RATIO).clip(0, GAP_BINS - 1).astype(np.int64)


_LOG_GAP_MIN, _PER_LOG_RATIO = float(np.log(GAP_MIN_S)), float(1 / np.log(GAP_BIN_RATIO))


@dataclass(frozen=True)
class EngineState:
    """The engine's own view from its latest /metrics page, under the schema's names whatever the engine calls them
    (harness/engine/server_metrics.py): requests in its batch and queued, the KV cache's share in use, and its
    prefix-cache hit rate since it started. None: the page has no such figure."""

    t_s: float  # when the page arrived, seconds from t0
    running: float | None
    waiting: float | None
    kv_usage_fraction: float | None
    prefix_cache_hit_rate: float | None


@dataclass(frozen=True)
class GpuState:
    """The GPUs' latest sample (harness/engine/telemetry/gpu.py, DCGM's field names and units): NVML's busy figure
    averaged over the GPUs, GPM's SM activity where the GPU has it, the power drawn by all of them."""

    t_s: float
    source: str  # "NVML" (read here) or "dcgm-exporter" (telemetry.dcgm_exporter_url)
    gpus: int
    util_pct: float | None  # DCGM_FI_DEV_GPU_UTIL, 0-100
    sm_active: float | None  # DCGM_FI_PROF_SM_ACTIVE, 0-1 (Hopper and later)
    power_w: float | None  # DCGM_FI_DEV_POWER_USAGE, summed


GPU_FIELDS = {"DCGM_FI_DEV_GPU_UTIL": "util_pct", "DCGM_FI_PROF_SM_ACTIVE": "sm_active"}
POWER_FIELD = "DCGM_FI_DEV_POWER_USAGE"


def gpu_state(t_s: float, values: list[tuple[str, str, float]]) -> GpuState | None:
    """One telemetry sample's GPU figures, NVML's (sources gpu:N) or a dcgm-exporter's (dcgm:N): each sampler's rows
    come apart; None for a sample of another source (the host's, the engine's)."""
    by_field: dict[str, list[float]] = {}
    gpus = set()
    for source, name, value in values:
        if source.startswith(("gpu:", "dcgm:")):
            gpus.add(source)
            by_field.setdefault(name, []).append(float(value))
    if not gpus:
        return None
    kind = "NVML" if next(iter(gpus)).startswith("gpu:") else "dcgm-exporter"
    means = {key: float(np.mean(by_field[name])) if name in by_field else None for name, key in GPU_FIELDS.items()}
    power = by_field.get(POWER_FIELD)
    return GpuState(t_s, kind, len(gpus), means["util_pct"], means["sm_active"], sum(power) if power else None)


def engine_state(page: str, t_s: float) -> EngineState:
    """The engine's gauges read off one Prometheus page (its label sets combined as the summary combines them)."""
    _, schema = parse_page(page)
    values = {name.removeprefix("bench:"): value for name, value, labels in schema if not labels}
    return EngineState(
        t_s,
        values.get("running"),
        values.get("waiting"),
        values.get("kv_usage_fraction"),
        values.get("prefix_cache_hit_rate"),
    )


@dataclass(frozen=True, kw_only=True)
class LiveFrame:
    """What a dashboard shows at one moment of a run; `final`: the summary's figures (steady window, when cut)."""

    elapsed_s: float  # since t0
    planned: int  # requests in the plan, warm-up ones included
    due: int  # requests whose intended send time has come (sent, or held back by a concurrency cap)
    completed: int  # measured requests that completed (warm-up left out, as in the summary)
    failed: int
    in_flight: int  # due but not finished
    concurrency: int | None  # load.concurrency, what in_flight is measured against
    requests_per_s: float
    output_tokens_per_s: float
    ttft_ms: Percentiles
    itl_ms: Percentiles
    tpot_ms: Percentiles
    slo_attainment: float | None  # share of the finished measured requests within every SLO; None: no SLO set
    send_lag_p99_ms: float | None  # actual send - intended send - cap wait, over the window
    client_bound: list[str]  # why the client looks behind its schedule (harness/metrics/latencies.py's rule)
    final: bool = False
    engine: EngineState | None = None  # from the engine's latest /metrics page; None: no page (yet)
    gpu: GpuState | None = None  # from the latest GPU sample; None: no GPU sampled


@dataclass
class _Second:
    """The measured requests that ended in one second of the run: the rolling window is kept a second at a time, so a
    frame adds up the window's ~11 seconds, not its records one by one (at 256 streams ~500 of them a frame)."""

    completed: int = 0
    output_tokens: int = 0
    ttft_s: list[float] = field(default_factory=list)
    tpot_s: list[float] = field(default_factory=list)
    send_lag_s: list[float] = field(default_factory=list)  # failed requests' too
    new_gaps_s: list[list[float]] = field(default_factory=list)  # ITL gaps not binned yet, a list per request
    gap_counts: np.ndarray | int = 0  # the binned ones' counts by bin (gap_bins)

    def bin_new_gaps(self) -> None:
        """The gaps observed since the last frame into the counts, in one numpy pass."""
        if self.new_gaps_s:
            self.gap_counts = self.gap_counts + np.bincount(gap_bins(flat(self.new_gaps_s)), minlength=GAP_BINS)
            self.new_gaps_s = []


class LiveAggregates:
    """Takes each completed record (observe) and gives a LiveFrame at any moment (frame), or the final one."""

    def __init__(
        self,
        requests: list,
        concurrency: int | None,
        slo: dict | None,
        dispatch_until_s: float | None = None,
        window_s: float = ROLLING_WINDOW_S,
    ) -> None:
        self.planned = len(requests)
        self.concurrency = concurrency
        self.slo = slo
        self._slo_limits = active_slo(slo)
        self.window_s = window_s
        # a first turn is due at its offset; a later turn once the turn before it ended (then it is due at once,
        # its think time aside): counted as the records of turns with a follow-up come in
        self._offsets = sorted(
            s.intended_offset_s
            for s in requests
            if s.intended_offset_s is not None and (dispatch_until_s is None or s.intended_offset_s <= dispatch_until_s)
        )
        last_turn: dict = {}
        for s in requests:
            if s.session_id is not None:
                last_turn[s.session_id] = max(last_turn.get(s.session_id, 0), s.turn_index)
        self._last_turn = last_turn
        self._closed_loop = bool(requests) and not self._offsets
        self.records: list[RequestRecord] = []
        self.completed = self.failed = self.good = self.follow_ups_due = 0
        self._seconds: dict[int, _Second] = {}  # second of the run -> the measured requests that ended in it

    def observe(self, rec: RequestRecord, latency: RequestLatency | None = None) -> None:
        """One finished record (failed ones too); `latency`: request_latency(rec) when the caller made it already."""
        self.records.append(rec)
        if rec.session_id is not None and rec.turn_index < self._last_turn.get(rec.session_id, 0):
            self.follow_ups_due += 1
        if rec.is_warmup:
            return
        if not rec.ok:
            self.failed += 1
        else:
            self.completed += 1
            latency = latency or request_latency(rec)
            self.good += latency is not None and meets_slo(latency, self._slo_limits)
        second = self._seconds.setdefault(int((rec.end_s or 0.0) // WINDOW_STEP_S), _Second())
        if rec.actual_send_s is not None:
            second.send_lag_s.append(rec.actual_send_s - rec.intended_send_s - rec.cap_wait_s)
        if rec.ok:
            second.completed += 1
            second.output_tokens += rec.output_tokens
        if rec.ok and latency is not None:
            if latency.ttft_s is not None:
                second.ttft_s.append(latency.ttft_s)
            if latency.tpot_s is not None:
                second.tpot_s.append(latency.tpot_s)
            if latency.itl_token_s:
                second.new_gaps_s.append(latency.itl_token_s)

    def frame(self, now_s: float) -> LiveFrame:
        """The figures at now_s (seconds from t0): counts so far; rates and percentiles over the requests that ended
        in the window, whose seconds run from floor(now_s - window_s) to now_s (window_s to window_s + 1 s long)."""
        first = math.floor((now_s - self.window_s) / WINDOW_STEP_S)
        for old in [k for k in self._seconds if k < first]:
            del self._seconds[old]
        window = list(self._seconds.values())
        span_s = now_s - max(first * WINDOW_STEP_S, 0.0)
        per_s = (lambda n: n / span_s) if span_s > 0 else (lambda n: 0.0)
        lags_s = [lag for second in window for lag in second.send_lag_s]
        ttft = Percentiles.of_seconds([v for second in window for v in second.ttft_s])
        lag_p99_ms = float(np.percentile(lags_s, 99) * 1e3) if lags_s else None
        for second in window:
            second.bin_new_gaps()
        due, in_flight = self._due_and_in_flight(now_s)
        finished = self.completed + self.failed
        return LiveFrame(
            elapsed_s=now_s,
            planned=self.planned,
            due=due,
            completed=self.completed,
            failed=self.failed,
            in_flight=in_flight,
            concurrency=self.concurrency,
            requests_per_s=per_s(sum(second.completed for second in window)),  # completions, as the summary counts
            output_tokens_per_s=per_s(sum(second.output_tokens for second in window)),
            ttft_ms=ttft,
            itl_ms=Percentiles.of_gap_bins(sum((second.gap_counts for second in window), np.zeros(GAP_BINS, np.int64))),
            tpot_ms=Percentiles.of_seconds([v for second in window for v in second.tpot_s]),
            slo_attainment=(self.good / finished if finished else None) if self._slo_limits else None,
            send_lag_p99_ms=lag_p99_ms,
            client_bound=lag_reasons(ttft.p50, lag_p99_ms),
        )

    def _due_and_in_flight(self, now_s: float) -> tuple[int, int]:
        """Requests due by now_s, and those of them not finished. A closed loop keeps `concurrency` in flight
        until fewer are left than that."""
        finished = len(self.records)
        if self._closed_loop:
            in_flight = min(self.concurrency or 1, self.planned - finished) if now_s >= 0 else 0
            return finished + in_flight, in_flight
        due = min(bisect.bisect_right(self._offsets, now_s) + self.follow_ups_due, self.planned)
        return max(due, finished), max(due - finished, 0)


def final_frame(figures: RequestFigures, live: LiveAggregates, elapsed_s: float) -> LiveFrame:
    """The last frame: the summary's figures (summarize() over the run's records), not computed twice; `due` is the
    records this view saw, so a record that missed it shows as due < planned."""
    finished = len(live.records)
    return LiveFrame(
        elapsed_s=elapsed_s,
        planned=live.planned,
        due=finished,
        completed=figures.requests.completed,
        failed=figures.requests.failed,
        in_flight=0,
        concurrency=live.concurrency,
        requests_per_s=figures.throughput.requests_per_s,
        output_tokens_per_s=figures.throughput.output_tokens_per_s,
        ttft_ms=Percentiles.of_stats(figures.ttft_ms),
        itl_ms=Percentiles.of_stats(figures.itl_ms),
        tpot_ms=Percentiles.of_stats(figures.tpot_ms),
        slo_attainment=figures.goodput.fraction if figures.goodput.slo else None,
        send_lag_p99_ms=figures.client_lag_ms.p99,
        client_bound=client_bound_reasons(figures),
        final=True,
    )


def lag_reasons(ttft_p50_ms: float | None, send_lag_p99_ms: float | None) -> list[str]:
    """The client-bound rule of the summary (latencies.client_bound_reasons) applied to the window's figures."""

    def stats(**known) -> Stats:
        return Stats(**(dict.fromkeys(STAT_KEYS) | known))

    figures = SimpleNamespace(ttft_ms=stats(p50=ttft_p50_ms), client_lag_ms=stats(p99=send_lag_p99_ms))
    figures.event_loop_lag_ms = stats()
    return client_bound_reasons(figures)
