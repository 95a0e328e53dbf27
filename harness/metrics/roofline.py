"""Roofline placement: where the engine's steps sit against the machine's two ceilings, memory
bandwidth (bytes/s) and compute (FLOP/s).

A step's arithmetic intensity is FLOPs / bytes moved. Below the ridge (peak FLOP/s over peak
bytes/s) a step cannot use the compute: it is memory-bound, and its bandwidth share says how
close it is; above, compute-bound. The native engine counts both per step (step trace) and in
total (native:weight_bytes_read_total + kv_bytes_read_total, native:flops_total); vLLM and SGLang
count them with --enable-mfu-metrics (estimated_{read_bytes,flops}_per_gpu_total).

Ceilings: for a CPU engine, measured on this machine after the load (memory: the telemetry's
matrix-vector ceiling; compute: the best fp32 matrix product below); for a GPU, the published
dense BF16 tensor peak and HBM bandwidth of the part (harness/scenario/gpus.py).
"""

from __future__ import annotations

import os
import time

import numpy as np

from harness.results.schema import Ceilings, GpuCounters, Roofline, RooflinePoint, Telemetry
from harness.scenario.gpus import gpu_peaks


def local_gpu_name() -> str | None:
    """The first NVIDIA GPU's name through NVML, None without one."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no driver, no GPU, no library: a CPU machine
        return None
    return name.decode() if isinstance(name, bytes) else str(name)


def measure_compute_ceiling_flops(budget_s: float = 0.5, max_repeats: int = 100) -> float:
    """Best fp32 matrix-product FLOP/s here at a prefill-like shape (256 x 1024 by 1024 x 1024),
    repeated for up to `budget_s`: on a shared machine the best run is the one that kept its cores."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 1024), dtype=np.float32)
    b = rng.standard_normal((1024, 1024), dtype=np.float32)
    best_s, deadline = float("inf"), time.perf_counter() + budget_s
    for k in range(max_repeats + 1):
        start = time.perf_counter()
        a @ b
        best_s = min(best_s, time.perf_counter() - start)
        if k > 5 and start > deadline:
            break
    return 2 * 256 * 1024 * 1024 / best_s


def place(
    bytes_moved: float, flops: float, seconds: float, peak_flops: float, peak_bytes_per_s: float, steps=None
) -> RooflinePoint:
    """One point on the roofline: achieved rates, shares of each ceiling, intensity, and the verdict; `steps`:
    how many steps it stands for (a step trace's)."""
    bytes_per_s, flops_per_s = bytes_moved / seconds, flops / seconds
    intensity = flops / bytes_moved if bytes_moved else None
    ridge = peak_flops / peak_bytes_per_s
    point = RooflinePoint(
        bytes_per_s=bytes_per_s,
        flops_per_s=flops_per_s,
        bandwidth_fraction=bytes_per_s / peak_bytes_per_s,
        compute_fraction=flops_per_s / peak_flops,
        intensity_flop_per_byte=intensity,
        ridge_flop_per_byte=ridge,
        seconds=seconds,
        bound="memory" if intensity is not None and intensity < ridge else "compute",
    )
    if steps is not None:
        point.steps = steps
    return point


def line(kind: str, point: RooflinePoint) -> str:
    """'decode is memory-bound: 71% of bandwidth, 4% of compute, intensity 1.9 FLOP/byte (ridge 9.6)'"""
    verb = "are" if kind.endswith("steps") else "is"
    return (
        f"{kind} {verb} {point.bound}-bound: {100 * point.bandwidth_fraction:.0f}% of bandwidth, "
        f"{100 * point.compute_fraction:.0f}% of compute, intensity "
        f"{point.intensity_flop_per_byte:.1f} FLOP/byte (ridge {point.ridge_flop_per_byte:.1f})"
    )


