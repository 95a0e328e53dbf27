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
    PeerRun,
    json_object_or_none,
    read_json_file,
    require,
    stats_ms,
    streamed_record,
)

TOOL = "GuideLLM"
MS = {"time_to_first_token_ms": "ttft_ms", "inter_token_latency_ms": "tpot_ms"}


def matches(path: Path) -> bool:
    obj = json_object_or_none(path) if path.suffix == ".json" else None
    if obj is None:
        return False
    benchmarks = obj.get("benchmarks")
    return isinstance(benchmarks, list) and bool(benchmarks) and "metrics" in benchmarks[0]


def load(path: Path) -> PeerRun:
    obj = read_json_file(path)
    bench = obj["benchmarks"][-1]
    warnings = (
        [f"{path}: holds {len(obj['benchmarks'])} benchmarks; the last is read"] if len(obj["benchmarks"]) > 1 else []
    )
    metrics = bench["metrics"]
    require(metrics, (*MS, "request_latency", "requests_per_second", "request_totals"), path, TOOL)
    totals = metrics["request_totals"]
    summary = {
        "requests": {
            "measured": totals["successful"] + totals["errored"] + totals["incomplete"],
            "completed": totals["successful"],
            "failed": totals["errored"] + totals["incomplete"],
        },
        "window_s": bench.get("duration"),
        "throughput": {
            "requests_per_s": _summary(metrics, "requests_per_second")["mean"],
            "output_tokens_per_s": _summary(metrics, "output_tokens_per_second")["mean"],
            "total_tokens_per_s": _summary(metrics, "tokens_per_second")["mean"],
        },
        "e2e_ms": stats(metrics, "request_latency", 1e3),
        # kept apart: GuideLLM's TPOT counts the first token's wait, no figure of ours does
        "peer_figures": {"time_per_output_token_ms": stats(metrics, "time_per_output_token_ms", 1.0)},
    }
    for theirs, ours in MS.items():
        summary[ours] = stats(metrics, theirs, 1.0)
    records = _records(bench.get("requests") or {})
    info = {
        "scenario": {"name": "guidellm-run", "load": _load(bench, summary["requests"]["measured"])},
        "backend": {"kind": f"{TOOL} (peer file)", "model": None},
        "peer": {"tool": TOOL, "version": _version(obj)},
    }
    return PeerRun(TOOL, _version(obj), path, info, summary, records, differences(), warnings)


def _summary(metrics: dict, name: str) -> dict:
    return (metrics.get(name) or {}).get("successful") or {"mean": None}


def stats(metrics: dict, name: str, to_ms: float) -> dict:
    s = _summary(metrics, name)
    if s.get("mean") is None:
        return stats_ms()
    pct = s.get("percentiles") or {}
    given = {"mean": s["mean"], "std": s.get("std_dev"), "min": s.get("min"), "max": s.get("max")}
    given |= {k: pct.get(k) for k in ("p90", "p95", "p99", "p999")}
    given["p50"] = s.get("median", pct.get("p50"))  # the console's Mdn
    return stats_ms(**{k: None if v is None else v * to_ms for k, v in given.items()})


def _version(obj: dict) -> str:
    return str((obj.get("metadata") or {}).get("guidellm_version") or obj.get("guidellm_version") or "unknown")


def _load(bench: dict, measured: int) -> dict:
    strategy = (bench.get("config") or {}).get("strategy") or {}
    load = {"arrival": strategy.get("type_"), "num_requests": measured}
    if strategy.get("rate"):
        load["rate"] = strategy["rate"]
    return load


def _records(requests: dict) -> list:
    """Each request from its first and last token times (GuideLLM keeps no per-chunk times)."""
    rows = [(r, "") for r in requests.get("successful") or []]
    rows += [(r, r.get("error") or "errored") for r in requests.get("errored") or []]
    rows += [(r, "incomplete") for r in requests.get("incomplete") or []]
    starts = [r["info"]["timings"].get("request_start") for r, _ in rows]
    t0 = min((s for s in starts if s is not None), default=0.0)
    out = []
    for i, (r, error) in enumerate(rows):
        t = r["info"]["timings"]
        send_s = (t.get("request_start") or t0) - t0
        out_tokens = (r.get("output_metrics") or {}).get("text_tokens") or r.get("output_tokens") or 0
        first, last = t.get("first_token_iteration"), t.get("last_token_iteration")
        times, per_chunk = [], None
        if not error and first is not None and last is not None:
            times = [first - t0] if out_tokens <= 1 else [first - t0, last - t0]
            per_chunk = [1] if out_tokens <= 1 else [1, out_tokens - 1]
        in_tokens = (r.get("input_metrics") or {}).get("text_tokens") or r.get("prompt_tokens") or 0
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
