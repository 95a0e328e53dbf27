"""SGLang's `bench_serving --output-file F.jsonl [--output-details]`: one JSON line per run, appended.

Its figures: `mean_/median_/std_/p99_{ttft,tpot}_ms`, `p95_/p99_itl_ms`, `p90_/p99_e2e_latency_ms`, `completed`,
`duration` (s), `request_throughput`, `output_throughput`, `total_throughput`; with --output-details, per request
`ttfts` (s), `itls` (s, per streamed chunk), `input_lens`, `output_lens`, `errors`, but no send times. The console's
"Max ITL" is not in the file: it is taken from the details. Source: python/sglang/bench_serving.py (0.5.9).
"""

from __future__ import annotations

import json
from pathlib import Path

from harness.results.folder import ResultsError
from reports.peers.common import (
    FROM_ACTUAL_SEND,
    PeerRun,
    chunk_times,
    one_token_per_chunk,
    require,
    stats_ms,
    streamed_record,
)

TOOL = "SGLang bench_serving"
FIGURES = ("duration", "completed", "request_throughput", "output_throughput", "total_throughput", "mean_ttft_ms")


def lines(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not a readable JSON-lines file ({e})") from None


def matches(path: Path) -> bool:
    if path.suffix != ".jsonl":
        return False
    try:
        rows = lines(path)
    except ResultsError:
        return False
    return bool(rows) and isinstance(rows[-1], dict) and all(k in rows[-1] for k in FIGURES) and "backend" in rows[-1]


def load(path: Path) -> PeerRun:
    rows = lines(path)
    obj = rows[-1]
    require(obj, FIGURES, path, TOOL)
    warnings = [f"{path}: holds {len(rows)} runs (the tool appends); the last is read"] if len(rows) > 1 else []
    records = _records(obj)
    every_gap = [g for r in obj.get("itls") or [] for g in r]
    measured = len(obj["ttfts"]) if "ttfts" in obj else obj["completed"]
    summary = {
        "requests": {"measured": measured, "completed": obj["completed"], "failed": measured - obj["completed"]},
        "window_s": obj["duration"],
        "throughput": {
            "requests_per_s": obj["request_throughput"],
            "output_tokens_per_s": obj["output_throughput"],
            "total_tokens_per_s": obj["total_throughput"],
        },
        "output_tokens": obj.get("total_output_tokens"),
        "ttft_ms": _stats(obj, "ttft", ("p99",)),
        "tpot_ms": _stats(obj, "tpot", ("p99",)),
        "e2e_ms": _stats(obj, "e2e_latency", ("p90", "p99")),
        "itl_chunk_ms": {**_stats(obj, "itl", ("p95", "p99")), "max": 1e3 * max(every_gap) if every_gap else None},
    }
    per_token = one_token_per_chunk(records)
    if per_token:
        summary["itl_ms"] = dict(summary["itl_chunk_ms"])
    info = {
        "scenario": {"name": f"sglang-bench-serving {obj.get('dataset_name')}", "load": _load(obj, measured)},
        "backend": {"kind": f"{TOOL} (peer file)", "model": None},
        "peer": {"tool": TOOL, "backend": obj.get("backend"), "tag": obj.get("tag")},
    }
    return PeerRun(TOOL, "unknown", path, info, summary, records, differences(per_token, bool(records)), warnings)


def _stats(obj: dict, metric: str, percentiles) -> dict:
    given = {"mean": obj.get(f"mean_{metric}_ms"), "std": obj.get(f"std_{metric}_ms")}
    given["p50"] = obj.get(f"median_{metric}_ms")
    given.update({p: obj.get(f"{p}_{metric}_ms") for p in percentiles})
    return stats_ms(**given)


def _load(obj: dict, measured: int) -> dict:
    rate = obj.get("request_rate")
    load = {"arrival": "poisson", "num_requests": measured}
    if isinstance(rate, (int, float)) and rate != float("inf"):
        load["rate"] = rate
    if obj.get("max_concurrency"):
        load["concurrency"] = obj["max_concurrency"]
    return load


def _records(obj: dict) -> list:
    """Per request, when saved with --output-details; without send times, each request is placed at 0."""
    if "ttfts" not in obj:
        return []
    out = []
    for i, ttft in enumerate(obj["ttfts"]):
        error = obj["errors"][i]
        times = [] if error else chunk_times(0.0, ttft, obj["itls"][i])
        out.append(streamed_record(i, 0.0, times, obj["output_lens"][i], obj["input_lens"][i], error))
    return out


def differences(per_token: bool, detailed: bool) -> list[str]:
    lines = [
        FROM_ACTUAL_SEND,
        "ITL is per streamed chunk (our itl_chunk_ms); "
        + ("every chunk here carried one token, so it is also our itl_ms" if per_token else "our itl_ms is not given"),
        "E2E latency ends when the stream closes ([DONE] read), ours at the last token; TPOT (excl. 1st token) = "
        "(E2E - TTFT) / (output tokens - 1) inherits that end",
        "the file has no send times: each request is drawn from 0 s, so this run's timeline and time windows are "
        "not its real ones",
    ]
    if not detailed:
        lines.append("saved without --output-details: no per-request data, so no distributions and no gate samples")
    return lines
