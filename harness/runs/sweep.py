"""`load.sweep`: the scenario run at each listed load, one point after another, into one folder.

Each point is a whole run (harness.runs.run.run_scenario) into OUT/point-NNN-rate-R/ (point-NNN-concurrency-C/
for a closed loop; names and sweep.json are harness.results.folder'). sweep.json lists the points and their
status (pending, running, completed, interrupted, failed), rewritten as each point starts and ends, so
a sweep cut short says which points are whole. A launched engine (backend.launch) is started once,
its log in OUT/engine.log, and stopped after the last point: every point sees the same process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.session import engine_session
from harness.metrics.latencies import active_slo
from harness.metrics.slo_capacity import DEFAULT_ATTAINMENT, LoadPoint, max_load_meeting_slo
from harness.results.folder import point_dir_name, prepare_sweep_dir, write_manifest
from harness.results.schema import SweepPoint
from harness.runs.run import Reporter, RunResult, run_scenario
from harness.scenario.scenario import Scenario


@dataclass
class SweepPointStatus:
    index: int
    offered_load: float  # requests/s (rate sweep) or requests in flight (concurrency sweep)
    dir: str
    status: str = "pending"  # pending | running | completed | interrupted | failed
    client_bound: bool = False
    result: RunResult | None = field(default=None, repr=False)  # once it ran


def sweep_kind(scenario: Scenario) -> str:
    return "concurrency" if scenario.load.process.paced_by == "concurrency" else "rate"


def run_sweep(
    scenario: Scenario,
    out_dir: Path,
    workers: str | None = None,
    overwrite: bool = False,
    reporter: Reporter | None = None,
) -> list[SweepPointStatus]:
    """Runs every point against one engine. A point cut by a signal, by the engine's exit or with records
    missing (incomplete) ends the sweep (later points stay pending); an exception marks its point failed
    and goes on to the caller."""
    reporter = reporter or Reporter()
    kind = sweep_kind(scenario)
    points = [SweepPointStatus(i, v, point_dir_name(i, kind, v)) for i, v in enumerate(scenario.load.sweep)]
    lock = prepare_sweep_dir(out_dir, overwrite)
    try:
        _run_points(scenario, out_dir, points, kind, workers, reporter)
    finally:
        lock.release()
    return points


def _run_points(scenario, out_dir, points, kind, workers, reporter) -> None:
    """Each point in turn against one engine, sweep.json saved at each status change."""
    save = lambda: _save_manifest(out_dir, scenario, kind, points)  # noqa: E731
    save()
    with engine_session(scenario, out_dir / "engine.log", reporter.info) as session:
        for point, point_scenario in zip(points, scenario.sweep_points()):
            point.status = "running"
            save()
            reporter.info(f"point {point.index + 1}/{len(points)}: {kind} {point.offered_load:g}")
            try:
                point.result = run_scenario(
                    point_scenario, out_dir / point.dir, workers=workers, session=session, reporter=reporter
                )
            except KeyboardInterrupt:
                point.status = "interrupted"
                raise
            except BaseException:
                point.status = "failed"
                raise
            finally:
                save()
            result = point.result
            point.status = run_status(result)
            point.client_bound = result.client_bound
            save()
            reporter.info(point_line(point, kind))
            if point.status != "completed":
                break


def run_status(result: RunResult) -> str:
    """A finished run's status in a sweep's or a repeats folder's manifest. Records missing (a lost client
    process) make a run as unusable as the engine's exit."""
    if result.engine_exit or result.incomplete_reasons or result.not_written:
        return "failed"
    return "interrupted" if result.summary.interrupted else "completed"


def manifest_points(points: list[SweepPointStatus]) -> list[SweepPoint]:
    """sweep.json's rows: each point's index, load, folder and status (its RunResult stays out)."""
    return [SweepPoint.model_validate(p, from_attributes=True) for p in points]


def _save_manifest(out_dir: Path, scenario: Scenario, kind: str, points: list[SweepPointStatus]) -> None:
    write_manifest(out_dir, kind, scenario.resolved_dict(), manifest_points(points))


def point_line(point: SweepPointStatus, kind: str) -> str:
    """One console line: offered load, achieved throughput, TTFT p50/p99, goodput."""
    s = point.result.summary
    thr, good, ttft = s.throughput, s.goodput, s.ttft_ms
    offered = f"{point.offered_load:g} req/s" if kind == "rate" else f"{point.offered_load:g} in flight"

    def ms(v):
        return "-" if v is None else f"{v:.0f} ms"

    flags = "".join(
        f"; {flag}"
        for flag, on in (("CLIENT-BOUND", point.client_bound), (point.status, point.status != "completed"))
        if on
    )
    return (
        f"  offered {offered}: {thr.requests_per_s:.2f} req/s, {thr.output_tokens_per_s:.1f} output tok/s, "
        f"TTFT p50 {ms(ttft.p50)} p99 {ms(ttft.p99)}, goodput {100 * good.fraction:.0f}% "
        f"({good.requests_per_s:.2f} req/s){flags}"
    )


def capacity_line(scenario: Scenario, points: list[SweepPointStatus]) -> str:
    """The highest load meeting the scenario's SLOs, over the completed points."""
    slo = active_slo(scenario.slo.model_dump())
    if not slo:
        return "no SLO in the scenario (slo:), so no capacity to state; `bench report` draws the curves"
    done = [p for p in points if p.status == "completed"]
    if not done:
        return "no completed point, so no capacity to state"
    kind = sweep_kind(scenario)
    unit = "req/s" if kind == "rate" else "in flight"
    limits = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items())
    capacity = max_load_meeting_slo([LoadPoint.from_summary(p.offered_load, p.result.summary) for p in done])
    partial = len(done) < len(points)
    confidence = scenario.slo.confidence
    return (
        f"highest {kind} meeting {limits} for {DEFAULT_ATTAINMENT:.0%} of requests"
        + (f" (with {confidence:.0%} confidence: the share's lower bound)" if confidence else "")
        + (f", from the {len(done)} completed of {len(points)} points" if partial else "")
        + f": {capacity.describe(unit)}"
    )
