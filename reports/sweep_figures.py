"""Plotly figures of sweeps: throughput against latency, and goodput against offered load."""

from __future__ import annotations

from collections.abc import Callable

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from harness.results.schema import Summary
from reports.figures import LAYOUT, color
from reports.load import Sweep
from reports.sweep import SloCapacity

# a panel per latency figure, each point's read from its summary
PANELS: tuple[tuple[str, Callable[[Summary], float | None]], ...] = (
    ("TTFT p50", lambda s: s.ttft_ms.p50),
    ("TTFT p99", lambda s: s.ttft_ms.p99),
    ("TPOT p50", lambda s: s.tpot_ms.p50),
    ("TPOT p99", lambda s: s.tpot_ms.p99),
)


def throughput_latency(sweeps: list[Sweep]) -> go.Figure:
    fig = make_subplots(rows=2, cols=2, subplot_titles=[title for title, _ in PANELS])
    for i, sw in enumerate(sweeps):
        x = [p.run.summary.throughput.output_tokens_per_s for p in sw.points]
        hover = [f"{sw.load_kind} {p.offered_load:g}" for p in sw.points]
        for k, (_, figure) in enumerate(PANELS):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[figure(p.run.summary) for p in sw.points],
                    mode="lines+markers",
                    name=sw.label,
                    legendgroup=sw.label,
                    showlegend=k == 0,
                    text=hover,
                    line=dict(color=color(i)),
                ),
                row=k // 2 + 1,
                col=k % 2 + 1,
            )
    fig.update_xaxes(title_text="achieved output tokens/s")
    fig.update_yaxes(title_text="ms")
    fig.update_layout(title="Throughput against latency (one marker per sweep point)", height=650, **LAYOUT)
    return fig


def goodput_vs_load(sweeps: list[Sweep], capacities: list[SloCapacity]) -> go.Figure:
    fig = go.Figure()
    for i, (sw, cap) in enumerate(zip(sweeps, capacities)):
        x = [p.offered_load for p in sw.points]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[p.run.summary.throughput.requests_per_s for p in sw.points],
                mode="lines+markers",
                name=f"{sw.label}: completed req/s",
                line=dict(color=color(i), dash="dot"),
            )
        )
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[p.run.summary.goodput.requests_per_s for p in sw.points],
                mode="lines+markers",
                name=f"{sw.label}: goodput req/s (within SLOs)",
                line=dict(color=color(i)),
            )
        )
        if cap.offered_load is not None:
            fig.add_vline(
                x=cap.offered_load,
                line=dict(color=color(i), dash="dash"),
                annotation_text=f"max at SLO {cap.offered_load:.3g}",
                annotation_position="top left",
            )
    kind = sweeps[0].load_kind if sweeps else "rate"
    fig.update_layout(
        title="Goodput against offered load",
        height=450,
        xaxis_title="offered load (requests/s)" if kind == "rate" else "requests in flight",
        yaxis_title="requests/s",
        **LAYOUT,
    )
    return fig


def goodput_fraction_vs_load(sweeps: list[Sweep], slo: dict, attainment: float) -> go.Figure:
    """Share of requests within `slo` at each offered load, with the attainment line the capacity is read at."""
    fig = go.Figure()
    for i, sw in enumerate(sweeps):
        fig.add_trace(
            go.Scatter(
                x=[p.offered_load for p in sw.points],
                y=[100 * p.run.goodput_fraction(slo) for p in sw.points],
                mode="lines+markers",
                name=sw.label,
                line=dict(color=color(i)),
            )
        )
    fig.add_hline(
        y=100 * attainment,
        line=dict(color="#888", dash="dash"),
        annotation_text=f"{attainment:.0%} of requests within SLO",
    )
    kind = sweeps[0].load_kind if sweeps else "rate"
    fig.update_layout(
        title="Requests within the SLOs against offered load",
        xaxis_title="offered load (requests/s)" if kind == "rate" else "requests in flight",
        yaxis_title="% of requests within SLO",
        yaxis_range=[0, 105],
        height=450,
        **LAYOUT,
    )
    return fig
