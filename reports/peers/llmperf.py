"""LLMPerf's (ray-project/llmperf `token_benchmark_ray.py --results-dir`) `*_summary.json`: one flat object of
`results_<metric>_s_{mean,min,max,stddev,quantiles_pNN}` figures, seconds.

Its inter-token latency is per request the sum of every gap, the first token's wait included, divided by the output
tokens (llmperf@f1d6bed: src/llmperf/ray_clients/openai_chat_completions_client.py sums `time_to_next_token` from the
TTFT on; token_benchmark_ray.py divides it by `number_output_tokens`): E2E / output tokens, none of ours, kept under
peer_figures like GuideLLM's TPOT. The summary has no duration and no request rate.
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

TOOL = "LLMPerf"


def flat_stats(obj: dict, prefix: str) -> dict:
    """`prefix_mean`, `prefix_stddev`, `prefix_quantiles_p50` ... of a flat LLMPerf object, as one statistics dict."""
    out = {}
    for key, value in obj.items():
        if key.startswith(prefix + "_"):
            out[key.removeprefix(prefix + "_").removeprefix("quantiles_")] = value
    return out


class LlmperfSummary(PeerFormat):
    tool = TOOL
    shape = "token_benchmark_ray.py *_summary.json (version 2023-08-31)"
    signature = ("results_ttft_s_mean", "results_end_to_end_latency_s_mean", "results_num_completed_requests")

    def load(self, path: Path) -> PeerRun:
        obj = document(path)
        completed = int(obj["results_num_completed_requests"])
        summary = figures_summary(
            completed=completed,
            failed=int(obj.get("results_number_errors") or 0),
            window_s=None,
            requests_per_s=None,
            output_tokens_per_s=obj.get("results_mean_output_throughput_token_per_s"),
            latencies={
                "ttft_ms": stats_of(flat_stats(obj, "results_ttft_s"), 1e3),
                "e2e_ms": stats_of(flat_stats(obj, "results_end_to_end_latency_s"), 1e3),
            },
        )
        itl = stats_of(flat_stats(obj, "results_inter_token_latency_s"), 1e3)
        summary["peer_figures"] = {"inter_token_latency_ms": itl}
        load = {
            "concurrency": obj.get("num_concurrent_requests"),
            "num_requests": obj.get("results_num_requests_started"),
        }
        run_info = info(
            f"llmperf {obj.get('name')}", TOOL, model=obj.get("model"), load=load, version=obj.get("version")
        )
        lines = [
            FROM_ACTUAL_SEND,
            "its inter-token latency is E2E / output tokens per request (the first token's wait included): none of "
            "ours, kept under peer_figures",
            f"no duration or request rate in its summary; {SUMMARY_ONLY}",
        ]
        return peer_run(path, TOOL, str(obj.get("version")), run_info, summary, differences=lines)
