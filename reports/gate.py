"""`bench gate`: did the current run get worse than the baseline, beyond noise and beyond a threshold?

Per metric: the relative change (current - baseline) / baseline with a bootstrap confidence
interval. Verdicts, with "worse" meaning higher latency or lower throughput/goodput:
  regression   the interval lies wholly on the worse side of 0 and the change is worse than the threshold
  improvement  the same on the better side
  pass         the interval lies within +-threshold, or the change is real but within the threshold
  inconclusive the interval straddles 0 and reaches past the threshold: too noisy to say
Only a regression fails the gate (exit 1).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.metrics import meets_slo, request_latency
from reports.load import RunData
from reports.markdown import md_table
from reports.stats import bootstrap_relative_change, statistic_fn, window_rates

PER_REQUEST_SOURCES = ("ttft", "tpot", "e2e", "itl", "goodput")
WINDOW_SOURCES = ("output_tokens_per_s", "requests_per_s")


class GateRulesError(Exception):
    """The rules file is not valid; the message names the key and the fix."""


class MetricRule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    source: Literal["ttft", "tpot", "e2e", "itl", "goodput", "output_tokens_per_s", "requests_per_s"]
    statistic: str = "p50"
    better: Literal["lower", "higher"]
    threshold: float = Field(gt=0, lt=10, description="relative change, e.g. 0.1 for 10%")


class GateRules(BaseModel):
    model_config = ConfigDict(extra="forbid")
    confidence: float = Field(default=0.95, gt=0.5, lt=1)
    resamples: int = Field(default=2000, ge=200)
    seed: int = 0
    min_samples: int = Field(default=20, ge=2, description="samples per run below which a metric is inconclusive")
    windows: int = Field(default=20, ge=4, description="time windows for throughput-like metrics")
    # a bootstrap of p99 from 50 samples resamples the same 1-2 top values: its interval is too narrow to trust
    min_tail_samples: int = Field(default=5, ge=1, description="samples beyond a percentile needed to judge it")
    metrics: dict[str, MetricRule]


DEFAULT_RULES = {"metrics": {
    "ttft_p50": {"source": "ttft", "statistic": "p50", "better": "lower", "threshold": 0.10},
    "ttft_p99": {"source": "ttft", "statistic": "p99", "better": "lower", "threshold": 0.20},
    "tpot_p50": {"source": "tpot", "statistic": "p50", "better": "lower", "threshold": 0.10},
    "output_tokens_per_s": {"source": "output_tokens_per_s", "statistic": "mean", "better": "higher", "threshold": 0.10},
    "goodput": {"source": "goodput", "statistic": "mean", "better": "higher", "threshold": 0.05}}}


def load_rules(path: str | Path | None) -> GateRules:
    data = DEFAULT_RULES
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise GateRulesError(f"--rules: file {str(path)!r} not found; pass a YAML file like ci/gate.yaml")
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    try:
        rules = GateRules.model_validate(data)
        for name, rule in rules.metrics.items():
            try:
                statistic_fn(rule.statistic)
            except ValueError as e:
                raise GateRulesError(f"metrics.{name}.{e}") from None
        return rules
    except ValidationError as e:
        lines = [f"{'.'.join(map(str, err['loc']))}: {err['msg']} (got {err.get('input')!r})" for err in e.errors()]
        raise GateRulesError(f"{path or 'default rules'}:\n" + "\n".join(lines)) from None


@dataclass
class MetricVerdict:
    name: str
    rule: MetricRule
    verdict: str  # pass | regression | improvement | inconclusive
    baseline: float | None = None
    current: float | None = None
    change: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    note: str = ""


def samples(run: RunData, rule: MetricRule, rules: GateRules, slo: dict) -> np.ndarray:
    """What the bootstrap resamples: per request (latencies in ms, 0/1 for meeting `slo`) or per window."""
    df = run.requests
    if rule.source in ("ttft", "tpot", "e2e"):
        return df[f"{rule.source}_s"].dropna().to_numpy(dtype=float) * 1e3
    if rule.source == "itl":
        return run.itl_s * 1e3
    if rule.source == "goodput":
        return np.array([float(lat is not None and meets_slo(lat, slo))
                         for lat in map(request_latency, run.records)])
    start = float(df["intended_send_s"].min()) if len(df) else 0.0
    end = float(np.nanmax(df["end_s"])) if len(df) else 0.0
    if rule.source == "output_tokens_per_s":
        return window_rates(run.token_times_s, None, start, end, rules.windows)
    done = df[df["ok"]]
    return window_rates(done["end_s"].to_numpy(dtype=float), None, start, end, rules.windows)


def judge(name: str, rule: MetricRule, baseline: RunData, current: RunData, rules: GateRules) -> MetricVerdict:
    slo = {k: v for k, v in baseline.slo.items() if v is not None}  # both runs judged by the baseline's SLOs
    b, c = samples(baseline, rule, rules, slo), samples(current, rule, rules, slo)
    if c.size < rules.min_samples <= b.size and rule.source in PER_REQUEST_SOURCES and rule.source != "goodput":
        # the baseline had enough; the current run lost them (failures, no tokens): that is itself a regression
        return MetricVerdict(name, rule, "regression", note=f"current run has {c.size} samples, baseline {b.size}")
    enough = min(rules.min_samples, rules.windows) if rule.source in WINDOW_SOURCES else rules.min_samples
    if min(b.size, c.size) < enough:
        return MetricVerdict(name, rule, "inconclusive",
                             note=f"too few samples ({b.size} vs {c.size}; need {enough})")
    needed = _samples_for_tail(rule.statistic, rules.min_tail_samples)
    if min(b.size, c.size) < needed:
        return MetricVerdict(name, rule, "inconclusive", note=f"{rule.statistic} needs >= {needed} samples per run "
                             f"to hold {rules.min_tail_samples} beyond it ({b.size} vs {c.size})")
    try:
        ch = bootstrap_relative_change(b, c, rule.statistic, rules.resamples, rules.confidence, rules.seed)
    except ValueError as e:
        return MetricVerdict(name, rule, "inconclusive", note=str(e))
    sign = 1.0 if rule.better == "lower" else -1.0  # worse = sign * change > 0
    worse, lo, hi = sign * ch.change, *sorted((sign * ch.ci_low, sign * ch.ci_high))
    t = rule.threshold
    if lo > 0 and worse > t:
        verdict = "regression"
    elif hi < 0 and -worse > t:
        verdict = "improvement"
    elif -t <= lo and hi <= t or lo > 0 or hi < 0:
        verdict = "pass"
    else:
        verdict = "inconclusive"
    return MetricVerdict(name, rule, verdict, ch.baseline, ch.current, ch.change, ch.ci_low, ch.ci_high)


def _samples_for_tail(statistic: str, tail: int) -> int:
    if not statistic.startswith("p"):
        return 0
    beyond = 1 - float(statistic[1:]) / 100
    return int(np.ceil(tail / max(beyond, 1e-9))) if beyond < 0.5 else 0


def compare(baseline: RunData, current: RunData, rules: GateRules) -> list[MetricVerdict]:
    return [judge(name, rule, baseline, current, rules) for name, rule in rules.metrics.items()]


def exit_code(verdicts: list[MetricVerdict]) -> int:
    return 1 if any(v.verdict == "regression" for v in verdicts) else 0


def scenario_differences(baseline: RunData, current: RunData) -> list[str]:
    """Scenario keys that differ (the backend URL aside): a gate across different loads compares apples and pears."""
    def flat(d, prefix=""):
        out = {}
        for k, v in (d or {}).items():
            key = f"{prefix}{k}"
            out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
        return out
    a, b = flat(baseline.run_info.get("scenario")), flat(current.run_info.get("scenario"))
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in ("backend.url", "name"))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys]


def render_markdown(baseline: RunData, current: RunData, verdicts: list[MetricVerdict], rules: GateRules) -> str:
    icon = {"pass": "✅ pass", "regression": "❌ regression", "improvement": "🚀 improvement",
            "inconclusive": "❔ inconclusive"}
    rows = []
    for v in verdicts:
        unit = "ms" if v.rule.source in ("ttft", "tpot", "e2e", "itl") else ""
        num = (lambda x: "-" if x is None else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}") + (unit and " " + unit))
        pct = (lambda x: "-" if x is None else f"{100 * x:+.1f}%")
        ci = "-" if v.ci_low is None else f"[{pct(v.ci_low)}, {pct(v.ci_high)}]"
        rows.append([v.name, f"{v.rule.source} {v.rule.statistic}", num(v.baseline), num(v.current), pct(v.change), ci,
                     f"±{100 * v.rule.threshold:.0f}% ({v.rule.better} is better)", icon[v.verdict], v.note])
    failed = exit_code(verdicts)
    out = [f"## Benchmark gate: {'FAILED' if failed else 'passed'}", "",
           f"Baseline `{baseline.path}` vs current `{current.path}`; {rules.confidence:.0%} bootstrap intervals "
           f"({rules.resamples} resamples, seed {rules.seed}) of the relative change.", "",
           md_table(["metric", "statistic", "baseline", "current", "change", f"{rules.confidence:.0%} CI",
                     "threshold", "verdict", "note"], rows), ""]
    diffs = scenario_differences(baseline, current)
    if diffs:
        out += ["> **Warning**: the runs used different scenarios: " + "; ".join(diffs), ""]
    for role, run in (("baseline", baseline), ("current", current)):
        flags = [f for f in ("client_bound", "interrupted") if run.summary.get(f)]
        if flags:
            out += [f"> **Warning**: the {role} run is {' and '.join(flags)}: its latencies are not the engine's alone.", ""]
    return "\n".join(out)
