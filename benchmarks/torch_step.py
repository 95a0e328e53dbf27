"""Time of one TorchModelRunner.forward step on the real model (lm_head included), in process, by dtype.

    flock /tmp/bench.lock python benchmarks/torch_step.py                     # batch 1, int4 and int8, 2 threads
    python benchmarks/torch_step.py --dtype int4 --batch 1 --batch 8 --batch 64 --threads 1
    python benchmarks/torch_step.py --dtype int4 --profile                         # where a batch-1 step goes
    python benchmarks/torch_step.py --dtype int4 --dtype int4-kernel --batch 4 --batch 8   # INT4_MAX_ROWS

Dtypes are interleaved step by step (one step of each in turn), so a load change on the shared machine
hits them alike: compare the figures of one run. Each batch is that many sequences decoding one token
at context --context (copies of one prefilled context). int4-kernel is int4 with every step through the
4-bit kernel (torch_int4.INT4_MAX_ROWS lifted): where it loses to int4's bf16 copy sets that threshold.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from native_engine import torch_int4
from native_engine.gguf_model import load_gguf
from native_engine.model_files import resolve_model
from native_engine.model_runner import SeqChunk

BLOCK = 16


def decode_steps(runner, batch: int, context: int, int4_max_rows: int | None = None):
    """A function running one decode step of `batch` sequences at position `context` (cache prefilled)."""
    per_seq = -(-(context + 1) // BLOCK)
    source = list(range(per_seq))
    prompt = np.random.default_rng(0).integers(100, 40000, context).tolist()
    runner.forward([SeqChunk(prompt, 0, source, False)])
    tables = [list(range((j + 1) * per_seq, (j + 2) * per_seq)) for j in range(batch)]
    for table in tables:
        runner.k_cache[:, table] = runner.k_cache[:, source]
        runner.v_cache[:, table] = runner.v_cache[:, source]
    chunks = [SeqChunk([1000 + j], context, table, True) for j, table in enumerate(tables)]

    def step():
        default, torch_int4.INT4_MAX_ROWS = torch_int4.INT4_MAX_ROWS, int4_max_rows or torch_int4.INT4_MAX_ROWS
        try:
            return runner.forward(chunks)
        finally:
            torch_int4.INT4_MAX_ROWS = default

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", action="append", help="int4, int8, bf16, fp32 (repeatable; default int4, int8)")
    parser.add_argument("--batch", type=int, action="append", help="sequences per step (repeatable; default 1)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's top ops of batch-1 steps")
    args = parser.parse_args()
    import torch

    from native_engine.torch_runner import TorchModelRunner

    dtypes, batches = args.dtype or ["int4", "int8"], args.batch or [1]
    config, weights = load_gguf(resolve_model("smollm2"))
    blocks = (max(batches) + 2) * -(-(args.context + 1) // BLOCK)
    runners = {
        d: TorchModelRunner(config, weights, blocks, BLOCK, dtype=d.split("-")[0], threads=args.threads) for d in dtypes
    }
    report = {"threads": args.threads, "context": args.context, "load_before": os.getloadavg()[0], "steps": {}}
    for batch in batches:
        steps = {
            d: decode_steps(runner, batch, args.context, 10**6 if d == "int4-kernel" else None)
            for d, runner in runners.items()
        }
        times = {d: [] for d in dtypes}
        for _ in range(3):
            for step in steps.values():
                step()
        for _ in range(args.steps):
            for d, step in steps.items():
                start = time.perf_counter()
                step()
                times[d].append(time.perf_counter() - start)
        for d in dtypes:
            report["steps"][f"{d} batch {batch}"] = {
                "median_ms": round(float(np.median(times[d])) * 1e3, 2),
                "best_ms": round(min(times[d]) * 1e3, 2),
            }
    report["load_after"] = os.getloadavg()[0]
    print(json.dumps(report, indent=1))
    if args.profile:
        step = decode_steps(runners[dtypes[0]], 1, args.context)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(20):
                step()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
