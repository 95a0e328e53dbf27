"""Results folders of `bench run` with `candidates:` (harness/runs/candidates.py): OUT/candidates.json
and a folder per candidate. Given such a folder, reports read each completed candidate as one
results folder named after it; failed ones are listed with their reason, not silently dropped."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.results.folder import ResultsError, read_candidates


@dataclass
class Expanded:
    paths: list[Path]
    labels: list[str] | None
    accelerators: dict[str, int] = field(default_factory=dict)  # label -> accelerators the candidate occupied
    left_out: list[str] = field(default_factory=list)  # "1P1D: failed (the engine exited ...)"


def expand_candidates(paths, labels: list[str] | None = None) -> Expanded:
    """Each candidates folder becomes its candidates' folders (labelled by name); other paths stay as given."""
    if labels and len(labels) != len(paths):
        raise ResultsError(f"--label: got {len(labels)} labels for {len(paths)} results folders; give one per folder")
    out = Expanded([], [] if labels or any(read_candidates(Path(p)) for p in paths) else None)
    for i, p in enumerate(map(Path, paths)):
        candidates = read_candidates(p) if p.is_dir() else []
        if not candidates:
            out.paths.append(p)
            if out.labels is not None:
                out.labels.append(labels[i] if labels else p.name)
            continue
        for c in candidates:
            label = c.name if not labels or len(paths) == 1 else f"{labels[i]}/{c.name}"
            if c.status != "completed":
                why = f" ({c.reason})" if c.reason else ""
                out.left_out.append(f"{label}: {c.status}{why}")
                continue
            out.paths.append(p / c.dir)
            out.labels.append(label)
            out.accelerators[label] = c.accelerators
    if not out.paths:
        raise ResultsError(
            f"{', '.join(map(str, paths))}: no candidate completed ({'; '.join(out.left_out)}); "
            f"see candidates.json and each candidate's engine.log"
        )
    return out
