"""Plotly figures of single runs; several runs are overlaid in one colour each.

Plain SVG traces only (no WebGL): the report must draw in any browser, headless ones too.
Long series are thinned before plotting so a report of a 100k-request run stays small.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from reports.load import RunData

COLORS = qualitative.Plotly
MAX_CDF_POINTS = 800
MAX_TIMELINE_REQUESTS = 1500
LAYOUT = dict(template="plotly_white", margin=dict(l=60, r=20, t=60, b=50), legend=dict(orientation="h", y=-0.15))


def color(i: int) -> str:
    return COLORS[i % len(COLORS)]


def cdf_points(values_ms: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(value, cumulative fraction) of the sorted values, thinned to evenly spaced quantiles."""
    v = np.sort(values_ms[np.isfinite(values_ms)])
    if v.size == 0:
        return v, v
    q = np.linspace(0, 1, min(v.size, MAX_CDF_POINTS))
    return np.quantile(v, q), q


def latency_cdfs(runs: list[RunData]) -> go.Figure:
    panels = (("TTFT", "ttft_s"), ("ITL (per token)", None), ("TPOT", "tpot_s"), ("E2E", "e2e_s"))
    fig = make_subplots(rows=2, cols=2, subplot_titles=[p[0] for p in panels])
    for i, run in enumerate(runs):
        for k, (_name, col) in enumerate(panels):
            ms = (run.itl_s if col is None else run.requests[col].to_numpy(dtype=float)) * 1e3
            x, y = cdf_points(ms)
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=y,
                    mode="lines",
                    name=run.label,
                    legendgroup=run.label,
                    showlegend=k == 0,
                    line=dict(color=color(i)),
                ),
                row=k // 2 + 1,
                col=k % 2 + 1,
            )
    fig.update_xaxes(title_text="ms")
    fig.update_yaxes(title_text="fraction of requests ≤ x", range=[0, 1.02])
    fig.update_layout(title="Latency distributions (CDF)", height=650, **LAYOUT)
    return fig


def _segments(starts, ends, ys):
    """One trace of many horizontal segments: x/y with None between them."""
    x, y = [], []
    for a, b, row in zip(starts, ends, ys):
        if np.isfinite(a) and np.isfinite(b):
            x += [a, b, None]
            y += [row, row, None]
    return x, y


def timeline(run: RunData) -> go.Figure:
    df = run.requests.sort_values("intended_send_s").head(MAX_TIMELINE_REQUESTS).reset_index(drop=True)
    rows = df.index.to_numpy()
    ok, bad = df[df["ok"]], df[~df["ok"]]
    parts = (
        ("waiting for a slot (concurrency cap)", ok["intended_send_s"], ok["send_s"], ok.index, "#bbbbbb"),
        ("sent → first token", ok["send_s"], ok["first_token_s"], ok.index, "#f0a030"),
        ("first → last token", ok["first_token_s"], ok["end_s"], ok.index, "#3070c0"),
        ("failed", bad["intended_send_s"], bad["end_s"], bad.index, "#d62728"),
    )
    fig = go.Figure()
    for name, a, b, ys, c in parts:
        x, y = _segments(a.to_numpy(dtype=float), b.to_numpy(dtype=float), ys)
        if x:
            fig.add_trace(go.Scatter(x=x, y=y, mode="lines", name=name, line=dict(color=c, width=3)))
    shown = f" (first {len(rows)} of {len(run.requests)})" if len(run.requests) > len(rows) else ""
    fig.update_layout(
        title=f"Per-request timeline: {run.label}{shown}",
        xaxis_title="seconds from t0",
        yaxis_title="request (by intended send time)",
        height=420,
        **LAYOUT,
    )
    return fig


def _window_s(run: RunData) -> float:
    span = float(np.nanmax(run.requests["end_s"])) if len(run.requests) else 1.0
    return max(0.5, span / 60)


def over_time(runs: list[RunData]) -> go.Figure:
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=("TTFT by send time", "ITL per window (median)", "Output tokens/s per window"),
    )
    for i, run in enumerate(runs):
        _add_ttft_by_send_time(fig, run, color(i))
        if run.token_times_s.size:
            _add_windows(fig, run, color(i))
    fig.update_yaxes(title_text="ms", row=1, col=1)
    fig.update_yaxes(title_text="ms", row=2, col=1)
    fig.update_yaxes(title_text="tokens/s", row=3, col=1)
    fig.update_xaxes(title_text="seconds from t0", row=3, col=1)
    fig.update_layout(title="Over time", height=750, **LAYOUT)
    return fig


def _add_ttft_by_send_time(fig: go.Figure, run: RunData, c: str) -> None:
    """Row 1: each finished request's TTFT at its intended send time."""
    done = run.requests[run.requests["ok"]]
    fig.add_trace(
        go.Scatter(
            x=done["intended_send_s"],
            y=done["ttft_s"] * 1e3,
            mode="markers",
            name=run.label,
            legendgroup=run.label,
            marker=dict(color=c, size=4),
        ),
        row=1,
        col=1,
    )


def _add_windows(fig: go.Figure, run: RunData, c: str) -> None:
    """Rows 3 and 2: output tokens/s and median ITL in windows of _window_s seconds."""
    w = _window_s(run)
    edges = np.arange(0, run.token_times_s[-1] + w, w)
    counts, _ = np.histogram(run.token_times_s, bins=edges)
    fig.add_trace(
        go.Scatter(
            x=edges[:-1] + w / 2,
            y=counts / w,
            mode="lines",
            line=dict(color=c),
            legendgroup=run.label,
            showlegend=False,
            name=run.label,
        ),
        row=3,
        col=1,
    )
    x_itl, y_itl = _itl_by_window(run, edges)
    fig.add_trace(
        go.Scatter(
            x=x_itl,
            y=y_itl,
            mode="lines+markers",
            line=dict(color=c),
            marker=dict(size=3),
            legendgroup=run.label,
            showlegend=False,
            name=run.label,
        ),
        row=2,
        col=1,
    )


def _itl_by_window(run: RunData, edges: np.ndarray):
    """Median per-token gap of the tokens that arrived in each window."""
    gaps, ends = [], []
    for r in run.records:
        if r.ok and len(r.token_times_s) > 1:
            t = np.asarray(r.token_times_s)
            k = np.asarray(r.tokens_per_chunk[1:] or [1] * (len(t) - 1), dtype=float)
            gaps.append(np.diff(t) / k)
            ends.append(t[1:])
    if not gaps:
        return [], []
    g, e = np.concatenate(gaps), np.concatenate(ends)
    which = np.digitize(e, edges) - 1
    xs, ys = [], []
    for b in np.unique(which):
        xs.append(edges[b] + (edges[1] - edges[0]) / 2)
        ys.append(float(np.median(g[which == b])) * 1e3)
    return xs, ys
