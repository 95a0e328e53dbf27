"""genai-bench's (sgl-project/genai-bench `genai-bench benchmark`) per-run JSON: `aggregated_metrics` (its figures:
`stats.<metric>` {min, max, mean, stddev, p25 ... p99}, `run_duration`, `requests_per_second`,
`mean_output_throughput_tokens_per_s`, counts) and `individual_request_metrics` (per request: ttft, tpot,
e2e_latency, token counts, error_code), times in `_time_unit` (s).

Its TPOT is (E2E - TTFT) / (output tokens - 1) per request, our TPOT (genai_bench/metrics/request_metrics_collector.py,
sgl-project/genai-bench@7fd04d8); its requests carry no send time, so they are drawn from 0 s, as SGLang's.
"""

from __future__ import annotations

from pathlib import Path

from reports.peers.common import (
    FROM_ACTUAL_SEND,
    PeerFormat,
    PeerRun,
    document,
    figures_summary,
    info,
    peer_run,
    stats_of,
    streamed_record,
)

TOOL = "genai-bench"
TO_MS = {"s": 1e3, "ms": 1.0}


class GenaiBenchRun(PeerFormat):
    tool = TOOL
    shape = "benchmark run JSON, aggregated_metrics + individual_request_metrics (2025)"
    signature = ("aggregated_metrics", "individual_request_metrics")

    def load(self, path: Path) -> PeerRun:
        obj = document(path)
        agg, to_ms = obj["aggregated_metrics"], TO_MS.get(obj.get("_time_unit", "s"), 1e3)
        stats = agg.get("stats") or {}
        summary = figures_summary(
            completed=int(agg.get("num_completed_requests") or 0),
            failed=int(agg.get("num_error_requests") or 0),
            window_s=agg.get("run_duration"),
            requests_per_s=agg.get("requests_per_second"),
            output_tokens_per_s=agg.get("mean_output_throughput_tokens_per_s"),
            total_tokens_per_s=agg.get("mean_total_tokens_throughput_tokens_per_s"),
            latencies={
                ours: stats_of(stats.get(theirs), to_ms)
                for theirs, ours in (("ttft", "ttft_ms"), ("tpot", "tpot_ms"), ("e2e_latency", "e2e_ms"))
            },
        )
        records = [_record(i, r, to_ms / 1e3) for i, r in enumerate(obj.get("individual_request_metrics") or [])]
        load = {"concurrency": agg.get("num_concurrency"), "num_requests": agg.get("num_requests")}
        run_info = info(f"genai-bench {agg.get('scenario')}", TOOL, load=load)
        lines = [
            FROM_ACTUAL_SEND,
            "its requests carry no send time: each is drawn from 0 s, so this run's timeline is not its real one",
            "its records hold TTFT and E2E only: our per-token ITL of a request is its mean gap",
        ]
        return peer_run(path, TOOL, "unknown", run_info, summary, records=records, differences=lines)


def _record(index: int, r: dict, to_s: float):
    out_tokens, error = int(r.get("num_output_tokens") or 0), r.get("error_message") or r.get("error_code") or ""
    times, per_chunk = [], None
    if not error and r.get("ttft") is not None and r.get("e2e_latency") is not None:
        times = [r["ttft"] * to_s] if out_tokens <= 1 else [r["ttft"] * to_s, r["e2e_latency"] * to_s]
        per_chunk = [1] if out_tokens <= 1 else [1, out_tokens - 1]
    return streamed_record(index, 0.0, times, out_tokens, int(r.get("num_input_tokens") or 0), str(error), per_chunk)
