"""`bench select`: which engine to buy time for, from sweeps of each engine under one workload.

Per engine: the highest request rate at which the SLOs still hold (from its sweep), the output
tokens/s per accelerator there, and the cost per million output tokens if the accelerators
run at that rate all hour. The recommendation is the cheapest per token among the engines
that met the SLOs at all, with the caveats that bound it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go

from harness.workers import client_bound_advice
from reports.figures import LAYOUT, color
from reports.html import render
from reports.load import Sweep, SweepPoint, load_results
from reports.markdown import md_table
from reports.sweep import DEFAULT_ATTAINMENT, SloCapacity, max_rate_meeting_slo
from reports.sweep_figures import goodput_fraction_vs_load, throughput_latency

SLO_KEYS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
COLUMNS = ("engine", "backend", "highest rate within SLOs", "output tok/s per accelerator",
           "$ per 1M output tokens", "sweep points", "notes")


@dataclass
class EngineResult:
    label: str
    backend: str
    capacity: SloCapacity
    tokens_per_s_per_accelerator: float | None
    cost_per_million_tokens: float | None
    points: int
    load_kind: str  # "rate" or "concurrency": what the sweep varied
    notes: list[str] = field(default_factory=list)

    def capacity_text(self) -> str:
        cap = self.capacity
        if cap.status == "none":
            return "none"
        text = (f"{cap.offered_load:.3g} req/s" if self.load_kind == "rate"
                else f"{cap.offered_load:.3g} in flight ({cap.requests_per_s:.3g} req/s)")
        return text + (" (at least)" if cap.status == "at_least" else "")


@dataclass
class Selection:
    slo: dict
    attainment: float
    gpu_cost_per_hour: float
    accelerators: int
    engines: list[EngineResult]
    sweeps: list[Sweep]
    recommendation: str
    caveats: list[str]

    def price_text(self) -> str:
        if all(_cpu_only(sw) for sw in self.sweeps):
            return f"Machine price ${self.gpu_cost_per_hour:g}/hour (CPU only, no accelerator), 1 machine per engine."
        return f"Accelerator price ${self.gpu_cost_per_hour:g}/hour, {self.accelerators} per engine."


def parse_slo(text: str) -> dict:
    """`ttft_ms=500,tpot_ms=50` -> {"ttft_ms": 500.0, "tpot_ms": 50.0}."""
    slo = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if not sep or key.strip() not in SLO_KEYS:
            raise ValueError(f"--slo: {part!r} is not valid; use KEY=MS with KEY one of {', '.join(SLO_KEYS)}, "
                             "e.g. --slo ttft_ms=500,tpot_ms=50")
        try:
            slo[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--slo: {part!r}: {value!r} is not a number of milliseconds") from None
        if slo[key.strip()] <= 0:
            raise ValueError(f"--slo: {part!r}: the limit must be > 0 ms")
    if not slo:
        raise ValueError("--slo: empty; give at least one limit, e.g. --slo ttft_ms=500,tpot_ms=50")
    return slo


def as_sweep(run) -> Sweep:
    """A single run is a one-point sweep at its offered rate (or concurrency)."""
    load = run.run_info.get("scenario", {}).get("load", {})
    kind, value = ("rate", load.get("rate")) if load.get("rate") else ("concurrency", load.get("concurrency"))
    value = value or run.summary.get("throughput", {}).get("requests_per_s", 0.0)
    return Sweep(run.path, run.label, kind, [SweepPoint(float(value), run)])


def select(paths, slo: dict, gpu_cost_per_hour: float, accelerators: int = 1, labels: list[str] | None = None,
           attainment: float = DEFAULT_ATTAINMENT) -> Selection:
    if gpu_cost_per_hour <= 0:
        raise ValueError("--gpu-cost-per-hour: must be > 0 (the price of one accelerator-hour, e.g. 2.5)")
    if accelerators < 1:
        raise ValueError("--accelerators: must be >= 1 (accelerators each engine ran on)")
    runs, sweeps = load_results(paths, labels)
    sweeps = sweeps + [as_sweep(r) for r in runs]
    engines = [_engine(sw, slo, gpu_cost_per_hour, accelerators, attainment) for sw in sweeps]
    recommendation, caveats = _recommend(engines, sweeps, slo, attainment)
    return Selection(slo, attainment, gpu_cost_per_hour, accelerators, engines, sweeps, recommendation, caveats)


def _engine(sw: Sweep, slo, cost_per_hour, accelerators, attainment) -> EngineResult:
    cap = max_rate_meeting_slo(sw.points, slo, attainment)
    info = sw.points[0].run.run_info.get("backend", {})
    tok_s = cap.output_tokens_per_s / accelerators if cap.output_tokens_per_s else None
    cost = cost_per_hour / (tok_s * 3600) * 1e6 if tok_s else None
    notes = []
    if cap.status == "at_least":
        notes.append("every tested load met the SLOs: the real limit is higher")
    if cap.status == "none":
        notes.append("missed the SLOs even at the lowest tested load")
    bound = _client_bound_note(sw, cap)
    if bound:
        notes.append(bound)
    model = _file_name(str(info.get("model", "?")))  # a GGUF path reads as its file name
    return EngineResult(sw.label, f"{info.get('kind', '?')} ({model})", cap, tok_s, cost,
                        len(sw.points), sw.load_kind, notes)


def _client_bound_note(sw: Sweep, cap: SloCapacity) -> str | None:
    """Where the client fell behind, and whether the capacity rests on those points (the ones up to
    the first that failed) or lies below them."""
    bound_points = [p for p in sw.points if p.run.summary.get("client_bound")]
    if not bound_points:
        return None
    bound = [p.offered_load for p in bound_points]
    first_fail = next((p.offered_load for p in sorted(sw.points, key=lambda p: p.offered_load)
                       if cap.offered_load is None or p.offered_load > cap.offered_load), None)
    loads = f"{sw.load_kind} {', '.join(f'{x:g}' for x in bound)}"
    if first_fail is None or min(bound) <= first_fail:
        run = bound_points[0].run
        advice = client_bound_advice(run.summary, run.run_info.get("host", {}).get("cpu_count"))
        return f"the client fell behind at {loads}, which the capacity rests on: rerun on a quieter machine, or {advice}"
    return f"the client fell behind at {loads}, past the capacity (those points do not move it)"


def _recommend(engines: list[EngineResult], sweeps: list[Sweep], slo: dict, attainment: float):
    slo_text = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items())
    caveats = [f"Measured for this workload only (the scenarios of these runs), at SLOs {slo_text} for "
               f"{attainment:.0%} of requests; another prompt/output length mix or arrival pattern can change the order.",
               "Measured on this hardware and these software versions: "
               + "; ".join(_where(sw) for sw in sweeps) + ".",
               "Cost assumes the accelerators are busy at that rate all hour; idle time raises the real cost."]
    if all(_cpu_only(sw) for sw in sweeps):
        caveats.append("No GPU was seen in these runs (CPU only): \"per accelerator\" means per machine here, "
                       "the price is the machine's, and on GPUs the engines can rank differently.")
    workloads = {repr(sw.points[0].run.run_info.get("scenario", {}).get("workload")) for sw in sweeps}
    if len(workloads) > 1:
        caveats.insert(0, "WARNING: the engines were run with different workloads; the comparison is not like for like.")
    usable = sorted((e for e in engines if e.cost_per_million_tokens), key=lambda e: e.cost_per_million_tokens)
    if not usable:
        return f"No engine met the SLOs ({slo_text}) at any tested load; relax the SLOs or test lower loads.", caveats
    best = usable[0]
    unit = "req/s" if best.load_kind == "rate" else "requests in flight"
    text = (f"Choose {best.label}: within {slo_text} it sustains {best.capacity.describe(unit)} at "
            f"{best.tokens_per_s_per_accelerator:,.1f} output tokens/s per accelerator, "
            f"${best.cost_per_million_tokens:,.2f} per million output tokens")
    if len(usable) > 1:
        runner_up = usable[1]
        ratio = runner_up.cost_per_million_tokens / best.cost_per_million_tokens
        if ratio < 1.1:
            text += f", within 10% of {runner_up.label}'s cost per token: a rerun could swap them, so weigh other factors"
        elif runner_up.capacity.status == "at_least":  # its limit is above its sweep: its cost is an upper bound
            text += (f", up to {ratio:.1f}× cheaper per token than {runner_up.label} (which never missed the SLOs "
                     f"in its sweep, so it may do better)")
        else:
            text += f", {ratio:.1f}× cheaper per token than {runner_up.label}"
    missed = [e.label for e in engines if e.cost_per_million_tokens is None]
    if missed:
        text += f"; {', '.join(missed)} did not meet the SLOs at any tested load"
    if best.capacity.status == "at_least":
        caveats.append(f"{best.label} never missed the SLOs in its sweep; sweep higher to find its limit.")
    return text + ".", caveats


def _where(sw: Sweep) -> str:
    """Label: engine kind, version and launch arguments; host, CPUs, GPU or not; harness version."""
    info = sw.points[0].run.run_info
    host, ver, backend = info.get("host", {}), info.get("versions", {}), info.get("backend", {})
    engine = f"{backend.get('kind', '?')} {backend.get('engine_version') or '(version not reported)'}"
    args = (info.get("scenario", {}).get("backend", {}).get("launch") or {}).get("args")
    if args:
        engine += f" started with `{' '.join(launch_args_text(args, str(backend.get('model', '?'))))}`"
    device = " CPU only," if _cpu_only(sw) else ""
    return (f"{sw.label}: {engine}, on {host.get('hostname', '?')} ({host.get('cpu_count', '?')} CPUs,{device} "
            f"{host.get('platform', '?')}), harness {ver.get('harness', '?')}")


def launch_args_text(args: list, model: str) -> list[str]:
    """Launch arguments as a reader can use them elsewhere: placeholders filled in (the model by its file
    name) and machine paths cut to their file names."""
    fill = {"model": _file_name(model), "host": "127.0.0.1", "port": "<port>"}
    out = []
    for arg in map(str, args):
        try:
            arg = arg.format(**fill)
        except (KeyError, IndexError, ValueError):
            pass  # braces that are not placeholders (a JSON option) stay as written
        out.append(_file_name(arg))
    return out


def _file_name(text: str) -> str:
    return Path(text).name if Path(text).is_absolute() else text


def _cpu_only(sw: Sweep) -> bool:
    """True when the run's telemetry looked for GPUs and found none (False when it did not say)."""
    telemetry = sw.points[0].run.run_info.get("telemetry") or {}
    return "sampled" in telemetry and "gpu" not in telemetry["sampled"]


