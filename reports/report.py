"""`bench report`: results folders in, one offline HTML file and a Markdown file out."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.engine.startup import startup_text
from harness.results.schema import Summary
from reports.candidates import expand_candidates
from reports.confidence_rows import interval_rows, validity_rows
from reports.explain_figures import phase_bars, step_timeline
from reports.figures import latency_cdfs, over_time, timeline
from reports.html import render_report_html
from reports.load import RunData, Sweep, load_results
from reports.markdown import render_report_md
from reports.mix_rows import mix_rows, modality_rows, turn_kind_rows
from reports.prediction import assumption_notes, is_simulated, model_text, prediction_rows, prediction_title
from reports.quality_rows import accuracy_rows, agreement_section
from reports.repeat_runs import expand_repeats
from reports.replica_figures import replica_comparison, replica_load
from reports.replicas import decision_rows, replica_rows, replica_view
from reports.run_files import LoadView, harness_version, scenario
from reports.server_figures import server_metrics, telemetry
from reports.sweep import DEFAULT_ATTAINMENT, SloCapacity, max_rate_meeting_slo
from reports.sweep_figures import goodput_vs_load, throughput_latency
from reports.telemetry_rows import telemetry_rows

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
    telemetry_rows: list[list[str]] = field(default_factory=list)  # run, its device figures (summary telemetry)
    mix_rows: list[list[str]] = field(default_factory=list)  # run, model: each side of a workload.mix
    turn_kind_rows: list[list[str]] = field(default_factory=list)  # run, turn kind: an agentic workload's turns
    modality_rows: list[list[str]] = field(default_factory=list)  # run, modality: text and image requests apart
    agreement_lines: list[str] = field(default_factory=list)  # two runs' answers compared (bench compare-outputs)
    repeat_rows: list[list[str]] = field(default_factory=list)  # a repeats folder's means across its repeats


def fmt(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def summary_row(label: str, run: RunData) -> list[str]:
    """A run's row of the summary table; a peer tool's file shows the tool's figures, so no goodput (it has none,
    and ours of its rebuilt requests runs on their timeline, not over the tool's duration)."""
    summary = run.summary
    req, thr = summary.requests, summary.throughput
    good = summary.goodput
    good_per_s, good_percent = (None, None) if run.peer is not None else (good.requests_per_s, 100 * good.fraction)
    return [
        label,
        str(req.completed),
        str(req.failed),
        fmt(thr.requests_per_s, 2),
        fmt(thr.output_tokens_per_s),
        fmt(good_per_s, 2),
        fmt(good_percent),
        fmt(summary.ttft_ms.p50),
        fmt(summary.ttft_ms.p99),
        fmt(summary.itl_ms.p50),
        fmt(summary.itl_ms.p99),
        fmt(summary.tpot_ms.p50),
        fmt(summary.tpot_ms.p99),
        fmt(summary.e2e_ms.p50),
        fmt(summary.e2e_ms.p99),
    ]


def context_row(run: RunData, label: str | None = None) -> list[str]:
    info = run.run_info
    slo = ", ".join(f"{k} {v:g}" for k, v in run.slo.items() if v is not None) or "none"
    return [
        label or run.label,
        model_text(run),
        offered_text(scenario(info.scenario).load),
        slo,
        harness_version(info) or "-",
        info.host.hostname if info.host else "-",
        startup_text(info.startup),
        ", ".join(run_flags(run.summary)) or "ok",
    ]


def offered_text(load: LoadView | None) -> str:
    if load is None:
        return "-"
    if load.rate:
        return f"{load.arrival} rate {load.rate}/s"
    if load.concurrency:
        return f"{load.arrival} concurrency {load.concurrency}"
    # offline (every request due at once) and traces set neither: say how many were sent
    return f"{load.arrival}, {load.num_requests:,} requests" if load.num_requests else str(load.arrival or "-")


def run_flags(summary: Summary) -> list[str]:
    """What to read a run's figures with care for, as the context table flags it."""
    flags = (
        ("CLIENT-BOUND", summary.client_bound),
        ("interrupted", summary.interrupted),
        ("SIMULATED (bench plan)", is_simulated(summary)),
        ("INVALID", summary.validity is not None and not summary.validity.valid),
    )
    return [flag for flag, on in flags if on]


