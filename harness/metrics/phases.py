"""Where a request's time goes: queue, prefill, decode inside the engine, and the client's own
overhead (late sends, waiting for a concurrency slot, connect + send). Definitions: docs/metrics.md.

Per request, where the engine reports its own account on the stream's last chunk
(RequestRecord.server_timings):
  native engine  queue_ms, prefill_ms, decode_ms (native_engine/llm_engine.py request_timings)
  llama.cpp      prompt_ms (prefill), predicted_ms (decode); queue is not reported, so it is what
                 the client's TTFT leaves after the client's parts and prefill (queue_derived)
  Ollama         prompt_eval_s (prefill), eval_s (decode); queue derived the same way
Per run otherwise, from the engine's histograms in server_metrics.csv, as sum/count deltas over
the measured window (the mean per request): vLLM, TensorRT-LLM and native
request_{queue,prefill,decode}_time_seconds; SGLang queue_time_seconds, prefill from
per_stage_req_latency_seconds{stage="prefill_forward"} where its server has it (else its TTFT minus queue),
decode = its e2e minus TTFT.

`ttft_share` splits the client's mean TTFT into the mean of each part; `other` is what no part
explains (tokenization, HTTP framing, the first chunk's trip back), never below zero.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.engine.server_metrics import read_schema, window_delta
from harness.results.schema import Phases, PhaseStats, TtftShare

ENGINE_PHASES = ("queue", "prefill", "decode")
CLIENT_PARTS = ("client_lag", "concurrency_wait", "connect_send")


def _stats(values_ms: list[float]) -> PhaseStats | None:
    if not values_ms:
        return None
    arr = np.asarray(values_ms, dtype=np.float64)
    return PhaseStats(
        mean=float(arr.mean()),
        p50=float(np.percentile(arr, 50)),
        p90=float(np.percentile(arr, 90)),
        p99=float(np.percentile(arr, 99)),
        max=float(arr.max()),
        count=int(arr.size),
    )


def engine_account(timings: dict) -> tuple[dict[str, float], str] | None:
    """({phase: ms}, source) from one record's server_timings, or None when it has none."""
    if "queue_ms" in timings and timings.get("prefill_ms") is not None:
        return {p: timings[f"{p}_ms"] for p in ENGINE_PHASES if timings.get(f"{p}_ms") is not None}, "native"
    if "prompt_ms" in timings:
        return {"prefill": timings["prompt_ms"], "decode": timings.get("predicted_ms", 0.0)}, "llamacpp"
    if "prompt_eval_s" in timings:
        return {"prefill": timings["prompt_eval_s"] * 1e3, "decode": timings.get("eval_s", 0.0) * 1e3}, "ollama"
    return None


def client_parts(rec) -> dict[str, float]:
    """The client's share of one request's TTFT, in ms."""
    parts = {}
    if rec.actual_send_s is not None:
        parts["client_lag"] = max(rec.actual_send_s - rec.intended_send_s - rec.cap_wait_s, 0.0) * 1e3
        parts["concurrency_wait"] = rec.cap_wait_s * 1e3
        if rec.request_written_s is not None:
            parts["connect_send"] = max(rec.request_written_s - rec.actual_send_s, 0.0) * 1e3
    return parts


def histogram_means(server_metrics_csv: Path, start_s: float, end_s: float) -> dict[str, float]:
    """{schema histogram: mean over the window} from bench:<name>_sum/_count deltas, in ms."""
    series = read_schema(server_metrics_csv)

    def delta(name: str) -> float | None:
        return window_delta(series.get(name), start_s, end_s)

    means = {}
    for hist in ("queue_s", "prefill_s", "decode_s", "ttft_s", "e2e_s"):
        total, count = delta(f"bench:{hist}_sum"), delta(f"bench:{hist}_count")
        if total is not None and count:
            means[hist.removesuffix("_s")] = total / count * 1e3
    return means


