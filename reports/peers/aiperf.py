"""AIPerf's `aiperf profile` artifacts: profile_export_aiperf.json (the figures) and, with `--export-level records`,
profile_export.jsonl beside it (one line per request).

The figures: a key per metric tag, each {unit, avg, min, max, std, p1 ... p99}: `time_to_first_token`,
`inter_token_latency` ((request latency - TTFT) / (output tokens - 1) per request: our TPOT), `inter_chunk_latency`
(gaps between streamed chunks: our itl_chunk_ms), `request_latency` (E2E), `request_throughput`,
`output_token_throughput`, `request_count`, `error_request_count`. Per request: metadata.request_start_ns and
metrics {tag: {value, unit}}; late 2025 (0.1-0.2), metadata.timestamp_ns and TTFT tagged `ttft`. Source:
aiperf/metrics/types/*.py, aiperf/exporters/metrics_json_exporter.py, aiperf/common/models/record_models.py.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from harness.results.folder import ResultsError
from reports.peers.common import (
    FROM_ACTUAL_SEND,
    SUMMARY_ONLY,
    PeerFormat,
    PeerModel,
    PeerRun,
    chunk_times,
    document,
    figures_summary,
    info,
    one_token_per_chunk,
    parse,
    peer_run,
    read_json_file,
    read_json_lines,
    require,
    stats_ms,
    streamed_record,
)

TOOL = "AIPerf"
RECORDS_FILE = "profile_export.jsonl"
METRICS = {
    "time_to_first_token": "ttft_ms",
    "inter_token_latency": "tpot_ms",
    "inter_chunk_latency": "itl_chunk_ms",
    "request_latency": "e2e_ms",
}
TO_MS = {"ms": 1.0, "s": 1e3, "sec": 1e3, "us": 1e-3, "ns": 1e-6}


class Metric(PeerModel):
    """One metric's statistics over the run (a count or a rate has its avg only)."""

    unit: str | None = None
    avg: float | None = None
    std: float | None = None
    min: float | None = None
    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    max: float | None = None

    def stats_ms(self, where: str) -> dict:
        """Ours in ms (avg is our mean; it has no p999)."""
        scale = TO_MS.get(self.unit)
        if scale is None:
            raise ResultsError(f"{where}: unit {self.unit!r} is not a time unit this reader knows ({', '.join(TO_MS)})")
        given = {"mean": self.avg, "std": self.std, "min": self.min, "max": self.max}
        given |= {"p50": self.p50, "p90": self.p90, "p95": self.p95, "p99": self.p99}
        return stats_ms(**{ours: None if value is None else scale * value for ours, value in given.items()})


class Endpoint(PeerModel):
    model_names: list[str] = []


class InputConfig(PeerModel):
    endpoint: Endpoint = Endpoint()


class Figures(PeerModel):
    """profile_export_aiperf.json: a key per metric tag, and the run's settings (the version from 0.11 on)."""

    aiperf_version: str = "unknown"
    request_count: Metric
    request_throughput: Metric
    error_request_count: Metric = Metric()
    benchmark_duration: Metric = Metric()
    output_token_throughput: Metric = Metric()
    total_token_throughput: Metric = Metric()
    total_output_tokens: Metric = Metric()
    time_to_first_token: Metric
    inter_token_latency: Metric
    inter_chunk_latency: Metric
    request_latency: Metric
    input_config: InputConfig = InputConfig()
    start_time: str | None = None


class Value(PeerModel):
    """One request's metric: a number, or a list (a gap per streamed chunk)."""

    value: float | list[float] | None = None
    unit: str | None = None

    def seconds(self) -> float | list[float] | None:
        scale = TO_MS.get(self.unit, 1.0) / 1e3
        if isinstance(self.value, list):
            return [x * scale for x in self.value]
        return None if self.value is None else self.value * scale


class RecordMetrics(PeerModel):
    time_to_first_token: Value = Value()
    inter_chunk_latency: Value = Value()
    output_sequence_length: Value | None = None
    input_sequence_length: Value = Value(value=0)


