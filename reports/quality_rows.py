"""The report's answer-quality tables: each run's known-answer accuracy, and, for two runs of the same prompts,
how far their answers agree (harness/scenario/answers.py, harness/metrics/output_agreement.py)."""

from __future__ import annotations

from harness.metrics.output_agreement import agreement_lines, compare_runs
from harness.results.folder import ResultsError

ACCURACY_COLUMNS = ("run", "answers scored", "correct", "accuracy", "95% interval")


def accuracy_rows(labelled) -> list[list[str]]:
    rows = []
    for label, run in labelled:
        acc = run.summary.accuracy
        if acc is not None:
            interval = f"{acc.low:.1%} – {acc.high:.1%}"
            rows.append([label, str(acc.scored), str(acc.correct), f"{acc.share:.1%}", interval])
    return rows


def agreement_section(runs) -> tuple[list[str], list[str]]:
    """(lines, notes): the comparison of the second run's answers with the first's, when exactly two runs kept
    them; a pair that cannot be compared (other prompts) is a note, not an error of the report."""
    if len(runs) != 2 or not all(any(r.prompt_sha256 for r in run.records) for run in runs):
        return [], []
    try:
        result = compare_runs(runs[0].path, runs[1].path)
    except ResultsError as e:
        return [], [f"Answers not compared: {e}."]
    return [f"{runs[1].label} against {runs[0].label}:", *agreement_lines(result)], []
