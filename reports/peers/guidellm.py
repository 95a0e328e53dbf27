"""GuideLLM's `guidellm run --output kind=json,path=benchmarks.json` (or .yaml): {"benchmarks": [...]}, one per rate.

Per benchmark, `metrics.<name>.successful` = {mean, median, std_dev, min, max, percentiles {p50, p90, p95, p99,
p999, ...}} for `time_to_first_token_ms`, `inter_token_latency_ms` ((last - first token) / (output tokens - 1): our
TPOT), `time_per_output_token_ms` ((last token - request start) / output tokens: the first token's wait included,
none of ours), `request_latency` (s), `requests_per_second`, `output_tokens_per_second`, `tokens_per_second`;
`requests.successful/errored/incomplete`: each request's `info.timings` (request_start, first_token_iteration,
last_token_iteration, request_end; Unix s) and token counts. Source: guidellm/schemas/base/request_stats.py,
guidellm/benchmark/schemas/metrics.py (0.8.1).
"""

from __future__ import annotations

from pathlib import Path

from harness.results.folder import ResultsError
from reports.peers.common import (
    FROM_ACTUAL_SEND,
    SUMMARY_ONLY,
    PeerFormat,
    PeerModel,
    PeerRun,
    document,
    figures_summary,
    parse,
    stats_ms,
    streamed_record,
)

TOOL = "GuideLLM"


class Percentiles(PeerModel):
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = None


class Distribution(PeerModel):
    """A metric's statistics over one group of requests (its `successful` ones are read)."""

    mean: float | None = None
    median: float | None = None
    std_dev: float | None = None
    min: float | None = None
    max: float | None = None
    percentiles: Percentiles = Percentiles()

    def stats_ms(self, to_ms: float) -> dict:
        """Ours, each value times to_ms; all None when it has no mean."""
        if self.mean is None:
            return stats_ms()
        pct = self.percentiles
        given = {"mean": self.mean, "std": self.std_dev, "min": self.min, "max": self.max}
        given |= {"p90": pct.p90, "p95": pct.p95, "p99": pct.p99, "p999": pct.p999}
        given["p50"] = self.median if self.median is not None else pct.p50  # the console's Mdn
        return stats_ms(**{k: None if v is None else v * to_ms for k, v in given.items()})


class Metric(PeerModel):
    successful: Distribution = Distribution()


class RequestTotals(PeerModel):
    successful: int
    errored: int
    incomplete: int


class Metrics(PeerModel):
    request_totals: RequestTotals | None = None  # 0.4 on; before, on the benchmark
    requests_per_second: Metric = Metric()
    output_tokens_per_second: Metric = Metric()
    tokens_per_second: Metric = Metric()
    request_latency: Metric = Metric()  # s
    time_to_first_token_ms: Metric = Metric()
    inter_token_latency_ms: Metric = Metric()
    time_per_output_token_ms: Metric = Metric()


class Timings(PeerModel):
    """A request's times, Unix s."""

    request_start: float | None = None
    first_token_iteration: float | None = None
    last_token_iteration: float | None = None


class Info(PeerModel):
    timings: Timings = Timings()


class TokenCounts(PeerModel):
    text_tokens: int | None = None


class Request(PeerModel):
    info: Info = Info()
    start_time: float | None = None  # 0.3 and before: the times on the request itself (Unix s)
    first_token_time: float | None = None
    last_token_time: float | None = None
    input_metrics: TokenCounts = TokenCounts()
    output_metrics: TokenCounts = TokenCounts()
    prompt_tokens: int | None = None  # before input_metrics
    output_tokens: int | None = None  # before output_metrics
    error: str | None = None


class Requests(PeerModel):
    successful: list[Request] = []
    errored: list[Request] = []
    incomplete: list[Request] = []


class Strategy(PeerModel):
    type_: str | None = None  # poisson, constant, ...
    rate: float | None = None


class BenchmarkConfig(PeerModel):
    strategy: Strategy = Strategy()


class Benchmark(PeerModel):
    """One rate's benchmark."""

    config: BenchmarkConfig = BenchmarkConfig()
    duration: float | None = None
    metrics: Metrics
    requests: Requests = Requests()
    request_totals: RequestTotals | None = None  # 0.3 and before

    def totals(self) -> RequestTotals:
        return self.metrics.request_totals or self.request_totals


class Metadata(PeerModel):
    guidellm_version: str | None = None


class BenchmarksFile(PeerModel):
    benchmarks: list[Benchmark]
    metadata: Metadata = Metadata()
    guidellm_version: str | None = None  # before metadata

    def version(self) -> str:
        return self.metadata.guidellm_version or self.guidellm_version or "unknown"