class RecordMetadata(PeerModel):
    request_start_ns: int  # ns since the epoch: kept an int, a float would round it to 256 ns


class RecordError(PeerModel):
    message: str | None = None


class Record(PeerModel):
    """One line of profile_export.jsonl: one request."""

    metadata: RecordMetadata
    metrics: RecordMetrics = RecordMetrics()
    error: RecordError | None = None

    def start_ns(self) -> int:
        return self.metadata.request_start_ns


class RecordMetrics2025(RecordMetrics):
    """Late 2025 (0.1-0.2): TTFT tagged `ttft`, the rest as later."""

    time_to_first_token: Value = Field(default=Value(), alias="ttft")


class RecordMetadata2025(PeerModel):
    # "the wall clock timestamp of the request start time in nanoseconds" (aiperf/common/models/record_models.py,
    # 2025-10): the same instant later files call request_start_ns
    timestamp_ns: int


class Record2025(Record):
    """One line of a late-2025 profile_export.jsonl."""

    metadata: RecordMetadata2025
    metrics: RecordMetrics2025 = RecordMetrics2025()

    def start_ns(self) -> int:
        return self.metadata.timestamp_ns


class AiperfJson(PeerFormat):
    """profile_export_aiperf.json of 0.11 on: a key per metric tag, `aiperf_version`, optional records beside it."""

    tool = TOOL
    shape = "profile_export_aiperf.json, metric tags at the top (2026, 0.11-0.13), + profile_export.jsonl records"
    signature = ("time_to_first_token", "request_latency", "request_count", "input_config")
    hints = ("aiperf_version", "schema_version", "inter_chunk_latency")

    def load(self, path: Path) -> PeerRun:
        return _load_current(path)


class AiperfRecordsWrapper(PeerFormat):
    """profile_export_aiperf.json of late 2025 (0.1-0.2): every metric under `records`, TTFT tagged `ttft`, no
    version in the file; its profile_export.jsonl records carry `timestamp_ns`, not request_start_ns, so only the
    figures are read."""

    tool = TOOL
    shape = "profile_export_aiperf.json, `records` wrapper (late 2025, 0.1-0.2)"
    signature = ("records", "input_config")

    def matches(self, path: Path) -> bool:
        return super().matches(path) and "ttft" in (document(path).get("records") or {})

    def load(self, path: Path) -> PeerRun:
        tags = document(path)["records"]
        metrics = {tag: parse(Metric, value, path, TOOL) for tag, value in tags.items() if isinstance(value, dict)}
        return _figures_run(path, "unknown (records wrapper, late 2025)", metrics, {"ttft": "time_to_first_token"})


class AiperfCsv(PeerFormat):
    """profile_export_aiperf.csv: `Metric,avg,min,max,p1,...,std` rows named "Header (unit)", then `Metric,Value`."""

    tool = TOOL
    shape = "profile_export_aiperf.csv (0.1-0.13)"
    suffixes = (".csv",)
    top = list

    def keys(self, path: Path) -> set[str]:
        rows = document(path) or []
        return {row[0] for row in rows if row}

    def matches(self, path: Path) -> bool:
        keys = self.keys(path) if path.suffix == ".csv" else set()
        return "Metric" in keys and any(k.startswith("Time to First Token") for k in keys)

    def load(self, path: Path) -> PeerRun:
        metrics, header = {}, []
        for row in document(path):
            if row and row[0] == "Metric":
                header = row[1:]
            elif row and header:
                label, _, unit = row[0].rpartition(" (") if " (" in row[0] else (row[0], "", "")
                stats = dict(zip(["avg"] if header == ["Value"] else header, (float(c) for c in row[1:] if c)))
                metrics[CSV_TAGS.get(label, label)] = Metric.model_validate({"unit": unit.rstrip(")"), **stats})
        return _figures_run(path, "unknown (CSV export)", metrics, {})


