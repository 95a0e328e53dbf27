"""`bench select`: which engine or deployment to buy time for, from sweeps of each under one workload.

Per engine: the highest request rate at which the SLOs still hold (from its sweep: the goodput), the
output tokens/s per accelerator there, and, given a price, the cost per million output tokens if the
accelerators run at that rate all hour. The ranking is by cost per token, or without a price by output
tokens/s per accelerator within the SLOs; engines that never met them come last. Each gets a line on
why (select_why.py). A folder of `candidates:` (harness/runs/candidates.py) stands for its deployments, each
with the accelerators it declared; the SLOs default to the ones the runs were made with.

Simulated runs (`bench plan`) price themselves: a run on plan.hardware with a price in plan.prices costs that per
GPU-hour, so deployments on different GPU types are priced each by its own (--gpu-cost-per-hour prices the rest).
A `bench plan --search` folder (search.json beside candidates.json) also gives the rate to carry: its first
traffic level's rate with headroom; then the deployments that carry it rank by $/hour, cheapest first, as the
search ranks them. A point's goodput is its summary's (the steady-state window the run was judged on) when
judged under the SLOs the run was made with, so both commands read one number from one simulation.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import plotly.graph_objects as go

from harness.client.workers import client_bound_advice
from harness.engine.startup import startup_text
from harness.metrics.latencies import active_slo, slo_confidence
from harness.metrics.slo_capacity import LoadPoint, max_load_meeting_slo
from harness.results.schema import Startup
from reports.candidates import expand_candidates
from reports.figures import LAYOUT, color
from reports.html import render
from reports.load import Sweep, SweepPoint, load_results
from reports.markdown import md_table
from reports.peers.history import no_samples_reason
from reports.prediction import model_text
from reports.run_files import LoadView, harness_version, scenario, telemetry_sampled
from reports.select_why import judged_goodput, why
from reports.sweep import DEFAULT_ATTAINMENT, SloCapacity, point_goodput
from reports.sweep_figures import goodput_fraction_vs_load, throughput_latency

SLO_KEYS = ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms")
COLUMNS = (
    "rank",
    "engine",
    "backend",
    "highest rate within SLOs",
    "output tok/s per accelerator",
    "$ per 1M output tokens",
    "sweep points",
    "start-up",
    "notes",
)


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
    why: str = ""  # latencies where it passed, the SLO it missed first, the replicas' shares
    lowest_load_goodput: float = 0.0  # share within the SLOs at its lowest load: orders those that never met them
    startup: str = ""  # harness.engine.startup's line: launch to ready, engine build, first request
    dollars_per_hour: float | None = None  # the accelerators' price per hour, all of them
    simulated: bool = False  # a bench plan run: deterministic, so a rerun gives the same figures

    def capacity_text(self) -> str:
        cap = self.capacity
        if cap.status == "none":
            return "none"
        text = (
            f"{cap.offered_load:.3g} req/s"
            if self.load_kind == "rate"
            else f"{cap.offered_load:.3g} in flight ({cap.requests_per_s:.3g} req/s)"
        )
        return text + (" (at least)" if cap.status == "at_least" else "")


@dataclass
class Selection:
    slo: dict
    attainment: float
    gpu_cost_per_hour: float | None
    accelerators: int
    engines: list[EngineResult]
    sweeps: list[Sweep]
    recommendation: str
    caveats: list[str]
    ranking: list[str] = field(default_factory=list)  # engine labels, best first
    left_out: list[str] = field(default_factory=list)  # candidates that did not complete, with why
    required_rate: float | None = None  # req/s the deployment must carry (a search folder's rate with headroom)
    prices: dict[str, float] = field(default_factory=dict)  # $/GPU-hour per GPU type, from the simulated runs

    def price_text(self) -> str:
        if self.prices:
            each = ", ".join(f"{gpu} ${price:g}" for gpu, price in self.prices.items())
            rest = f"; others ${self.gpu_cost_per_hour:g}" if self.gpu_cost_per_hour is not None else ""
            carry = (
                f" Ranked by $/hour among the deployments that carry {self.required_rate:.3g} req/s within the SLOs."
                if self.required_rate is not None
                else ""
            )
            return f"Priced per GPU type (plan.prices, $/GPU-hour): {each}{rest}.{carry}"
        if self.gpu_cost_per_hour is None:
            return "No price given: ranked by output tokens/s per accelerator within the SLOs."
        if all(_cpu_only(sw) for sw in self.sweeps):
            return f"Machine price ${self.gpu_cost_per_hour:g}/hour (CPU only, no accelerator), 1 machine per engine."
        return f"Accelerator price ${self.gpu_cost_per_hour:g}/hour, {self.accelerators} per engine."


def parse_slo(text: str) -> dict:
    """`ttft_ms=500,tpot_ms=50` -> {"ttft_ms": 500.0, "tpot_ms": 50.0}; `confidence=0.95` judges on the bound."""
    slo = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        if sep and key.strip() == "confidence":
            slo["confidence"] = parse_confidence(part, value)
            continue
        if not sep or key.strip() not in SLO_KEYS:
            raise ValueError(
                f"--slo: {part!r} is not valid; use KEY=MS with KEY one of {', '.join(SLO_KEYS)}, "
                "or confidence=P, e.g. --slo ttft_ms=500,tpot_ms=50,confidence=0.95"
            )
        try:
            slo[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"--slo: {part!r}: {value!r} is not a number of milliseconds") from None
        if slo[key.strip()] <= 0:
            raise ValueError(f"--slo: {part!r}: the limit must be > 0 ms")
    if not active_slo(slo):
        raise ValueError("--slo: empty; give at least one limit, e.g. --slo ttft_ms=500,tpot_ms=50")
    return slo


def parse_confidence(part: str, value: str) -> float:
    try:
        confidence = float(value)
    except ValueError:
        raise ValueError(f"--slo: {part!r}: {value!r} is not a probability") from None
    if not 0.5 < confidence < 1:
        raise ValueError(f"--slo: {part!r}: confidence must be between 0.5 and 1 (exclusive), e.g. confidence=0.95")
    return confidence


def as_sweep(run) -> Sweep:
    """A single run is a one-point sweep at its offered rate (or concurrency)."""
    load = scenario(run.run_info.scenario).load or LoadView()
    kind, value = ("rate", load.rate) if load.rate else ("concurrency", load.concurrency)
    value = value or run.summary.throughput.requests_per_s
    return Sweep(run.path, run.label, kind, [SweepPoint(float(value), run)])


def select(
    paths,
    slo: dict | None = None,
    gpu_cost_per_hour: float | None = None,
    accelerators: int = 1,
    labels: list[str] | None = None,
    attainment: float = DEFAULT_ATTAINMENT,
    required_rate: float | None = None,
) -> Selection:
    if gpu_cost_per_hour is not None and gpu_cost_per_hour <= 0:
        raise ValueError("--gpu-cost-per-hour: must be > 0 (the price of one accelerator-hour, e.g. 2.5)")
    if accelerators < 1:
        raise ValueError("--accelerators: must be >= 1 (accelerators each engine ran on)")
    expanded = expand_candidates(paths, labels)
    runs, sweeps = load_results(expanded.paths, expanded.labels)
    sweeps = sweeps + [as_sweep(r) for r in runs]
    confidence = slo_confidence(slo) or runs_confidence(sweeps)
    slo = active_slo(slo) or runs_slo(sweeps)
    engines = [
        _engine(sw, slo, gpu_cost_per_hour, _accelerators(sw, expanded, accelerators), attainment, confidence)
        for sw in sweeps
    ]
    required_rate = required_rate if required_rate is not None else search_rate(paths)
    ranking = rank(engines, required_rate)
    recommendation, caveats = _recommend(ranking, sweeps, slo, attainment, required_rate)
    if confidence is not None:
        caveats.insert(
            0,
            f"SLOs judged on the bound: a load meets them when, with {confidence:.0%} confidence, at least "
            f"{attainment:.0%} of its requests do (the share's lower bound, not the share measured).",
        )
    if expanded.left_out:
        caveats.insert(0, "Not compared, as they did not complete: " + "; ".join(expanded.left_out) + ".")
    return Selection(
        slo,
        attainment,
        gpu_cost_per_hour,
        accelerators,
        engines,
        sweeps,
        recommendation,
        caveats,
        [e.label for e in ranking],
        expanded.left_out,
        required_rate,
        dict(price for sw in sweeps if (price := plan_price(sw))[0] is not None),
    )


def search_rate(paths) -> float | None:
    """The rate a `bench plan --search` folder asked its deployments to carry (its first level, headroom in)."""
    for path in map(Path, paths):
        found = path / "search.json"
        if path.is_dir() and found.is_file():
            levels = json.loads(found.read_text(encoding="utf-8")).get("levels") or []
            if levels and levels[0].get("target_rate_per_s"):
                return float(levels[0]["target_rate_per_s"])
    return None


def plan_price(sw: Sweep) -> tuple[str | None, float | None]:
    """(GPU type, $/GPU-hour) of a simulated run whose plan prices its hardware; (None, None) otherwise."""
    plan = sw.points[0].run.run_info.scenario.get("plan") or {}
    hardware = plan.get("hardware")
    price = (plan.get("prices") or {}).get(hardware)
    return (hardware, float(price)) if sw.points[0].run.summary.simulated and price else (None, None)


def _accelerators(sw: Sweep, expanded, default: int) -> int:
    """A candidate's declared accelerators; a simulated run's plan: TP x replicas; else --accelerators."""
    if sw.label in expanded.accelerators:
        return expanded.accelerators[sw.label]
    plan = sw.points[0].run.run_info.scenario.get("plan") or {}
    if sw.points[0].run.summary.simulated and default == 1 and plan.get("hardware"):
        return int(plan.get("tensor_parallel") or 1) * int(plan.get("replicas") or 1)
    return default


def runs_slo(sweeps: list[Sweep]) -> dict:
    """The SLOs the runs were made with, when they all agree (the comparison needs one set)."""
    slos = {json.dumps(active_slo(sw.points[0].run.slo), sort_keys=True) for sw in sweeps}
    if len(slos) != 1 or slos == {"{}"}:
        raise ValueError(
            "--slo: missing, and the runs do not share one set of SLOs to compare them at "
            f"({' vs '.join(sorted(slos))}); give them, e.g. --slo ttft_ms=500,tpot_ms=50"
        )
    return active_slo(sweeps[0].points[0].run.slo)  # in the order the scenario wrote them


def runs_confidence(sweeps: list[Sweep]) -> float | None:
    """The slo.confidence the runs were made with, when every run had the same one (else judged on the point)."""
    found = {sw.points[0].run.summary.goodput.confidence for sw in sweeps}
    return found.pop() if len(found) == 1 else None


def rank(engines: list[EngineResult], required_rate: float | None = None) -> list[EngineResult]:
    """Best first: with a rate to carry, those whose capacity carries it, cheapest per hour (most capacity at equal
    price: the search's order); then cheapest per token (or, without a price, most output tokens/s per
    accelerator within the SLOs); the engines that never met the SLOs after them, most requests within the SLOs at
    their lowest load first."""
    carrying = [e for e in engines if required_rate is not None and _carries(e, required_rate)]
    carrying.sort(key=lambda e: (e.dollars_per_hour, -e.capacity.offered_load))
    usable = [e for e in engines if e.tokens_per_s_per_accelerator and e not in carrying]
    usable.sort(
        key=lambda e: (
            e.cost_per_million_tokens if e.cost_per_million_tokens is not None else -e.tokens_per_s_per_accelerator
        )
    )
    rest = sorted((e for e in engines if e not in usable and e not in carrying), key=lambda e: -e.lowest_load_goodput)
    return carrying + usable + rest


def _carries(engine: EngineResult, rate: float) -> bool:
    """Priced, and its capacity reaches the rate: a deployment that passed at exactly the search's target rate (4
    decimals, harness/plan/search.py) reads back at it, not a rounding below."""
    cap = engine.capacity
    return engine.dollars_per_hour is not None and cap.status != "none" and (cap.offered_load or 0) >= rate * 0.9999


def _engine(sw: Sweep, slo, cost_per_hour, accelerators, attainment, confidence=None) -> EngineResult:
    cap = capacity(sw, slo, attainment, confidence)
    backend = sw.points[0].run.run_info.backend
    cost_per_hour = plan_price(sw)[1] or cost_per_hour
    tok_s = cap.output_tokens_per_s / accelerators if cap.output_tokens_per_s else None
    cost = cost_per_hour / (tok_s * 3600) * 1e6 if tok_s and cost_per_hour else None
    notes = []
    if cap.status == "at_least":
        notes.append("every tested load met the SLOs: the real limit is higher")
    only = sw.points[0].run if len(sw.points) == 1 else None
    no_samples = no_samples_reason(only.records, only.summary) if only else None
    if no_samples:  # a share within the SLOs needs per-request samples: no verdict on none (reports/peers/history.py)
        notes.append(no_samples)
    elif cap.status == "none":
        notes.append("missed the SLOs even at the lowest tested load")
    bound = _client_bound_note(sw, cap)
    if bound:
        notes.append(bound)
    if accelerators != 1:
        notes.append(f"{accelerators} accelerators")
    return EngineResult(
        sw.label,
        model_text(sw.points[0].run, _file_name(str(backend.model))),  # a GGUF path reads as its file name
        cap,
        tok_s,
        cost,
        len(sw.points),
        sw.load_kind,
        notes,
        why(sw, cap, slo, attainment, confidence),
        point_goodput(min(sw.points, key=lambda p: p.offered_load), slo, confidence),
        startup_text(_startup(sw)),
        cost_per_hour * accelerators if cost_per_hour else None,
        bool(sw.points[0].run.summary.simulated),
    )


def capacity(sw: Sweep, slo: dict, attainment: float, confidence: float | None) -> SloCapacity:
    """The highest load within the SLOs; each point judged on its summary's window when under its own SLOs."""
    return max_load_meeting_slo(
        [LoadPoint.from_summary(p.offered_load, p.run.summary, judged_goodput(p, slo, confidence)) for p in sw.points],
        attainment,
    )


