"""GuideLLM's `guidellm run --output kind=json,path=benchmarks.json` (or .yaml): {"benchmarks": [...]}, one per rate.

Per benchmark, `metrics.<name>.successful` = {mean, median, std_dev, min, max, percentiles {p50, p90, p95, p99,
p999, ...}} for `time_to_first_token_ms`, `inter_token_latency_ms` ((last - first token) / (output tokens - 1): our
TPOT), `time_per_output_token_ms` ((last token - request start) / output tokens: the first token's wait included,
none of ours), `request_latency` (s), `requests_per_second`, `output_tokens_per_second`, `tokens_per_second`;
`requests.successful/errored/incomplete`: each request's `info.timings` (request_start, first_token_iteration,
last_token_iteration, request_end; Unix s) and token counts. Source: guidellm/schemas/base/request_stats.py,
guidellm/benchmark/schemas/metrics.py (0.8.1). `--output kind=csv` (benchmarks.csv, 0.4 on) holds the same
statistics, a row per benchmark under three header rows, and no request (guidellm/benchmark/outputs/csv.py).
"""

from __future__ import annotations

import json
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
    info,
    parse,
    peer_run,
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


class GuidellmCsv(PeerFormat):
    """benchmarks.csv of 0.4-0.8 (`--output kind=csv`, late 2025-2026): three header rows (group, field, unit: e.g.
    "Time to First Token", "Successful ms", "Mean"), then one row per benchmark; each distribution as Mean, Median,
    Std Dev and Percentiles, a list [min, p0.1, p1, p5, p10, p25, p75, p90, p95, p99, max]. No request of its own:
    summary only. Source: guidellm/benchmark/outputs/csv.py."""

    tool = TOOL
    shape = "benchmarks.csv, three header rows (0.4-0.8, late 2025-2026)"
    suffixes = (".csv",)
    signature = ("Request Counts", "Request Latency", "Time to First Token", "Inter Token Latency", "Server Throughput")
    hints = ("Run Info", "Timings", "Token Throughput")  # few: a file cut in its first row still names GuideLLM
    top = list

    def keys(self, path: Path) -> set[str]:
        """Its groups: the cells of the first header row."""
        rows = document(path) or []
        return set(rows[0]) if rows else set()

    def matches(self, path: Path) -> bool:
        # the third header row names each statistic: the mid-2025 CSV (one header row) has none
        return super().matches(path) and len(document(path)) > 3 and "Mean" in document(path)[2]

    def load(self, path: Path) -> PeerRun:
        rows = document(path)
        header = list(zip(rows[0], rows[1], rows[2]))
        for n, row in enumerate(rows[3:], start=4):
            if len(row) != len(header):  # a file cut short, or edited: the cells would fall under the wrong header
                raise ResultsError(
                    f"{path}: a GuideLLM benchmarks.csv (0.4-0.8) whose row {n} has {len(row)} of its "
                    f"{len(header)} columns (cut short?); pass the file the tool saved, unedited"
                )
        warnings = [f"{path}: holds {len(rows) - 3} benchmarks; the last is read"] if len(rows) > 4 else []
        columns = CsvColumns(path, dict(zip(header, rows[-1])))
        return _csv_run(path, columns, warnings)


REQUEST_COUNTS = ("Successful", "Errored", "Incomplete")  # its Request Counts columns read (Total is their sum)
# the percentiles list of each distribution, in its order (guidellm/benchmark/outputs/csv.py `_add_distribution_stats`)
CSV_PERCENTILES = ("min", "p001", "p01", "p05", "p10", "p25", "p75", "p90", "p95", "p99", "max")


