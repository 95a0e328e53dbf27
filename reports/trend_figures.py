"""The trend chart of one series: a panel per metric, nights along x (date and commit on hover and ticks).

Each panel: the nights' values, the gate's 95% interval from the nights before each night (shaded), a
dashed line at each step (first night after it) and a shaded span over each drift.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reports.figures import LAYOUT, color

MAX_TICKS = 12
STEP_COLOR, DRIFT_COLOR, BAND_COLOR = "#d62728", "rgba(255,127,14,0.18)", "rgba(31,119,180,0.15)"


def _label(night) -> str:
    return f"{night.finished_at[5:10]} {(night.commit or '?')[:7]}"


def trend_figure(series) -> go.Figure:  # series: reports.trends.SeriesTrend (which imports this module)
    n_metrics = max(1, len(series.metrics))
    fig = make_subplots(
        rows=n_metrics,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=[
            f"{m.name} ({m.rule.source} {m.rule.statistic}, {m.rule.better} is better)" for m in series.metrics
        ],
    )
    position = {night.batch: i + 1 for i, night in enumerate(series.nights)}  # night number on the x axis
    for row, m in enumerate(series.metrics, start=1):
        x = [position[n.batch] for n in m.nights]
        _add_band(fig, row, x, m.band)
        _add_values(fig, row, x, m)
        _mark_findings(fig, row, x, m)
    every = max(1, -(-len(series.nights) // MAX_TICKS))
    ticks = list(range(1, len(series.nights) + 1, every))
    fig.update_xaxes(tickvals=ticks, ticktext=[_label(series.nights[t - 1]) for t in ticks])
    fig.update_xaxes(title_text="night (date, commit)", row=n_metrics, col=1)
    fig.update_layout(
        title=f"{series.title}: {len(series.nights)} nights, {series.runs} runs", height=220 * n_metrics + 160, **LAYOUT
    )
    return fig


def _add_band(fig: go.Figure, row: int, x: list[int], band: list) -> None:
    """The gate's interval at each night that has one: its upper edge, then the lower edge filled up to it."""
    banded = [(xi, b) for xi, b in zip(x, band) if b is not None]
    if not banded:
        return
    fig.add_trace(
        go.Scatter(
            x=[xi for xi, _ in banded],
            y=[b[1] for _, b in banded],
            mode="lines",
            line=dict(width=0),
            hoverinfo="skip",
            showlegend=False,
        ),
        row=row,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=[xi for xi, _ in banded],
            y=[b[0] for _, b in banded],
            mode="lines",
            line=dict(width=0),
            fill="tonexty",
            fillcolor=BAND_COLOR,
            hoverinfo="skip",
            name="gate's 95% interval",
            legendgroup="band",
            showlegend=row == 1,
        ),
        row=row,
        col=1,
    )


def _add_values(fig: go.Figure, row: int, x: list[int], m) -> None:
    """The metric's value per night (m: a reports.trends.MetricTrend); the hover names the night's date, commit,
    branch and runs."""
    hover = [
        f"night {xi}<br>{n.finished_at[:16]}<br>commit {n.commit or '?'}<br>branch {n.branch or '-'}"
        f"<br>{len(n.run_ids)} run(s)"
        for xi, n in zip(x, m.nights)
    ]
    fig.add_trace(
        go.Scatter(
            x=x,
            y=m.values,
            mode="lines+markers",
            name=m.name,
            text=hover,
            hovertemplate="%{y:.4g}<br>%{text}<extra></extra>",
            line=dict(color=color(row - 1)),
        ),
        row=row,
        col=1,
    )


def _mark_findings(fig: go.Figure, row: int, x: list[int], m) -> None:
    """Of m's findings: a dashed line before each step's first night, a shaded span over each drift, each
    labelled with its change and first commit."""
    for f in m.findings:
        start = x[f.index]
        if f.kind == "step":
            fig.add_vline(x=start - 0.5, line=dict(color=STEP_COLOR, dash="dash"), row=row, col=1)
            text = f"step {100 * f.change:+.1f}% at {(m.nights[f.index].commit or '?')[:7]}"
        else:
            fig.add_vrect(x0=start - 0.5, x1=x[f.end] + 0.5, fillcolor=DRIFT_COLOR, line_width=0, row=row, col=1)
            text = f"drift {100 * f.change:+.1f}% from {(m.nights[f.index].commit or '?')[:7]}"
        fig.add_annotation(
            x=start,
            y=max(m.values),
            text=text,
            showarrow=False,
            yanchor="bottom",
            font=dict(size=11, color=STEP_COLOR),
            row=row,
            col=1,
        )