def _startup(sw: Sweep) -> Startup | None:
    """The engine's start-up block: every point of a sweep carries the same one (one engine for all)."""
    return next((p.run.run_info.startup for p in sw.points if p.run.run_info.startup is not None), None)


def _client_bound_note(sw: Sweep, cap: SloCapacity) -> str | None:
    """Where the client fell behind, and whether the capacity rests on those points (the ones up to
    the first that failed) or lies below them."""
    bound_points = [p for p in sw.points if p.run.summary.client_bound]
    if not bound_points:
        return None
    bound = [p.offered_load for p in bound_points]
    first_fail = next(
        (
            p.offered_load
            for p in sorted(sw.points, key=lambda p: p.offered_load)
            if cap.offered_load is None or p.offered_load > cap.offered_load
        ),
        None,
    )
    loads = f"{sw.load_kind} {', '.join(f'{x:g}' for x in bound)}"
    if first_fail is None or min(bound) <= first_fail:
        run = bound_points[0].run
        advice = client_bound_advice(run.summary, run.run_info.host.cpu_count if run.run_info.host else None)
        return (
            f"the client fell behind at {loads}, which the capacity rests on: rerun on a quieter machine, or {advice}"
        )
    return f"the client fell behind at {loads}, past the capacity (those points do not move it)"


