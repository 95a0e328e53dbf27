"""What limits one run, each finding one line with its numbers: the `diagnosis` of summary.json.

Every rule reads the run (its summary, its records, the engine's schema series from
server_metrics.csv, the step trace when there is one, the scenario) and returns a Finding or
None. Thresholds are the module's constants, named after what they bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from harness.metrics.latencies import flat, request_latency
from harness.results.schema import Finding, ScenarioRecord, Summary, TokenCountRecord, TtftShare

QUEUE_SHARE_MAIN = 0.5  # queueing at least this share of mean TTFT: the run is saturated
QUEUE_SHARE_NOTABLE = 0.25  # ... a warning from here
WAITING_SAMPLES_FRACTION = 0.2  # requests waiting in at least this share of /metrics samples
KV_USAGE_HIGH = 0.9
KV_USAGE_LOW = 0.5  # below: the KV cache is not what caps the batch
STALL_TIMES_MEDIAN = 8.0  # an ITL gap this many times the median gap is a stall ...
STALL_MIN_S = 0.1  # ... and at least this long
STALL_ALIGNED_FRACTION = 0.5  # share of stalls that coincide with a long prompt's prefill
LONG_PROMPT_TIMES_MEDIAN = 4.0  # a prompt this many times the median prompt is long
HOL_QUEUE_SHARE = 0.5  # short requests queued for at least this share of their TTFT
PREFIX_HIT_FRACTION_OF_EXPECTED = 0.5
CLIENT_SHARE = 0.2  # the client's own parts of TTFT
LOW_BANDWIDTH_FRACTION = 0.3  # memory-bound decode below this share of bandwidth: overhead-bound


def _finding(rule: str, severity: str, message: str, evidence: dict) -> Finding:
    return Finding(rule=rule, severity=severity, message=message, evidence=evidence)


@dataclass
class Run:
    summary: Summary
    records: list
    series: dict = field(default_factory=dict)  # harness.engine.server_metrics.read_schema, on the records' clock
    steps: list = field(default_factory=list)  # harness.engine.step_trace steps
    scenario: dict = field(default_factory=dict)  # the resolved scenario

    def completed(self) -> list:
        """The measured requests that completed."""
        return [r for r in self.records if not r.is_warmup and r.ok and r.token_times_s]

    def window_values(self, name: str) -> list[float]:
        done = [r for r in self.records if not r.is_warmup]
        if not done:
            return []
        start = min(r.intended_send_s for r in done)
        end = max(r.end_s if r.end_s is not None else r.intended_send_s for r in done)
        return [v for t, v in self.series.get(name, []) if start <= t <= end]

    def counter_increase(self, name: str) -> float:
        values = self.window_values(name)
        return values[-1] - values[0] if len(values) >= 2 else 0.0


def _pct(x: float) -> str:
    return f"{100 * x:.0f}%"


def saturation(run: Run) -> Finding | None:
    phases = run.summary.phases_ms
    share = phases.ttft_share.queue if phases is not None and phases.ttft_share is not None else None
    waiting = run.window_values("bench:waiting")
    waiting_fraction = sum(w > 0 for w in waiting) / len(waiting) if waiting else 0.0
    if (share is None or share < QUEUE_SHARE_NOTABLE) and waiting_fraction < WAITING_SAMPLES_FRACTION:
        return None
    running = run.window_values("bench:running")
    evidence = {
        "queue_share_of_ttft": share,
        "waiting_samples_fraction": waiting_fraction,
        "waiting_max": max(waiting, default=None),
        "running_max": max(running, default=None),
    }
    if share is not None and waiting and max(waiting) == 0:
        # Queue time with an empty queue gauge: requests waited for the running step to end (a step
        # boundary), not for a slot in a full batch; that is slow steps, not saturation.
        queue_ms, ttft_ms = phases.queue.mean, phases.ttft.mean
        return _finding(
            "saturation",
            "info",
            f"step-boundary wait, not saturation: queueing is {_pct(share)} of TTFT (queue "
            f"{queue_ms:.0f} ms of mean TTFT {ttft_ms:.0f} ms) yet no request waited for a slot in "
            f"{len(waiting)} samples: new requests waited for the running step to end",
            evidence,
        )
    if share is not None:
        queue_ms, ttft_ms = phases.queue.mean, phases.ttft.mean
        main = share >= QUEUE_SHARE_MAIN and phases.main_ttft_part == "queue"
        message = (
            f"saturated: queueing is {_pct(share)} of TTFT{' (its main share)' if main else ''} "
            f"(queue {queue_ms:.0f} ms of mean TTFT {ttft_ms:.0f} ms)"
        )
    else:
        main = False
        message = "requests queued in the engine"
    if waiting:
        message += f"; up to {max(waiting):.0f} requests waited (waiting > 0 in {_pct(waiting_fraction)} of samples)"
    return _finding("saturation", "critical" if main else "warning", message, evidence)


def batch_limit(run: Run) -> Finding | None:
    running, waiting = run.window_values("bench:running"), run.window_values("bench:waiting")
    kv = run.window_values("bench:kv_usage_fraction")
    if not running or not waiting or not kv:
        return None
    cap = max(running)
    pressed = [(r, w) for r, w in zip(running, waiting) if w > 0]
    if cap < 1 or len(pressed) < max(2, WAITING_SAMPLES_FRACTION * len(waiting)):
        return None
    at_cap = sum(r >= cap for r, _ in pressed) / len(pressed)
    if at_cap < 0.8 or max(kv) >= KV_USAGE_LOW:
        return None
    return _finding(
        "batch_limit",
        "warning",
        f"concurrency is capped by the batch limit, not by memory: {cap:.0f} running while up to "
        f"{max(w for _, w in pressed):.0f} waited, KV cache at most {_pct(max(kv))} used "
        f"(raise max_num_seqs / the token budget)",
        {"running_max": cap, "at_cap_when_waiting": at_cap, "kv_usage_max": max(kv)},
    )


def kv_pressure(run: Run) -> Finding | None:
    kv = run.window_values("bench:kv_usage_fraction")
    preemptions = run.counter_increase("bench:preemptions")
    preempted_requests = sum((r.server_timings or {}).get("preemptions", 0) > 0 for r in run.completed())
    preemptions = max(preemptions, float(preempted_requests))
    if (not kv or max(kv) < KV_USAGE_HIGH) and preemptions <= 0:
        return None
    parts = []
    if kv:
        parts.append(f"usage peaked at {_pct(max(kv))}")
    if preemptions > 0:
        parts.append(f"{preemptions:.0f} preemptions (requests recomputed)")
    return _finding(
        "kv_pressure",
        "critical" if preemptions > 0 else "warning",
        "KV-cache pressure: " + ", ".join(parts),
        {"kv_usage_max": max(kv, default=None), "preemptions": preemptions},
    )


def prefill_interference(run: Run) -> Finding | None:
    done = [r for r in run.completed() if len(r.token_times_s) > 1]
    if len(done) < 2:
        return None
    # every request's token gaps in one array, made by the same subtractions as a gap at a time (a tuple a gap cost
    # 8 CPU-s in a 100,000-request plan's 12.8 M); only the stalls become tuples (gap, its start, its end, request)
    times = flat([r.token_times_s for r in done])
    lengths = np.array([len(r.token_times_s) for r in done])
    firsts = np.cumsum(lengths) - lengths  # where each request's times start in `times`
    within = np.ones(len(times) - 1, dtype=bool)
    within[firsts[1:] - 1] = False  # not the step from one request's last time to the next one's first
    at = np.flatnonzero(within)
    gaps = times[at + 1] - times[at]
    median_gap = float(np.median(gaps))
    stall_s = max(STALL_TIMES_MEDIAN * median_gap, STALL_MIN_S)
    stalled = at[gaps >= stall_s]
    if not stalled.size:
        return None
    owner = np.searchsorted(firsts, stalled, side="right") - 1
    stalls = [
        (b - a, a, b, done[o].index)
        for a, b, o in zip(times[stalled].tolist(), times[stalled + 1].tolist(), owner.tolist())
    ]
    prompts = [r.prompt_tokens for r in done]
    long_tokens = LONG_PROMPT_TIMES_MEDIAN * float(np.median(prompts))
    long_first_tokens = [(r.token_times_s[0], r.index, r.prompt_tokens) for r in done if r.prompt_tokens >= long_tokens]
    # a stall is aligned when another request's long prompt finished prefilling during it
    aligned = [s for s in stalls if any(s[1] < t <= s[2] + median_gap and i != s[3] for t, i, _ in long_first_tokens)]
    fraction = len(aligned) / len(stalls)
    if fraction < STALL_ALIGNED_FRACTION:
        return None
    worst = max(g for g, *_ in stalls)
    longest = max(p for *_, p in long_first_tokens)
    return _finding(
        "prefill_interference",
        "critical",
        f"prefill interference: {len(stalls)} token gaps stalled {stall_s * 1e3:.0f} ms or more "
        f"(median gap {median_gap * 1e3:.0f} ms, worst {worst * 1e3:.0f} ms), {_pct(fraction)} of them "
        f"while a long prompt (up to {longest} tokens) was prefilled; chunked prefill bounds them",
        {
            "stalls": len(stalls),
            "aligned_fraction": fraction,
            "median_gap_ms": median_gap * 1e3,
            "worst_gap_ms": worst * 1e3,
            "long_prompt_tokens": long_tokens,
        },
    )


def head_of_line(run: Run) -> Finding | None:
    done = [r for r in run.completed() if "queue_ms" in (r.server_timings or {}) and r.token_times_s]
    if len(done) < 4:
        return None
    prompts = np.array([r.prompt_tokens for r in done])
    short_limit = float(np.percentile(prompts, 50))
    if prompts.max() < LONG_PROMPT_TIMES_MEDIAN * max(short_limit, 1):
        return None  # no long requests to wait for
    short = [r for r in done if r.prompt_tokens <= short_limit]
    ttft_ms = [request_latency(r).ttft_s * 1e3 for r in short]
    waited_ms = [r.server_timings["queue_ms"] for r in short]
    share = sum(waited_ms) / sum(ttft_ms) if sum(ttft_ms) > 0 else 0.0
    if share < HOL_QUEUE_SHARE:
        return None
    return _finding(
        "head_of_line",
        "warning",
        f"short requests wait for long ones: requests of <= {short_limit:.0f} prompt tokens spent "
        f"{_pct(share)} of their TTFT (mean {np.mean(ttft_ms):.0f} ms) queued behind longer ones",
        {
            "short_prompt_tokens_max": short_limit,
            "short_queue_share": share,
            "short_ttft_mean_ms": float(np.mean(ttft_ms)),
        },
    )


def decode_roofline(run: Run) -> Finding | None:
    roof = run.summary.roofline
    if roof is None:
        return None
    points = roof.points or {}
    point = points.get("decode") or points.get("all steps")
    if not point and roof.hardware:  # a GPU's counters, without the engine's bytes and FLOPs
        return _finding("decode_bound", "info", roof.hardware.line, roof.hardware.model_dump())
    if not point or not roof.line:
        return None
    overhead = point.bound == "memory" and point.bandwidth_fraction < LOW_BANDWIDTH_FRACTION
    message = roof.line
    if overhead:
        message += (
            "; far below the bandwidth ceiling: per-step overhead or small batches, not the hardware, set the pace"
        )
    elif point.bound == "memory":
        message += ": low compute use is expected here, more concurrency raises throughput"
    evidence = point.model_dump(
        include={"bandwidth_fraction", "compute_fraction", "intensity_flop_per_byte", "ridge_flop_per_byte", "bound"}
    )
    return _finding("decode_bound", "warning" if overhead else "info", message, evidence)


def prefix_cache_miss(run: Run) -> Finding | None:
    workload = ScenarioRecord.model_validate(run.scenario).workload
    if workload.kind != "shared_prefix" or not workload.prefix_tokens:
        return None
    # the mean prompt past the shared prefix
    suffix = (workload.input_tokens.mean or 0) if isinstance(workload.input_tokens, TokenCountRecord) else 0
    prefix = workload.prefix_tokens
    expected = prefix / (prefix + suffix)
    timed = [r.server_timings for r in run.completed() if "cache_n" in (r.server_timings or {})]
    if timed:
        # llama.cpp's prompt_n excludes the cached tokens (tools/server/server-task.cpp: n_prompt_tokens_processed;
        # a live run showed cache_n 64 + prompt_n 16 for an 80-token prompt), and the native engine's follows it
        cached = sum(t["cache_n"] for t in timed)
        hit = cached / max(cached + sum(t.get("prompt_n", 0) for t in timed), 1)
        source = "the engine's per-request cache_n"
    else:
        window = run.summary.prefix_cache
        if not window:
            return None
        hit, source = window.hit_rate, "the engine's prefix-cache counters over the window"
    if hit >= PREFIX_HIT_FRACTION_OF_EXPECTED * expected:
        return None
    return _finding(
        "prefix_cache_miss",
        "warning",
        f"prefix cache misses: {_pct(hit)} of prompt tokens came from the cache on a shared-prefix "
        f"workload where {_pct(expected)} could ({prefix} shared of ~{prefix + suffix:.0f}); is prefix caching on, "
        f"and the shared prefix at least one KV block (vLLM's CPU build caches whole 128-token blocks)?",
        {"hit_fraction": hit, "expected_fraction": expected, "source": source},
    )


def prefix_cache_saving(run: Run) -> Finding | None:
    """What the prefix cache saved over the window, and the memory it kept for that: the blocks only the cache
    holds (prefixes no running request uses, which a cache-less engine would have free) and its evictions."""
    window = run.summary.prefix_cache
    blocks = run.window_values("bench:prefix_cache_blocks")
    if window is None or not window.hit_tokens or not blocks:
        return None
    evictions = run.counter_increase("bench:prefix_cache_evictions")
    return _finding(
        "prefix_cache_saving",
        "info",
        f"prefix cache saved {_pct(window.hit_rate)} of prefill ({window.hit_tokens:.0f} of "
        f"{window.queried_tokens:.0f} prompt tokens served from cache); its memory: up to {max(blocks):.0f} KV "
        f"blocks held by cached prefixes no running request used, {evictions:.0f} blocks evicted",
        {
            "hit_fraction": window.hit_rate,
            "saved_prefill_tokens": window.hit_tokens,
            "cached_blocks_max": max(blocks),
            "evicted_blocks": evictions,
        },
    )


def client_bound(run: Run) -> Finding | None:
    phases = run.summary.phases_ms
    share = phases.ttft_share if phases is not None and phases.ttft_share is not None else TtftShare()
    client = (share.client_lag or 0.0) + (share.connect_send or 0.0)
    reasons = run.summary.client_bound_reasons
    if not reasons and client < CLIENT_SHARE:
        return None
    if client >= CLIENT_SHARE:
        message = f"client-bound: the client's own lag and sends are {_pct(client)} of TTFT"
        severity = "critical"
    else:  # behind its schedule, but by little next to what the engine takes
        message = f"the client fell behind its schedule, but its lag and sends are only {_pct(client)} of TTFT"
        severity = "info"
    if reasons:
        message += " (" + "; ".join(reasons) + ")"
    return _finding("client_bound", severity, message, {"client_share_of_ttft": client, "reasons": reasons})


def token_count_mismatch(run: Run) -> Finding | None:
    mismatches = run.summary.token_count_mismatches
    if not mismatches:
        return None
    done = run.summary.requests.completed
    return _finding(
        "token_count_mismatch",
        "warning",
        f"token counts disagree in {mismatches} of {done} requests: the server's usage differs from "
        f"the chunks counted, so per-token latencies use the server's count",
        {"mismatches": mismatches, "completed": done},
    )


RULES = (
    saturation,
    batch_limit,
    kv_pressure,
    prefill_interference,
    head_of_line,
    decode_roofline,
    prefix_cache_miss,
    prefix_cache_saving,
    client_bound,
    token_count_mismatch,
)
SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


def diagnose(run: Run) -> list[Finding]:
    """Every rule's finding, most severe first."""
    found = [f for f in (rule(run) for rule in RULES) if f is not None]
    found.sort(key=lambda f: SEVERITY_ORDER[f.severity])
    return found
