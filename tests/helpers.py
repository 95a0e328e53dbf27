"""Helpers shared by several test modules (a test module never imports another test module)."""

from __future__ import annotations

import json
import math
import time

import numpy as np

from harness.metrics.latencies import summarize
from harness.metrics.validity import run_validity
from harness.results.folder import RequestRecord, ResultWriter
from harness.results.schema import Backend, Host, RunInfo, Summary
from native_engine.model_runner import ModelRunner, SeqChunk
from native_engine.sequence import SamplingParams, Sequence

# ---- near ties: what batch-invariant output guarantees -------------------------------------------------

# What "the same output alone, batched, chunked, cached or preempted" really guarantees on any CPU.
# A step's shape picks the BLAS kernel (a matrix-vector product for one row, blocked gemm for many, and
# OpenBLAS's Haswell, Zen and SkylakeX kernels each sum in their own order), so the same token's logits
# differ in their last bits between shapes: up to 5.2e-5 on SmolLM2, 1.4e-5 on the tiny model
# (`python benchmarks/logit_noise.py`, the same under OPENBLAS_CORETYPE=Haswell and SkylakeX; docs/engine.md).
# Where the two best choices are closer than that, either may win. So tokens must be equal up to the first
# position where the decision was a near tie, and the tie is checked: a real divergence still fails.
NEAR_TIE_LOGIT_GAP = 1e-3  # greedy: top-1 minus top-2 logit, ~20x the largest shape-to-shape difference seen
NEAR_TIE_CDF_SHARE = 1e-4  # seeded sampling: the draw's distance from the two tokens' shared CDF edge, of the mass


def assert_same_tokens_up_to_near_tie(loaded, prompt: list[int], params, got: list[int], expected: list[int]):
    """got == expected, or they part at a position whose decision (from `expected`'s own logits there, one
    sequence alone) was a near tie between exactly the two tokens they chose. Returns where they parted
    (None: equal). params: the request's SamplingParams, greedy or plain temperature sampling with a seed."""
    if got == expected:
        return None
    position = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    assert position is not None, f"one output is a prefix of the other: {len(got)} vs {len(expected)} tokens"
    logits = _logits_after(loaded, prompt + expected[:position]).astype(np.float64)
    pair = (got[position], expected[position])
    if params.temperature == 0.0:
        _assert_greedy_tie(logits, pair, position)
    else:
        _assert_sampled_tie(logits, pair, position, params)
    return position


def _assert_greedy_tie(logits: np.ndarray, pair: tuple[int, int], position: int):
    top2 = np.argsort(-logits)[:2]
    gap = logits[top2[0]] - logits[top2[1]]
    assert set(pair) == set(top2.tolist()) and gap < NEAR_TIE_LOGIT_GAP, (
        f"greedy tokens part at output {position} ({pair[0]} vs {pair[1]}) where the best two are {top2.tolist()} "
        f"with a logit gap of {gap:.2e}, not a near tie (< {NEAR_TIE_LOGIT_GAP}): a real divergence"
    )


def _assert_sampled_tie(logits: np.ndarray, pair: tuple[int, int], position: int, params):
    assert (params.top_k, params.top_p, params.min_p) in ((0, 1.0, 0.0), (-1, 1.0, 0.0)), (
        "near ties are worked out for plain temperature sampling only: set no top_k, top_p or min_p"
    )
    rng = np.random.default_rng(params.seed)
    u = [rng.random() for _ in range(position + 1)][position]  # one draw per output token
    scaled = logits / params.temperature
    cdf = np.cumsum(np.exp(scaled - scaled.max()))
    low, high = sorted(pair)
    edge = cdf[low]  # where `low`'s share ends and, with nothing between them, `high`'s begins
    share = abs(u * cdf[-1] - edge) / cdf[-1]
    assert math.isclose(cdf[high - 1], edge) and share < NEAR_TIE_CDF_SHARE, (
        f"sampled tokens part at output {position} ({pair[0]} vs {pair[1]}) where the draw lies {share:.2e} of the "
        f"mass from their edge, not a near tie (< {NEAR_TIE_CDF_SHARE}): a real divergence"
    )


