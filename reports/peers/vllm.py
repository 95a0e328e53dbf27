"""`vllm bench serve --save-result [--save-detailed]`: one JSON object per run.

Its figures: `mean_/median_/std_/pN_{ttft,tpot,itl,e2el}_ms` (N from --metric-percentiles), `completed`, `failed`,
`duration` (s), `request_throughput`, `output_throughput`, `total_token_throughput`; with --save-detailed, per
request `start_times` (perf_counter s), `ttfts` (s), `itls` (s, per streamed chunk), `input_lens`, `output_lens`,
`errors`. Source: vllm/benchmarks/serve.py (calculate_metrics, benchmark).
"""

from __future__ import annotations

from pathlib import Path

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

TOOL = "vLLM bench serve"
FIGURES = ("duration", "completed", "request_throughput", "output_throughput", "mean_ttft_ms")
METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_chunk_ms", "e2el": "e2e_ms"}


def matches(path: Path) -> bool:
    obj = json_object_or_none(path) if path.suffix == ".json" else None
    if obj is None:
        return False
    return all(k in obj for k in FIGURES) and "endpoint_type" in obj and "median_ttft_ms" in obj


def load(path: Path) -> PeerRun:
    obj = read_json_file(path)
    require(obj, (*FIGURES, "failed", "total_token_throughput"), path, TOOL)
    records = _records(obj)
    summary = {
        "requests": {
            "measured": obj["completed"] + obj["failed"],
            "completed": obj["completed"],
            "failed": obj["failed"],
        },
        "window_s": obj["duration"],
        "throughput": {
            "requests_per_s": obj["request_throughput"],
            "output_tokens_per_s": obj["output_throughput"],
            "total_tokens_per_s": obj["total_token_throughput"],
        },
        "output_tokens": obj.get("total_output_tokens"),
    }
    for theirs, ours in METRICS.items():
        summary[ours] = latency_stats(obj, theirs)
    per_token = one_token_per_chunk(records)
    if per_token:  # every chunk carried one token: per-chunk ITL is per-token ITL
        summary["itl_ms"] = dict(summary["itl_chunk_ms"])
    return PeerRun(TOOL, "unknown", path, run_info(obj), summary, records, differences(per_token, bool(records)))


def latency_stats(obj: dict, metric: str) -> dict:
    """mean, std, median (our p50) and every pN the file has."""
    given = {"mean": obj.get(f"mean_{metric}_ms"), "std": obj.get(f"std_{metric}_ms")}
    given["p50"] = obj.get(f"median_{metric}_ms")
    for ours, word in (("p90", "90"), ("p95", "95"), ("p99", "99"), ("p999", "99.9")):
        if f"p{word}_{metric}_ms" in obj:
            given[ours] = obj[f"p{word}_{metric}_ms"]
    return stats_ms(**given)


def _records(obj: dict) -> list:
    starts = obj.get("start_times") or []
    if not starts:  # saved without --save-detailed: figures only
        return []
    t0 = min(starts)
    out = []
    for i, start in enumerate(starts):
        error = (obj.get("errors") or [""] * len(starts))[i]
        times = [] if error else chunk_times(start - t0, obj["ttfts"][i], obj["itls"][i])
        out.append(streamed_record(i, start - t0, times, obj["output_lens"][i], obj["input_lens"][i], error))
    return out


def run_info(obj: dict) -> dict:
    rate = obj.get("request_rate")
    load = {
        "arrival": "poisson" if obj.get("burstiness", 1.0) == 1.0 else "gamma",
        "num_requests": obj.get("num_prompts"),
    }
    if obj.get("max_concurrency"):
        load["concurrency"] = obj["max_concurrency"]
    if isinstance(rate, (int, float)):
        load["rate"] = rate
    return {
        "scenario": {"name": f"vllm-bench-serve {obj.get('label') or obj.get('model_id')}", "load": load},
        "backend": {"kind": f"{TOOL} (peer file)", "model": obj.get("model_id")},
        "peer": {"tool": TOOL, "date": obj.get("date"), "backend": obj.get("backend")},
    }


def differences(per_token: bool, detailed: bool) -> list[str]:
    lines = [
        FROM_ACTUAL_SEND,
        "ITL is per streamed chunk (our itl_chunk_ms); "
        + (
            "every chunk here carried one token, so it is also our per-token itl_ms"
            if per_token
            else "our per-token itl_ms is not given (some chunks carried several tokens)"
        ),
        "E2EL ends when the stream closes ([DONE] read), ours at the last token-bearing chunk; TPOT = (E2EL - TTFT) "
        "/ (output tokens - 1) inherits that end",
        "output tokens are the server's usage count, or, when its stream carries none, the tool's tokenizer's "
        "count of the returned text",
        "throughput is over the tool's benchmark duration (first send to the last request's end), ours over the "
        "measured window",
    ]
    if not detailed:
        lines.append("saved without --save-detailed: no per-request data, so no distributions and no gate samples")
    return lines
