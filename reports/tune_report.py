"""The report of a `bench tune` folder (harness/tune/tune.py's tune.json): the capacity table, the recommendation
with its margin, what the search cost beside a dense sweep, and two charts: the Pareto front of output
tokens/s per accelerator against tokens/s per user (1 / TPOT, as InferenceX draws it) over every measured
point, and each configuration's attainment against load with its bracket."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import plotly.graph_objects as go

from harness.results.folder import ResultsError, read_model
from harness.results.schema import TuneCapacity, TuneConfiguration, TuneManifest, TuneTrial
from reports.figures import LAYOUT, color
from reports.html import render
from reports.markdown import md_table
from reports.run_files import scenario

TUNE_MANIFEST = "tune.json"
CAPACITY_COLUMNS = (
    "configuration",
    "launch args",
    "status",
    "capacity",
    "bracket",
    "points",
    "requests",
    "early stops",
)
COST_COLUMNS = ("", "runs", "requests", "minutes")


@dataclass
class TuneReport:
    doc: TuneManifest
    capacity_rows: list[list[str]]
    cost_rows: list[list[str]]
    recommendation: str
    front: list[TuneTrial]  # the measured points no other point beats on both axes


def is_tune_dir(path: Path) -> bool:
    return (Path(path) / TUNE_MANIFEST).is_file()


def pareto_front(points: list[TuneTrial]) -> list[TuneTrial]:
    """Points with no other point at least as high on both axes and higher on one, by tokens/s per user."""
    usable = [p for p in points if p.tokens_per_s_per_user is not None]
    front = [
        p
        for p in usable
        if not any(
            q.tokens_per_s_per_user >= p.tokens_per_s_per_user
            and q.output_tokens_per_s_per_accelerator >= p.output_tokens_per_s_per_accelerator
            and (q.tokens_per_s_per_user, q.output_tokens_per_s_per_accelerator)
            != (p.tokens_per_s_per_user, p.output_tokens_per_s_per_accelerator)
            for q in usable
        )
    ]
    return sorted(front, key=lambda p: p.tokens_per_s_per_user)


def measured_points(doc: TuneManifest) -> list[TuneTrial]:
    return [t for t in doc.trials if t.kind == "point" and t.status == "completed"]


def build(path: Path) -> TuneReport:
    doc: TuneManifest | None = read_model(Path(path) / TUNE_MANIFEST)
    if doc is None or not doc.configurations:
        raise ResultsError(f"{path}: {TUNE_MANIFEST} lists no configuration; pass a folder written by `bench tune`")
    rows = [capacity_row(doc, c) for c in doc.configurations]
    search, dense = doc.cost.search, doc.cost.dense_sweep
    cost_rows = [
        ["this search", str(search.runs), str(search.requests), f"{search.minutes:.1f}"],
        [
            f"a dense sweep ({dense.points_per_configuration} loads per configuration)",
            str(dense.runs),
            str(dense.requests),
            f"≥ {dense.minutes_at_least:.1f}",
        ],
    ]
    return TuneReport(doc, rows, cost_rows, recommendation_text(doc), pareto_front(measured_points(doc)))


def capacity_row(doc: TuneManifest, c: TuneConfiguration) -> list[str]:
    """A configuration's row: its launch, status, capacity with its bracket, and what its search ran."""
    trials = [t for t in doc.trials if t.config == c.name and t.status != "pending"]
    cap = c.capacity or TuneCapacity(offered_load=None)
    lo, hi = cap.bracket or (None, None)
    value = cap.offered_load
    text = "-" if value is None else ("≥ " if cap.status == "at_least" else "") + f"{value:.3g} {doc.unit}"
    bracket = f"[{_g(lo)}, {_g(hi)}]" if lo is not None or hi is not None else "-"
    return [
        c.name,
        " ".join(c.launch_args) or "-",
        c.status + (f": {c.reason}" if c.reason else ""),
        text,
        bracket,
        str(cap.points or 0),
        str(sum(t.requests for t in trials)),
        str(sum(t.stopped_early is not None for t in trials)),
    ]


def slo_text(doc: TuneManifest) -> str:
    """The SLOs a point is judged on: the per-request ones with their attainment, then the percentile bounds."""
    parts = []
    if doc.slo:
        slo = ", ".join(f"{k} ≤ {v:g}" for k, v in doc.slo.items())
        parts.append(f"SLOs {slo}, met by at least {doc.attainment:.0%} of requests")
    bounds = doc.percentile_slo or {}  # absent from a tune.json written before they existed
    if bounds:
        text = ", ".join(f"{m} {q} ≤ {v:g}" for m, limits in bounds.items() for q, v in limits.items())
        parts.append(f"percentile SLOs {text} (on each point's measured distribution)")
    return "; ".join(parts)


