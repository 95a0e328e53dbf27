"""Rebuilds this example: the built-in engine and llama.cpp's llama-server, one rate sweep each, then `bench select`.

Both engines serve the same GGUF file (native_engine.model_files.resolve_model("smollm2")), are
started by the harness (backend.launch) once for their whole sweep, and run one after the
other, so they never share the CPU. The sweep, workload, seed and SLOs are scenario.yaml's,
identical for both; only `backend` is overridden for llama-server.

Run from the repository root on a quiet machine (CPU heavy, ~5-10 minutes on 2 cores):
    python docs/engine-selection-example/make_example.py [--out /tmp/selection-example]
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
REPO = HERE.parents[1]
SLO = "ttft_ms=2000,tpot_ms=150"  # the same limits as scenario.yaml's slo
# The machine's price per hour: AWS c6i.large (2 vCPUs, 4 GiB, on-demand Linux, us-east-1), the size
# of the 2-core VM these runs were made on; there is no accelerator, the VM is the unit of cost.
COST_PER_HOUR = 0.085
# One compute thread each: the load generator needs the other core, and on a shared machine 2 spinning
# threads per engine make steps erratic. llama-server: 16 slots of 256 tokens (a request needs 96).
NATIVE_ARGS = ["--blas-threads", "1"]
LLAMA_SERVER_ARGS = ["-t", "1", "-c", "4096", "--parallel", "16"]


def llama_server_dir() -> str:
    """The folder of the cached llama-server (benchmarks/build_llama_server.sh builds it only if missing)."""
    path = (
        subprocess.run(
            ["bash", str(REPO / "benchmarks/build_llama_server.sh")], check=True, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    return str(Path(path).parent)


def engines(gguf: str) -> dict[str, list[str]]:
    """Engine label -> the `--set` overrides of scenario.yaml that select it."""
    path_env = f"{llama_server_dir()}:{os.environ['PATH']}"  # the backend's default command runs `llama-server`
    return {
        "native-engine": [f"backend.launch.args=[--model, '{gguf}', {', '.join(NATIVE_ARGS)}]"],
        "llama-server": [
            "backend.kind=llamacpp",
            f"backend.model='{gguf}'",
            "backend.launch.args=[" + ", ".join(LLAMA_SERVER_ARGS) + "]",
            f"backend.launch.env={{PATH: '{path_env}'}}",
        ],
    }


def bench(*args: str) -> None:
    print("$ bench " + shlex.join(args), flush=True)
    subprocess.run([sys.executable, "-m", "harness", *args], check=True)


def main() -> None:
    from native_engine.model_files import resolve_model

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("/tmp/selection-example"))
    args = p.parse_args()
    load_1m = os.getloadavg()[0]
    if load_1m > 0.5:  # both engines' threads spin on shared cores: other work skews the figures badly
        print(f"warning: load average {load_1m:.1f}; other processes will slow both engines", flush=True)
    gguf = str(resolve_model("smollm2"))
    sweeps, labels = [], []
    for label, overrides in engines(gguf).items():
        out = args.out / label
        sets = [arg for o in overrides for arg in ("--set", o)]
        shutil.rmtree(out, ignore_errors=True)  # no stale points from an earlier sweep
        # --allow-client-bound: the client shares the 2 cores; select flags the points where it fell behind
        bench("run", str(HERE / "scenario.yaml"), "--output", str(out), "--allow-client-bound", *sets)
        sweeps.append(str(out))
        labels += ["--label", label]
    bench(
        "select",
        *sweeps,
        *labels,
        "--slo",
        SLO,
        "--gpu-cost-per-hour",
        str(COST_PER_HOUR),
        "-o",
        str(HERE / "selection.html"),
    )


if __name__ == "__main__":
    main()