class AiperfRecordsJsonl(PeerFormat):
    """profile_export.jsonl alone (`--export-level records`): one line per request, {metadata: request_start_ns ...,
    metrics: {tag: {value, unit}}, error}; with no figures of the tool's beside it, every statistic is ours, computed
    on its requests (TTFT from its values, ITL from its inter_chunk_latency lists)."""

    tool = TOOL
    shape = "profile_export.jsonl records alone, request_start_ns (0.3-0.13)"
    suffixes = (".jsonl",)
    signature = ("metadata", "metrics")
    hints = ("request_start_ns",)  # tells a damaged file of this shape from one of late 2025
    top = list
    record: type[Record] = Record
    start_key = "request_start_ns"  # the metadata key of each request's start, the mark of the shape
    version = "unknown"

    def matches(self, path: Path) -> bool:
        return super().matches(path) and self.start_key in (document(path)[-1].get("metadata") or {})

    def part_of(self, path: Path) -> Path | None:
        figures = path.parent / "profile_export_aiperf.json"
        return figures if figures.is_file() else None

    def load(self, path: Path) -> PeerRun:
        records = _records(path, self.record)
        failed = sum(not r.ok for r in records)
        summary = figures_summary(
            completed=len(records) - failed, failed=failed, window_s=None, requests_per_s=None, latencies={}
        )
        lines = differences(one_token_per_chunk(records), True)
        lines.append("its records alone, no figures of the tool's: every statistic here is ours, on its requests")
        run_info = info("aiperf-profile", TOOL, load={"num_requests": len(records)}, version=self.version)
        return peer_run(path, TOOL, self.version, run_info, summary, records=records, differences=lines)


class AiperfRecordsJsonl2025(AiperfRecordsJsonl):
    """profile_export.jsonl of late 2025 (0.1-0.2, beside the `records` wrapper): each request's start is
    metadata.timestamp_ns and its TTFT is tagged `ttft`; read alone, as the records of 2026 are."""

    shape = "profile_export.jsonl records alone, timestamp_ns (late 2025, 0.1-0.2)"
    hints = ("timestamp_ns",)
    record = Record2025
    start_key = "timestamp_ns"
    version = "unknown (records with timestamp_ns, late 2025)"


# the CSV's headers of the metrics read, as its exporter names them (aiperf/metrics/types/*.py `header`)
CSV_TAGS = {
    "Time to First Token": "time_to_first_token",
    "Inter Token Latency": "inter_token_latency",
    "Inter Chunk Latency": "inter_chunk_latency",
    "Request Latency": "request_latency",
    "Request Throughput": "request_throughput",
    "Request Count": "request_count",
    "Error Request Count": "error_request_count",
    "Benchmark Duration": "benchmark_duration",
    "Output Token Throughput": "output_token_throughput",
    "Total Output Tokens": "total_output_tokens",
}


def _figures_run(path: Path, version: str, metrics: dict, renamed: dict[str, str]) -> PeerRun:
    """A run of AIPerf's figures alone (no records): `metrics` by tag, `renamed` its older tags to the current."""
    metrics = {renamed.get(tag, tag): m for tag, m in metrics.items()}
    if "time_to_first_token" not in metrics or "request_count" not in metrics:
        raise ResultsError(f"{path}: an AIPerf export lacks time_to_first_token or request_count")

    def avg(tag: str):
        return metrics[tag].avg if tag in metrics else None

    completed, failed = int(avg("request_count")), int(avg("error_request_count") or 0)
    summary = figures_summary(
        completed=completed,
        failed=failed,
        window_s=avg("benchmark_duration"),
        requests_per_s=avg("request_throughput"),
        output_tokens_per_s=avg("output_token_throughput"),
        total_tokens_per_s=avg("total_token_throughput"),
        output_tokens=avg("total_output_tokens"),
        latencies={ours: metrics[tag].stats_ms(f"{path}: {tag}") for tag, ours in METRICS.items() if tag in metrics},
    )
    run_info = info("aiperf-profile", TOOL, load={"num_requests": completed + failed}, version=version)
    return peer_run(path, TOOL, version, run_info, summary, differences=differences(False, False))


