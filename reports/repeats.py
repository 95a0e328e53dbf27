"""One side of `bench gate`: a single run folder, a peer tool's result file (reports/peers), or a folder of
repeated runs of one scenario
(which folders those are: harness.results.folder.run_dirs). Repeats are only
comparable when they ran the same scenario: same name, workload and load (the seed may differ:
the same distribution with fresh prompts keeps a shared engine's prefix cache out of the picture).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.metrics.validity import skip_reason
from harness.results.folder import ResultsError, run_dirs
from reports.load import RunData, load_peer_run, load_run
from reports.peers import find_peer_file

SAME_SCENARIO_KEYS = ("name", "workload", "load")


@dataclass
class RunSet:
    path: Path
    runs: list[RunData]
    skipped: list[str] = field(default_factory=list)  # "<folder>: <why it is invalid>" for each run left out

    @property
    def scenario(self) -> dict:
        return self.runs[0].run_info.scenario


def load_run_set(path: str | Path, keep_invalid: bool = False) -> RunSet:
    """The runs of one side; an invalid run (summary.json validity) is left out, named in `skipped` with its
    reasons, unless `keep_invalid`. A side with no valid run is a ResultsError."""
    path = Path(path)
    runs, skipped = [], []
    loaded = [load_peer_run(path)] if find_peer_file(path) is not None else [load_run(d) for d in run_dirs(path)]
    for run in loaded:
        why = None if keep_invalid else skip_reason(run.summary)
        if why is None:
            runs.append(run)
        else:
            skipped.append(f"{run.path}: invalid: {why}")
    if not runs:
        raise ResultsError(
            f"{path}: every run is invalid, so there is nothing to judge:\n"
            + "\n".join(skipped)
            + "\nrerun them, or pass --keep-invalid to judge them anyway"
        )
    return RunSet(path, runs, skipped)


def check_same_scenario(*sides: RunSet) -> None:
    """Every run of every side ran the first baseline run's scenario (name, workload, load), or ResultsError."""
    first = sides[0].runs[0]
    want = scenario_settings(first.run_info.scenario)
    for side in sides:
        for run in side.runs:
            got = scenario_settings(run.run_info.scenario)
            odd = sorted(k for k in set(want) | set(got) if want.get(k) != got.get(k))
            if odd:
                detail = "; ".join(f"{k}: {got.get(k)!r} vs {want.get(k)!r}" for k in odd)
                raise ResultsError(
                    f"{run.path}: not the same scenario as {first.path} ({detail}); "
                    f"gate only repeats of one scenario against each other"
                )


def scenario_settings(scenario: dict) -> dict:
    """A resolved scenario's name, workload and load as flat dotted keys. Unset (None) keys are left out: a run
    recorded before a new scenario option existed has no key for it, a newer one has it as None."""

    def flat(value, key: str) -> dict:
        if isinstance(value, dict):
            return {k: v for sub, x in value.items() for k, v in flat(x, f"{key}.{sub}").items()}
        return {} if value is None else {key: value}

    return {k: v for name in SAME_SCENARIO_KEYS for k, v in flat(scenario.get(name), name).items()}