def recommendation_text(doc: TuneManifest) -> str:
    best = doc.recommended
    if best is None:
        return "No configuration met the SLOs at any load tried."
    text = (
        f"{best.name} ({' '.join(best.launch_args) or 'the launch as written'}) carries "
        f"{best.capacity:.3g} {doc.unit} within the SLOs"
    )
    if best.next is None:
        return text + "."
    text += f", {100 * best.margin:.0f}% more than {best.next}"
    return text + (
        "; their brackets do not overlap."
        if best.separated
        else "; their brackets overlap, so the lead is within the search's precision."
    )


def pareto_figure(report: TuneReport) -> go.Figure:
    fig = go.Figure()
    names = [c.name for c in report.doc.configurations]
    for i, name in enumerate(names):
        pts = [p for p in measured_points(report.doc) if p.config == name and p.tokens_per_s_per_user]
        symbols = ["circle" if p.passed else "x" for p in pts]
        fig.add_trace(
            go.Scatter(
                x=[p.tokens_per_s_per_user for p in pts],
                mode="markers",
                name=name,
                y=[p.output_tokens_per_s_per_accelerator for p in pts],
                marker={"color": color(i), "size": 9, "symbol": symbols},
                text=[f"{p.offered_load:g} {report.doc.unit}" for p in pts],
            )
        )
    front = report.front
    fig.add_trace(
        go.Scatter(
            x=[p.tokens_per_s_per_user for p in front],
            mode="lines",
            name="Pareto front",
            y=[p.output_tokens_per_s_per_accelerator for p in front],
            line={"color": "#222", "dash": "dash"},
        )
    )
    fig.update_layout(
        title="Output tokens/s per accelerator against tokens/s per user (x: failed the SLOs)",
        xaxis_title="tokens/s per user (1 / TPOT)",
        yaxis_title="output tokens/s per accelerator",
        height=480,
        **LAYOUT,
    )
    return fig


def attainment_figure(report: TuneReport) -> go.Figure:
    doc = report.doc
    fig = go.Figure()
    for i, c in enumerate(doc.configurations):
        pts = sorted((p for p in measured_points(doc) if p.config == c.name), key=lambda p: p.offered_load)
        fig.add_trace(
            go.Scatter(
                x=[p.offered_load for p in pts],
                y=[p.goodput_fraction for p in pts],
                mode="lines+markers",
                name=c.name,
                line={"color": color(i)},
            )
        )
    fig.add_hline(y=doc.attainment, line_dash="dot", annotation_text=f"target {doc.attainment:.0%}")
    fig.update_layout(
        title="Share of requests within the SLOs at each load the search measured",
        xaxis_title=f"offered load ({doc.unit})",
        yaxis_title="within SLOs",
        xaxis_type="log",
        height=420,
        **LAYOUT,
    )
    return fig


def render_markdown(report: TuneReport) -> str:
    doc = report.doc
    lines = [
        f"# Tune: {scenario(doc.scenario).name}",
        "",
        f"**Recommended.** {report.recommendation}",
        "",
        f"{slo_text(doc)}. Search: {doc.method_why}.",
        "",
        "## Capacity",
        "",
        md_table(CAPACITY_COLUMNS, report.capacity_rows),
        "",
        "## Cost",
        "",
        md_table(COST_COLUMNS, report.cost_rows),
        "",
        f"Early stops saved about {doc.cost.search.seconds_saved_by_early_stops:.0f} s.",
        "",
        "## Pareto front",
        "",
        md_table(
            ("configuration", "load", "tokens/s per user", "output tok/s per acc."),
            [
                [
                    p.config,
                    f"{p.offered_load:g}",
                    f"{p.tokens_per_s_per_user:.1f}",
                    f"{p.output_tokens_per_s_per_accelerator:.1f}",
                ]
                for p in report.front
            ],
        ),
        "",
    ]
    return "\n".join(lines)


def write_tune_report(path: Path, out_html: Path) -> TuneReport:
    report = build(path)
    figures = [("Pareto front", pareto_figure(report)), ("Attainment against load", attainment_figure(report))]
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(
        render(
            "tune.html.j2",
            figures,
            title=f"Tune: {scenario(report.doc.scenario).name}",
            r=report,
            slo_text=slo_text(report.doc),
            capacity_columns=CAPACITY_COLUMNS,
            cost_columns=COST_COLUMNS,
        ),
        encoding="utf-8",
    )
    out_html.with_suffix(".md").write_text(render_markdown(report), encoding="utf-8")
    return report


def _g(value) -> str:
    return "-" if value is None else f"{value:g}"
