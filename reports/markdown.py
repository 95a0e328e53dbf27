"""Markdown rendering: the same tables as the HTML report, for PR comments and CI summaries."""

from __future__ import annotations

from reports.confidence_rows import INTERVAL_COLUMNS, VALIDITY_COLUMNS
from reports.mix_rows import MIX_COLUMNS, MIX_NOTE, MODALITY_COLUMNS, MODALITY_NOTE, TURN_KIND_COLUMNS, TURN_KIND_NOTE
from reports.prediction import PREDICTION_COLUMNS
from reports.quality_rows import ACCURACY_COLUMNS
from reports.repeat_runs import REPEAT_COLUMNS, REPEATS_NOTE
from reports.replicas import REPLICA_COLUMNS
from reports.telemetry_rows import TELEMETRY_COLUMNS, TELEMETRY_NOTE

SUMMARY_COLUMNS = (
    "run",
    "completed",
    "failed",
    "req/s",
    "output tok/s",
    "goodput req/s",
    "goodput %",
    "TTFT p50",
    "TTFT p99",
    "ITL p50",
    "ITL p99",
    "TPOT p50",
    "TPOT p99",
    "E2E p50",
    "E2E p99",
)
INTERVALS_NOTE = (
    "Distribution-free intervals from order statistics (ms): the true percentile lies inside with at least the "
    "stated confidence; a percentile the sample count cannot bound says how many samples it needs."
)


def md_table(columns, rows) -> str:
    def cell(v) -> str:
        return str(v).replace("|", "\\|")

    lines = [
        "| " + " | ".join(cell(c) for c in columns) + " |",
        "|" + "|".join("---" if i == 0 else "---:" for i in range(len(columns))) + "|",
    ]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def render_report_md(content) -> str:
    out = [f"# {content.title}", ""]
    out += [f"> {note}" for note in content.notes]
    out += _run_tables(content)
    out += _replicas(content)
    out += _sweeps(content.sweeps)
    out += _runs_and_plots(content)
    return "\n".join(out)


def _run_tables(content) -> list[str]:
    """The sections of per-run tables, each only where the runs have its rows."""
    out = []
    if content.summary_rows:
        out += [
            "## Summary",
            "",
            "Latencies in ms from each request's intended send time; goodput = completed requests that met every SLO.",
            "",
            md_table(SUMMARY_COLUMNS, content.summary_rows),
            "",
        ]
    if content.repeat_rows:
        out += ["## Across repeats", "", REPEATS_NOTE, "", md_table(REPEAT_COLUMNS, content.repeat_rows), ""]
    if content.validity_rows:
        out += ["## Validity", "", md_table(VALIDITY_COLUMNS, content.validity_rows), ""]
    if content.interval_rows:
        intervals = md_table(INTERVAL_COLUMNS, content.interval_rows)
        out += ["## Percentile confidence intervals", "", INTERVALS_NOTE, "", intervals, ""]
    if content.agreement_lines:
        out += ["## Answers compared", "", *[f"- {line}" for line in content.agreement_lines], ""]
    if content.accuracy_rows:
        out += ["## Known-answer accuracy", "", md_table(ACCURACY_COLUMNS, content.accuracy_rows), ""]
    if content.mix_rows:
        out += ["## By model (workload.mix)", "", MIX_NOTE, "", md_table(MIX_COLUMNS, content.mix_rows), ""]
    if content.turn_kind_rows:
        table = md_table(TURN_KIND_COLUMNS, content.turn_kind_rows)
        out += ["## By turn kind (agentic sessions)", "", TURN_KIND_NOTE, "", table, ""]
    if content.modality_rows:
        table = md_table(MODALITY_COLUMNS, content.modality_rows)
        out += ["## By modality (workload.images)", "", MODALITY_NOTE, "", table, ""]
    if content.telemetry_rows:
        out += ["## Devices", "", TELEMETRY_NOTE, "", md_table(TELEMETRY_COLUMNS, content.telemetry_rows), ""]
    if content.prediction_rows:
        out += ["## Prediction beside measurement", "", md_table(PREDICTION_COLUMNS, content.prediction_rows), ""]
    if content.diagnosis_rows:
        out += ["## Diagnosis", "", md_table(["run", "severity", "finding"], content.diagnosis_rows), ""]
    if content.roofline_rows:
        out += ["## Roofline", "", md_table(["run", "placement"], content.roofline_rows), ""]
    return out


def _replicas(content) -> list[str]:
    if not content.replica_rows:
        return []
    out = [
        "## Replicas",
        "",
        "Over each run, warm-ups included (the router's and each replica's own counters).",
        "",
        *[f"- {note}" for note in content.replica_notes],
        "",
        md_table(REPLICA_COLUMNS, content.replica_rows),
        "",
    ]
    if content.decision_rows:
        out += [md_table(["run", "policy", "reason", "routing decisions"], content.decision_rows), ""]
    return out


def _sweeps(sweeps) -> list[str]:
    """A section per sweep: its capacity at the SLOs, then a summary row per load."""
    out = []
    for s in sweeps:
        unit = "req/s" if s.sweep.load_kind == "rate" else "in flight"
        out += [
            f"## Sweep: {s.sweep.label}",
            "",
            f"**Highest {s.sweep.load_kind} meeting the SLOs for {s.capacity.attainment:.0%} of requests: "
            f"{s.capacity.describe(unit)}**",
            "",
            md_table(SUMMARY_COLUMNS, s.rows),
            "",
        ]
    return out


def _runs_and_plots(content) -> list[str]:
    """Each run's context, then where the plots are (the HTML report only)."""
    context_columns = ["run", "backend", "offered load", "SLO (ms)", "harness", "host", "start-up", "status"]
    return [
        "## Runs",
        "",
        md_table(context_columns, content.context_rows),
        "",
        "Plots (CDFs, timelines, over-time, server metrics) are in the HTML report: "
        + ", ".join(heading for heading, _ in content.figures)
        + ".",
        "",
    ]
