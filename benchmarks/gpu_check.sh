#!/usr/bin/env bash
# GPU telemetry check, < 5 minutes: the recorder samples NVML + GPM for ~30 s while a known
# workload (idle / 4 GiB copies / bf16 matmuls / idle, with torch+CUDA) runs, then prints the
# series and PASS/FAIL per check. Outputs go to $OUT (or ./gpu_check_out): telemetry.csv and
# nvml_recorded.json (a real replay fixture for tests/test_telemetry_gpu.py).
# Usage: benchmarks/gpu_check.sh [--interval-ms 500] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"

fail() { echo "gpu_check: FAILED: $*" >&2; exit 1; }

"$PYTHON" -c "import pynvml" 2>/dev/null || fail "nvidia-ml-py is not installed (pip install nvidia-ml-py)"
"$PYTHON" -c "import harness.telemetry" 2>/dev/null \
  || fail "cannot import harness.telemetry (run from the repository, after: pip install -e . --no-deps)"
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
exec timeout 280 "$PYTHON" benchmarks/gpu_check.py "$@"