def _logits_after(loaded, token_ids: list[int]) -> np.ndarray:
    """Next-token logits after token_ids, one sequence in one prefill chunk."""
    block_size = 16
    n_blocks = -(-len(token_ids) // block_size)
    runner = ModelRunner(loaded.config, loaded.weights, num_kv_blocks=n_blocks, kv_block_size=block_size)
    chunk = SeqChunk(token_ids, start_pos=0, block_table=list(range(n_blocks)), need_logits=True)
    return runner.forward([chunk])[0]


# ---- results folders as `bench run` leaves them (report, gate, history, select) ------------------------------
def synthetic_records(
    n=60, rate=4.0, ttft_s=0.05, itl_s=0.01, tokens=16, seed=0, ttft_sigma=0.2, fail_every=0, slow_from=None
):
    """Requests sent at `rate`/s with lognormal TTFTs around ttft_s and steady ITLs; `slow_from`: index after
    which TTFT doubles (a server that fell behind)."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        send = i / rate
        ttft = ttft_s * rng.lognormal(0, ttft_sigma) * (2 if slow_from is not None and i >= slow_from else 1)
        rec = RequestRecord(index=i, intended_send_s=send, actual_send_s=send + 1e-4, prompt_tokens=32)
        if fail_every and i % fail_every == fail_every - 1:
            rec.fail("http_5xx", "HTTP 500")
            rec.end_s = send + 0.01
        else:
            gaps = itl_s * rng.lognormal(0, 0.1, tokens - 1)
            rec.token_times_s = list(send + ttft + np.concatenate([[0], np.cumsum(gaps)]))
            rec.tokens_per_chunk = [1] * tokens
            rec.output_tokens = rec.output_tokens_counted = tokens
            rec.end_s = rec.token_times_s[-1] + 1e-4
            rec.finish_reason = "length"
        records.append(rec)
    return records


def write_run(
    path,
    records,
    slo=None,
    rate=4.0,
    kind="native",
    server_metrics=False,
    telemetry=False,
    explain=False,
    verdict=False,
):
    """A results folder as `bench run` leaves it; `explain`: with the native engine's per-request
    timings, phases_ms and diagnosis in summary.json, and an engine_trace.json; `verdict`: with its
    validity (harness/metrics/validity.py), as `bench run` writes it."""
    slo = slo or {"ttft_ms": 200.0, "tpot_ms": 50.0}
    writer = ResultWriter(path)
    writer.write_run_info(
        RunInfo(
            scenario={
                "name": "synthetic",
                "backend": {"kind": kind, "url": "http://127.0.0.1:1"},
                "load": {"arrival": "constant", "rate": rate},
                "slo": slo,
            },
            versions={"harness": "0.1.0"},
            host=Host(hostname="test", platform="Linux-test", cpu_count=2, machine="x86_64"),
            backend=Backend(kind=kind, model="smollm2"),
            token_count_method="local_tokenizer",
            tokenizer="smollm2",
            time_unit="seconds from t0 (perf_counter_ns)",
        )
    )
    for r in records:
        if explain and r.ok:
            ttft_ms = (r.token_times_s[0] - r.intended_send_s) * 1e3
            r.server_timings = {
                "queue_ms": 0.6 * ttft_ms,
                "prefill_ms": 0.3 * ttft_ms,
                "decode_ms": 40.0,
                "cache_n": 0,
                "prompt_n": r.prompt_tokens,
                "preemptions": 0,
            }
        writer.append(r)
    writer.close()
    summary = Summary(
        **dict(summarize(records, slo)),
        client_bound=False,
        client_bound_reasons=[],
        interrupted=False,
        incomplete=False,
        incomplete_reasons=[],
        lost_workers=[],
    )
    if verdict:
        summary.validity = run_validity(summary)
    if explain:
        from harness.engine.step_trace import write_engine_trace
        from harness.metrics.diagnosis import Run, diagnose
        from harness.metrics.phases import phases

        summary.phases_ms = phases(records)
        summary.diagnosis = diagnose(Run(summary, records))
        steps = [
            {
                "t_s": 0.03 * k,
                "dur_s": 0.025,
                "forward_s": 0.02,
                "prefill_tokens": 64 if k % 10 == 0 else 0,
                "prefill_chunks": [64] if k % 10 == 0 else [],
                "decode_seqs": 1 + k % 4,
                "kv_blocks_used": 10 + k % 7,
                "preemptions": 0,
                "prefix_hit_tokens": 16 if k % 10 == 0 else 0,
                "bytes_read": 5e8,
                "flops": 1e9,
                "running": 1 + k % 4,
                "waiting": k % 3,
            }
            for k in range(200)
        ]
        write_engine_trace(path / "engine_trace.json", steps)
    writer.write_summary(summary)
    end = max(r.end_s for r in records)
    if server_metrics:
        times = np.arange(0, end, 0.5)
        rows = ["t_s,name,value,labels"] + [
            f"{t:.2f},vllm:num_requests_running,{int(3 + 2 * np.sin(t))},model=smollm2" for t in times
        ]
        rows += [f"{t:.2f},vllm:kv_cache_usage_perc,{min(1, t / end):.3f},model=smollm2" for t in times]
        # counters: 3 of every 4 prefix-cache queries hit; a histogram that the report leaves out
        rows += [f"{t:.2f},vllm:prefix_cache_queries_total,{8 * k},model=smollm2" for k, t in enumerate(times)]
        rows += [f"{t:.2f},vllm:prefix_cache_hits_total,{6 * k},model=smollm2" for k, t in enumerate(times)]
        rows += [f"{t:.2f},vllm:e2e_request_latency_seconds_bucket,{k},le=1.0" for k, t in enumerate(times)]
        (path / "server_metrics.csv").write_text("\n".join(rows) + "\n")
    if telemetry:
        # as harness/engine/telemetry writes it: host counters, the engine's byte counters and their rate
        rows = ["t_s,source,name,value"] + [
            f"{t:.2f},engine_process,cpu_percent,{150 + 30 * np.cos(t):.1f}" for t in np.arange(0, end, 0.5)
        ]
        rows += [f"{t:.2f},engine_metrics,native:weight_bytes_read_total,{1e9 * t:.0f}" for t in np.arange(0, end, 0.5)]
        rows += [f"{t:.2f},engine_metrics,read_bytes_per_s,{1e9:.0f}" for t in np.arange(0, end, 0.5)]
        rows += [f"{t:.2f},host,memory_used_bytes,{2e9 + 1e6 * t:.0f}" for t in np.arange(0, end, 0.5)]
        (path / "telemetry.csv").write_text("\n".join(rows) + "\n")
    return path


def write_sweep(root, rates=(1, 2, 4, 8), capacity_rps=5.0, seed=0):
    """A sweep folder whose TTFT grows past the SLO once the rate passes `capacity_rps`."""
    for i, rate in enumerate(rates):
        over = max(0.0, rate - capacity_rps)
        records = synthetic_records(n=40, rate=rate, ttft_s=0.05 + 0.2 * over, seed=seed + i, ttft_sigma=0.3)
        write_run(root / f"point-{i:03d}-rate-{rate:g}", records, rate=rate)
    return root


# ---- an engine or router on 127.0.0.1 (router, disaggregation) -----------------------------------------------
async def post(http, url, payload):
    async with http.post(url, json=payload) as resp:
        if resp.headers.get("Content-Type", "").startswith("text/event-stream"):
            return resp.status, [line[6:] for line in (await resp.text()).split("\n\n") if line]
        return resp.status, await resp.json()


def streamed_text(events):
    chunks = [json.loads(e) for e in events if e != "[DONE]"]
    return "".join(
        c["choices"][0].get("text") or c["choices"][0].get("delta", {}).get("content") or ""
        for c in chunks
        if c.get("choices")
    )


async def metric(http, url, name, **labels):
    async with http.get(url + "/metrics") as resp:
        text = await resp.text()
    want = [f'{k}="{v}"' for k, v in labels.items()]
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith((name + "{", name + " ")) and all(w in line for w in want)
    )


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_gone(pids, timeout_s=30.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


# ---- the block manager as the engine drives it (block manager, radix cache) ----------------------------------
def make_seq(tokens, request_id="r"):
    return Sequence(request_id, list(tokens), SamplingParams(max_tokens=4))


def run_prefill(bm, seq):
    """Allocate with any prefix hit, then mark every token computed, as the engine does."""
    cached = bm.find_cached_prefix(seq)
    assert bm.allocate(seq, seq.num_tokens - len(cached) * bm.block_size, cached)
    seq.num_computed_tokens = seq.num_tokens
    bm.cache_computed_blocks(seq)
    return cached
