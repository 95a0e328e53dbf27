"""Rebuilds this example: two configurations of the built-in engine, a rate sweep each, then `bench select`.

The "engines" are the built-in numpy engine with continuous batching (its default) and with
static batching (`--static-batching`: a new batch starts only when the running one is done).
Each is started once, swept over RATES (one results folder per point, as a scenario sweep
writes them), and stopped before the next starts, so they never share the CPU.

Run from the repository root (CPU heavy, ~4 minutes on 2 cores):
    python docs/engine-selection-example/make_example.py [--out /tmp/selection-example]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
RATES = (1.0, 2.0, 4.0, 8.0)
ENGINES = {"continuous-batching": [], "static-batching": ["--static-batching"]}
SLO = "ttft_ms=1000,tpot_ms=150"
GPU_COST_PER_HOUR = 0.10  # stands for the price of this 2-core CPU machine per hour


def main() -> None:
    from harness.launcher import launch
    from harness.scenario import LaunchConfig

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/selection-example"))
    args = p.parse_args()
    sweeps = []
    for name, engine_args in ENGINES.items():
        root = args.out / name
        root.mkdir(parents=True, exist_ok=True)
        engine = launch("native", LaunchConfig(args=engine_args), None, "smollm2", root / "engine.log")
        try:
            # a fresh engine's first requests are slow (allocation, caches): warm it up, discard the run
            subprocess.run([sys.executable, "-m", "harness", "run", str(HERE / "scenario.yaml"), "--output",
                            str(root / "warmup"), "--allow-client-bound", "--set", f"backend.url={engine.url}",
                            "--set", "load.duration_s=null", "--set", "load.num_requests=4"], check=True)
            for i, rate in enumerate(RATES):
                cmd = [sys.executable, "-m", "harness", "run", str(HERE / "scenario.yaml"),
                       "--output", str(root / f"point-{i:03d}-rate-{rate:g}"), "--allow-client-bound",
                       "--set", f"backend.url={engine.url}", "--set", f"load.rate={rate}"]
                subprocess.run(cmd, check=True)
        finally:
            engine.stop()
        sweeps.append(root)
    labels = [arg for name in ENGINES for arg in ("--label", name)]
    subprocess.run([sys.executable, "-m", "harness", "select", *map(str, sweeps), *labels, "--slo", SLO,
                    "--gpu-cost-per-hour", str(GPU_COST_PER_HOUR), "-o", str(HERE / "selection.html")], check=True)


if __name__ == "__main__":
    main()
