"""How long `bench plan --search` takes, and how many simulations it needs, on a chat-sized scenario.

Llama-3.1-8B at bf16, 1024-token prompts and 128-token answers at 20 requests/s (200 requests by default), SLOs TTFT
500 ms and TPOT 50 ms, over four GPU types priced per GPU-hour. Prints the engine-selection table, the
simulations run against an exhaustive sweep of the same space (TP 1-8 x replicas up to --max-gpus), the wall
time and the load average before and after. Hold /tmp/bench.lock while it runs (one measurement at a time):

  PYTHONPATH=. flock /tmp/bench.lock python benchmarks/plan_search.py [--requests 200] [--max-gpus 16]

2026-12-01, this 2-core machine, load average 2.5 before and 2.1 after: 20 simulations of 200 requests (an
exhaustive sweep of the same space: 120) in 18.7 s, 0.93 s each. Cheapest: 1 x H100 ($2.50/h, SLO margin
62%), then 3 x L40S ($3.00), 3 x A100 ($4.80), L4 at TP 4 x 3 replicas ($7.20; TP 1 misses the TPOT on
its decode step alone, 72 ms).
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

from harness.plan.search import TP_SIZES, Search, table_lines
from harness.scenario.scenario import load_scenario

SCENARIO = """
name: plan-search-bench
backend: {{kind: native, model: smollm2, launch: {{args: [--max-num-seqs, "128", --max-num-batched-tokens, "4096"]}}}}
workload: {{kind: random, input_tokens: 1024, output_tokens: 128, ignore_eos: true}}
load: {{arrival: poisson, rate: 20, num_requests: {requests}}}
slo: {{ttft_ms: 500, tpot_ms: 50}}
plan: {{model: llama-3.1-8b, step_model: roofline, prices: {{H100: 2.5, A100-80GB-SXM: 1.6, L40S: 1.0, L4: 0.6}}}}
seed: 0
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--max-gpus", type=int, default=16)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "scenario.yaml"
        path.write_text(SCENARIO.format(requests=args.requests))
        scenario = load_scenario(path)
        load_before = os.getloadavg()[0]
        start = time.perf_counter()
        # headroom 0: the asked rate only, as the 2026-12-01 figures above; search.simulations now also counts
        # the capacity bracket of each GPU type's choice (harness/plan/search.py)
        search = Search(scenario, Path(tmp) / "out", max_gpus=args.max_gpus, headroom=0.0)
        results = search.run()
        wall_s = time.perf_counter() - start
    print("\n".join(table_lines(results)))
    exhaustive = len(scenario.plan.prices) * sum(args.max_gpus // tp for tp in TP_SIZES)
    print(
        f"\n{search.simulations} simulations of {args.requests} requests (an exhaustive sweep: {exhaustive}) "
        f"in {wall_s:.1f} s, {wall_s / max(search.simulations, 1):.2f} s each; "
        f"load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after, {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
