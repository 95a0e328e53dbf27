"""SGLang's `bench_serving --output-file F.jsonl [--output-details]`: one JSON line per run, appended; two key sets.

Its figures: `mean_/median_/std_/p99_{ttft,tpot}_ms`, `p95_/p99_itl_ms`, `p90_/p99_e2e_latency_ms`, `completed`,
`duration` (s), `request_throughput`, `output_throughput`, `total_throughput`; with --output-details, per request
`ttfts` (s), `itls` (s, per streamed chunk), `input_lens`, `output_lens`, `errors`, but no send times. The console's
"Max ITL" is not in the file: it is taken from the details. Source: python/sglang/bench_serving.py (0.5.9). The
late-2024 key set (SglangJsonlOld) is that of the files in datacrunch-research/h200-benchmarks
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
    read_json_lines,
    require,
    stats_ms,
    streamed_record,
)

TOOL = "SGLang bench_serving"
FIGURES = ("duration", "completed", "request_throughput", "output_throughput", "total_throughput", "mean_ttft_ms")
# the percentiles it writes of each latency, besides mean, median and std
PERCENTILES = {"ttft": ("p99",), "tpot": ("p99",), "e2e_latency": ("p90", "p99"), "itl": ("p95", "p99")}


class SglangResult(PeerModel):
    """One line of the file: the figures, the settings and, with --output-details, the per-request lists."""

    duration: float
    completed: int
    request_throughput: float
    output_throughput: float
    total_throughput: float
    total_output_tokens: int | None = None
    ttfts: list[float] | None = None  # None: saved without --output-details
    itls: list[list[float]] = []
    input_lens: list[int] = []
    output_lens: list[int] = []
    errors: list[str] = []
    dataset_name: str | None = None
    request_rate: float | str | None = None
    max_concurrency: int | None = None
    backend: str | None = None
    tag: str | None = None


class SglangJsonl(PeerFormat):
    """The key set of 2025 on (0.4.x-0.5.x): request and total throughput, TTFT/TPOT/ITL/E2E statistics."""

    tool = TOOL
    shape = "bench_serving --output-file JSONL, 2025 key set [--output-details] (0.4.4-0.5.x)"
    suffixes = (".jsonl",)
    signature = (*FIGURES, "backend")
    hints = ("total_output_tokens_retokenized", "dataset_name", "random_input_len")
    top = list

    def load(self, path: Path) -> PeerRun:
        return _load_new(path)


class SglangJsonlOld(PeerFormat):
    """The key set of late 2024 (0.3-0.4): completed, duration, output throughput, mean/median E2E, median TTFT and
    ITL only; no request throughput, no TPOT, no per-request details; `request_rate` may be Infinity."""

    tool = TOOL
    shape = "bench_serving --output-file JSONL, 2024 key set (0.3-0.4)"
    suffixes = (".jsonl",)
    signature = ("backend", "duration", "completed", "output_throughput", "median_ttft_ms", "median_e2e_latency_ms")
    hints = ("total_output_tokens_retokenized", "dataset_name", "sharegpt_output_len")
    top = list

    def load(self, path: Path) -> PeerRun:
        rows = document(path)
        last = rows[-1]
        result = parse(SglangResult2024, last, path, TOOL)
        summary = figures_summary(
            completed=result.completed,
            failed=0,
            window_s=result.duration,
            requests_per_s=None,  # not in its file
            output_tokens_per_s=result.output_throughput,
            output_tokens=result.total_output_tokens,
            latencies={
                "ttft_ms": stats_ms(p50=result.median_ttft_ms),
                "itl_chunk_ms": stats_ms(p50=result.median_itl_ms),
                "e2e_ms": stats_ms(mean=result.mean_e2e_latency_ms, p50=result.median_e2e_latency_ms),
            },
        )
        load = {"arrival": "poisson", "num_requests": result.completed}
        if isinstance(result.request_rate, float) and result.request_rate != float("inf"):
            load["rate"] = result.request_rate
        run_info = info(f"sglang-bench-serving {result.dataset_name}", TOOL, load=load, backend=result.backend)
        warnings = [f"{path}: holds {len(rows)} runs (the tool appends); the last is read"] if len(rows) > 1 else []
        lines = differences(False, False) + ["its 2024 key set has no request throughput, TPOT or failed count"]
        return peer_run(path, TOOL, "unknown", run_info, summary, differences=lines, warnings=warnings)


class SglangResult2024(PeerModel):
    duration: float
    completed: int
    output_throughput: float
    total_output_tokens: int | None = None
    mean_e2e_latency_ms: float | None = None
    median_e2e_latency_ms: float | None = None
    median_ttft_ms: float | None = None
    median_itl_ms: float | None = None
    dataset_name: str | None = None
    request_rate: float | str | None = None
    backend: str | None = None


def _load_new(path: Path) -> PeerRun:
    rows = read_json_lines(path)
    require(rows[-1], FIGURES, path, TOOL)
    result = parse(SglangResult, rows[-1], path, TOOL)
    warnings = [f"{path}: holds {len(rows)} runs (the tool appends); the last is read"] if len(rows) > 1 else []
    records = _records(result)
    every_gap = [g for gaps in result.itls for g in gaps]
    measured = len(result.ttfts) if result.ttfts is not None else result.completed
    latency = {metric: FlatLatency.of(rows[-1], metric, p).stats_ms() for metric, p in PERCENTILES.items()}
    summary = figures_summary(
        completed=result.completed,
        failed=measured - result.completed,
        window_s=result.duration,
        requests_per_s=result.request_throughput,
        output_tokens_per_s=result.output_throughput,
        total_tokens_per_s=result.total_throughput,
        output_tokens=result.total_output_tokens,
        latencies={
            "ttft_ms": latency["ttft"],
            "tpot_ms": latency["tpot"],
            "e2e_ms": latency["e2e_latency"],
            "itl_chunk_ms": {**latency["itl"], "max": 1e3 * max(every_gap) if every_gap else None},
        },
    )
    per_token = one_token_per_chunk(records)
    if per_token:
        summary["itl_ms"] = dict(summary["itl_chunk_ms"])
    info_ = {
        "scenario": {"name": f"sglang-bench-serving {result.dataset_name}", "load": _load(result, measured)},
        "backend": {"kind": f"{TOOL} (peer file)", "model": None},
        "peer": {"tool": TOOL, "backend": result.backend, "tag": result.tag},
    }
    return PeerRun(TOOL, "unknown", path, info_, summary, records, differences(per_token, bool(records)), warnings)


def _load(result: SglangResult, measured: int) -> dict:
    load = {"arrival": "poisson", "num_requests": measured}
    if isinstance(result.request_rate, float) and result.request_rate != float("inf"):
        load["rate"] = result.request_rate
    if result.max_concurrency:
        load["concurrency"] = result.max_concurrency
    return load


def _records(result: SglangResult) -> list:
    """Per request, when saved with --output-details; without send times, each request is placed at 0."""
    if result.ttfts is None:
        return []
    out = []
    for i, ttft in enumerate(result.ttfts):
        error = result.errors[i]
        times = [] if error else chunk_times(0.0, ttft, result.itls[i])
        out.append(streamed_record(i, 0.0, times, result.output_lens[i], result.input_lens[i], error))
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
        lines.append(f"saved without --output-details: {SUMMARY_ONLY}")
    return lines
