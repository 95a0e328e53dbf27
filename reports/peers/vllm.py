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
    FlatLatency,
    PeerModel,
    PeerRun,
    chunk_times,
    json_object_or_none,
    one_token_per_chunk,
    parse,
    read_json_file,
    require,
    streamed_record,
)

TOOL = "vLLM bench serve"
FIGURES = ("duration", "completed", "request_throughput", "output_throughput", "mean_ttft_ms")
METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_chunk_ms", "e2el": "e2e_ms"}
PERCENTILES = ("p90", "p95", "p99", "p99.9")  # those of ours its --metric-percentiles may have written


class VllmResult(PeerModel):
    """The file's figures, its settings and, with --save-detailed, its per-request lists (one entry a request)."""

    duration: float
    completed: int
    failed: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    total_output_tokens: int | None = None
    start_times: list[float] = []  # perf_counter s; empty without --save-detailed
    ttfts: list[float] = []
    itls: list[list[float]] = []
    input_lens: list[int] = []
    output_lens: list[int] = []
    errors: list[str] = []
    request_rate: float | str | None = None  # "inf" when every request was sent at once
    burstiness: float = 1.0
    num_prompts: int | None = None
    max_concurrency: int | None = None
    label: str | None = None
    model_id: str | None = None
    date: str | None = None
    backend: str | None = None


def matches(path: Path) -> bool:
    obj = json_object_or_none(path) if path.suffix == ".json" else None
    if obj is None:
        return False
    return all(k in obj for k in FIGURES) and "endpoint_type" in obj and "median_ttft_ms" in obj


def load(path: Path) -> PeerRun:
    obj = read_json_file(path)
    require(obj, (*FIGURES, "failed", "total_token_throughput"), path, TOOL)
    result = parse(VllmResult, obj, path, TOOL)
    records = _records(result)
    summary = {
        "requests": {
            "measured": result.completed + result.failed,
            "completed": result.completed,
            "failed": result.failed,
        },
        "window_s": result.duration,
        "throughput": {
            "requests_per_s": result.request_throughput,
            "output_tokens_per_s": result.output_throughput,
            "total_tokens_per_s": result.total_token_throughput,
        },
        "output_tokens": result.total_output_tokens,
    }
    for theirs, ours in METRICS.items():
        summary[ours] = FlatLatency.of(obj, theirs, PERCENTILES).stats_ms()
    per_token = one_token_per_chunk(records)
    if per_token:  # every chunk carried one token: per-chunk ITL is per-token ITL
        summary["itl_ms"] = dict(summary["itl_chunk_ms"])
    return PeerRun(TOOL, "unknown", path, run_info(result), summary, records, differences(per_token, bool(records)))


def _records(result: VllmResult) -> list:
    starts = result.start_times
    if not starts:  # saved without --save-detailed: figures only
        return []
    t0 = min(starts)
    errors = result.errors or [""] * len(starts)
    out = []
    for i, start in enumerate(starts):
        times = [] if errors[i] else chunk_times(start - t0, result.ttfts[i], result.itls[i])
        out.append(streamed_record(i, start - t0, times, result.output_lens[i], result.input_lens[i], errors[i]))
    return out


def run_info(result: VllmResult) -> dict:
    load = {
        "arrival": "poisson" if result.burstiness == 1.0 else "gamma",
        "num_requests": result.num_prompts,
    }
    if result.max_concurrency:
        load["concurrency"] = result.max_concurrency
    if isinstance(result.request_rate, float):
        load["rate"] = result.request_rate
    return {
        "scenario": {"name": f"vllm-bench-serve {result.label or result.model_id}", "load": load},
        "backend": {"kind": f"{TOOL} (peer file)", "model": result.model_id},
        "peer": {"tool": TOOL, "date": result.date, "backend": result.backend},
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