def _recommend(ranking: list[EngineResult], sweeps: list[Sweep], slo: dict, attainment: float, required_rate=None):
    """(the recommendation, the caveats): the best engine within the SLOs and how far it leads the next."""
    slo_text = ", ".join(f"{k.removesuffix('_ms').upper()} ≤ {v:g} ms" for k, v in slo.items())
    caveats = _caveats(ranking, sweeps, slo_text, attainment)
    usable = [e for e in ranking if e.tokens_per_s_per_accelerator]
    if not usable:
        return f"No engine met the SLOs ({slo_text}) at any tested load; relax the SLOs or test lower loads.", caveats
    if required_rate is not None and _carries(ranking[0], required_rate):
        return _carrying_text(ranking, required_rate, slo_text), caveats
    best = usable[0]
    priced = best.cost_per_million_tokens is not None
    unit = "req/s" if best.load_kind == "rate" else "requests in flight"
    text = (
        f"Choose {best.label}: within {slo_text} it sustains {best.capacity.describe(unit)} at "
        f"{best.tokens_per_s_per_accelerator:,.1f} output tokens/s per accelerator"
        + (f", ${best.cost_per_million_tokens:,.2f} per million output tokens" if priced else "")
    )
    if len(usable) > 1:
        text += _lead(best, usable[1])
    if best.why:
        text += f"; {best.why}"
    unjudged = "not established"  # no per-request samples: neither met nor missed (reports/peers/history.py)
    missed = [e.label for e in ranking if not e.tokens_per_s_per_accelerator and not e.why.startswith(unjudged)]
    if missed:
        text += f"; {', '.join(missed)} did not meet the SLOs at any tested load"
    if best.capacity.status == "at_least":
        caveats.append(f"{best.label} never missed the SLOs in its sweep; sweep higher to find its limit.")
    return text + ".", caveats


