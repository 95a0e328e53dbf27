"""Results folders of `bench run --repeats` (harness/runs/repeats.py): OUT/repeats.json and a run folder per repeat.
Given such a folder, reports read each completed repeat as a run (labelled `<folder>/repeat-K`) and show the
table of means across the valid ones that repeats.json holds; repeats not completed are listed, not dropped."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.results.folder import ResultsError, read_model
from harness.results.schema import Repeat, RepeatsManifest
from harness.runs.repeats import MANIFEST

REPEAT_COLUMNS = ("repeats", "metric", "unit", "mean", "interval", "±", "per repeat")
REPEATS_NOTE = (
    "Each headline figure's mean across the repeats counted (the valid ones unless --keep-invalid), with its "
    "Student t interval at the runs' confidence: where the mean of this scenario's runs lies "
    "(harness/metrics/across_runs.py)."
)


@dataclass
class ExpandedRepeats:
    paths: list[Path]
    labels: list[str] | None
    rows: list[list[str]] = field(default_factory=list)  # a row per (repeats folder, headline metric)
    notes: list[str] = field(default_factory=list)  # per folder: how many repeats, why they stopped, left out


def expand_repeats(paths, labels: list[str] | None = None) -> ExpandedRepeats:
    """Each repeats folder becomes its completed repeats' run folders; other paths stay as given."""
    held: list[RepeatsManifest | None] = [read_model(Path(p) / MANIFEST) if Path(p).is_dir() else None for p in paths]
    out = ExpandedRepeats([], [] if labels or any(held) else None)
    for i, (path, manifest) in enumerate(zip(map(Path, paths), held)):
        name = labels[i] if labels else path.name
        if manifest is None:
            out.paths.append(path)
            if out.labels is not None:
                out.labels.append(name)
            continue
        done = [r for r in manifest.repeats if r.status == "completed"]
        if not done:
            raise ResultsError(f"{path}: no repeat completed ({MANIFEST}: stopped {manifest.stopped}); rerun it")
        out.paths += [path / r.dir for r in done]
        out.labels += [f"{name}/{r.dir}" for r in done]
        out.rows += repeat_rows(name, manifest)
        out.notes.append(repeats_note(name, manifest, done))
    return out


def repeat_rows(name: str, manifest: RepeatsManifest) -> list[list[str]]:
    rows = []
    for metric, m in manifest.metrics.items():
        interval = "-" if m.low is None else f"{m.low:,.2f} – {m.high:,.2f}"
        share = "-" if m.relative_half_width is None else f"{100 * m.relative_half_width:.1f}%"
        mean = "-" if m.mean is None else f"{m.mean:,.2f}"
        values = ", ".join(f"{v:,.1f}" for v in m.values)
        rows.append([name, metric, m.unit, mean, interval, share, values])
    return rows


def repeats_note(name: str, manifest: RepeatsManifest, done: list[Repeat]) -> str:
    until = manifest.until_ci
    invalid = [f"{r.dir} ({'; '.join(r.reasons)})" for r in done if r.valid is False]
    kept = "counted in the means (--keep-invalid)" if manifest.keep_invalid else "left out of the means"
    cut = [f"{r.dir} ({r.status})" for r in manifest.repeats if r.status in ("running", "interrupted", "failed")]
    return (
        f"{name}: {len(done)} of up to {manifest.max_repeats} repeats completed, stopped: "
        f"{manifest.stopped}"
        + (f" (until ±{100 * until:g}%)" if until else "")
        + (f"; invalid, {kept}: {', '.join(invalid)}" if invalid else "")
        + (f"; not completed: {', '.join(cut)}" if cut else "")
        + "."
    )
