"""`bench plan`'s results folders for sweeps and candidates, in the layout `bench run` writes
(point-NNN-... folders with sweep.json; one folder per candidate with candidates.json), so
`bench report` and `bench select` read a simulated sweep or comparison as they read a measured one."""

from __future__ import annotations

from pathlib import Path

from harness.plan.simulator import simulate_scenario
from harness.results.folder import (
    CANDIDATES_MANIFEST,
    ResultsError,
    point_dir_name,
    prepare_sweep_dir,
    write_candidates,
    write_manifest,
)
from harness.runs.candidates import CandidateStatus, manifest_candidates
from harness.runs.run import RunResult
from harness.runs.sweep import SweepPointStatus, manifest_points, sweep_kind
from harness.scenario.scenario import Scenario


def simulate_sweep(scenario: Scenario, out_dir: Path, overwrite: bool = False) -> list[SweepPointStatus]:
    kind = sweep_kind(scenario)
    points = [SweepPointStatus(i, v, point_dir_name(i, kind, v)) for i, v in enumerate(scenario.load.sweep)]
    lock = prepare_sweep_dir(out_dir, overwrite)
    try:
        for point, point_scenario in zip(points, scenario.sweep_points()):
            summary = simulate_scenario(point_scenario, out_dir / point.dir)
            point.status, point.result = "completed", RunResult(out_dir / point.dir, summary, None)
        write_manifest(out_dir, kind, scenario.resolved_dict(), manifest_points(points))
    finally:
        lock.release()
    return points


def simulate_candidates(scenario: Scenario, out_dir: Path, overwrite: bool = False) -> list[CandidateStatus]:
    if (out_dir / CANDIDATES_MANIFEST).exists() and not overwrite:
        raise ResultsError(
            f"--output: {out_dir} already holds candidates' results ({CANDIDATES_MANIFEST}); choose a "
            f"new folder, or pass --overwrite to replace them"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    statuses = []
    for candidate, cand_scenario in scenario.candidate_scenarios():
        status = CandidateStatus(candidate.name, candidate.name, list(candidate.launch_args), candidate.accelerators)
        if cand_scenario.load.sweep is not None:
            simulate_sweep(cand_scenario, out_dir / status.dir, overwrite)
        else:
            simulate_scenario(cand_scenario, out_dir / status.dir, overwrite=overwrite)
        status.status = "completed"
        statuses.append(status)
    write_candidates(out_dir, scenario.resolved_dict(), manifest_candidates(statuses))
    return statuses
