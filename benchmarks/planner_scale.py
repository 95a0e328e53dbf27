"""How fast `bench plan` simulates: a Mooncake-format trace of multi-turn sessions (`bench make-trace`'s
generator) over many replicas behind the cache_aware router, on one core.

Three parts, timed apart (CPU seconds of this process):
  plan        bench run's own request schedule (harness/scenario/workload.build_schedule: each trace row's prompt
              text, encoded once by the tokenizer to count it), per request: the first N and 2N rows timed, the
              difference/N;
  prompts     this script's stand-in for it over every row: the same word blocks per hash_id
              (harness/scenario/workload.hash_block_ids) and random word fill, made as token ids directly (word
              tokens re-encode to themselves, harness/scenario/prompts.py) with their text, before the simulation,
              as bench plan encodes every prompt before it simulates;
  simulation  every row through the simulator (harness/plan/simulator.run_simulation: the engine's Scheduler,
              BlockManager and router Policy on the virtual clock), then summarize and requests.jsonl: the
              figure the simulated requests per CPU-second are of.
The step model is a fitted-form model with the coefficients below (GPU-like step times; the rate of
simulation depends on them only through how many steps they make). Prints simulated requests per
CPU-second and microseconds per sequence-step (one sequence in one step's batch).
With --bench-plan, then bench plan's own path over the same scenario (harness/plan/simulator.simulate_scenario:
build_schedule with the tokenizer, the prompts' ids from the encodings it made, the simulation, the summary, the
diagnosis and the results folder), timed apart: what `bench plan` of this trace costs end to end.

  PYTHONPATH=. python benchmarks/planner_scale.py [--requests 100000] [--replicas 100] [--profile] [--no-fast-forward]
      [--bench-plan | --only-bench-plan] [--plan-out DIR]

--only-bench-plan times bench plan's path alone (with --profile, its top functions); --plan-out keeps its results
folder (to compare requests.jsonl and summary.json before and after a change).

Measured 2026-12-02 alone on the machine (load average 1.1-1.6): 100,000 requests over 100 replicas in 56.7
CPU-s (56.7 s wall; simulation and requests.jsonl 49.7, summary 6.9): 1,765 simulated requests per CPU-second,
98% of 9.67 M engine steps fast-forwarded (harness/plan/decode_run.py), 3.9 us a sequence-step, peak memory
4.5 GiB; the prompts 20.4 CPU-s more. Before (load 2.3-3.9): 172 CPU-s, 581 a CPU-second. What limits it is
per request (docs/planner.md, Speed). Fast-forward against --no-fast-forward (the earlier tree), 10,000
requests over 10 replicas: 19.7 against 20.4 CPU-s at 1 request/s a replica, 12.6 against 15.5 at 10.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import os
import pstats
import resource
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

from harness.metrics.latencies import summarize
from harness.plan.deployment import deployment_from_args
from harness.plan.simulator import Simulation, run_simulation, simulate_scenario
from harness.plan.step_model import FittedStepModel
from harness.results.folder import ResultWriter
from harness.scenario.arrivals import trace_offsets_s
from harness.scenario.chat_trace import SessionTraceConfig, write_session_trace
from harness.scenario.prompts import prompt_builder
from harness.scenario.scenario import load_scenario
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.traces import load_trace
from harness.scenario.workload import RequestSpec, build_schedule, hash_block_ids

TURNS = 4
BLOCK_TOKENS = 32
# 6 ms a step, 20 us a prompt token, 50 us a decoding sequence, 5 ns a KV position read
GPU_LIKE = FittedStepModel(
    {
        "intercept_s": 6e-3,
        "per_prefill_token_s": 2e-5,
        "per_prefill_seq_s": 0.0,
        "per_decode_seq_s": 5e-5,
        "per_context_token_s": 5e-9,
    },
    0.0,
    0.0,
    {},
    [],
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--rate-per-replica", type=float, default=1.0, help="requests/s each replica gets on average")
    ap.add_argument("--plan-sample", type=int, default=500, help="rows whose plan building is timed")
    ap.add_argument("--profile", action="store_true", help="print the simulation's top functions")
    ap.add_argument("--no-fast-forward", action="store_true", help="every step one event (harness/plan/decode_run.py)")
    ap.add_argument("--bench-plan", action="store_true", help="then time bench plan's own path (simulate_scenario)")
    ap.add_argument("--only-bench-plan", action="store_true", help="time bench plan's own path alone")
    ap.add_argument("--plan-out", type=Path, help="bench plan's results folder (default: a temporary one)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="planner-scale-"))
    sessions = args.requests // TURNS
    gap_s = TURNS / (args.rate_per_replica * args.replicas)  # each session brings TURNS requests
    config = SessionTraceConfig(
        sessions=sessions,
        turns=TURNS,
        block_tokens=BLOCK_TOKENS,
        system_blocks=2,
        user_blocks=(2, 6),
        output_tokens=(64, 192),
        session_gap_s=gap_s,
        think_time_s=(5.0, 15.0),
        seed=0,
    )
    rows = write_session_trace(config, tmp / "trace.jsonl")
    spec = {
        "name": "scale",
        "backend": {
            "kind": "native",
            "model": "smollm2",
            "launch": {
                "args": [
                    "--data-parallel",
                    str(args.replicas),
                    "--router-policy",
                    "cache_aware",
                    "--max-num-batched-tokens",
                    "2048",
                    "--max-num-seqs",
                    "128",
                    "--kv-cache-tokens",
                    "262144",
                ]
            },
        },
        "workload": {"kind": "random", "ignore_eos": True},
        "load": {"arrival": "trace", "trace": str(tmp / "trace.jsonl"), "trace_block_size": BLOCK_TOKENS},
        "plan": {"step_model": "roofline"},
        "seed": 0,
    }
    (tmp / "scale.yaml").write_text(yaml.safe_dump(spec))
    scenario = load_scenario(tmp / "scale.yaml")
    mean_in = sum(r["input_length"] for r in rows) / len(rows)
    mean_out = sum(r["output_length"] for r in rows) / len(rows)
    print(
        f"{len(rows)} requests, prompts {mean_in:.0f} tokens and answers {mean_out:.0f} on average, "
        f"{args.replicas} replicas, cache_aware; load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    if args.only_bench_plan:
        time_bench_plan(scenario, args.plan_out or tmp / "plan", args.profile)
        return
    tokenizer = LocalTokenizer("smollm2")
    # the trace file is read whole by every build_schedule: time two sample sizes, the difference is per request
    times = []
    for n in (args.plan_sample, 2 * args.plan_sample):
        sample = scenario.model_copy(update={"load": scenario.load.model_copy(update={"num_requests": n})})
        start = time.process_time()
        build_schedule(sample, tokenizer)
        times.append(time.process_time() - start)
    plan_s = (times[1] - times[0]) / args.plan_sample
    print(
        f"plan: {1e3 * plan_s:.2f} CPU-ms a request past reading the trace ({times[0]:.1f} CPU-s for "
        f"{args.plan_sample}), so about {plan_s * len(rows):.0f} CPU-s for all {len(rows)}",
        flush=True,
    )

    start = time.process_time()
    requests, prompts = trace_requests(scenario, tokenizer)
    prompts_s = time.process_time() - start
    print(
        f"prompts: {prompts_s:.1f} CPU-s for every row's token ids and text (plan building: bench plan makes "
        f"them before it simulates), {1e3 * prompts_s / len(rows):.2f} CPU-ms a request",
        flush=True,
    )
    deployment = deployment_from_args(scenario.backend.launch.args, "smollm2")
    sim = Simulation(deployment, GPU_LIKE, keep_steps=False, fast_forward=not args.no_fast_forward)
    records = []
    writer = ResultWriter(tmp / "out")
    profile = cProfile.Profile() if args.profile else None
    start, wall_start = time.process_time(), time.perf_counter()
    if profile:
        profile.enable()
    run_simulation(sim, requests, prompts, None, lambda rec: (records.append(rec), writer.append(rec)))
    simulated = time.process_time()
    summary = summarize(records)
    if profile:
        profile.disable()
    end, wall_s = time.process_time(), time.perf_counter() - wall_start
    writer.close()
    sim_s, summary_s = simulated - start, end - simulated
    print(
        f"simulation and requests.jsonl {sim_s:.1f} CPU-s, summary {summary_s:.1f} CPU-s: {sim_s + summary_s:.1f} "
        f"CPU-s ({wall_s:.1f} s of wall clock); load average {os.getloadavg()[0]:.1f}; peak memory "
        f"{peak_rss_gib():.1f} GiB"
    )
    print(
        f"{len(rows) / (sim_s + summary_s):,.0f} simulated requests per CPU-second, {sim.sequence_steps:,} "
        f"sequence-steps in {sim.engine_steps:,} engine steps ({sim.fast_forwarded_steps / sim.engine_steps:.0%} "
        f"fast-forwarded), {1e6 * sim_s / sim.sequence_steps:.2f} us per sequence-step"
    )
    print(
        f"simulated: {summary.requests.completed} completed, TTFT p50 {summary.ttft_ms.p50:.0f} ms, "
        f"TPOT p50 {summary.tpot_ms.p50:.1f} ms, {summary.throughput.output_tokens_per_s:.0f} output tok/s"
    )
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
    if args.bench_plan:
        time_bench_plan(scenario, args.plan_out or tmp / "plan")


def time_bench_plan(scenario, out_dir: Path, profiled: bool = False) -> None:
    """bench plan's own path over the scenario (simulate_scenario), with this benchmark's step model."""
    profile = cProfile.Profile() if profiled else None
    start, wall_start = time.process_time(), time.perf_counter()
    if profile:
        profile.enable()
    summary = simulate_scenario(scenario, out_dir, overwrite=True, step_model=GPU_LIKE)
    if profile:
        profile.disable()
    total_s, wall_s, cpu = time.process_time() - start, time.perf_counter() - wall_start, summary.plan.cpu_s
    print(
        f"bench plan's path: {total_s:.1f} CPU-s ({wall_s:.1f} s of wall clock): plan building and prompt ids "
        f"{cpu.plan:.1f}, simulation and requests.jsonl {cpu.simulation:.1f}, the rest (summary, diagnosis, "
        f"run folder) {total_s - cpu.plan - cpu.simulation:.1f}; {summary.requests.completed} completed; load "
        f"average {os.getloadavg()[0]:.1f}; peak memory {peak_rss_gib():.1f} GiB"
    )
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(30)


def peak_rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB on Linux


class TracePrompts:
    """Each trace row's prompt as token ids, made once before the simulation (as bench plan encodes every
    prompt before it simulates), kept as int32 arrays (~2.4 KB a request) and listed when its request arrives."""

    def __init__(self, scenario, tokenizer, rows):
        self.rows, self.seed, self.block_size = rows, scenario.seed, scenario.load.trace_block_size
        self.tokenizer, self.builder = tokenizer, prompt_builder(tokenizer)
        self.special = tokenizer.encode(self.builder.text_of(self.builder.word_ids[:1]))[: tokenizer.added_tokens]
        self.ids: list[np.ndarray] = []

    # A session's turns repeat its earlier blocks and every prompt starts with the system blocks, so the blocks of
    # the sessions in flight are kept with their text (rows come in time order: ~60 MB at this size): drawing a
    # block's words is cheap now (a counter hash, harness/scenario/workload.hash_blocks_ids), its text is not.
    @functools.lru_cache(maxsize=1 << 17)  # noqa: B019 (one instance a run; the cache goes with it)
    def block(self, hash_id: int) -> tuple[np.ndarray, str]:
        words = hash_block_ids(self.tokenizer, self.seed, hash_id, self.block_size)
        return words, self.builder.text_of(words)

    def add(self, i: int) -> str:
        """Makes row i's token ids; returns its text (its word tokens' text: what the router matches)."""
        row = self.rows[i]
        body = max(row.input_tokens, 1) - len(self.special)
        parts, texts, n = [np.array(self.special, dtype=np.int64)], [], 0
        for h in row.hash_ids or ():
            words, text = self.block(h)
            if n + len(words) > body:  # the blocks are cut where the prompt ends
                words, text = words[: body - n], self.builder.text_of(words[: body - n])
            parts.append(words)
            texts.append(text)
            n += len(words)
            if n == body:
                break
        if body > n:
            fill = np.random.default_rng([self.seed, 2, i]).choice(self.builder.word_ids, size=body - n)
            parts.append(fill)
            texts.append(self.builder.text_of(fill))
        self.ids.append(np.concatenate(parts).astype(np.int32))
        return "".join(texts)

    def __getitem__(self, i: int) -> list[int]:
        return self.ids[i].tolist()


def trace_requests(scenario, tokenizer) -> tuple[list[RequestSpec], TracePrompts]:
    rows = load_trace(scenario.load.trace)
    offsets = trace_offsets_s([row.timestamp_s for row in rows], scenario.load.time_scale)
    prompts = TracePrompts(scenario, tokenizer, rows)
    requests = [
        RequestSpec(i, prompts.add(i), None, row.input_tokens, max(row.output_tokens, 1), float(offsets[i]))
        for i, row in enumerate(rows)
    ]
    return requests, prompts


if __name__ == "__main__":
    main()
