"""AIPerf's `aiperf profile` artifacts: profile_export_aiperf.json (the figures) and, with `--export-level records`,
profile_export.jsonl beside it (one line per request).

The figures: a key per metric tag, each {unit, avg, min, max, std, p1 ... p99}: `time_to_first_token`,
`inter_token_latency` ((request latency - TTFT) / (output tokens - 1) per request: our TPOT), `inter_chunk_latency`
(gaps between streamed chunks: our itl_chunk_ms), `request_latency` (E2E), `request_throughput`,
`output_token_throughput`, `request_count`, `error_request_count`. Per request: metadata.request_start_ns and
metrics {tag: {value, unit}}. Source: aiperf/metrics/types/*.py, aiperf/exporters/metrics_json_exporter.py.
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.results.folder import ResultsError
from reports.peers.common import (
    FROM_ACTUAL_SEND,
    PeerRun,
    chunk_times,
    json_object_or_none,
    one_token_per_chunk,
    read_json_file,
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


def matches(path: Path) -> bool:
    obj = json_object_or_none(path) if path.suffix == ".json" else None
    if obj is None:
        return False
    return "aiperf_version" in obj and "time_to_first_token" in obj


def load(path: Path) -> PeerRun:
    obj = read_json_file(path)
    require(obj, ("aiperf_version", "request_count", "request_throughput", *METRICS), path, TOOL)
    records = _records(path.parent / RECORDS_FILE)
    completed = int(obj["request_count"]["avg"])
    failed = int((obj.get("error_request_count") or {}).get("avg") or 0)
    summary = {
        "requests": {"measured": completed + failed, "completed": completed, "failed": failed},
        "window_s": (obj.get("benchmark_duration") or {}).get("avg"),
        "throughput": {
            "requests_per_s": obj["request_throughput"]["avg"],
            "output_tokens_per_s": (obj.get("output_token_throughput") or {}).get("avg"),
            "total_tokens_per_s": (obj.get("total_token_throughput") or {}).get("avg"),
        },
        "output_tokens": (obj.get("total_output_tokens") or {}).get("avg"),
    }
    for theirs, ours in METRICS.items():
        summary[ours] = metric_stats(obj[theirs], f"{path}: {theirs}")
    per_token = one_token_per_chunk(records)
    if per_token:
        summary["itl_ms"] = dict(summary["itl_chunk_ms"])
    config = obj.get("input_config") or {}
    info = {
        "scenario": {"name": "aiperf-profile", "load": {"num_requests": completed + failed}},
        "backend": {"kind": f"{TOOL} (peer file)", "model": _model(config)},
        "peer": {"tool": TOOL, "version": obj["aiperf_version"], "start_time": obj.get("start_time")},
    }
    return PeerRun(TOOL, obj["aiperf_version"], path, info, summary, records, differences(per_token, bool(records)))


def metric_stats(metric: dict, where: str) -> dict:
    """One AIPerf metric's statistics in ms (avg is our mean; it has no p999)."""
    scale = TO_MS.get(metric.get("unit"))
    if scale is None:
        raise ResultsError(
            f"{where}: unit {metric.get('unit')!r} is not a time unit this reader knows ({', '.join(TO_MS)})"
        )
    pick = {
        "mean": "avg",
        "std": "std",
        "min": "min",
        "p50": "p50",
        "p90": "p90",
        "p95": "p95",
        "p99": "p99",
        "max": "max",
    }
    return stats_ms(**{ours: None if metric.get(k) is None else scale * metric[k] for ours, k in pick.items()})


def _model(config: dict):
    names = (config.get("endpoint") or {}).get("model_names") or []
    return names[0] if names else None


def _records(path: Path) -> list:
    """Each request of profile_export.jsonl, timed from the first request's start."""
    if not path.is_file():
        return []
    try:
        rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not a readable JSON-lines file ({e})") from None
    t0 = min(r["metadata"]["request_start_ns"] for r in rows)
    out = []
    for i, row in enumerate(rows):
        metrics = row.get("metrics") or {}
        send_s = (row["metadata"]["request_start_ns"] - t0) / 1e9
        error = (row.get("error") or {}).get("message") or ("failed" if row.get("error") else "")
        ttft, gaps = value_s(metrics, "time_to_first_token"), value_s(metrics, "inter_chunk_latency") or []
        times = [] if error or ttft is None else chunk_times(send_s, ttft, gaps)
        out_tokens = (metrics.get("output_sequence_length") or {}).get("value", len(times))
        in_tokens = (metrics.get("input_sequence_length") or {}).get("value", 0)
        out.append(streamed_record(i, send_s, times, out_tokens, in_tokens, error))
    return out


def value_s(metrics: dict, tag: str):
    """A record's metric in seconds (a number or a list), None when absent."""
    metric = metrics.get(tag) or {}
    value, scale = metric.get("value"), TO_MS.get(metric.get("unit"), 1.0) / 1e3
    if isinstance(value, list):
        return [x * scale for x in value]
    return None if value is None else value * scale


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
