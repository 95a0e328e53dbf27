"""Summary figures over the measured window, from the telemetry timeline (summary.json's `telemetry`, the
Telemetry model).

Fields (None where the inputs were not sampled):
  gpu_dram_active_mean, gpu_tensor_active_mean   fraction, DCGM_FI_PROF_* mean over samples and GPUs
  gpu_energy_j, energy_per_output_token_j        J over the window (all GPUs), and per output token
  engine_read_bytes_per_s, engine_flops_per_s    from the engine's own counters (engine_bytes.py)
  memory_bandwidth_ceiling_bytes_per_s, _source  what MBU divides by: the GPU's peak (vLLM/SGLang on a
                                                 GPU) or the host ceiling measured at stop (CPU engines)
  mbu                                            engine_read_bytes_per_s / the ceiling
  dram_bandwidth_util_mean, _source              the headline: GPU DRAM_ACTIVE, or mbu for CPU engines
  engine_cpu_percent_mean, host_cpu_percent_mean top-style percent (100 = one core)
  engine_rss_bytes_max                           bytes, the engine's process tree

Means of sampled figures take the samples whose t_s falls inside [start, end]. Counters
(energy, bytes read) are read at the window's edges by linear interpolation between samples,
so a window shorter than the sampling interval still gets a figure; outside the sampled
span the counter is held at its first/last value, which can only under-count.
"""

from __future__ import annotations

import numpy as np

from harness.engine.telemetry.timeline import Timeline
from harness.results.schema import Telemetry


def window_mean(t_s: np.ndarray, values: np.ndarray, start_s: float, end_s: float) -> float | None:
    inside = values[(t_s >= start_s) & (t_s <= end_s)]
    return float(inside.mean()) if inside.size else None


def counter_increase(t_s: np.ndarray, values: np.ndarray, start_s: float, end_s: float) -> float | None:
    if t_s.size < 2:
        return None
    return float(np.interp(end_s, t_s, values) - np.interp(start_s, t_s, values))


def _gpu_sources(timeline: Timeline, name: str) -> list[str]:
    """NVML's own readings when there are any, else dcgm-exporter's: never both, that would count twice."""
    sources = timeline.sources_with(name)
    nvml = [s for s in sources if s.startswith("gpu:")]
    return nvml or [s for s in sources if s.startswith("dcgm:")]


def _mean_over_gpus(timeline: Timeline, name: str, start_s: float, end_s: float) -> float | None:
    means = [window_mean(*timeline.series(s, name), start_s, end_s) for s in _gpu_sources(timeline, name)]
    means = [m for m in means if m is not None]
    return float(np.mean(means)) if means else None


def summarize(
    timeline: Timeline,
    start_s: float,
    end_s: float,
    output_tokens: int,
    engine_family: str | None,
    host_ceiling_bytes_per_s: float | None,
) -> Telemetry:
    if end_s <= start_s:
        raise ValueError(f"window_end_s ({end_s}) must be after window_start_s ({start_s})")
    dram_active = _mean_over_gpus(timeline, "DCGM_FI_PROF_DRAM_ACTIVE", start_s, end_s)
    energy = [
        counter_increase(*timeline.series(s, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"), start_s, end_s)
        for s in _gpu_sources(timeline, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
    ]
    energy = [e for e in energy if e is not None]
    energy_j = float(sum(energy)) if energy else None

    # MBU: the engine's own bytes-read estimate over the memory it reads from.
    # engine_family None: no engine counters, or counters that never moved (vLLM without --enable-mfu-metrics).
    read_bytes = flops = None
    if engine_family is not None:
        read_bytes = counter_increase(*timeline.series("engine_metrics", "read_bytes_total"), start_s, end_s)
        flops = counter_increase(*timeline.series("engine_metrics", "flops_total"), start_s, end_s)
    read_bytes_per_s = read_bytes / (end_s - start_s) if read_bytes is not None else None
    gpu_peaks = timeline.series("gpu:0", "memory_bandwidth_peak_bytes_per_s")[1]
    if engine_family in ("vllm", "sglang") and gpu_peaks.size:
        ceiling, ceiling_name = float(gpu_peaks[0]), "gpu:0 memory_bandwidth_peak_bytes_per_s"
    else:
        ceiling, ceiling_name = host_ceiling_bytes_per_s, "host memory_bandwidth_ceiling_bytes_per_s"
    mbu = read_bytes_per_s / ceiling if ceiling and read_bytes_per_s is not None else None

    # One headline "DRAM bandwidth utilisation": the GPU's hardware counter where the engine runs on
    # a GPU; the native engine always runs on the CPU, whatever GPUs the machine has.
    if dram_active is not None and engine_family != "native":
        util, util_source = dram_active, "DCGM_FI_PROF_DRAM_ACTIVE"
    else:
        util, util_source = mbu, "engine bytes read / memory ceiling" if mbu is not None else None

    t_s, rss = timeline.series("engine_process", "rss_bytes")
    rss = rss[(t_s >= start_s) & (t_s <= end_s)]
    return Telemetry(
        window_s=[start_s, end_s],
        gpu_dram_active_mean=dram_active,
        gpu_tensor_active_mean=_mean_over_gpus(timeline, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", start_s, end_s),
        gpu_energy_j=energy_j,
        energy_per_output_token_j=energy_j / output_tokens if energy and output_tokens > 0 else None,
        engine_read_bytes_per_s=read_bytes_per_s,
        engine_flops_per_s=flops / (end_s - start_s) if flops is not None else None,
        memory_bandwidth_ceiling_bytes_per_s=ceiling,
        memory_bandwidth_ceiling_source=ceiling_name if ceiling else None,
        mbu=mbu,
        dram_bandwidth_util_mean=util,
        dram_bandwidth_util_source=util_source,
        engine_cpu_percent_mean=window_mean(*timeline.series("engine_process", "cpu_percent"), start_s, end_s),
        host_cpu_percent_mean=window_mean(*timeline.series("host", "cpu_percent"), start_s, end_s),
        engine_rss_bytes_max=float(rss.max()) if rss.size else None,
    )
