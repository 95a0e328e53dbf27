"""Plots of what the engine and the device reported during a run (server_metrics.csv, telemetry.csv).

Scheduler gauges are plotted as scraped; the prefix-cache hit rate is derived from the hit and
query counters (their increase between two scrapes), because a running total hides when the
cache stopped helping. Histogram series and `_created` timestamps are left out.
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from reports.figures import LAYOUT, color
from reports.load import RunData

# vLLM (and the built-in engine under `native:`), then llama.cpp's names for the same state
GAUGES = (
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage_perc",
    "gpu_cache_usage_perc",
    "requests_processing",
    "requests_deferred",
    "kv_cache_usage_ratio",
)
BENCH_GAUGES = {
    "bench:running": "requests running",
    "bench:waiting": "requests waiting",
    "bench:kv_usage_fraction": "KV cache in use (fraction)",
}
HIT_RATE = "prefix cache hit rate"
SKIP_SUFFIXES = ("_bucket", "_sum", "_count", "_created")
# harness/engine/telemetry names (host.py, gpu.py, engine_bytes.py), most telling first
TELEMETRY_FIRST = (
    "cpu_percent",
    "bandwidth_util",
    "read_bytes_per_s",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_DEV_GPU_UTIL",
    "rss_bytes",
    "memory_used_bytes",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_POWER_USAGE",
    "flops_per_s",
    "write_bytes_per_s",
)
TELEMETRY_SKIP = SKIP_SUFFIXES + (
    "_total",
    "TOTAL_ENERGY_CONSUMPTION",
    "CLOCK_THROTTLE_REASONS",
    "memory_bandwidth_peak_bytes_per_s",
    "num_processes",
    "FB_TOTAL",
)
MAX_PANELS = 8


def _short(name: str) -> str:
    return name.split(":")[-1]


def _hit_rate(frame: pd.DataFrame) -> pd.DataFrame | None:
    """Δhits / Δqueries between scrapes, from bench:prefix_cache_hits and bench:prefix_cache_queries (the same
    counters on every engine, harness/engine/server_metrics.py), else `*prefix_cache_{hits,queries}_total` (files from
    before those rows)."""
    hits, queries = (
        frame[frame["name"] == "bench:prefix_cache_hits"],
        frame[frame["name"] == "bench:prefix_cache_queries"],
    )
    if hits.empty or queries.empty:
        hits = frame[frame["name"].str.endswith("prefix_cache_hits_total") & ~frame["name"].str.contains("external")]
        queries = frame[
            frame["name"].str.endswith("prefix_cache_queries_total") & ~frame["name"].str.contains("external")
        ]
    if hits.empty or queries.empty:
        return None
    h = hits.groupby("t_s")["value"].sum().sort_index()
    q = queries.groupby("t_s")["value"].sum().sort_index()
    both = pd.concat([h.rename("h"), q.rename("q")], axis=1).dropna()
    dq = both["q"].diff()
    rate = (both["h"].diff() / dq.where(dq > 0)).dropna()
    return pd.DataFrame({"t_s": rate.index, "value": rate.to_numpy(), "key": ""})


def _counter_rate(part: pd.DataFrame) -> pd.DataFrame:
    """Increase per second between scrapes of a counter."""
    series = part.groupby("t_s")["value"].sum().sort_index()
    rate = (series.diff() / series.index.to_series().diff()).dropna()
    return pd.DataFrame({"t_s": rate.index, "value": rate.to_numpy(), "key": ""})


def server_panels(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Panel title -> rows (t_s, value, key) of one run; key tells series in a panel apart (labels).

    harness/engine/server_metrics.py writes the engine's state once more under `bench:` names, the same
    for every engine; those are used when present, the engine's own names otherwise.
    """
    labels = frame["labels"].fillna("") if "labels" in frame else pd.Series("", index=frame.index)
    keyed = frame.assign(key=labels)
    panels = {}
    if keyed["name"].str.startswith("bench:").any():
        for name, title in BENCH_GAUGES.items():
            part = keyed[keyed["name"] == name]
            if len(part):
                panels[title] = part[["t_s", "value", "key"]]
        tokens = keyed[keyed["name"] == "bench:generation_tokens"]
        if len(tokens) > 1:
            panels["generation tokens/s (engine's count)"] = _counter_rate(tokens)
    else:
        for gauge in GAUGES:
            part = keyed[keyed["name"].map(_short) == gauge]
            if len(part):
                panels[gauge] = part[["t_s", "value", "key"]]
    hit = _hit_rate(frame)  # per interval, from the counters: more telling than hits/queries since start
    if hit is not None:
        panels[HIT_RATE] = hit
    elif "bench:prefix_cache_hit_rate" in set(frame["name"]):
        panels[HIT_RATE] = keyed[keyed["name"] == "bench:prefix_cache_hit_rate"][["t_s", "value", "key"]]
    if not panels:  # an engine we do not know: show what it reported, histograms aside
        names = [n for n in sorted(frame["name"].unique()) if not n.endswith(SKIP_SUFFIXES)]
        for name in names[:MAX_PANELS]:
            panels[name] = keyed[keyed["name"] == name][["t_s", "value", "key"]]
    return panels


def telemetry_panels(frame: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The most telling device series first; running totals are left out when their rate is there."""
    counts = frame["name"].value_counts()
    names = [n for n in frame["name"].unique() if not _short(n).endswith(TELEMETRY_SKIP) and counts[n] > 1]
    rank = {n: i for i, n in enumerate(GAUGES + TELEMETRY_FIRST)}
    names.sort(key=lambda n: (rank.get(_short(n), len(rank)), n))
    panels = {}
    for name in names[:MAX_PANELS]:
        part = frame[frame["name"] == name]
        panels[name] = part.assign(key=part["source"].fillna("").astype(str))[["t_s", "value", "key"]]
    return panels


def server_metrics(runs: list[RunData]) -> go.Figure | None:
    per_run = [(i, r, server_panels(r.server_metrics)) for i, r in enumerate(runs) if r.server_metrics is not None]
    return _small_multiples("Server metrics", per_run) if per_run else None


def telemetry(runs: list[RunData]) -> go.Figure | None:
    per_run = [(i, r, telemetry_panels(r.telemetry)) for i, r in enumerate(runs) if r.telemetry is not None]
    return _small_multiples("Device telemetry", per_run) if per_run else None


def _small_multiples(title: str, per_run) -> go.Figure | None:
    names = list(dict.fromkeys(n for _, _, panels in per_run for n in panels))[:MAX_PANELS]  # first run's order
    if not names:  # a run too short for any series to have two samples: nothing to draw
        return None
    fig = make_subplots(
        rows=len(names), cols=1, shared_xaxes=True, subplot_titles=names, vertical_spacing=min(0.08, 0.3 / len(names))
    )
    shown = set()
    for row, name in enumerate(names, start=1):
        for i, run, panels in per_run:
            for key, part in panels[name].groupby("key", sort=True) if name in panels else []:
                label = f"{run.label} {key}".strip()
                fig.add_trace(
                    go.Scatter(
                        x=part["t_s"],
                        y=part["value"],
                        mode="lines",
                        name=label,
                        legendgroup=run.label,
                        showlegend=run.label not in shown,
                        line=dict(color=color(i)),
                    ),
                    row=row,
                    col=1,
                )
                shown.add(run.label)
    fig.update_xaxes(title_text="seconds from t0", row=len(names), col=1)
    fig.update_layout(title=title, height=max(320, 200 * len(names)), **LAYOUT)
    return fig
