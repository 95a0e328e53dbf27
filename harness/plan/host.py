"""Co-located replicas sharing one host's CPU cores (plan.host_cores): a step slows down when the busy
engine processes and the rest of the host's work ask for more cores than the host has.

A fitted step model's times are one engine's, measured beside the client alone. Replicas on one CPU host
(this machine's native engines) share its cores: while k replicas are stepping they and the client (and a
router) ask for k x engine_cores + other_cores cores, and a step stretches by that demand over the host's
cores once it passes them (the kernel shares the cores evenly among what is runnable), relative to the
demand the calibration ran under (one engine):

    slowdown(k) = max(1, (k x engine_cores + other_cores) / host_cores)
                  / max(1, (engine_cores + other_cores) / host_cores)

k counts the replicas with a step in flight when the step starts, itself included; the step's length is fixed
then (a replica that starts or stops mid-step does not change it). engine_cores (what one stepping engine
process takes: its step thread, the server's HTTP and tokenization; at least 1) and other_cores (the client
and whatever else ran) default to the fitted runs' telemetry: the engine process's CPU over its busy time, and
the host's CPU less the engine's, over the measured window. Not modelled: memory bandwidth and cache sharing
(docs/planner.md has a measurement: it matters for batch-1 decode steps, which stream the weights), a router's
CPU unless it is added to plan.host_other_cores, a client that grows busier with the load. A GPU deployment
leaves host_cores unset: each replica has its own device.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from harness.engine.step_trace import read_engine_trace
from harness.results.schema import Telemetry

DEFAULT_ENGINE_CORES = 1.0  # one BLAS thread a step; used when no fitted run has telemetry


@dataclass(frozen=True)
class HostShare:
    host_cores: float
    engine_cores: float  # cores one stepping engine process takes
    other_cores: float  # cores the client, a router and anything else on the host take
    source: str  # where engine_cores and other_cores came from

    def slowdown(self, busy_engines: int) -> float:
        """A step's time over its calibrated time while busy_engines replicas (this one included) step."""
        calibrated = max(1.0, (self.engine_cores + self.other_cores) / self.host_cores)
        demand = busy_engines * self.engine_cores + self.other_cores
        return max(1.0, demand / self.host_cores) / calibrated

    def describe(self) -> dict:
        return {"form": "max(1, (busy x engine_cores + other_cores) / host_cores) over one engine's", **asdict(self)}


def host_share(plan, fitted_dirs: list[str] | None) -> HostShare | None:
    """The plan's host sharing (None: host_cores unset, replicas do not share cores); what the plan leaves
    out is read from the fitted runs' telemetry."""
    if plan is None or plan.host_cores is None:
        return None
    measured = measured_cores(fitted_dirs or [])
    engine_cores, other_cores = plan.engine_cores, plan.host_other_cores
    if engine_cores is not None and other_cores is not None:
        source = "plan"
    elif measured is not None:
        source = "fitted runs"
    else:
        source = "defaults (no telemetry in the fitted runs)"
    if engine_cores is None:
        engine_cores = DEFAULT_ENGINE_CORES if measured is None else measured.engine_cores
    if other_cores is None:
        other_cores = 0.0 if measured is None else measured.other_cores
    return HostShare(plan.host_cores, engine_cores, other_cores, source)


@dataclass(frozen=True)
class MeasuredCores:
    """What the fitted runs' telemetry says of the cores, as means over the runs."""

    engine_cores: float  # one stepping engine process
    other_cores: float  # the client and the rest of the host


class _SummaryTelemetry(BaseModel):
    """The part of summary.json read here, its other keys ignored: a fitted run's summary need not be whole."""

    model_config = ConfigDict(extra="ignore")
    telemetry: Telemetry | None = None


def measured_cores(run_dirs: list[str]) -> MeasuredCores | None:
    """Means over the runs that have telemetry (summary.json) and a step trace; None when none has."""
    engine, other = [], []
    for run_dir in map(Path, run_dirs):
        summary_path, trace_path = run_dir / "summary.json", run_dir / "engine_trace.json"
        if not summary_path.is_file() or not trace_path.is_file():
            continue
        t = _SummaryTelemetry.model_validate_json(summary_path.read_bytes()).telemetry or Telemetry()
        engine_pct, host_pct, window = t.engine_cpu_percent_mean, t.host_cpu_percent_mean, t.window_s
        busy_s = sum(s["dur_s"] for s in read_engine_trace(trace_path))
        if engine_pct is None or host_pct is None or not window or busy_s <= 0:
            continue
        window_s = window[1] - window[0]
        # the engine's CPU seconds per second it stepped; its step thread is runnable all the step, so it asks for
        # a core at least (less measured: other work held it off, which is what the model is to predict)
        engine.append(max(DEFAULT_ENGINE_CORES, engine_pct / 100 * window_s / busy_s))
        other.append(max(0.0, host_pct - engine_pct) / 100)
    if not engine:
        return None
    return MeasuredCores(engine_cores=sum(engine) / len(engine), other_cores=sum(other) / len(other))
