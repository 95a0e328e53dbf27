"""Checks the GPU telemetry path on a real NVIDIA GPU in about 35 s (run it through gpu_check.sh).

The recorder samples while a known workload runs in phases: idle, a device-to-device copy
(DRAM-bound), bf16 matrix products (tensor-core-bound), idle. The GPM series must follow:
DRAM_ACTIVE high in the copy, PIPE_TENSOR_ACTIVE high in the matmuls, both low when idle,
energy rising. It prints the series and a PASS/FAIL line per check, and saves
  OUT/telemetry.csv         what the recorder wrote
  OUT/nvml_recorded.json    every NVML answer, in the format of tests/fixtures/nvml_*.json,
                            so the tests can replay a real GPU instead of the hand-written one.
Exit status 0 when every applicable check passes; 1 with the reason otherwise.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.engine.telemetry import TelemetryRecorder
from harness.engine.telemetry.gpu import GPM_FIELDS, GpuSampler
from harness.engine.telemetry.timeline import Unavailable
from harness.scenario.telemetry_settings import TelemetryConfig

PHASES = [("idle", 5.0), ("copy", 10.0), ("matmul", 10.0), ("idle_after", 5.0)]
# pynvml function -> its key in the fixture (both reason functions answer the same bitmask)
RECORDED = {
    name: name
    for name in [
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetPowerUsage",
        "nvmlDeviceGetTemperature",
        "nvmlDeviceGetTotalEnergyConsumption",
        "nvmlDeviceGetUtilizationRates",
        "nvmlDeviceGetCurrentClocksThrottleReasons",
    ]
}
RECORDED["nvmlDeviceGetCurrentClocksEventReasons"] = "nvmlDeviceGetCurrentClocksThrottleReasons"


def _address(pointer) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value


class RecordingNvml:
    """pynvml (or any stand-in for it), passing every call through and keeping each device's answers in call order."""

    def __init__(self, backend=pynvml):
        self.backend = backend
        self.device_of: dict[int, int] = {}  # id(handle) -> index (the sampler keeps its handles)
        self.sample_device: dict[int, int] = {}  # GPM sample address -> device index
        self.calls: dict[tuple[int, str], list] = defaultdict(list)
        self.constants: dict[int, dict] = defaultdict(dict)

    def __getattr__(self, name):
        real = getattr(self.backend, name)
        if name in RECORDED:

            def recorded(handle, *args):
                value = real(handle, *args)
                kept = {f: getattr(value, f) for f in ("total", "used", "free", "gpu", "memory") if hasattr(value, f)}
                self.calls[self.device_of[id(handle)], RECORDED[name]].append(kept or value)
                return value

            return recorded
        return real

    def nvmlDeviceGetHandleByIndex(self, index):
        handle = self.backend.nvmlDeviceGetHandleByIndex(index)
        self.device_of[id(handle)] = index
        self.constants[index].update(
            {
                "nvmlDeviceGetName": self.backend.nvmlDeviceGetName(handle),
                "nvmlGpmQueryDeviceSupport": _try(
                    lambda: self.backend.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice, 0
                ),
                "nvmlDeviceGetMemoryBusWidth": _try(lambda: self.backend.nvmlDeviceGetMemoryBusWidth(handle), None),
                "nvmlDeviceGetMaxClockInfo": {
                    "NVML_CLOCK_MEM": _try(
                        lambda: self.backend.nvmlDeviceGetMaxClockInfo(handle, pynvml.NVML_CLOCK_MEM), None
                    )
                },
            }
        )
        return handle

    def nvmlDeviceGetClockInfo(self, handle, clock):
        value = self.backend.nvmlDeviceGetClockInfo(handle, clock)
        key = "NVML_CLOCK_SM" if clock == pynvml.NVML_CLOCK_SM else "NVML_CLOCK_MEM"
        self.calls[self.device_of[id(handle)], f"nvmlDeviceGetClockInfo/{key}"].append(value)
        return value

    def nvmlGpmSampleGet(self, handle, sample):
        self.sample_device[_address(sample)] = self.device_of[id(handle)]
        return self.backend.nvmlGpmSampleGet(handle, sample)

    def nvmlGpmMetricsGet(self, request):
        self.backend.nvmlGpmMetricsGet(request)
        names = {getattr(pynvml, metric): metric for metric, _ in GPM_FIELDS.values()}
        values = {
            names[m.metricId]: (m.value if m.nvmlReturn == pynvml.NVML_SUCCESS else None)
            for m in request.metrics[: request.numMetrics]
        }
        self.calls[self.sample_device[_address(request.sample2)], "nvmlGpmMetricsGet"].append(values)
        return request

    def fixture(self) -> dict:
        devices = []
        for index, constants in sorted(self.constants.items()):
            series = {name: values for (device, name), values in self.calls.items() if device == index}
            n = min(len(v) for v in series.values()) if series else 0
            ticks = []
            for k in range(n):
                tick = {name: values[k] for name, values in series.items() if "/" not in name}
                tick["nvmlDeviceGetClockInfo"] = {
                    name.split("/")[1]: values[k] for name, values in series.items() if "/" in name
                }
                ticks.append(tick)
            devices.append({**constants, "ticks": ticks})
        return {
            "about": f"Recorded by benchmarks/gpu_check.py on {time.strftime('%Y-%m-%d')}, phases {PHASES}; "
            "NVML's own units; null: that GPM metric answered an error.",
            "devices": devices,
        }


