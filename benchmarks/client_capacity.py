"""The client's capacity on this machine (harness/client/capacity.py): real `bench run`s (harness.runs.run.run_scenario)
against the ground-truth server, kernel-stamped client and aiohttp interleaved, each run's tokens per CPU-second
and the figure (their median) `workers: auto` would size from.

    flock /tmp/bench.lock python benchmarks/client_capacity.py --concurrency 256 --rounds 2

The capacity file is a temporary one unless --record (then the user's cache, or BENCH_CLIENT_CAPACITY_FILE):
with --record this is a calibration that later runs on this machine size from.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]
from groundtruth_server import GroundTruthConfig, GroundTruthProcess

from harness.client.capacity import CAPACITY_FILE_ENV, MIN_BUSY_CORES, WORKER_CPU_SHARE, load_capacity
from harness.runs.run import run_scenario
from harness.scenario.scenario import load_scenario


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=256)  # a busy client: see MIN_BUSY_CORES
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--stamps", nargs="+", default=["kernel", "loop"], choices=["kernel", "loop"])
    p.add_argument("--record", action="store_true", help="keep the measurements in the real capacity file")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="client_capacity_"))
    if not args.record:
        os.environ[CAPACITY_FILE_ENV] = str(work / "client_capacity.json")
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=args.itl_ms)) as gt:
        for r in range(args.rounds):
            for stamps in args.stamps:
                path = work / f"{stamps}{r}.yaml"
                path.write_text(
                    f"name: cap\nbackend: {{kind: openai, url: '{gt.url}', model: gt, stamps: {stamps}}}\n"
                    f"workload: {{kind: random, input_tokens: 8, output_tokens: {args.tokens}}}\n"
                    f"load: {{arrival: closed, concurrency: {args.concurrency}, "
                    f"num_requests: {args.requests}, workers: 1}}\n"
                )
                result = run_scenario(load_scenario(path), work / f"{stamps}{r}")
                s = result.summary
                m = s.client_capacity_measured
                if m is None:
                    print(
                        f"{stamps:6s} round {r}: not kept, the client used {s.client_cpu_s:.2f} CPU-s over "
                        f"{s.window_s:.1f} s (under {MIN_BUSY_CORES:g} of a core): more --concurrency",
                        flush=True,
                    )
                    continue
                print(
                    f"{stamps:6s} round {r}: {m.tokens:,} tokens, {m.cpu_s:.2f} CPU-s over "
                    f"{s.window_s:.1f} s ({s.throughput.output_tokens_per_s:,.0f} tokens/s): "
                    f"{m.tokens_per_cpu_s:,.0f} tokens per CPU-second",
                    flush=True,
                )
    for stamps in args.stamps:
        capacity = load_capacity(stamps, [])
        if capacity.tokens_per_cpu_s is None:
            print(f"{stamps}: no run kept: `workers: auto` stays on the planning figure")
            continue
        print(
            f"{stamps}: median {capacity.tokens_per_cpu_s:,.0f} tokens per CPU-second of {capacity.measurements} "
            f"run(s) -> auto plans {capacity.tokens_per_s_per_worker:,.0f} tokens/s per process "
            f"({WORKER_CPU_SHARE:g} of a core)"
        )


if __name__ == "__main__":
    main()
