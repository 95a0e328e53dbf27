"""AIPerf's `aiperf profile` artifacts: profile_export_aiperf.json (the figures) and, with `--export-level records`,
profile_export.jsonl beside it (one line per request).

The figures: a key per metric tag, each {unit, avg, min, max, std, p1 ... p99}: `time_to_first_token`,
`inter_token_latency` ((request latency - TTFT) / (output tokens - 1) per request: our TPOT), `inter_chunk_latency`
(gaps between streamed chunks: our itl_chunk_ms), `request_latency` (E2E), `request_throughput`,
`output_token_throughput`, `request_count`, `error_request_count`. Per request: metadata.request_start_ns and
metrics {tag: {value, unit}}. Source: aiperf/metrics/types/*.py, aiperf/exporters/metrics_json_exporter.py.
"""

from __future__ import annotations

from pathlib import Path

from harness.results.folder import ResultsError
from reports.peers.common import (
    FROM_ACTUAL_SEND,
    PeerModel,
    PeerRun,
    chunk_times,
    json_object_or_none,
    one_token_per_chunk,
    parse,
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
    """profile_export_aiperf.json: a key per metric tag, and the run's settings."""

    aiperf_version: str
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


def matches(path: Path) -> bool:
    obj = json_object_or_none(path) if path.suffix == ".json" else None
    if obj is None:
        return False
    return "aiperf_version" in obj and "time_to_first_token" in obj


def load(path: Path) -> PeerRun:
    obj = read_json_file(path)
    require(obj, ("aiperf_version", "request_count", "request_throughput", *METRICS), path, TOOL)
    figures = parse(Figures, obj, path, TOOL)
    records = _records(path.parent / RECORDS_FILE)
    completed = int(figures.request_count.avg)
    failed = int(figures.error_request_count.avg or 0)
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
    info = {
        "scenario": {"name": "aiperf-profile", "load": {"num_requests": completed + failed}},
        "backend": {"kind": f"{TOOL} (peer file)", "model": model_names[0] if model_names else None},
        "peer": {"tool": TOOL, "version": figures.aiperf_version, "start_time": figures.start_time},
    }
    return PeerRun(TOOL, figures.aiperf_version, path, info, summary, records, differences(per_token, bool(records)))


def _records(path: Path) -> list:
    """Each request of profile_export.jsonl, timed from the first request's start."""
    if not path.is_file():
        return []
    rows = [parse(Record, row, path, TOOL) for row in read_json_lines(path)]
    t0 = min(row.metadata.request_start_ns for row in rows)
    out = []
    for i, row in enumerate(rows):
        metrics = row.metrics
        send_s = (row.metadata.request_start_ns - t0) / 1e9
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
        lines.append(f"no {RECORDS_FILE} beside it (--export-level summary): no distributions and no gate samples")
    return lines