def _try(fn, default):
    try:
        return fn()
    except pynvml.NVMLError:
        return default


def run_workload(t0_ns: int) -> tuple[dict[str, tuple[float, float]], str | None]:
    """Runs the phases; returns {phase: (start_s, end_s)} on the run clock and why there was no load, if none."""
    try:
        import torch

        assert torch.cuda.is_available(), "torch.cuda.is_available() is False"
    except (ImportError, AssertionError) as exc:
        reason = f"no GPU workload: torch with CUDA is not usable ({exc}); the GPU stays idle throughout"
        time.sleep(sum(seconds for _, seconds in PHASES))
        return {}, reason
    src = torch.empty(1 << 30, dtype=torch.float32, device="cuda")  # 4 GiB: far beyond L2
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    windows = {}
    for phase, seconds in PHASES:
        start_s = (time.perf_counter_ns() - t0_ns) / 1e9
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            for _ in range(10):
                if phase == "copy":
                    dst.copy_(src)
                elif phase == "matmul":
                    a @ a
            if phase.startswith("idle"):
                time.sleep(0.05)
            torch.cuda.synchronize()
        windows[phase] = (start_s, (time.perf_counter_ns() - t0_ns) / 1e9)
    return windows, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or "gpu_check_out", help="folder for the outputs")
    parser.add_argument("--interval-ms", type=int, default=500)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        GpuSampler().close()  # fail loudly, before anything else, if there is no GPU to check
    except Unavailable as exc:
        print(f"gpu_check: FAILED: {exc}", file=sys.stderr)
        return 1

    nvml = RecordingNvml()
    t0_ns = time.perf_counter_ns()
    recorder = TelemetryRecorder(TelemetryConfig(interval_ms=args.interval_ms), t0_ns, out, nvml=nvml)
    recorder.start()
    windows, no_load = run_workload(t0_ns)
    status = recorder.stop()
    (out / "nvml_recorded.json").write_text(json.dumps(nvml.fixture(), indent=1))
    print("sampled:", status.sampled)
    print("not sampled:", json.dumps(status.not_sampled, indent=1), "errors:", status.errors)
    return report(recorder, windows, no_load, status)


def report(recorder, windows, no_load, status) -> int:
    timeline = recorder.timeline
    columns = [
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_PROF_SM_ACTIVE",
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "DCGM_FI_DEV_POWER_USAGE",
        "DCGM_FI_DEV_SM_CLOCK",
        "DCGM_FI_DEV_FB_USED",
    ]
    series = {c: dict(zip(*timeline.series("gpu:0", c))) for c in columns}
    print("\n  t_s  " + "  ".join(c.replace("DCGM_FI_", "")[:14].rjust(14) for c in columns))
    for t in sorted(series["DCGM_FI_DEV_POWER_USAGE"]):
        print(f"{t:6.2f} " + "  ".join(f"{series[c].get(t, float('nan')):14.4g}" for c in columns))
    failures = []

    def check(ok: bool, what: str) -> None:
        print(("PASS  " if ok else "FAIL  ") + what)
        if not ok:
            failures.append(what)

    check("gpu:0" in status.sampled, "NVML fields sampled for gpu:0")
    energy = timeline.series("gpu:0", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[1]
    check(
        energy.size > 1 and energy[-1] > energy[0],
        f"energy counter rises ({energy[0] if energy.size else '-'} J -> {energy[-1] if energy.size else '-'} J)",
    )
    if "gpu:0 GPM" in status.not_sampled:
        print(f"SKIP  GPM checks: {status.not_sampled['gpu:0 GPM']}")
    elif no_load:
        print(f"SKIP  phase checks: {no_load}")
    else:
        means = {
            phase: recorder.derived(start + min(0.6, (end - start) / 2), end, output_tokens=1)
            for phase, (start, end) in windows.items()
        }
        for phase, d in means.items():
            print(
                f"{phase:>10}: DRAM_ACTIVE {d.gpu_dram_active_mean}, TENSOR_ACTIVE {d.gpu_tensor_active_mean}, "
                f"energy {d.gpu_energy_j} J"
            )
        check((means["copy"].gpu_dram_active_mean or 0) > 0.5, "DRAM_ACTIVE > 0.5 during the 4 GiB copies")
        check((means["matmul"].gpu_tensor_active_mean or 0) > 0.3, "PIPE_TENSOR_ACTIVE > 0.3 during bf16 matmuls")
        check((means["copy"].gpu_tensor_active_mean or 1) < 0.05, "PIPE_TENSOR_ACTIVE < 0.05 during copies")
        check((means["idle_after"].gpu_dram_active_mean or 1) < 0.05, "DRAM_ACTIVE < 0.05 when idle")
    if no_load:
        failures.append(no_load)
    print("gpu_check: " + ("OK" if not failures else f"FAILED: {'; '.join(failures)}"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
