"""Plots of a deployment's replicas (reports/replicas.py): each replica's load over time, and, side by
side for every run compared, the share of requests each replica served, its prefix-cache hit rate
and the router's decisions by reason."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reports.figures import LAYOUT, color
from reports.replicas import ReplicaView

PANELS = ("requests running", "requests waiting", "KV cache in use (fraction)", "prefix-cache hit rate (per interval)")


def replica_load(view: ReplicaView) -> go.Figure:
    """One run: a panel per gauge, a line per replica (one colour each)."""
    panels = [p for p in PANELS if (view.series["panel"] == p).any()]
    fig = make_subplots(
        rows=len(panels),
        cols=1,
        shared_xaxes=True,
        subplot_titles=panels,
        vertical_spacing=min(0.08, 0.3 / len(panels)),
    )
    for i, stats in enumerate(view.replicas):
        for row, panel in enumerate(panels, start=1):
            part = view.series[(view.series["panel"] == panel) & (view.series["replica"] == stats.replica)]
            fig.add_trace(
                go.Scatter(
                    x=part["t_s"],
                    y=part["value"],
                    mode="lines",
                    name=f"replica {stats.replica}",
                    legendgroup=stats.replica,
                    showlegend=row == 1,
                    line=dict(color=color(i)),
                ),
                row=row,
                col=1,
            )
    fig.update_xaxes(title_text="seconds from t0", row=len(panels), col=1)
    fig.update_layout(title=f"Load per replica: {view.label}", height=max(320, 200 * len(panels)), **LAYOUT)
    return fig


def replica_comparison(views: list[ReplicaView]) -> go.Figure:
    """Every run's replicas side by side (a colour per run): share served, hit rate, decisions by reason."""
    by_requests = all(r.request_share is not None for v in views for r in v.replicas)
    share_title = "share of requests routed" if by_requests else "share of output tokens generated"
    with_decisions = any(v.decisions for v in views)
    titles = [share_title, "prefix-cache hit rate"] + (["router decisions by reason"] if with_decisions else [])
    fig = make_subplots(rows=1, cols=len(titles), subplot_titles=titles)
    for i, v in enumerate(views):
        x = [f"replica {r.replica}" for r in v.replicas]
        shares = [r.request_share if by_requests else r.token_share for r in v.replicas]
        common = dict(name=v.label, legendgroup=v.label, marker_color=color(i))
        fig.add_trace(go.Bar(x=x, y=shares, **common), row=1, col=1)
        fig.add_trace(go.Bar(x=x, y=[r.hit_rate for r in v.replicas], showlegend=False, **common), row=1, col=2)
        if with_decisions:
            fig.add_trace(
                go.Bar(x=list(v.decisions), y=list(v.decisions.values()), showlegend=False, **common), row=1, col=3
            )
    fig.update_yaxes(range=[0, 1], tickformat=".0%", row=1, col=1)
    fig.update_yaxes(range=[0, 1], row=1, col=2)
    fig.update_layout(title="Replicas compared", barmode="group", height=420, **LAYOUT)
    return fig