def _caveats(ranking: list[EngineResult], sweeps: list[Sweep], slo_text: str, attainment: float) -> list[str]:
    """What the comparison holds for: this workload and these SLOs, this hardware and software, the price,
    CPU-only runs, and workloads that differ."""
    caveats = [
        f"Measured for this workload only (the scenarios of these runs), at SLOs {slo_text} for "
        f"{attainment:.0%} of requests; another prompt/output length mix or arrival pattern can change the order.",
        "Measured on this hardware and these software versions: " + "; ".join(_where(sw) for sw in sweeps) + ".",
        "Cost assumes the accelerators are busy at that rate all hour; idle time raises the real cost.",
    ]
    if all(e.cost_per_million_tokens is None for e in ranking):
        caveats.pop()  # no price (or nothing met the SLOs): no cost to qualify
    if all(_cpu_only(sw) for sw in sweeps):
        unit = (
            "per machine here, or per the accelerators (cores) a candidate declared"
            if any("accelerators" in n for e in ranking for n in e.notes)
            else "per machine here"
        )
        caveats.append(
            f'No GPU was seen in these runs (CPU only): "per accelerator" means {unit}, '
            "the price is the machine's, and on GPUs the engines can rank differently."
        )
    workloads = {repr(scenario(sw.points[0].run.run_info.scenario).workload) for sw in sweeps}
    if len(workloads) > 1:
        caveats.insert(
            0, "WARNING: the engines were run with different workloads; the comparison is not like for like."
        )
    return caveats


