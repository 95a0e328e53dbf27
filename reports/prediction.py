"""Prediction beside measurement: each simulated run (`bench plan`, summary.json `simulated: true`)
set against each measured run of the same report, metric by metric, with the prediction's error; and what a
report of simulated runs says of itself: PREDICTION in its title, the model it simulated (plan.model, not the
scenario's backend.model), and every assumption the prediction rests on (GPU, TP, replicas, precision, the engine
profile's settings and overheads, the roofline's MFU/MBU)."""

from __future__ import annotations

from collections.abc import Callable

from harness.results.schema import Summary

PREDICTION_COLUMNS = ["metric", "measured run", "measured", "simulated run", "predicted", "error %"]
METRICS: tuple[tuple[str, Callable[[Summary], float | None]], ...] = (
    ("TTFT p50 ms", lambda s: s.ttft_ms.p50),
    ("TTFT p90 ms", lambda s: s.ttft_ms.p90),
    ("TPOT p50 ms", lambda s: s.tpot_ms.p50),
    ("ITL p50 ms", lambda s: s.itl_ms.p50),
    ("E2E p50 ms", lambda s: s.e2e_ms.p50),
    ("output tok/s", lambda s: s.throughput.output_tokens_per_s),
    ("goodput req/s", lambda s: s.goodput.requests_per_s),
)


def is_simulated(summary: Summary) -> bool:
    return bool(summary.simulated)


def prediction_rows(runs) -> list[list[str]]:
    """A row per (measured run, simulated run, metric); none unless the report holds both kinds."""
    measured = [r for r in runs if not is_simulated(r.summary)]
    simulated = [r for r in runs if is_simulated(r.summary)]
    rows = []
    for m in measured:
        for s in simulated:
            for name, figure in METRICS:
                actual, predicted = figure(m.summary), figure(s.summary)
                error = 100 * (predicted - actual) / actual if actual and predicted is not None else None
                rows.append(
                    [name, m.label, _fmt(actual), s.label, _fmt(predicted), "-" if error is None else f"{error:+.1f}"]
                )
    return rows


def _fmt(value) -> str:
    return "-" if value is None else f"{value:,.1f}"


def prediction_title(title: str, runs) -> str:
    """The report's title, saying PREDICTION when its runs were simulated (or that some were)."""
    simulated = [r for r in runs if is_simulated(r.summary)]
    if not simulated:
        return title
    if len(simulated) == len(runs):
        return f"PREDICTION (simulated by bench plan, not measured): {title}"
    return f"{title} (with SIMULATED runs: predictions beside measurements)"


def simulated_model(run) -> str | None:
    """The model a simulated run's roofline ran (plan.model's architecture), None for a measured or fitted run."""
    plan = run.summary.plan
    if not is_simulated(run.summary) or plan is None:
        return None
    return (plan.step_model.get("architecture") or {}).get("name")


def model_text(run, model: str | None = None) -> str:
    """`kind (model)` for a context table: a simulated run names the model it simulated, not the scenario's
    backend.model (which a plan of the native engine leaves at the small model it never loads). `model`: how to
    write backend.model (a GGUF path cut to its file name, say)."""
    backend = run.run_info.backend
    model = model or backend.model
    simulated = simulated_model(run)
    if simulated is None or simulated == model:
        return f"{backend.kind} ({model})"
    return f"{backend.kind} simulating {simulated} (backend.model {model})"


def assumption_notes(labelled) -> list[str]:
    """A note per distinct simulated deployment among (label, run) pairs: the plan block and every assumed
    constant, so a reader sees what the prediction rests on without opening summary.json."""
    notes: dict[str, list[str]] = {}
    for label, run in labelled:
        if is_simulated(run.summary) and run.summary.plan is not None:
            notes.setdefault(assumption_text(run.summary.plan), []).append(label)
    return [f"PREDICTION, not a measurement ({', '.join(labels)}): {text}" for text, labels in notes.items()]


def assumption_text(plan) -> str:
    """One line: model, GPU, TP, replicas, precision, engine profile settings (with where each came from), the
    overheads, and the step model's coefficients."""
    step, deployment = plan.step_model, plan.deployment
    engine = deployment.get("engine") or {}
    arch, gpu = step.get("architecture") or {}, step.get("gpu") or {}
    parts = [
        f"model {arch.get('name', '?')}" + (f" ({arch['source']})" if arch.get("source") else ""),
        f"GPU {gpu.get('name', 'this host (fitted)')}",
        f"TP {step.get('tensor_parallel', 1)} x {deployment.get('replicas', 1)} replica(s)",
    ]
    if step.get("precision"):
        parts.append("precision " + ", ".join(f"{k} {v}" for k, v in step["precision"].items()))
    sources = engine.get("sources") or {}
    settings = ", ".join(f"{k} {v} ({sources.get(k, '?')})" for k, v in (engine.get("settings") or {}).items())
    parts.append(f"engine profile {engine.get('name', deployment.get('engine_profile', '?'))}: {settings}")
    overheads = engine.get("overheads_ms") or {}
    if overheads:
        parts.append("overheads " + ", ".join(f"{k} {v:g}" for k, v in overheads.items()) + " (stated)")
    coefficients = step.get("coefficients") or {}
    parts.append(f"step model {step.get('kind', '?')}: " + ", ".join(f"{k} {v:g}" for k, v in coefficients.items()))
    parts.append(f"KV blocks {deployment.get('num_kv_blocks', '?'):,} of {deployment.get('kv_block_size', '?')}")
    return "; ".join(parts)