def _load_current(path: Path) -> PeerRun:
    obj = read_json_file(path)
    require(obj, ("request_count", "request_throughput", *METRICS), path, TOOL)
    figures = parse(Figures, obj, path, TOOL)
    records = _records(path.parent / RECORDS_FILE)
    completed = int(figures.request_count.avg)
    failed = int(figures.error_request_count.avg or 0)
    partial = bool(records) and len(records) != completed + failed
    if partial:  # a records file of other requests (trimmed, or another run's): no distribution from it
        records = []
    summary = {
        "requests": {"measured": completed + failed, "completed": completed, "failed": failed},
        "window_s": figures.benchmark_duration.avg,
        "throughput": {
            "requests_per_s": figures.request_throughput.avg,
            "output_tokens_per_s": figures.output_token_throughput.avg,
            "total_tokens_per_s": figures.total_token_throughput.avg,
        },
        "output_tokens": figures.total_output_tokens.avg,
    }
    for tag, metric in (
        ("time_to_first_token", figures.time_to_first_token),
        ("inter_token_latency", figures.inter_token_latency),
        ("inter_chunk_latency", figures.inter_chunk_latency),
        ("request_latency", figures.request_latency),
    ):
        summary[METRICS[tag]] = metric.stats_ms(f"{path}: {tag}")
    per_token = one_token_per_chunk(records)
    if per_token:
        summary["itl_ms"] = dict(summary["itl_chunk_ms"])
    model_names = figures.input_config.endpoint.model_names
    run_info_ = {
        "scenario": {"name": "aiperf-profile", "load": {"num_requests": completed + failed}},
        "backend": {"kind": f"{TOOL} (peer file)", "model": model_names[0] if model_names else None},
        "peer": {"tool": TOOL, "version": figures.aiperf_version, "start_time": figures.start_time},
    }
    lines = differences(per_token, bool(records))
    if partial:
        lines.append(f"its {RECORDS_FILE} does not hold the {completed + failed} requests counted: not read")
    return PeerRun(TOOL, figures.aiperf_version, path, run_info_, summary, records, lines)


def _records(path: Path, record: type[Record] = Record) -> list:
    """Each request of profile_export.jsonl (lines of `record`'s shape), timed from the first request's start."""
    if not path.is_file():
        return []
    rows = [parse(record, row, path, TOOL) for row in read_json_lines(path)]
    if not rows:
        raise ResultsError(f"{path}: an AIPerf {RECORDS_FILE} with no request in it")
    t0 = min(row.start_ns() for row in rows)
    out = []
    for i, row in enumerate(rows):
        metrics = row.metrics
        send_s = (row.start_ns() - t0) / 1e9
        error = (row.error.message or "failed") if row.error else ""
        ttft, gaps = metrics.time_to_first_token.seconds(), metrics.inter_chunk_latency.seconds() or []
        times = [] if error or ttft is None else chunk_times(send_s, ttft, gaps)
        out_tokens = metrics.output_sequence_length.value if metrics.output_sequence_length else len(times)
        out.append(streamed_record(i, send_s, times, out_tokens, metrics.input_sequence_length.value, error))
    return out


def differences(per_token: bool, detailed: bool) -> list[str]:
    lines = [
        FROM_ACTUAL_SEND,
        "its Inter Token Latency is per request, (request latency - TTFT) / (output tokens - 1): our TPOT, shown as "
        "tpot_ms; its Inter Chunk Latency, each gap between streamed chunks, is our itl_chunk_ms"
        + ("; every chunk here carried one token, so it is also our itl_ms" if per_token else ""),
        "output tokens are counted by its tokenizer on the returned text unless --use-server-token-count",
        "times in ms in the file (converted from its ns records)",
    ]
    if not detailed:
        lines.append(f"no {RECORDS_FILE} records read beside it: {SUMMARY_ONLY}")
    return lines
