"""MFU, MBU and the per-step overhead of the roofline step model, fitted to one measured run.

Two sources of what the engine did and how long it took:
- its step trace (engine_trace.json, native engine with backend.trace): per step the duration and the
  bytes and FLOPs the engine counted;
- vLLM's own counters in server_metrics.csv (`--enable-mfu-metrics`): between two scrapes with requests
  running, the FLOPs and bytes estimated per GPU and the steps run (iteration_tokens_total's count). An
  interval is a sum of steps: a coarser fit than the trace's.
The plan's model adds, per kernel group, its compute time and its reads (roofline_model.py), so a step's (or an
interval's) time is linear in its totals: duration = FLOPs x s/FLOP + bytes x s/byte + steps x overhead. Least
squares on relative error (each row divided by its duration: short decode steps count as much as long
prefills), non-negative. A term the fit leaves at 0 (no row told it apart) keeps its default, said in `notes`.
peak_flops is the peak of the precision the run's matmuls ran in (roofline_scenario passes plan.compute_dtype's).
"""

from __future__ import annotations

import csv
import dataclasses
from collections import defaultdict
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict
from scipy.optimize import nnls

from harness.engine.step_trace import read_engine_trace
from harness.plan.roofline_model import DEFAULTS, RooflineParams
from harness.plan.step_model import FitRange, is_simulated_run, trace_fit_range

VLLM_COUNTERS = {
    "flops": "vllm:estimated_flops_per_gpu_total",
    "bytes": "vllm:estimated_read_bytes_per_gpu_total",
    "steps": "vllm:iteration_tokens_total_count",
    "running": "vllm:num_requests_running",
}


@dataclass(frozen=True)
class RooflineFit:
    params: RooflineParams
    peak_flops: float
    peak_bytes_per_s: float
    source: str  # "step trace" | "vLLM server metrics"
    rows: int  # steps, or scrape intervals
    compute_bound_rows: int  # rows whose compute time, as fitted, exceeds their reads'
    median_abs_error: float  # |predicted - measured| / measured over the rows
    notes: list[str]
    # the batches and contexts of the traced steps (None from vLLM's counters: an interval has no one batch)
    fit_range: FitRange | None = None


class _Ceilings(BaseModel):
    model_config = ConfigDict(extra="ignore")
    flops_per_s: float
    bytes_per_s: float


class _RooflineSection(BaseModel):
    model_config = ConfigDict(extra="ignore")
    ceilings: _Ceilings | None = None  # the peaks the run's roofline was drawn against


class _SummaryRoofline(BaseModel):
    """The part of summary.json the fit reads, other keys ignored: only the two peaks of the roofline's ceilings
    (harness.results.schema.Roofline holds the whole section), so a summary cut down to them still fits."""

    model_config = ConfigDict(extra="ignore")
    roofline: _RooflineSection | None = None


def fit_roofline(
    run_dir: str | Path, peak_flops: float | None = None, peak_bytes_per_s: float | None = None
) -> RooflineFit:
    """Fit against the ceilings given (the hardware the run measured on), else those its summary.json's
    roofline block used (measured on a CPU, published for a GPU)."""
    run_dir = Path(run_dir)
    if is_simulated_run(run_dir):
        raise ValueError(f"{run_dir} is a simulated run (bench plan): its steps are a model's; fit to a measured run")
    if (run_dir / "engine_trace.json").is_file():
        source, (flops, moved, steps, dur) = "step trace", trace_rows(run_dir / "engine_trace.json")
    elif (run_dir / "server_metrics.csv").is_file() and (rows := vllm_rows(run_dir / "server_metrics.csv")):
        source, (flops, moved, steps, dur) = "vLLM server metrics", rows
    else:
        raise FileNotFoundError(
            f"{run_dir}: fitting the roofline needs the engine's step trace (measure with "
            "backend.trace: true) or vLLM's --enable-mfu-metrics counters in server_metrics.csv"
        )
    if len(dur) < 3:
        raise ValueError(f"{run_dir}: {len(dur)} rows from the {source}; the fit needs at least 3")
    if peak_flops is None or peak_bytes_per_s is None:
        roofline = _SummaryRoofline.model_validate_json((run_dir / "summary.json").read_bytes()).roofline
        if roofline is None or roofline.ceilings is None:
            raise ValueError(
                f"{run_dir}/summary.json has no roofline.ceilings; pass peak_flops and "
                "peak_bytes_per_s (the hardware the run measured on)"
            )
        peak_flops = peak_flops or roofline.ceilings.flops_per_s
        peak_bytes_per_s = peak_bytes_per_s or roofline.ceilings.bytes_per_s
    (per_flop, per_byte, overhead_s), _ = nnls(np.column_stack([flops, moved, steps]) / dur[:, None], np.ones_like(dur))
    notes, mfu, mbu = [], DEFAULTS.mfu, DEFAULTS.mbu
    if per_flop > 0:
        mfu = 1 / (per_flop * peak_flops)
    else:
        notes.append(f"the fit charged nothing per FLOP: mfu stays at its default {mfu}")
    if per_byte > 0:
        mbu = 1 / (per_byte * peak_bytes_per_s)
    else:
        notes.append(f"the fit charged nothing per byte: mbu stays at its default {mbu}")
    compute_s, memory_s = flops / (peak_flops * mfu), moved / (peak_bytes_per_s * mbu)
    predicted, compute_bound = compute_s + memory_s + overhead_s * steps, compute_s > memory_s
    error = float(np.median(np.abs(predicted - dur) / dur))
    params = dataclasses.replace(DEFAULTS, mfu=float(mfu), mbu=float(mbu), overhead_ms=float(overhead_s * 1e3))
    fitted_range = trace_fit_range(run_dir) if source == "step trace" else None
    return RooflineFit(
        params, peak_flops, peak_bytes_per_s, source, len(dur), int(compute_bound.sum()), error, notes, fitted_range
    )


def trace_rows(path: Path) -> tuple[np.ndarray, ...]:
    """(flops, bytes, steps = 1, duration_s) per traced step that counted its bytes."""
    steps = [s for s in read_engine_trace(path) if s["bytes_read"] > 0 and s["dur_s"] > 0]
    return (
        np.array([s["flops"] for s in steps], dtype=float),
        np.array([s["bytes_read"] for s in steps], dtype=float),
        np.ones(len(steps)),
        np.array([s["dur_s"] for s in steps], dtype=float),
    )


def vllm_rows(path: Path) -> tuple[np.ndarray, ...] | None:
    """(flops, bytes, steps, duration_s) per scrape interval with requests running at both ends and steps run;
    None without vLLM's MFU counters. Values are summed over label sets (engines, models)."""
    wanted = {name: key for key, name in VLLM_COUNTERS.items()}
    samples: dict[float, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    with open(path, newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["name"] in wanted:
                samples[float(row["t_s"])][wanted[row["name"]]] += float(row["value"])
    times = sorted(t for t, s in samples.items() if set(VLLM_COUNTERS) <= set(s))
    rows = []
    for a, b in pairwise(times):
        sa, sb = samples[a], samples[b]
        delta = {k: sb[k] - sa[k] for k in ("flops", "bytes", "steps")}
        if sa["running"] > 0 and sb["running"] > 0 and delta["steps"] > 0 and delta["bytes"] > 0:
            rows.append((delta["flops"], delta["bytes"], delta["steps"], b - a))
    return tuple(np.array(column, dtype=float) for column in zip(*rows)) if rows else None