def rows(sel: Selection) -> list[list[str]]:
    def money(x):
        return "n/a" if x is None else f"${x:,.2f}"
    return [[e.label, e.backend, e.capacity_text(),
             "n/a" if e.tokens_per_s_per_accelerator is None else f"{e.tokens_per_s_per_accelerator:,.1f}",
             money(e.cost_per_million_tokens), str(e.points), "; ".join(e.notes)] for e in sel.engines]


def cost_figure(sel: Selection) -> go.Figure:
    usable = [e for e in sel.engines if e.cost_per_million_tokens is not None]
    fig = go.Figure(go.Bar(x=[e.label for e in usable], y=[e.cost_per_million_tokens for e in usable],
                           marker_color=[color(sel.engines.index(e)) for e in usable]))
    fig.update_layout(title="Cost per million output tokens at the highest rate within SLOs", yaxis_title="$",
                      height=400, **LAYOUT)
    return fig


def render_markdown(sel: Selection) -> str:
    head = [f"# Engine selection: {', '.join(e.label for e in sel.engines)}", "", f"**Recommendation.** {sel.recommendation}",
            "", sel.price_text(), "",
            md_table(COLUMNS, rows(sel)), "", "## Caveats", ""]
    return "\n".join(head + [f"- {c}" for c in sel.caveats] + [""])


def write_selection(paths, out_html: Path, out_md: Path | None = None, **kwargs) -> Selection:
    sel = select(paths, **kwargs)
    figures = [("Goodput against offered load", goodput_fraction_vs_load(sel.sweeps, sel.slo, sel.attainment)),
               ("Throughput against latency", throughput_latency(sel.sweeps))]
    if any(e.cost_per_million_tokens for e in sel.engines):
        figures.append(("Cost per million output tokens", cost_figure(sel)))
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(render("select.html.j2", figures, title="Engine selection", sel=sel, columns=COLUMNS,
                               rows=rows(sel)), encoding="utf-8")
    (Path(out_md) if out_md else out_html.with_suffix(".md")).write_text(render_markdown(sel), encoding="utf-8")
    return sel
