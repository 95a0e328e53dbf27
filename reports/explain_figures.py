"""Figures that explain a run: where TTFT goes (phase bars, from summary.json's phases_ms) and
the engine's step timeline (from engine_trace.json): tokens per step, batch, step time."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reports.figures import LAYOUT, color
from reports.load import RunData

# the parts of TTFT in the order a request meets them, then decode
TTFT_PARTS = ("client_lag", "concurrency_wait", "connect_send", "queue", "prefill", "other")
MAX_STEPS = 4000  # thinned past this; a long run's steps still show their shape


def phase_bars(runs: list[RunData]) -> go.Figure | None:
    """One horizontal bar per run: mean ms of each part of TTFT, stacked; decode beside it."""
    runs = [r for r in runs if (r.summary.get("phases_ms") or {}).get("ttft_share")]
    if not runs:
        return None
    fig = make_subplots(
        rows=1,
        cols=2,
        column_widths=[0.7, 0.3],
        shared_yaxes=True,
        subplot_titles=("TTFT by phase (mean ms)", "decode (mean ms)"),
    )
    labels = [r.label for r in runs]
    for k, part in enumerate(TTFT_PARTS):
        values = []
        for r in runs:
            p = r.summary["phases_ms"]
            values.append(p["ttft_share"].get(part, 0.0) * p["ttft"]["mean"])
        fig.add_trace(
            go.Bar(
                name=part,
                y=labels,
                x=values,
                orientation="h",
                marker_color=color(k),
                hovertemplate=f"{part}: %{{x:.1f}} ms<extra></extra>",
            ),
            row=1,
            col=1,
        )
    decode = [(r.summary["phases_ms"].get("decode") or {}).get("mean", 0.0) for r in runs]
    fig.add_trace(
        go.Bar(
            name="decode",
            y=labels,
            x=decode,
            orientation="h",
            marker_color=color(len(TTFT_PARTS)),
            hovertemplate="decode: %{x:.1f} ms<extra></extra>",
        ),
        row=1,
        col=2,
    )
    fig.update_layout(**LAYOUT, barmode="stack", height=160 + 60 * len(runs))
    return fig


def step_timeline(run: RunData) -> go.Figure | None:
    """Per engine step: prefill tokens and decode sequences (the batch), and how long it took."""
    steps = run.steps
    if not steps:
        return None
    stride = max(1, len(steps) // MAX_STEPS)
    steps = steps[::stride]
    t = [s["t_s"] for s in steps]
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=("tokens per step", "batch (sequences)", "step time (ms)"),
    )
    fig.add_trace(
        go.Scatter(
            x=t,
            y=[s["prefill_tokens"] for s in steps],
            name="prefill tokens",
            mode="markers",
            marker=dict(size=4, color=color(4)),
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=t,
            y=[s["decode_seqs"] for s in steps],
            name="decode tokens",
            mode="markers",
            marker=dict(size=4, color=color(0)),
        ),
        row=1,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=t, y=[s["running"] for s in steps], name="running", mode="lines", line=dict(shape="hv", color=color(2))
        ),
        row=2,
        col=1,
    )
    fig.add_trace(
        go.Scatter(
            x=t, y=[s["waiting"] for s in steps], name="waiting", mode="lines", line=dict(shape="hv", color=color(1))
        ),
        row=2,
        col=1,
    )
    kinds = sorted({s["kind"] for s in steps})
    for k, kind in enumerate(kinds):
        group = [s for s in steps if s["kind"] == kind]
        fig.add_trace(
            go.Scatter(
                x=[s["t_s"] for s in group],
                y=[s["dur_s"] * 1e3 for s in group],
                mode="markers",
                name=f"{kind} step",
                marker=dict(size=4, color=color(5 + k)),
            ),
            row=3,
            col=1,
        )
    fig.update_xaxes(title_text="seconds from t0", row=3, col=1)
    fig.update_layout(**LAYOUT, height=620)
    return fig
