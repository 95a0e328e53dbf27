"""GuideLLM's `guidellm run --output kind=json,path=benchmarks.json`: {"benchmarks": [...]}, one per rate.

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

from reports.peers.common import (
    FROM_ACTUAL_SEND,
    PeerModel,
    PeerRun,
    json_object_or_none,
    parse,
    read_json_file,
    require,
    stats_ms,
    streamed_record,
)

TOOL = "GuideLLM"
# the metrics a benchmark must have (a file of another shape is refused naming them)
REQUIRED = (
    "time_to_first_token_ms",
    "inter_token_latency_ms",
    "request_latency",
    "requests_per_second",
    "request_totals",
)


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
    request_totals: RequestTotals
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
    timings: Timings


class TokenCounts(PeerModel):
    text_tokens: int | None = None


class Request(PeerModel):
    info: Info
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


class Metadata(PeerModel):
    guidellm_version: str | None = None


class BenchmarksFile(PeerModel):
    benchmarks: list[Benchmark]
    metadata: Metadata = Metadata()
    guidellm_version: str | None = None  # before metadata

    def version(self) -> str:
        return self.metadata.guidellm_version or self.guidellm_version or "unknown"


def matches(path: Path) -> bool:
    obj = json_object_or_none(path) if path.suffix == ".json" else None
    if obj is None:
        return False
    benchmarks = obj.get("benchmarks")
    return isinstance(benchmarks, list) and bool(benchmarks) and "metrics" in benchmarks[0]


def load(path: Path) -> PeerRun:
    obj = read_json_file(path)
    require(obj["benchmarks"][-1]["metrics"], REQUIRED, path, TOOL)
    file = parse(BenchmarksFile, obj, path, TOOL)
    bench = file.benchmarks[-1]
    warnings = (
        [f"{path}: holds {len(file.benchmarks)} benchmarks; the last is read"] if len(file.benchmarks) > 1 else []
    )
    summary = _summary(bench)
    strategy = bench.config.strategy
    load = {"arrival": strategy.type_, "num_requests": summary["requests"]["measured"]}
    if strategy.rate:
        load["rate"] = strategy.rate
    info = {
        "scenario": {"name": "guidellm-run", "load": load},
        "backend": {"kind": f"{TOOL} (peer file)", "model": None},
        "peer": {"tool": TOOL, "version": file.version()},
    }
    records = _records(bench.requests)
    return PeerRun(TOOL, file.version(), path, info, summary, records, differences(), warnings)


def _summary(bench: Benchmark) -> dict:
    metrics, totals = bench.metrics, bench.metrics.request_totals
    return {
        "requests": {
            "measured": totals.successful + totals.errored + totals.incomplete,
            "completed": totals.successful,
            "failed": totals.errored + totals.incomplete,
        },
        "window_s": bench.duration,
        "throughput": {
            "requests_per_s": metrics.requests_per_second.successful.mean,
            "output_tokens_per_s": metrics.output_tokens_per_second.successful.mean,
            "total_tokens_per_s": metrics.tokens_per_second.successful.mean,
        },
        "e2e_ms": metrics.request_latency.successful.stats_ms(1e3),
        # kept apart: GuideLLM's TPOT counts the first token's wait, no figure of ours does
        "peer_figures": {"time_per_output_token_ms": metrics.time_per_output_token_ms.successful.stats_ms(1.0)},
        "ttft_ms": metrics.time_to_first_token_ms.successful.stats_ms(1.0),
        "tpot_ms": metrics.inter_token_latency_ms.successful.stats_ms(1.0),  # its ITL: our TPOT
    }


def _records(requests: Requests) -> list:
    """Each request from its first and last token times (GuideLLM keeps no per-chunk times)."""
    rows = [(r, "") for r in requests.successful]
    rows += [(r, r.error or "errored") for r in requests.errored]
    rows += [(r, "incomplete") for r in requests.incomplete]
    starts = [r.info.timings.request_start for r, _ in rows]
    t0 = min((s for s in starts if s is not None), default=0.0)
    out = []
    for i, (r, error) in enumerate(rows):
        t = r.info.timings
        send_s = (t.request_start or t0) - t0
        out_tokens = r.output_metrics.text_tokens or r.output_tokens or 0
        first, last = t.first_token_iteration, t.last_token_iteration
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
