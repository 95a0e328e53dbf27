"""Decode speed of native_engine's runner (numpy or torch) on the real model, next to the memory-bandwidth roofline.

    python benchmarks/model_speed.py                 # single stream at context 128, batches of 8, 32 and 64 at 256
    python benchmarks/model_speed.py --batch 8 --batch 16 --steps 8
    python benchmarks/model_speed.py --runtime torch --dtype int8 --blas-threads 1   # the torch runtime

Single stream: a decode step reads every weight once, so its ceiling is
measured read bandwidth / bytes read per step. Batched: one step advances every sequence by one token.
Wall-clock figures suffer when other processes share the cores; the CPU-time figures (process time,
all threads) are steadier: with --blas-threads 1 they approximate an idle core.
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

from native_engine.blas import measure_read_bandwidth_gbs, set_blas_threads
from native_engine.gguf_model import load_gguf
from native_engine.model_files import resolve_model
from native_engine.model_runner import SeqChunk
from native_engine.runtime import make_runner

BLOCK = 16


def blocks(n_tokens: int) -> int:
    return -(-n_tokens // BLOCK)


def single_stream(runner, context: int, steps: int) -> dict:
    rng = np.random.default_rng(0)
    prompt = rng.integers(100, 40000, context).tolist()
    table = list(range(blocks(context + steps + 1)))
    logits = runner.forward([SeqChunk(prompt, 0, table, True)])
    token, step_s, cpu_s = int(np.argmax(logits[0])), [], []
    for pos in range(context, context + steps):
        start, start_cpu = time.perf_counter(), time.process_time()
        token = int(np.argmax(runner.forward([SeqChunk([token], pos, table, True)])[0]))
        step_s.append(time.perf_counter() - start)
        cpu_s.append(time.process_time() - start_cpu)
    median_s = float(np.median(step_s))
    return {
        "context": context,
        "steps": steps,
        "median_step_ms": round(median_s * 1e3, 2),
        "best_step_ms": round(min(step_s) * 1e3, 2),
        "tok_per_s": round(1 / median_s, 2),
        "median_step_cpu_ms": round(float(np.median(cpu_s)) * 1e3, 2),
        "bytes_per_step": runner.last_step_bytes_read,
    }


def batched(runner, batch: int, context: int, steps: int) -> dict:
    """Every sequence holds its own copy of one prefilled context (prefilling each would take minutes)."""
    rng = np.random.default_rng(1)
    prompt = rng.integers(100, 40000, context).tolist()
    per_seq = blocks(context + steps + 1)
    if (batch + 1) * per_seq > runner.num_kv_blocks:
        raise ValueError(f"--kv-blocks must be at least {(batch + 1) * per_seq} for batch {batch}")
    source = list(range(per_seq))
    runner.forward([SeqChunk(prompt, 0, source, False)])
    tables = [list(range((j + 1) * per_seq, (j + 2) * per_seq)) for j in range(batch)]
    for table in tables:
        runner.k_cache[:, table] = runner.k_cache[:, source]
        runner.v_cache[:, table] = runner.v_cache[:, source]
    tokens = rng.integers(100, 40000, batch).tolist()
    step_s, cpu_s = [], []
    for s in range(steps):
        chunks = [SeqChunk([t], context + s, table, True) for t, table in zip(tokens, tables)]
        start, start_cpu = time.perf_counter(), time.process_time()
        tokens = np.argmax(runner.forward(chunks), axis=1).tolist()
        step_s.append(time.perf_counter() - start)
        cpu_s.append(time.process_time() - start_cpu)
    median_s, median_cpu_s = float(np.median(step_s)), float(np.median(cpu_s))
    return {
        "batch": batch,
        "context": context,
        "steps": steps,
        "median_step_ms": round(median_s * 1e3, 1),
        "tok_per_s": round(batch / median_s, 1),
        "median_step_cpu_ms": round(median_cpu_s * 1e3, 1),
        "tok_per_cpu_s": round(batch / median_cpu_s, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--single-context", type=int, default=128)
    parser.add_argument("--batch-context", type=int, default=256)
    parser.add_argument("--batch", type=int, action="append", help="batch sizes (default 8, 32 and 64)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--kv-blocks", type=int, default=1280)
    parser.add_argument(
        "--blas-threads", type=int, help="OpenBLAS threads, and torch's under --runtime torch (default: one per core)"
    )
    parser.add_argument("--runtime", default="numpy", help="numpy (fp32 reference), torch or auto")
    parser.add_argument("--dtype", default="int8", help="--runtime torch: int8, bf16 or fp32 weights")
    args = parser.parse_args()
    if args.blas_threads and set_blas_threads(args.blas_threads) is None:
        raise SystemExit("--blas-threads: numpy's BLAS is not an OpenBLAS this process can reach")

    config, weights = load_gguf(resolve_model(args.model))
    runner = make_runner(config, weights, args.kv_blocks, BLOCK, args.runtime, args.dtype, args.blas_threads or 0)
    # the probe before and after the single stream: the better one is the machine's, not a neighbour's
    bandwidth_gbs = measure_read_bandwidth_gbs(n_bytes=512 * 2**20)
    single = single_stream(runner, args.single_context, args.steps * 2)
    bandwidth_gbs = max(bandwidth_gbs, measure_read_bandwidth_gbs(n_bytes=512 * 2**20))
    roofline = bandwidth_gbs * 1e9 / single["bytes_per_step"]
    report = {
        "machine": {
            "cpus": os.cpu_count(),
            "load_avg_1m": round(os.getloadavg()[0], 2),
            "blas_threads": args.blas_threads or "default",
        },
        "runner": f"{type(runner).__name__} {getattr(runner, 'dtype', 'fp32')}",
        "read_bandwidth_gbs": round(bandwidth_gbs, 2),
        "weight_bytes": runner.weight_bytes,
        "single_stream": single,
        "roofline_tok_per_s": round(roofline, 2),
        "fraction_of_roofline": round(single["tok_per_s"] / roofline, 3),
        "best_step_fraction_of_roofline": round(1e3 / single["best_step_ms"] / roofline, 3),
        "batched": [batched(runner, b, args.batch_context, args.steps) for b in (args.batch or [8, 32, 64])],
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
