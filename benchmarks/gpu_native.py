"""The built-in engine on CUDA, for gpu_check.sh on a device machine (no network needed there).

  steps OUT            decode step time of the torch runner (bf16) at batch 1, 8, 64, with CUDA graphs and
                       without (the same fixed-shape step launched kernel by kernel), interleaved; the ratio
                       is the graphs' gain. Writes OUT/cuda_steps.json.
  telemetry RUN_DIR    reads a `bench run` folder's telemetry.csv (scenarios/native_cuda.yaml) and checks
                       that the GPU's DRAM-bandwidth and tensor-pipe series are nonzero while requests ran.
Exit status 1 with the reason when a check fails.
"""

from __future__ import annotations

import csv
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.results.folder import read_records  # noqa: E402

BATCHES = (1, 8, 64)
CONTEXT = 256  # prompt tokens per sequence before the timed decode steps


def steps(out: Path) -> int:
    import torch

    from native_engine.gguf_model import load_gguf
    from native_engine.model_files import resolve_model
    from native_engine.model_runner import SeqChunk
    from native_engine.torch_runner import TorchModelRunner

    config, weights = load_gguf(resolve_model("smollm2"))
    blocks_per_seq = CONTEXT // 16 + 4
    runners = {
        graphs: TorchModelRunner(
            config, weights, max(BATCHES) * blocks_per_seq, 16, dtype="bf16", device="cuda", cuda_graphs=graphs
        )
        for graphs in (True, False)
    }
    table = lambda i: list(range(i * blocks_per_seq, (i + 1) * blocks_per_seq))  # noqa: E731
    report = {"device": torch.cuda.get_device_name(0), "context": CONTEXT}
    for batch in BATCHES:
        times = {True: [], False: []}
        for runner in runners.values():
            runner.forward([SeqChunk(list(range(3, 3 + CONTEXT)), 0, table(i), True) for i in range(batch)])
        for k in range(40):  # interleaved, the first 5 of each not counted (capture, warm-up)
            for graphs, runner in runners.items():
                chunks = [SeqChunk([7], CONTEXT + k % 16, table(i), True) for i in range(batch)]
                torch.cuda.synchronize()
                start = time.perf_counter()
                runner.forward(chunks)  # returns numpy: the step has finished
                if k >= 5:
                    times[graphs].append(time.perf_counter() - start)
        with_ms, without_ms = (1000 * float(np.median(times[g])) for g in (True, False))
        report[f"batch_{batch}"] = {
            "step_ms_cuda_graphs": round(with_ms, 3),
            "step_ms_no_graphs": round(without_ms, 3),
            "no_graphs_over_graphs": round(without_ms / with_ms, 2),
            "tok_s_cuda_graphs": round(batch / with_ms * 1000, 1),
        }
        print(json.dumps({f"batch_{batch}": report[f"batch_{batch}"]}), flush=True)
    replays = runners[True].cuda_decode.graph_replays
    report["graph_replays"], report["captured_sizes"] = replays, sorted(runners[True].cuda_decode.captured)
    (out / "cuda_steps.json").write_text(json.dumps(report, indent=1))
    if replays == 0:
        print("gpu_native: FAILED: no step replayed a CUDA graph")
        return 1
    return 0


def telemetry(run_dir: Path) -> int:
    """Nonzero GPM DRAM and tensor series inside the window where requests ran."""
    ok = [r for r in read_records(run_dir) if r.ok]
    if not ok:
        print("gpu_native telemetry: FAILED: no request of the run succeeded")
        return 1
    window = (min(r.actual_send_s for r in ok), max(r.end_s for r in ok))
    series: dict[str, list[float]] = {}
    with open(run_dir / "telemetry.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["source"].startswith("gpu:0") and window[0] <= float(row["t_s"]) <= window[1]:
                series.setdefault(row["name"], []).append(float(row["value"]))
    failures = []
    for name in ("DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "DCGM_FI_PROF_SM_ACTIVE"):
        values = series.get(name, [])
        ok = bool(values) and max(values) > 0
        print(
            f"{'PASS' if ok else 'FAIL'}  {name}: {len(values)} samples while serving, "
            f"mean {np.mean(values) if values else float('nan'):.3f}, max {max(values) if values else float('nan'):.3f}"
        )
        if not ok:
            failures.append(name)
    print("gpu_native telemetry: " + ("OK" if not failures else f"FAILED: {', '.join(failures)} zero or absent"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("steps", "telemetry"):
        sys.exit(__doc__)
    sys.exit(steps(Path(sys.argv[2])) if sys.argv[1] == "steps" else telemetry(Path(sys.argv[2])))
