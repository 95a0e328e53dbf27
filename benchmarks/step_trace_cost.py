"""What the native engine's step trace (--step-trace) costs: step time with it on against off.

Two engines share one loaded SmolLM2 and run the same batch of prompts, in turns (on, off, off,
on, ...) so a machine shared with other work slows both alike; the ratio of their median step
times is the cost. On a busy machine that ratio is noisy, so the trace's own work per step (the
record of a decode step of the batch) is also timed alone and set against the median step.
Prints the load average, since the machine is shared.

    python benchmarks/step_trace_cost.py [--rounds 4] [--prompts 4] [--output-tokens 16]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import timeit

import numpy as np

from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.sequence import SamplingParams
from native_engine.step_trace import StepRecord


def step_times(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> list[float]:
    for i, prompt in enumerate(prompts):
        engine.add_request(f"r{time.perf_counter_ns()}-{i}", prompt, params)
    times = []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--prompt-tokens", type=int, default=16)
    parser.add_argument("--output-tokens", type=int, default=16)
    args = parser.parse_args()
    loaded = LoadedModel.load("smollm2")
    engines = {on: LLMEngine(EngineConfig(step_trace=on), loaded) for on in (True, False)}
    rng = np.random.default_rng(0)
    prompts = [rng.integers(100, 10000, args.prompt_tokens).tolist() for _ in range(args.prompts)]
    params = SamplingParams(max_tokens=args.output_tokens, temperature=0.0, ignore_eos=True)
    step_times(engines[False], prompts[:1], params)  # warm both up
    step_times(engines[True], prompts[:1], params)
    medians = {True: [], False: []}
    for k in range(args.rounds):
        order = (True, False) if k % 2 == 0 else (False, True)
        for on in order:
            medians[on].append(statistics.median(step_times(engines[on], prompts, params)))
        print(f"round {k + 1}: on {medians[True][-1] * 1e3:.1f} ms, off {medians[False][-1] * 1e3:.1f} ms", flush=True)
    on, off = statistics.median(medians[True]), statistics.median(medians[False])
    trace = engines[True].step_trace
    step = StepRecord(
        start_ns=time.perf_counter_ns(),
        end_ns=time.perf_counter_ns(),
        forward_ns=1,
        prefill_chunks=[],
        decode_seqs=args.prompts,
        kv_blocks_used=40,
        preemptions=0,
        prefix_hit_tokens=0,
        bytes_read=5e8,
        flops=1e9,
        running=args.prompts,
        waiting=0,
        kv_positions_read=0,
        prefill_starts=[],
    )
    n = 20000
    record_s = min(timeit.repeat(lambda: trace.record(step), number=n, repeat=5)) / n
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.rounds} rounds of "
        f"{args.prompts} prompts x {args.output_tokens} tokens"
    )
    print(f"median step: trace on {on * 1e3:.2f} ms, off {off * 1e3:.2f} ms; on/off = {on / off:.3f}")
    print(f"one step's record alone: {record_s * 1e6:.2f} us = {record_s / off:.1e} of the median step")


if __name__ == "__main__":
    main()
