"""How fast `bench plan` simulates: a Mooncake-format trace of multi-turn sessions (`bench make-trace`'s
generator) over many replicas behind the cache_aware router, on one core.

Times, separately, building the plan (bench run's own harness/workload.py: prompt text per trace row,
encoded once to count it) and the simulation (the engine's Scheduler, BlockManager and router Policy
on the virtual clock, through simulate_scenario). The step model is a fitted-form model with the
coefficients below (GPU-like step times; the rate of simulation does not depend on their values
beyond how many steps they make). Prints simulated requests per second and microseconds per
simulated sequence-step (one sequence in one step's batch).

  PYTHONPATH=. python benchmarks/planner_scale.py [--requests 100000] [--replicas 100] [--profile]
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import time
from pathlib import Path

import yaml

from harness.plan.simulator import simulate_scenario
from harness.plan.step_model import FittedStepModel
from harness.scenario import load_scenario
from harness.session_trace import SessionTraceConfig, write_session_trace

TURNS = 4
# 6 ms a step, 20 us a prompt token, 50 us a decoding sequence, 5 ns a KV position read
GPU_LIKE = FittedStepModel({"intercept_s": 6e-3, "per_prefill_token_s": 2e-5, "per_prefill_seq_s": 0.0,
                            "per_decode_seq_s": 5e-5, "per_context_token_s": 5e-9}, 0.0, 0.0, {}, [])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--replicas", type=int, default=100)
    ap.add_argument("--rate-per-replica", type=float, default=1.0, help="requests/s each replica gets on average")
    ap.add_argument("--profile", action="store_true", help="print the simulation's top functions")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="planner-scale-"))
    sessions = args.requests // TURNS
    # sessions start rate / TURNS per second: each brings TURNS requests
    gap_s = TURNS / (args.rate_per_replica * args.replicas)
    config = SessionTraceConfig(sessions=sessions, turns=TURNS, block_tokens=32, system_blocks=2,
                                user_blocks=(2, 6), output_tokens=(64, 192), session_gap_s=gap_s,
                                think_time_s=(5.0, 15.0), seed=0)
    rows = write_session_trace(config, tmp / "trace.jsonl")
    spec = {"name": "scale", "backend": {"kind": "native", "model": "smollm2", "launch": {"args": [
        "--data-parallel", str(args.replicas), "--router-policy", "cache_aware",
        "--max-num-batched-tokens", "2048", "--max-num-seqs", "128", "--kv-cache-tokens", "262144"]}},
        "workload": {"kind": "random", "ignore_eos": True},
        "load": {"arrival": "trace", "trace": str(tmp / "trace.jsonl"), "trace_block_size": 32},
        "plan": {"step_model": "roofline"}, "seed": 0}
    (tmp / "scale.yaml").write_text(yaml.safe_dump(spec))
    scenario = load_scenario(tmp / "scale.yaml")
    mean_in = sum(r["input_length"] for r in rows) / len(rows)
    mean_out = sum(r["output_length"] for r in rows) / len(rows)
    print(f"{len(rows)} requests, prompts {mean_in:.0f} tokens and answers {mean_out:.0f} on average, "
          f"{args.replicas} replicas, cache_aware; load average {os.getloadavg()[0]:.1f}", flush=True)
    profile = cProfile.Profile() if args.profile else None
    start_wall = time.perf_counter()
    if profile:
        profile.enable()
    summary = simulate_scenario(scenario, tmp / "out", step_model=GPU_LIKE)
    if profile:
        profile.disable()
    wall_s = time.perf_counter() - start_wall
    plan_cpu_s, sim_cpu_s = summary["plan"]["cpu_s"]["plan"], summary["plan"]["cpu_s"]["simulation"]
    print(f"plan (prompts built and encoded): {plan_cpu_s:.1f} CPU-s; simulation and summary: {sim_cpu_s:.1f} CPU-s; "
          f"wall {wall_s:.1f} s; load average {os.getloadavg()[0]:.1f}")
    seq_steps = summary["plan"]["sequence_steps"]
    print(f"{len(rows) / sim_cpu_s:,.0f} simulated requests per CPU-second, {seq_steps:,} sequence-steps in "
          f"{summary['plan']['engine_steps']:,} engine steps, {1e6 * sim_cpu_s / seq_steps:.2f} us per sequence-step")
    print(f"simulated: {summary['requests']['completed']} completed, TTFT p50 {summary['ttft_ms']['p50']:.0f} ms, "
          f"TPOT p50 {summary['tpot_ms']['p50']:.1f} ms, {summary['throughput']['output_tokens_per_s']:.0f} "
          f"output tok/s")
    if profile:
        pstats.Stats(profile).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
