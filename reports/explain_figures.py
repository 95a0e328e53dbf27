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
    runs = [r for r in runs if r.summary.phases_ms is not None and r.summary.phases_ms.ttft_share is not None]
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
            phases = r.summary.phases_ms
            values.append((phases.ttft_share.model_dump()[part] or 0.0) * phases.ttft.mean)
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
    decode = [r.summary.phases_ms.decode.mean if r.summary.phases_ms.decode else 0.0 for r in runs]
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
    if not run.steps:
        return None
    steps = run.steps[:: max(1, len(run.steps) // MAX_STEPS)]
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=("tokens per step", "batch (sequences)", "step time (ms)"),
    )
    _add_tokens_per_step(fig, steps)
    _add_batch(fig, steps)
    _add_step_times(fig, steps)
    fig.update_xaxes(title_text="seconds from t0", row=3, col=1)
    fig.update_layout(**LAYOUT, height=620)
    return fig


def _add_tokens_per_step(fig: go.Figure, steps: list[dict]) -> None:
    """Row 1: prefill tokens and decode sequences of each step, as markers."""
    t = [s["t_s"] for s in steps]
    for column, name, color_index in (("prefill_tokens", "prefill tokens", 4), ("decode_seqs", "decode tokens", 0)):
        fig.add_trace(
            go.Scatter(
                x=t,
                y=[s[column] for s in steps],
                name=name,
                mode="markers",
                marker=dict(size=4, color=color(color_index)),
            ),
            row=1,
            col=1,
        )


def _add_batch(fig: go.Figure, steps: list[dict]) -> None:
    """Row 2: running and waiting sequences, as steps in time."""
    t = [s["t_s"] for s in steps]
    for name, color_index in (("running", 2), ("waiting", 1)):
        fig.add_trace(
            go.Scatter(
                x=t,
                y=[s[name] for s in steps],
                name=name,
                mode="lines",
                line=dict(shape="hv", color=color(color_index)),
            ),
            row=2,
            col=1,
        )


def _add_step_times(fig: go.Figure, steps: list[dict]) -> None:
    """Row 3: each step's duration in ms, one marker series per step kind."""
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