def _carrying_text(ranking: list[EngineResult], required_rate: float, slo_text: str) -> str:
    """The cheapest deployment per hour that carries the rate, and what the next one costs."""
    best = ranking[0]
    text = (
        f"Choose {best.label}: the cheapest per hour (${best.dollars_per_hour:,.2f}) of those that carry "
        f"{required_rate:.3g} req/s within {slo_text}; its capacity is {best.capacity.describe('req/s')}"
    )
    runner_up = next((e for e in ranking[1:] if _carries(e, required_rate)), None)
    if runner_up is not None:
        text += f"; next, {runner_up.label} at ${runner_up.dollars_per_hour:,.2f}/hour"
        if best.simulated and runner_up.simulated:
            text += " (simulated, so deterministic: a rerun gives the same order; the model's own error is not in it)"
    return text + "."


def _lead(best: EngineResult, runner_up: EngineResult) -> str:
    """How far the best engine leads the runner-up: by cost per token when priced, else by output tokens/s."""
    priced = best.cost_per_million_tokens is not None
    ratio = (
        runner_up.cost_per_million_tokens / best.cost_per_million_tokens
        if priced
        else best.tokens_per_s_per_accelerator / runner_up.tokens_per_s_per_accelerator
    )
    better = "cheaper per token than" if priced else "the output tokens/s within the SLOs of"
    if ratio < 1.1:
        what = "cost per token" if priced else "output tokens/s"
        if best.simulated and runner_up.simulated:  # a plan is deterministic: a rerun cannot swap them
            return (
                f", within 10% of {runner_up.label}'s {what} (both simulated: the same on every rerun, but within "
                f"the model's own error of each other)"
            )
        return f", within 10% of {runner_up.label}'s {what}: a rerun could swap them, so weigh other factors"
    if runner_up.capacity.status == "at_least":  # its limit is above its sweep: its figure is a bound
        return (
            f", up to {ratio:.1f}× {better} {runner_up.label} (which never missed the SLOs "
            f"in its sweep, so it may do better)"
        )
    return f", {ratio:.1f}× {better} {runner_up.label}"