def _run_means(done, server_metrics_csv: Path | None, scrape_offset_s: float) -> dict:
    """The engine's histogram means (ms) over the requests' span, the phases it lacks derived where it can."""
    start = min(r.intended_send_s for r in done) + scrape_offset_s
    end = max(r.end_s for r in done) + scrape_offset_s
    means = (
        histogram_means(server_metrics_csv, start, end)
        if server_metrics_csv and Path(server_metrics_csv).is_file()
        else {}
    )
    if "prefill" not in means and "ttft" in means and "queue" in means:  # SGLang without per-stage latency
        means["prefill"] = max(means["ttft"] - means["queue"], 0.0)
    if "decode" not in means and "e2e" in means and "ttft" in means:
        means["decode"] = max(means["e2e"] - means["ttft"], 0.0)
    return means


def phases(records, server_metrics_csv: Path | None = None, scrape_offset_s: float = 0.0) -> Phases:
    """The phases_ms block of summary.json for the measured, completed requests.
    `scrape_offset_s`: add to record times to get server_metrics.csv's clock."""
    done = [r for r in records if not r.is_warmup and r.ok and r.token_times_s]
    if not done:
        return Phases(source=None, reason="no completed requests")
    ttft_ms = [(r.token_times_s[0] - r.intended_send_s) * 1e3 for r in done]  # request_latency's ttft_s, alone
    per_part, sources, accounted = _request_parts(done, ttft_ms)
    if accounted:
        how = {"source": "per request: " + ", ".join(sorted(sources)), "requests_with_engine_timings": accounted}
        parts = {p: _stats(v) for p, v in per_part.items()}
    else:
        how, parts = _per_run(done, per_part, server_metrics_csv, scrape_offset_s)
    parts = {p: stats for p, stats in parts.items() if stats}
    ttft_mean = float(np.mean(ttft_ms))
    shares = {p: parts[p].mean / ttft_mean for p in ("queue", "prefill", *CLIENT_PARTS) if p in parts and ttft_mean > 0}
    if shares:
        shares["other"] = max(1.0 - sum(shares.values()), 0.0)
        how |= {"ttft_share": TtftShare(**shares), "main_ttft_part": max(shares, key=shares.get)}
    return Phases(requests=len(done), **how, **parts, ttft=_stats(ttft_ms))


def _request_parts(done: list, ttft_ms: list[float]) -> tuple[dict[str, list[float]], set[str], int]:
    """Each part's per-request values (ms), the engines' sources and how many requests carried their account."""
    per_part: dict[str, list[float]] = {p: [] for p in (*ENGINE_PHASES, *CLIENT_PARTS)}
    sources = set()
    accounted = 0
    for rec, ttft in zip(done, ttft_ms):
        client = client_parts(rec)
        for part, value in client.items():
            per_part[part].append(value)
        account = engine_account(rec.server_timings or {})
        if account is None:
            continue
        engine, source = account
        accounted += 1
        sources.add(source)
        if "queue" not in engine:  # llama.cpp, Ollama: what TTFT leaves after the client and prefill
            engine["queue"] = max(ttft - sum(client.values()) - engine["prefill"], 0.0)
            sources.add("queue_derived")
        for phase in ENGINE_PHASES:
            if phase in engine:
                per_part[phase].append(engine[phase])
    return per_part, sources, accounted


def _per_run(done: list, per_part: dict, server_metrics_csv: Path | None, scrape_offset_s: float):
    """Without the engine's per-request account: its histogram means over the run, beside the client's parts."""
    means = _run_means(done, server_metrics_csv, scrape_offset_s)
    parts = {p: _stats(v) for p, v in per_part.items() if p in CLIENT_PARTS}
    found = [p for p in ENGINE_PHASES if p in means]
    parts |= {phase: PhaseStats(mean=means[phase]) for phase in found}
    if found:
        return {"source": "per run: engine histograms over the window"}, parts
    reason = (
        "no engine timings: the stream carries none and server_metrics.csv has no "
        "queue/prefill/decode histograms that moved during the run"
    )
    return {"source": None, "reason": reason}, parts