class GuidellmBenchmarks(PeerFormat):
    """benchmarks.json of 0.4-0.8 (2026's `metadata.version: 2` included): request_totals under each benchmark's
    metrics, every request's timings kept."""

    tool = TOOL
    shape = "benchmarks.json/.yaml, request_totals in metrics (0.4-0.8, 2025-2026)"
    suffixes = (".json", ".yaml", ".yml")
    signature = ("benchmarks",)
    request_totals_in_metrics = True

    def matches(self, path: Path) -> bool:
        if not super().matches(path):
            return False
        benchmarks = document(path)["benchmarks"]
        first = benchmarks[0] if isinstance(benchmarks, list) and benchmarks else {}
        metrics = first.get("metrics") if isinstance(first, dict) else None
        if not isinstance(metrics, dict):
            return False
        return ("request_totals" in metrics) == self.request_totals_in_metrics and (
            self.request_totals_in_metrics or "request_totals" in first
        )

    def load(self, path: Path) -> PeerRun:
        return _load(path, document(path))


class GuidellmBenchmarks2025(GuidellmBenchmarks):
    """benchmarks.json/.yaml of mid-2025 (0.2-0.3): request_totals beside the metrics, each metric split by
    successful/errored/incomplete/total, and only a sample of the requests kept (`request_samples`)."""

    shape = "benchmarks.json/.yaml, request_totals beside metrics (0.2-0.3, mid-2025)"
    request_totals_in_metrics = False


def _load(path: Path, obj: dict) -> PeerRun:
    file = parse(BenchmarksFile, obj, path, TOOL)
    bench = file.benchmarks[-1]
    if bench.totals() is None:
        raise ResultsError(f"{path}: a GuideLLM benchmark lacks request_totals (in metrics, or beside them)")
    warnings = (
        [f"{path}: holds {len(file.benchmarks)} benchmarks; the last is read"] if len(file.benchmarks) > 1 else []
    )
    summary = _summary(bench)
    strategy = bench.config.strategy
    load = {"arrival": strategy.type_, "num_requests": summary["requests"]["measured"]}
    if strategy.rate:
        load["rate"] = strategy.rate
    run_info = {
        "scenario": {"name": "guidellm-run", "load": load},
        "backend": {"kind": f"{TOOL} (peer file)", "model": None},
        "peer": {"tool": TOOL, "version": file.version()},
    }
    records = _records(bench.requests)
    lines = differences()
    if len(records) != summary["requests"]["measured"]:  # a sample of the requests: no distribution from it
        lines.append(f"its file keeps {len(records)} of {summary['requests']['measured']} requests: {SUMMARY_ONLY}")
        records = []
    return PeerRun(TOOL, file.version(), path, run_info, summary, records, lines, warnings)


def _summary(bench: Benchmark) -> dict:
    metrics, totals = bench.metrics, bench.totals()
    summary = figures_summary(
        completed=totals.successful,
        failed=totals.errored + totals.incomplete,
        window_s=bench.duration,
        requests_per_s=metrics.requests_per_second.successful.mean,
        output_tokens_per_s=metrics.output_tokens_per_second.successful.mean,
        total_tokens_per_s=metrics.tokens_per_second.successful.mean,
        latencies={
            "e2e_ms": metrics.request_latency.successful.stats_ms(1e3),
            "ttft_ms": metrics.time_to_first_token_ms.successful.stats_ms(1.0),
            "tpot_ms": metrics.inter_token_latency_ms.successful.stats_ms(1.0),  # its ITL: our TPOT
        },
    )
    # kept apart: GuideLLM's TPOT counts the first token's wait, no figure of ours does
    summary["peer_figures"] = {"time_per_output_token_ms": metrics.time_per_output_token_ms.successful.stats_ms(1.0)}
    return summary


def _records(requests: Requests) -> list:
    """Each request from its first and last token times (GuideLLM keeps no per-chunk times)."""
    rows = [(r, "") for r in requests.successful]
    rows += [(r, r.error or "errored") for r in requests.errored]
    rows += [(r, "incomplete") for r in requests.incomplete]
    starts = [r.info.timings.request_start or r.start_time for r, _ in rows]
    t0 = min((s for s in starts if s is not None), default=0.0)
    out = []
    for i, (r, error) in enumerate(rows):
        t = r.info.timings
        send_s = (t.request_start or r.start_time or t0) - t0
        out_tokens = r.output_metrics.text_tokens or r.output_tokens or 0
        first, last = t.first_token_iteration or r.first_token_time, t.last_token_iteration or r.last_token_time
        times, per_chunk = [], None
        if not error and first is not None and last is not None:
            times = [first - t0] if out_tokens <= 1 else [first - t0, last - t0]
            per_chunk = [1] if out_tokens <= 1 else [1, out_tokens - 1]
        in_tokens = r.input_metrics.text_tokens or r.prompt_tokens or 0
        out.append(streamed_record(i, send_s, times, out_tokens, in_tokens, error, per_chunk))
    return out


def differences() -> list[str]:
    return [
        FROM_ACTUAL_SEND,
        "its ITL is per request, (last token - first token) / (output tokens - 1): our TPOT, shown as tpot_ms",
        "its TPOT, (last token - request start) / output tokens, includes the first token's wait: none of ours, "
        "kept under peer_figures",
        "its file has no per-chunk times, only each request's first and last token: our per-token ITL of its "
        "requests is each request's mean gap",
        "request latency in seconds in its file, TTFT/ITL/TPOT in ms",
    ]