class CsvColumns:
    """One benchmark's row of benchmarks.csv, its cells by (group, field, unit)."""

    def __init__(self, path: Path, cells: dict[tuple[str, str, str], str]):
        self.path, self.cells = path, cells

    def cell(self, group: str, field: str, unit: str = "") -> str:
        key = (group, field, unit)
        if key not in self.cells:
            where = " / ".join(part for part in key if part)
            raise ResultsError(f"{self.path}: a GuideLLM benchmarks.csv lacks the column {where}")
        return self.cells[key]

    def number(self, group: str, field: str, unit: str = "") -> float | None:
        text = self.cell(group, field, unit)
        try:
            return float(text) if text not in ("", "None") else None
        except ValueError:
            raise ResultsError(f"{self.path}: {group} / {field} {unit}: {text!r} is not a number") from None

    def stats_ms(self, group: str, unit: str, to_ms: float) -> dict:
        """Our statistics (ms) of a distribution over the successful requests; all None when the file has none (it
        leaves out a distribution whose every value is 0)."""
        field = f"Successful {unit}"
        if (group, field, "Mean") not in self.cells:
            return stats_ms()
        pct = dict(zip(CSV_PERCENTILES, self.percentiles(group, field)))
        given = {"mean": self.number(group, field, "Mean"), "p50": self.number(group, field, "Median")}
        given |= {"std": self.number(group, field, "Std Dev"), "min": pct["min"], "max": pct["max"]}
        given |= {"p90": pct["p90"], "p95": pct["p95"], "p99": pct["p99"]}
        return stats_ms(**{k: None if v is None else v * to_ms for k, v in given.items()})

    def percentiles(self, group: str, field: str) -> list[float | None]:
        """The Percentiles cell, "[min, p0.1, ..., max]" as Python writes a list of floats (None where no value)."""
        text = self.cell(group, field, "Percentiles")
        listed = [v.strip() for v in text.strip("[]").split(",")]
        try:
            values = [None if v == "None" else float(v) for v in listed]
        except ValueError:
            values = []
        if len(values) != len(CSV_PERCENTILES):
            raise ResultsError(
                f"{self.path}: {group} / {field} / Percentiles {text!r}: not the {len(CSV_PERCENTILES)} numbers "
                "GuideLLM writes (min, p0.1, p1, p5, p10, p25, p75, p90, p95, p99, max)"
            )
        return values

    def mean(self, group: str, unit: str) -> float | None:
        key = (group, f"Successful {unit}", "Mean")
        return self.number(*key) if key in self.cells else None


def _csv_run(path: Path, columns: CsvColumns, warnings: list[str]) -> PeerRun:
    counts = {status: int(columns.number("Request Counts", status) or 0) for status in REQUEST_COUNTS}
    summary = figures_summary(
        completed=counts["Successful"],
        failed=counts["Errored"] + counts["Incomplete"],
        window_s=columns.number("Timings", "Duration", "Sec"),
        requests_per_s=columns.mean("Server Throughput", "Requests/Sec"),
        output_tokens_per_s=columns.mean("Token Throughput", "Output Tokens/Sec"),
        total_tokens_per_s=columns.mean("Token Throughput", "Total Tokens/Sec"),
        latencies={
            "e2e_ms": columns.stats_ms("Request Latency", "Sec", 1e3),
            "ttft_ms": columns.stats_ms("Time to First Token", "ms", 1.0),
            "tpot_ms": columns.stats_ms("Inter Token Latency", "ms", 1.0),  # its ITL: our TPOT
        },
    )
    summary["peer_figures"] = {"time_per_output_token_ms": columns.stats_ms("Time per Output Token", "ms", 1.0)}
    version = _csv_version(columns)
    arrival = columns.cells.get(("Benchmark", "Strategy", ""))
    load = {"arrival": arrival, "num_requests": summary["requests"]["measured"]}
    run_info = info("guidellm-run", TOOL, load=load, version=version)
    # the line on its requests' first and last token times says nothing of a file that holds no request
    lines = [line for line in differences() if "per-chunk" not in line]
    lines.append(f"its CSV export holds each benchmark's statistics only: {SUMMARY_ONLY}")
    return peer_run(path, TOOL, version, run_info, summary, differences=lines, warnings=warnings)


def _csv_version(columns: CsvColumns) -> str:
    """guidellm_version from the Runtime Info / Metadata cell (JSON), when the file has it."""
    try:
        metadata = json.loads(columns.cells.get(("Runtime Info", "Metadata", ""), "") or "{}")
    except ValueError:
        return "unknown"
    return str(metadata.get("guidellm_version") or "unknown") if isinstance(metadata, dict) else "unknown"


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