def roofline(
    steps: list[dict],
    telemetry: Telemetry,
    engine_kind: str,
    gpu_name: str | None = None,
    compute_ceiling_flops: float | None = None,
) -> Roofline:
    """The roofline block of summary.json. Steps (the step trace) give per-kind points over the time
    the steps ran; without them, the engine's counters over the window (idle time included)."""
    on_cpu = engine_kind == "native" or gpu_peaks(gpu_name) is None
    hardware = None if on_cpu else _gpu_counters(telemetry)
    if not steps and not (telemetry.engine_read_bytes_per_s and telemetry.engine_flops_per_s):
        why = (
            "the engine reported no bytes moved and FLOPs done (native: backend.trace or its /metrics; "
            "vLLM, SGLang: --enable-mfu-metrics)"
        )
        return Roofline(reason=why, hardware=hardware, line=hardware.line) if hardware else Roofline(reason=why)
    if on_cpu and not telemetry.memory_bandwidth_ceiling_bytes_per_s:
        return Roofline(reason="no memory ceiling was measured (telemetry off)")
    ceilings = _ceilings(on_cpu, telemetry, gpu_name, compute_ceiling_flops)
    points, basis = _points(steps, telemetry, ceilings.flops_per_s, ceilings.bytes_per_s)
    out = Roofline(ceilings=ceilings, points=points)
    if basis:
        out.basis = basis
    if hardware:
        out.hardware = hardware
    if any(p.bandwidth_fraction > 1 or p.compute_fraction > 1 for p in points.values()):
        ceilings.note = (
            f"steps beat a measured ceiling: the machine was busy while it was measured "
            f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores), so the "
            f"fractions overstate"
        )
    main = "decode" if "decode" in points else next(iter(points), None)
    if main:
        out.line = line(main, points[main])
    return out


def _gpu_counters(telemetry: Telemetry) -> GpuCounters | None:
    """What the GPU itself counted (NVML GPM / DCGM), when it did: DRAM and tensor-pipe activity."""
    dram, tensor = telemetry.gpu_dram_active_mean, telemetry.gpu_tensor_active_mean
    if dram is None or tensor is None:
        return None
    return GpuCounters(
        dram_active=dram,
        tensor_active=tensor,
        line=f"the GPU's own counters: DRAM active {100 * dram:.0f}%, tensor pipes active "
        f"{100 * tensor:.0f}% ({'memory' if dram > tensor else 'compute'}-bound)",
    )


def _ceilings(
    on_cpu: bool, telemetry: Telemetry, gpu_name: str | None, compute_ceiling_flops: float | None
) -> Ceilings:
    """Peak FLOP/s and bytes/s, and where they come from: measured on this CPU, or a GPU's published peaks."""
    if not on_cpu:
        peak_flops, peak_bytes = gpu_peaks(gpu_name)
        return Ceilings(
            source=f"published peaks of {gpu_name} (dense BF16, HBM)",
            flops_per_s=peak_flops,
            bytes_per_s=peak_bytes,
            ridge_flop_per_byte=peak_flops / peak_bytes,
        )
    peak_flops = compute_ceiling_flops or measure_compute_ceiling_flops()
    peak_bytes = telemetry.memory_bandwidth_ceiling_bytes_per_s
    return Ceilings(
        source="measured on this CPU (matrix-vector read, fp32 matrix product)",
        load_average=os.getloadavg()[0],
        cpu_count=os.cpu_count(),
        flops_per_s=peak_flops,
        bytes_per_s=peak_bytes,
        ridge_flop_per_byte=peak_flops / peak_bytes,
    )


def _points(
    steps: list[dict], telemetry: Telemetry, peak_flops: float, peak_bytes: float
) -> tuple[dict[str, RooflinePoint], str | None]:
    """One roofline point per step kind (the step trace), else one of the engine's counters; and its basis."""
    points: dict[str, RooflinePoint] = {}
    if not steps:
        read, done = telemetry.engine_read_bytes_per_s, telemetry.engine_flops_per_s
        if not (read and done):
            return points, None
        points["all steps"] = place(read, done, 1.0, peak_flops, peak_bytes)
        return points, "engine counters over the measured window (idle time included)"
    by_kind: dict[str, list[dict]] = {}
    for s in steps:
        kind = s.get("kind") or (
            "mixed" if s["prefill_tokens"] and s["decode_seqs"] else "prefill" if s["prefill_tokens"] else "decode"
        )
        by_kind.setdefault(kind, []).append(s)
    for kind, group in by_kind.items():
        seconds = sum(s["dur_s"] for s in group)
        moved, flops = sum(s["bytes_read"] for s in group), sum(s["flops"] for s in group)
        if seconds > 0 and moved > 0:
            points[kind] = place(moved, flops, seconds, peak_flops, peak_bytes, steps=len(group))
    return points, "step trace: bytes and FLOPs over the time the steps ran"
