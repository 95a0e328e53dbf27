"""`vllm bench serve --save-result [--save-detailed]` (and `benchmarks/benchmark_serving.py` before it): one JSON
object per run; `vllm bench sweep`: the same object per run (`run=N.json`) and a `summary.json` listing them.

Its figures: `mean_/median_/std_/pN_{ttft,tpot,itl,e2el}_ms` (N from --metric-percentiles, default 99, of the
--percentile-metrics asked: ttft,tpot,itl by default, so E2EL is often absent), `completed`, `failed`, `duration`
(s), `request_throughput`, `output_throughput`, `total_token_throughput`; with --save-detailed, per request
`start_times` (perf_counter s), `ttfts` (s), `itls` (s, per streamed chunk), `input_lens`, `output_lens`, `errors`.
A run where every request failed has every latency 0.0 (no sample). Source: vllm/benchmarks/serve.py
(calculate_metrics, benchmark), vllm/benchmarks/sweep/serve.py; the files read are 0.25.1's and 0.33.0's
(tests/fixtures/peers/manifest.yaml).
"""

from __future__ import annotations

from pathlib import Path

from reports.peers.common import (
    FROM_ACTUAL_SEND,
    SUMMARY_ONLY,
    FlatLatency,
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
    streamed_record,
)

TOOL = "vLLM bench serve"
METRICS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "itl": "itl_chunk_ms", "e2el": "e2e_ms"}
PERCENTILES = ("p90", "p95", "p99", "p99.9")  # those of ours its --metric-percentiles may have written


class VllmResult(PeerModel):
    """The file's figures, its settings and, with --save-detailed, its per-request lists (one entry a request)."""

    duration: float
    completed: int
    failed: int = 0
    request_throughput: float
    output_throughput: float
    total_token_throughput: float | None = None
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


class VllmBenchServe(PeerFormat):
    """One run's JSON object, summary-only or --save-detailed, completed or every request failed."""

    tool = TOOL
    shape = "bench serve --save-result [--save-detailed] (0.6-0.33; sweep run=N.json)"
    signature = ("duration", "completed", "request_throughput", "output_throughput", "median_ttft_ms")
    hints = ("endpoint_type", "burstiness", "tokenizer_id", "failed")

    def load(self, path: Path) -> PeerRun:
        return run_of(document(path), path)


class VllmSweepSummary(PeerFormat):
    """`vllm bench sweep`'s summary.json: a list of one setting's runs, each a bench serve object; the first is read."""

    tool = TOOL
    shape = "bench sweep summary.json (0.25)"
    signature = VllmBenchServe.signature
    top = list

    def load(self, path: Path) -> PeerRun:
        runs = document(path)
        run = run_of(runs[0], path)
        if len(runs) > 1:
            run.warnings.append(f"{path}: holds {len(runs)} runs of one setting (a sweep's repeats); the first is read")
        return run


def run_of(obj: dict, path: Path) -> PeerRun:
    result = parse(VllmResult, obj, path, TOOL)
    records = _records(result)
    latencies = {ours: FlatLatency.of(obj, theirs, PERCENTILES).stats_ms() for theirs, ours in METRICS.items()}
    summary = figures_summary(
        completed=result.completed,
        failed=result.failed,
        window_s=result.duration,
        requests_per_s=result.request_throughput,
        output_tokens_per_s=result.output_throughput,
        total_tokens_per_s=result.total_token_throughput,
        output_tokens=result.total_output_tokens,
        latencies=latencies,
    )
    per_token = one_token_per_chunk(records)
    if per_token:  # every chunk carried one token: per-chunk ITL is per-token ITL
        summary["itl_ms"] = dict(summary["itl_chunk_ms"])
    return peer_run(
        path,
        TOOL,
        "unknown",
        run_info(result),
        summary,
        records=records,
        differences=differences(per_token, bool(records)),
    )


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
        "concurrency": result.max_concurrency or None,
        "rate": result.request_rate if isinstance(result.request_rate, float) else None,
    }
    name = f"vllm-bench-serve {result.label or result.model_id}"
    return info(name, TOOL, model=result.model_id, load=load, date=result.date, backend=result.backend)


def differences(per_token: bool, detailed: bool) -> list[str]:
    lines = [
        FROM_ACTUAL_SEND,
        "ITL is per streamed chunk (our itl_chunk_ms); "
        + (
            "every chunk here carried one token, so it is also our per-token itl_ms"
            if per_token
            else "our per-token itl_ms is not given (some chunks carried several tokens, or no per-request data)"
        ),
        "E2EL ends when the stream closes ([DONE] read), ours at the last token-bearing chunk; TPOT = (E2EL - TTFT) "
        "/ (output tokens - 1) inherits that end",
        "output tokens are the server's usage count, or, when its stream carries none, the tool's tokenizer's "
        "count of the returned text",
        "throughput is over the tool's benchmark duration (first send to the last request's end), ours over the "
        "measured window",
    ]
    if not detailed:
        lines.append(f"saved without --save-detailed: {SUMMARY_ONLY}")
    return lines
