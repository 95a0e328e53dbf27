"""`bench report`: results folders in, one offline HTML file and a Markdown file out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.startup import startup_text
from reports.candidates import expand_candidates
from reports.confidence_rows import interval_rows, validity_rows
from reports.explain_figures import phase_bars, step_timeline
from reports.figures import latency_cdfs, over_time, timeline
from reports.html import render_report_html
from reports.load import RunData, Sweep, load_results
from reports.markdown import render_report_md
from reports.prediction import is_simulated, prediction_rows
from reports.quality_rows import accuracy_rows, agreement_section
from reports.repeat_runs import expand_repeats
from reports.replica_figures import replica_comparison, replica_load
from reports.replicas import decision_rows, replica_rows, replica_view
from reports.server_figures import server_metrics, telemetry
from reports.sweep import DEFAULT_ATTAINMENT, SloCapacity, max_rate_meeting_slo
from reports.sweep_figures import goodput_vs_load, throughput_latency

MAX_TIMELINES = 4  # one timeline per run; past a few the page gets long and says little more


@dataclass
class SweepSection:
    sweep: Sweep
    capacity: SloCapacity
    rows: list[list[str]]  # the summary row of each point


@dataclass
class ReportContent:
    title: str
    runs: list[RunData]
    sweeps: list[SweepSection]
    summary_rows: list[list[str]]
    context_rows: list[list[str]]
    figures: list = field(default_factory=list)  # (heading, plotly Figure)
    notes: list[str] = field(default_factory=list)
    diagnosis_rows: list[list[str]] = field(default_factory=list)  # run, severity, finding (summary.json diagnosis)
    roofline_rows: list[list[str]] = field(default_factory=list)  # run, the roofline line
    prediction_rows: list[list[str]] = field(default_factory=list)  # simulated runs beside measured ones
    replica_rows: list[list[str]] = field(default_factory=list)  # a row per replica of each deployment run
    decision_rows: list[list[str]] = field(default_factory=list)  # run, policy, reason, decisions
    replica_notes: list[str] = field(default_factory=list)  # a sentence per deployment run: who served what
    interval_rows: list[list[str]] = field(default_factory=list)  # run, metric, each percentile's interval
    validity_rows: list[list[str]] = field(default_factory=list)  # run, valid or INVALID, the reasons
    accuracy_rows: list[list[str]] = field(default_factory=list)  # run, a known-answer task's accuracy
    agreement_lines: list[str] = field(default_factory=list)  # two runs' answers compared (bench compare-outputs)
    repeat_rows: list[list[str]] = field(default_factory=list)  # a repeats folder's means across its repeats


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def summary_row(label: str, summary: dict) -> list[str]:
    req, thr, good = summary.get("requests", {}), summary.get("throughput", {}), summary.get("goodput", {})

    def ms(metric, stat):
        return fmt((summary.get(metric) or {}).get(stat))

    return [
        label,
        str(req.get("completed", "-")),
        str(req.get("failed", "-")),
        fmt(thr.get("requests_per_s"), 2),
        fmt(thr.get("output_tokens_per_s")),
        fmt(good.get("requests_per_s"), 2),
        fmt(100 * good["fraction"] if "fraction" in good else None),
        ms("ttft_ms", "p50"),
        ms("ttft_ms", "p99"),
        ms("itl_ms", "p50"),
        ms("itl_ms", "p99"),
        ms("tpot_ms", "p50"),
        ms("tpot_ms", "p99"),
        ms("e2e_ms", "p50"),
        ms("e2e_ms", "p99"),
    ]


def context_row(run: RunData, label: str | None = None) -> list[str]:
    info = run.run_info
    backend, load = info.get("backend", {}), info.get("scenario", {}).get("load", {})
    offered = (
        f"{load.get('arrival')} rate {load.get('rate')}/s"
        if load.get("rate")
        else f"{load.get('arrival')} concurrency {load.get('concurrency')}"
    )
    slo = ", ".join(f"{k} {v:g}" for k, v in run.slo.items() if v is not None) or "none"
    flags = [
        f
        for f, on in (
            ("CLIENT-BOUND", run.summary.get("client_bound")),
            ("interrupted", run.summary.get("interrupted")),
            ("SIMULATED (bench plan)", is_simulated(run.summary)),
            ("INVALID", not (run.summary.get("validity") or {}).get("valid", True)),
        )
        if on
    ]
    return [
        label or run.label,
        f"{backend.get('kind', '?')} ({backend.get('model', '?')})",
        offered if load else "-",
        slo,
        info.get("versions", {}).get("harness", "-"),
        info.get("host", {}).get("hostname", "-"),
        startup_text(info.get("startup")),
        ", ".join(flags) or "ok",
    ]


def build_report(paths, labels: list[str] | None = None, attainment: float = DEFAULT_ATTAINMENT) -> ReportContent:
    repeats = expand_repeats(paths, labels)  # a folder of repeats: each completed repeat one run
    expanded = expand_candidates(repeats.paths, repeats.labels)  # a folder of candidates: each its own sweep or run
    runs, sweeps = load_results(expanded.paths, expanded.labels)
    sections = []
    for sw in sweeps:
        cap = max_rate_meeting_slo(sw.points, attainment=attainment)
        sections.append(
            SweepSection(sw, cap, [summary_row(f"{sw.load_kind} {p.offered_load:g}", p.run.summary) for p in sw.points])
        )
    names = " vs ".join(x.label for x in runs + sweeps)
    content = ReportContent(
        f"Benchmark report: {names}",
        runs,
        sections,
        [summary_row(r.label, r.summary) for r in runs],
        [context_row(r) for r in runs]
        + [context_row(s.points[0].run, f"{s.label} (sweep, first point)") for s in sweeps],
    )
    if sweeps:
        content.figures += [
            ("Goodput against offered load", goodput_vs_load(sweeps, [s.capacity for s in sections])),
            ("Throughput against latency", throughput_latency(sweeps)),
        ]
        content.figures += [
            (f"Latency distributions per point: {s.label}", latency_cdfs([p.run for p in s.points])) for s in sweeps
        ]
    content.prediction_rows = prediction_rows(runs)
    content.repeat_rows = repeats.rows
    content.notes += repeats.notes
    for run in runs:
        content.diagnosis_rows += [[run.label, f["severity"], f["message"]] for f in run.summary.get("diagnosis") or ()]
        if (run.summary.get("roofline") or {}).get("line"):
            content.roofline_rows.append([run.label, run.summary["roofline"]["line"]])
    if runs:
        bars = phase_bars(runs)
        if bars is not None:
            content.figures.append(("Where TTFT goes", bars))
        content.figures.append(("Latency distributions", latency_cdfs(runs)))
        content.figures.append(("Over time", over_time(runs)))
        for fig_name, make in (("Server metrics", server_metrics), ("Device telemetry", telemetry)):
            fig = make(runs)
            if fig is not None:
                content.figures.append((fig_name, fig))
        content.figures += [(f"Timeline: {r.label}", timeline(r)) for r in runs[:MAX_TIMELINES]]
        content.figures += [
            (f"Engine steps: {r.label}", fig) for r in runs[:MAX_TIMELINES] if (fig := step_timeline(r)) is not None
        ]
        if len(runs) > MAX_TIMELINES:
            content.notes.append(f"Timelines are drawn for the first {MAX_TIMELINES} runs only.")
    _add_replicas(content, runs, sweeps)
    labelled = [(r.label, r) for r in runs] + [(f"{s.label} {p.run.label}", p.run) for s in sweeps for p in s.points]
    content.interval_rows, content.validity_rows = interval_rows(labelled), validity_rows(labelled)
    content.accuracy_rows = accuracy_rows(labelled)
    content.agreement_lines, agreement_notes = agreement_section(runs)
    content.notes += agreement_notes
    content.notes += [f"Candidate left out: {why}." for why in expanded.left_out]
    content.notes += peer_notes(runs)
    for sw in sweeps:
        if sw.left_out:
            content.notes.append(f"{sw.label}: left out, not completed: {', '.join(sw.left_out)}.")
    for label, run in labelled:
        if run.summary.get("client_bound"):
            content.notes.append(
                f"{label}: the client fell behind its schedule ("
                + "; ".join(run.summary.get("client_bound_reasons", []))
                + "); latencies include client delay."
            )
    return content


def peer_notes(runs: list[RunData]) -> list[str]:
    """A sentence per definition of a peer tool's file that is not ours (docs/peers.md)."""
    notes = []
    for run in runs:
        peer = run.run_info.get("peer")
        if peer:
            notes += [
                f"{run.label} ({peer['tool']}, read from its own file): {d}." for d in peer.get("differences", [])
            ]
    return notes


def _add_replicas(content: ReportContent, runs: list[RunData], sweeps: list[Sweep]) -> None:
    """The per-replica table, sentences and plots, for the runs (and sweep points) whose server metrics
    carry replica labels."""
    labelled = [(r.label, r) for r in runs] + [(f"{s.label} {p.run.label}", p.run) for s in sweeps for p in s.points]
    views = [v for label, r in labelled if (v := replica_view(r, label)) is not None]
    if not views:
        return
    content.replica_rows = replica_rows(views)
    content.decision_rows = decision_rows(views)
    content.replica_notes = [v.imbalance() for v in views]
    content.figures.append(("Replicas compared", replica_comparison(views)))
    content.figures += [(f"Load per replica: {v.label}", replica_load(v)) for v in views[:MAX_TIMELINES]]


def write_report(
    paths,
    out_html: Path,
    out_md: Path | None = None,
    labels: list[str] | None = None,
    attainment: float = DEFAULT_ATTAINMENT,
) -> ReportContent:

    content = build_report(paths, labels, attainment)
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(render_report_html(content), encoding="utf-8")
    out_md = Path(out_md) if out_md else out_html.with_suffix(".md")
    out_md.write_text(render_report_md(content), encoding="utf-8")
    return content
