"""`load.sweep`: the scenario run at each listed load, one point after another, into one folder.

OUT/point-NNN-rate-R/ (point-NNN-concurrency-C/ for a closed loop) is a complete run folder per
point, named as reports.load reads them. OUT/sweep.json lists the points and their status
(pending, running, completed, interrupted, failed), rewritten as each point starts and ends, so a
sweep cut short says which points are whole. A launched engine (backend.launch) is started once,
its log in OUT/engine.log, and stopped after the last point: every point sees the same process.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

MANIFEST = "sweep.json"


@dataclass
class SweepPointStatus:
    index: int
    offered_load: float  # requests/s (rate sweep) or requests in flight (concurrency sweep)
    dir: str
    status: str = "pending"  # pending | running | completed | interrupted | failed
    client_bound: bool = False
    summary: dict | None = field(default=None, repr=False)  # the point's summary.json, once it ran


def sweep_kind(scenario) -> str:
    return "concurrency" if scenario.load.arrival == "closed" else "rate"


def point_dir_name(index: int, kind: str, value: float) -> str:
    # positional digits (no exponent) so the folder name matches reports.load.POINT_DIR
    return f"point-{index:03d}-{kind}-{np.format_float_positional(value, trim='-')}"


def run_sweep(scenario, out_dir: Path, workers_option: str | None, console) -> list[SweepPointStatus]:
    """Runs every point (harness.cli.execute) against one engine. Ctrl-C or a failure ends the sweep:
    the point it hit is marked, later points stay pending, and the exception goes on to the caller."""
    from backends import load_backend
    from harness.cli import execute
    from harness.launcher import launch
    from harness.results import ResultWriter

    kind = sweep_kind(scenario)
    points = [SweepPointStatus(i, v, point_dir_name(i, kind, v)) for i, v in enumerate(scenario.load.sweep)]
    out_dir.mkdir(parents=True, exist_ok=True)
    write_manifest(out_dir, scenario, kind, points)
    backend, launched = scenario.backend, None
    try:
        if backend.launch is not None:
            console.print(f"starting the {backend.kind} engine once for {len(points)} points "
                          f"(log: {out_dir / 'engine.log'})")
            launched = launch(load_backend(backend.kind, tuple(backend.eos_token_ids), backend.profile, backend.trace), backend.launch, backend.url,
                              backend.model, out_dir / "engine.log", backend.headers)
        for point, point_scenario in zip(points, scenario.sweep_points()):
            point.status = "running"
            write_manifest(out_dir, scenario, kind, points)
            console.print(f"[bold]point {point.index + 1}/{len(points)}[/]: {kind} {point.offered_load:g}")
            writer = ResultWriter(out_dir / point.dir)
            try:
                point.summary = execute(point_scenario, writer, workers_option, console, launched=launched)
            except KeyboardInterrupt:
                point.status = "interrupted"
                raise
            except BaseException:
                point.status = "failed"
                raise
            finally:
                writer.close()
                write_manifest(out_dir, scenario, kind, points)
            point.status = "interrupted" if point.summary["interrupted"] else "completed"
            point.client_bound = bool(point.summary["client_bound"])
            write_manifest(out_dir, scenario, kind, points)
            console.print(point_line(point, kind))
            if point.status == "interrupted":
                break
    finally:
        if launched:
            launched.stop()
    return points


def point_line(point: SweepPointStatus, kind: str) -> str:
    """One console line: offered load, achieved throughput, TTFT p50/p99, goodput."""
    s = point.summary
    thr, good, ttft = s["throughput"], s["goodput"], s["ttft_ms"]
    offered = f"{point.offered_load:g} req/s" if kind == "rate" else f"{point.offered_load:g} in flight"

    def ms(v):
        return "-" if v is None else f"{v:.0f} ms"
    flags = "".join(f"; {flag}" for flag, on in (("CLIENT-BOUND", point.client_bound),
                                                 ("interrupted", point.status == "interrupted")) if on)
    return (f"  offered {offered}: {thr['requests_per_s']:.2f} req/s, {thr['output_tokens_per_s']:.1f} output tok/s, "
            f"TTFT p50 {ms(ttft['p50'])} p99 {ms(ttft['p99'])}, goodput {100 * good['fraction']:.0f}% "
            f"({good['requests_per_s']:.2f} req/s){flags}")


def capacity_line(out_dir: Path, scenario) -> str:
    """The highest load meeting the scenario's SLOs, over the completed points (reports.sweep)."""
    from reports.load import load_sweep
    from reports.sweep import DEFAULT_ATTAINMENT, max_rate_meeting_slo

    slo = {k: v for k, v in scenario.slo.model_dump().items() if v is not None}
    if not slo:
        return "no SLO in the scenario (slo:), so no capacity to state; `bench report` draws the curves"
    sweep = load_sweep(out_dir)
    unit = "req/s" if sweep.load_kind == "rate" else "in flight"
    limits = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items())
    capacity = max_rate_meeting_slo(sweep.points)
    partial = len(sweep.points) < len(scenario.load.sweep)
    return (f"highest {sweep.load_kind} meeting {limits} for {DEFAULT_ATTAINMENT:.0%} of requests"
            + (f", from the {len(sweep.points)} completed of {len(scenario.load.sweep)} points" if partial else "")
            + f": {capacity.describe(unit)}")


def write_manifest(out_dir: Path, scenario, kind: str, points: list[SweepPointStatus]) -> None:
    from harness.results import write_json

    rows = [{k: v for k, v in asdict(p).items() if k != "summary"} for p in points]
    write_json(out_dir / MANIFEST, {"kind": kind, "unit": "requests/s" if kind == "rate" else "requests in flight",
                                    "scenario": scenario.resolved_dict(), "points": rows})


def read_statuses(out_dir: Path) -> dict[str, str]:
    """Point folder name -> status, from sweep.json; empty when the folder has none."""
    import json

    path = Path(out_dir) / MANIFEST
    if not path.is_file():
        return {}
    return {p["dir"]: p["status"] for p in json.loads(path.read_text(encoding="utf-8")).get("points", [])}
