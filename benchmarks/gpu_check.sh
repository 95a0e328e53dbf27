#!/usr/bin/env bash
# GPU check for a device machine, < 10 minutes, no network needed (torch with CUDA preinstalled):
#  1. telemetry: the recorder samples NVML + GPM for ~30 s while a known workload (idle / 4 GiB copies /
#     bf16 matmuls / idle) runs; prints the series and PASS/FAIL per check (benchmarks/gpu_check.py).
#  2. the built-in engine on CUDA: decode step time with and without CUDA graphs at batch 1, 8, 64
#     (benchmarks/gpu_native.py steps).
#  3. `bench run scenarios/native_cuda.yaml` (torch runtime on CUDA, GPU telemetry live), then checks its
#     DRAM-bandwidth and tensor-activity series are nonzero while requests ran (gpu_native.py telemetry).
# Outputs go to $OUT (or ./gpu_check_out): telemetry.csv, nvml_recorded.json (a real replay fixture for
# tests/test_telemetry_gpu.py), cuda_steps.json, bench_run/. Exit status: the first failing part's.
# Usage: benchmarks/gpu_check.sh [--interval-ms 500]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

fail() { echo "gpu_check: FAILED: $*" >&2; exit 1; }

"$PYTHON" -c "import pynvml" 2>/dev/null || fail "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
"$PYTHON" -c "import harness.engine.telemetry" 2>/dev/null \
  || fail "cannot import harness.engine.telemetry (run from the repository, after: pip install -e . --no-deps)"
reason=$("$PYTHON" - <<'PY' 2>&1
import pynvml
try:
    pynvml.nvmlInit()
except pynvml.NVMLError as exc:
    raise SystemExit(f"NVML did not start: {exc} (no NVIDIA driver or no GPU on this machine)")
count = pynvml.nvmlDeviceGetCount()
if count == 0:
    raise SystemExit("NVML sees no GPU")
h = pynvml.nvmlDeviceGetHandleByIndex(0)
print(f"{count} GPU(s); gpu 0: {pynvml.nvmlDeviceGetName(h)}, driver {pynvml.nvmlSystemGetDriverVersion()}")
PY
) || fail "$reason"
echo "gpu_check: $reason"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,power.limit,clocks.max.memory --format=csv || true
OUT_DIR="${OUT:-gpu_check_out}"
mkdir -p "$OUT_DIR"
status=0
keep_first() { [ "$status" -ne 0 ] || status=$1; }   # the exit status is the first failing part's
timeout 120 "$PYTHON" benchmarks/gpu_check.py --out "$OUT_DIR" "$@" || keep_first $?
echo "== native engine on CUDA: step time with and without CUDA graphs"
timeout 180 "$PYTHON" benchmarks/gpu_native.py steps "$OUT_DIR" || keep_first $?
echo "== bench run scenarios/native_cuda.yaml (GPU telemetry live)"
if timeout 200 "$PYTHON" -m harness run scenarios/native_cuda.yaml --output "$OUT_DIR/bench_run" --overwrite; then
  "$PYTHON" benchmarks/gpu_native.py telemetry "$OUT_DIR/bench_run" || keep_first $?
else
  echo "gpu_check: FAILED: bench run of scenarios/native_cuda.yaml"; keep_first 1
fi
exit "$status"