def _where(sw: Sweep) -> str:
    """Label: engine kind, version and launch arguments; host, CPUs, GPU or not; harness version."""
    info = sw.points[0].run.run_info
    backend = info.backend
    engine = f"{backend.kind} {backend.engine_version or '(version not reported)'}"
    launch = scenario(info.scenario).backend.launch
    if launch is not None and launch.args:
        engine += f" started with `{' '.join(launch_args_text(launch.args, str(backend.model)))}`"
    device = " CPU only," if _cpu_only(sw) else ""
    host = info.host
    machine = f"{host.hostname} ({host.cpu_count} CPUs,{device} {host.platform})" if host else f"? (? CPUs,{device} ?)"
    return f"{sw.label}: {engine}, on {machine}, harness {harness_version(info) or '?'}"


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
    sampled = telemetry_sampled(sw.points[0].run.run_info)
    return sampled is not None and "gpu" not in sampled


def rows(sel: Selection) -> list[list[str]]:
    """The table, best first."""

    def money(x):
        return "n/a" if x is None else f"${x:,.2f}"

    by_label = {e.label: e for e in sel.engines}
    return [
        [
            str(i),
            e.label,
            e.backend,
            e.capacity_text(),
            "n/a" if e.tokens_per_s_per_accelerator is None else f"{e.tokens_per_s_per_accelerator:,.1f}",
            money(e.cost_per_million_tokens),
            str(e.points),
            e.startup,
            "; ".join(e.notes),
        ]
        for i, e in enumerate((by_label[label] for label in sel.ranking), start=1)
    ]


def why_lines(sel: Selection) -> list[str]:
    by_label = {e.label: e for e in sel.engines}
    return [f"{label}: {by_label[label].why}" for label in sel.ranking if by_label[label].why]


def cost_figure(sel: Selection) -> go.Figure:
    usable = [e for e in sel.engines if e.cost_per_million_tokens is not None]
    fig = go.Figure(
        go.Bar(
            x=[e.label for e in usable],
            y=[e.cost_per_million_tokens for e in usable],
            marker_color=[color(sel.engines.index(e)) for e in usable],
        )
    )
    fig.update_layout(
        title="Cost per million output tokens at the highest rate within SLOs", yaxis_title="$", height=400, **LAYOUT
    )
    return fig


def render_markdown(sel: Selection) -> str:
    head = [
        f"# Engine selection: {', '.join(e.label for e in sel.engines)}",
        "",
        f"**Recommendation.** {sel.recommendation}",
        "",
        sel.price_text(),
        "",
        md_table(COLUMNS, rows(sel)),
        "",
        "## Why",
        "",
        *[f"- {line}" for line in why_lines(sel)],
        "",
        "## Caveats",
        "",
    ]
    return "\n".join(head + [f"- {c}" for c in sel.caveats] + [""])


def write_selection(paths, out_html: Path, out_md: Path | None = None, **kwargs) -> Selection:
    sel = select(paths, **kwargs)
    figures = [
        ("Goodput against offered load", goodput_fraction_vs_load(sel.sweeps, sel.slo, sel.attainment)),
        ("Throughput against latency", throughput_latency(sel.sweeps)),
    ]
    if any(e.cost_per_million_tokens for e in sel.engines):
        figures.append(("Cost per million output tokens", cost_figure(sel)))
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(
        render(
            "select.html.j2",
            figures,
            title="Engine selection",
            sel=sel,
            columns=COLUMNS,
            rows=rows(sel),
            why=why_lines(sel),
        ),
        encoding="utf-8",
    )
    (Path(out_md) if out_md else out_html.with_suffix(".md")).write_text(render_markdown(sel), encoding="utf-8")
    return sel
