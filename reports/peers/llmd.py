"""llm-d's Benchmark Report (llm-d/llm-d-benchmark, llmdbenchmark/analysis/benchmark_report/): YAML or JSON, `version`
0.1 (`metrics`: time, requests, latency, throughput) or 0.2 / 0.2.1 (`results.request_performance.aggregate`:
requests, latency, throughput; 0.2.1 adds multimodal and power fields, not read here). Each latency carries its
`units` (ms, s, ms/token, s/token); statistics mean, stddev, min, p10 ... p99p9, max. Its definitions are those of
the harness that ran (inference-perf, GuideLLM, vLLM's bench): time_per_output_token is TPOT, inter_token_latency
per chunk. Schemas: br_v0_1_json_schema.json, br_v0_2_json_schema.json, br_v0_2_1_json_schema.json there.
"""

from __future__ import annotations

from pathlib import Path

from harness.results.folder import ResultsError
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

TOOL = "llm-d Benchmark Report"
LATENCIES = {
    "time_to_first_token": "ttft_ms",
    "time_per_output_token": "tpot_ms",
    "inter_token_latency": "itl_chunk_ms",
    "request_latency": "e2e_ms",
}
TO_MS = {"ms": 1.0, "s": 1e3, "ms/token": 1.0, "s/token": 1e3}


def _latencies(latency: dict, path: Path) -> dict:
    out = {}
    for theirs, ours in LATENCIES.items():
        given = latency.get(theirs)
        if not isinstance(given, dict):
            continue
        scale = TO_MS.get(given.get("units"))
        if scale is None:
            raise ResultsError(f"{path}: {theirs} in units {given.get('units')!r}, none of {', '.join(TO_MS)}")
        out[ours] = stats_of(given, scale)
    return out


def _mean(value) -> float | None:
    return value.get("mean") if isinstance(value, dict) else value


class LlmdReportV01(PeerFormat):
    tool = TOOL
    shape = "Benchmark Report v0.1 (YAML/JSON)"
    suffixes = (".yaml", ".yml", ".json")
    signature = ("version", "scenario", "metrics")

    def load(self, path: Path) -> PeerRun:
        obj = document(path)
        m = obj["metrics"]
        requests, throughput = m.get("requests") or {}, m.get("throughput") or {}
        failed = int(requests.get("failures") or 0) + int(requests.get("incomplete") or 0)
        summary = figures_summary(
            completed=int(requests.get("total") or 0) - failed,
            failed=failed,
            window_s=(m.get("time") or {}).get("duration"),
            requests_per_s=throughput.get("requests_per_sec"),
            output_tokens_per_s=throughput.get("output_tokens_per_sec"),
            total_tokens_per_s=throughput.get("total_tokens_per_sec"),
            latencies=_latencies(m.get("latency") or {}, path),
        )
        return _run(path, str(obj["version"]), summary)


class LlmdReportV02(PeerFormat):
    tool = TOOL
    shape = "Benchmark Report v0.2 / v0.2.1 (YAML/JSON)"
    suffixes = (".yaml", ".yml", ".json")
    signature = ("version", "run", "scenario", "results")

    def load(self, path: Path) -> PeerRun:
        obj = document(path)
        aggregate = ((obj["results"] or {}).get("request_performance") or {}).get("aggregate")
        if not isinstance(aggregate, dict):
            raise ResultsError(f"{path}: an llm-d Benchmark Report lacks results.request_performance.aggregate")
        requests, throughput = aggregate.get("requests") or {}, aggregate.get("throughput") or {}
        failed = int(requests.get("failures") or 0)
        summary = figures_summary(
            completed=int(requests.get("total") or 0) - failed,
            failed=failed,
            window_s=None,  # run.time.duration is an ISO 8601 span of the whole run, not the measured window
            requests_per_s=_mean(throughput.get("request_rate")),
            output_tokens_per_s=_mean(throughput.get("output_token_rate")),
            total_tokens_per_s=_mean(throughput.get("total_token_rate")),
            latencies=_latencies(aggregate.get("latency") or {}, path),
        )
        return _run(path, str(obj["version"]), summary)


def _run(path: Path, version: str, summary: dict) -> PeerRun:
    run_info = info(f"llm-d-report {path.stem}", TOOL, version=version)
    lines = [
        FROM_ACTUAL_SEND,
        "its figures follow the harness that produced it (inference-perf, GuideLLM, vLLM's bench): "
        "time_per_output_token is our TPOT, inter_token_latency per streamed chunk (our itl_chunk_ms)",
        SUMMARY_ONLY,
    ]
    return peer_run(path, TOOL, version, run_info, summary, differences=lines)