def build_report(paths, labels: list[str] | None = None, attainment: float = DEFAULT_ATTAINMENT) -> ReportContent:
    """The report's tables, figures and notes of the given results folders (runs, sweeps, repeats, candidates,
    peer tools' files)."""
    repeats = expand_repeats(paths, labels)  # a folder of repeats: each completed repeat one run
    expanded = expand_candidates(repeats.paths, repeats.labels)  # a folder of candidates: each its own sweep or run
    runs, sweeps = load_results(expanded.paths, expanded.labels)
    content = _tables(runs, sweeps, attainment)
    content.repeat_rows = repeats.rows
    content.notes += repeats.notes
    _add_sweep_figures(content)
    _add_run_figures(content)
    _add_replicas(content, runs, sweeps)
    _add_run_checks(content, runs, sweeps)
    content.notes += [f"Candidate left out: {why}." for why in expanded.left_out]
    content.notes += peer_notes(runs)
    content.notes += [f"{sw.label}: left out, not completed: {', '.join(sw.left_out)}." for sw in sweeps if sw.left_out]
    content.notes += client_bound_notes(_labelled(runs, sweeps))
    every_run = [run for _, run in _labelled(runs, sweeps)]
    content.title = prediction_title(content.title, every_run)
    content.notes[:0] = assumption_notes(_labelled(runs, sweeps))  # under the title: what the prediction assumed
    return content


def _labelled(runs: list[RunData], sweeps: list[Sweep]) -> list[tuple[str, RunData]]:
    """Every run with its label in the report: the runs, then each sweep's points."""
    return [(r.label, r) for r in runs] + [(f"{s.label} {p.run.label}", p.run) for s in sweeps for p in s.points]


def _tables(runs: list[RunData], sweeps: list[Sweep], attainment: float) -> ReportContent:
    """The content with its summary and context tables, a section per sweep with its capacity, and the
    predictions, diagnoses and roofline lines of the runs."""
    sections = [
        SweepSection(
            sw,
            max_rate_meeting_slo(sw.points, attainment=attainment),
            [summary_row(f"{sw.load_kind} {p.offered_load:g}", p.run) for p in sw.points],
        )
        for sw in sweeps
    ]
    content = ReportContent(
        f"Benchmark report: {' vs '.join(x.label for x in runs + sweeps)}",
        runs,
        sections,
        [summary_row(r.label, r) for r in runs],
        [context_row(r) for r in runs]
        + [context_row(s.points[0].run, f"{s.label} (sweep, first point)") for s in sweeps],
    )
    content.prediction_rows = prediction_rows(runs)
    for run in runs:
        content.diagnosis_rows += [[run.label, f.severity, f.message] for f in run.summary.diagnosis or ()]
        if run.summary.roofline is not None and run.summary.roofline.line:
            content.roofline_rows.append([run.label, run.summary.roofline.line])
    return content


def _add_sweep_figures(content: ReportContent) -> None:
    sweeps = [s.sweep for s in content.sweeps]
    if not sweeps:
        return
    content.figures += [
        ("Goodput against offered load", goodput_vs_load(sweeps, [s.capacity for s in content.sweeps])),
        ("Throughput against latency", throughput_latency(sweeps)),
    ]
    content.figures += [
        (f"Latency distributions per point: {s.label}", latency_cdfs([p.run for p in s.points])) for s in sweeps
    ]


def _add_run_figures(content: ReportContent) -> None:
    """Where TTFT goes, the latency distributions, each run over time, the server's and the device's series,
    and the first runs' timelines and engine steps."""
    runs = content.runs
    if not runs:
        return
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


def _add_run_checks(content: ReportContent, runs: list[RunData], sweeps: list[Sweep]) -> None:
    """Each run's percentile intervals, validity and accuracy, and two runs' answers compared."""
    labelled = _labelled(runs, sweeps)
    content.interval_rows, content.validity_rows = interval_rows(labelled), validity_rows(labelled)
    content.accuracy_rows = accuracy_rows(labelled)
    content.telemetry_rows = telemetry_rows(labelled)
    content.mix_rows = mix_rows(labelled)
    content.turn_kind_rows = turn_kind_rows(labelled)
    content.modality_rows = modality_rows(labelled)
    content.agreement_lines, agreement_notes = agreement_section(runs)
    content.notes += agreement_notes


def client_bound_notes(labelled: list[tuple[str, RunData]]) -> list[str]:
    return [
        f"{label}: the client fell behind its schedule ({'; '.join(run.summary.client_bound_reasons)}); "
        "latencies include client delay."
        for label, run in labelled
        if run.summary.client_bound
    ]


def peer_notes(runs: list[RunData]) -> list[str]:
    """A sentence per definition of a peer tool's file that is not ours (docs/peers.md)."""
    return [
        f"{run.label} ({run.peer.tool}, read from its own file): {d}."
        for run in runs
        if run.peer is not None
        for d in run.peer.differences
    ]


def _add_replicas(content: ReportContent, runs: list[RunData], sweeps: list[Sweep]) -> None:
    """The per-replica table, sentences and plots, for the runs (and sweep points) whose server metrics
    carry replica labels."""
    views = [v for label, r in _labelled(runs, sweeps) if (v := replica_view(r, label)) is not None]
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
