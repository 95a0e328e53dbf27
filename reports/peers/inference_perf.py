"""inference-perf's (kubernetes-sigs/inference-perf) lifecycle reports: `summary_lifecycle_metrics.json` and
`stage_N_lifecycle_metrics.json` (JSON), and the same report as YAML (llm-d-benchmark keeps one): `load_summary`
{count, requested_rate, achieved_rate}, `successes` {count, latency {time_to_first_token, time_per_output_token,
inter_token_latency, request_latency, normalized_time_per_output_token}: {mean, min, median, p90, p99, p99.9, max},
throughput {requests_per_sec, output_tokens_per_sec, total_tokens_per_sec}}, `failures` {count}; seconds.

Its inter_token_latency is each gap between streamed chunks (our itl_chunk_ms); its time_per_output_token is per
request decode time / decode tokens, our TPOT (inference_perf/client/modelserver/openai_client.py,
kubernetes-sigs/inference-perf@7de5ef2).
"""

from __future__ import annotations

from pathlib import Path

from reports.peers.common import (
    FROM_ACTUAL_SEND,
    SUMMARY_ONLY,
    PeerFormat,
    PeerRun,
    document,
    figures_summary,
    info,
    peer_run,
    stats_of,
)

TOOL = "inference-perf"
LATENCIES = {
    "time_to_first_token": "ttft_ms",
    "time_per_output_token": "tpot_ms",
    "inter_token_latency": "itl_chunk_ms",
    "request_latency": "e2e_ms",
}


class InferencePerfLifecycle(PeerFormat):
    tool = TOOL
    shape = "lifecycle metrics report, JSON or YAML (2025-2026)"
    suffixes = (".json", ".yaml", ".yml")
    signature = ("load_summary", "successes", "failures")

    def load(self, path: Path) -> PeerRun:
        obj = document(path)
        successes, load_summary = obj["successes"] or {}, obj["load_summary"] or {}
        latency, throughput = successes.get("latency") or {}, successes.get("throughput") or {}
        summary = figures_summary(
            completed=int(successes.get("count") or 0),
            failed=int((obj.get("failures") or {}).get("count") or 0),
            window_s=obj.get("benchmark_time_seconds"),
            requests_per_s=throughput.get("requests_per_sec"),
            output_tokens_per_s=throughput.get("output_tokens_per_sec"),
            total_tokens_per_s=throughput.get("total_tokens_per_sec"),
            latencies={ours: stats_of(latency.get(theirs), 1e3) for theirs, ours in LATENCIES.items()},
        )
        load = {"rate": load_summary.get("requested_rate"), "num_requests": load_summary.get("count")}
        run_info = info(f"inference-perf {path.stem}", TOOL, load=load)
        lines = [
            FROM_ACTUAL_SEND,
            "its inter_token_latency is each gap between streamed chunks (our itl_chunk_ms); its "
            "time_per_output_token is our TPOT",
            f"seconds in its file; {SUMMARY_ONLY}",
        ]
        return peer_run(path, TOOL, "unknown", run_info, summary, differences=lines)
