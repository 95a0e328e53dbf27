"""`bench gate`: did the current runs get worse than the baseline runs, beyond noise and beyond a threshold?

Each side is one run or several runs of the same scenario (reports/repeats.py). Per metric: the
relative change (current - baseline) / baseline and a confidence interval:
  - two or more runs on a side: each run's statistic (its TTFT p50, its tokens/s) is one sample and
    the interval comes from the spread between runs (reports.stats.run_level_change), so the
    run-to-run variation of the machine is in it; a side with one run borrows the other's spread;
  - one run on each side: a block bootstrap within the runs (reports.stats.bootstrap_relative_change).
    It cannot see run-to-run variation (10-25% between whole runs on a shared 2-core box), so a
    significant change only counts beyond the metric's `single_run_threshold`; below that the
    verdict is inconclusive and the note says to repeat the runs.
Verdicts, with "worse" meaning higher latency or lower throughput/goodput:
  regression   the interval lies wholly on the worse side of 0 and the change is worse than the threshold
  improvement  the same on the better side
  pass         the interval lies within +-threshold, or the change is real but within the threshold
  inconclusive the interval straddles 0 and reaches past the threshold: too noisy to say
Only a regression fails the gate (exit 1). When no metric regressed but some could not be decided the
headline says "inconclusive"; `bench gate --strict` (for CI) then exits 5.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.metrics.confidence import samples_needed
from harness.metrics.latencies import active_slo, meets_slo, request_latency
from reports.load import RunData
from reports.markdown import md_table
from reports.repeats import RunSet
from reports.stats import RelativeChange, bootstrap_relative_change, run_level_change, statistic_fn, window_rates

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
    # one run per side: whole runs differ by 10-25% here, so only a change this large is trusted
    single_run_threshold: float = Field(
        default=0.5, gt=0, lt=10, description="relative change a one-run-per-side comparison must pass"
    )

    @model_validator(mode="after")
    def _single_run_threshold_is_larger(self) -> MetricRule:
        if self.single_run_threshold < self.threshold:
            raise ValueError(
                f"single_run_threshold ({self.single_run_threshold}) must be >= threshold "
                f"({self.threshold}): one run per side is the less certain comparison"
            )
        return self


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


DEFAULT_RULES = {
    "metrics": {
        "ttft_p50": {"source": "ttft", "statistic": "p50", "better": "lower", "threshold": 0.10},
        "ttft_p99": {"source": "ttft", "statistic": "p99", "better": "lower", "threshold": 0.20},
        "tpot_p50": {"source": "tpot", "statistic": "p50", "better": "lower", "threshold": 0.10},
        "output_tokens_per_s": {
            "source": "output_tokens_per_s",
            "statistic": "mean",
            "better": "higher",
            "threshold": 0.10,
        },
        "goodput": {"source": "goodput", "statistic": "mean", "better": "higher", "threshold": 0.05},
    }
}


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
    baseline: float | None = None  # the baseline's statistic: mean over its runs
    current: float | None = None
    change: float | None = None
    ci_low: float | None = None
    ci_high: float | None = None
    note: str = ""
    baseline_runs: int = 1
    current_runs: int = 1
    baseline_spread: float | None = None  # standard deviation of the per-run values (None with one run)
    current_spread: float | None = None


def samples(run: RunData, rule: MetricRule, rules: GateRules, slo: dict) -> np.ndarray:
    """One run's samples: per request (latencies in ms, 0/1 for meeting `slo`) or per time window."""
    df = run.requests
    if rule.source in ("ttft", "tpot", "e2e"):
        return df[f"{rule.source}_s"].dropna().to_numpy(dtype=float) * 1e3
    if rule.source == "itl":
        return run.itl_s * 1e3
    if rule.source == "goodput":
        return np.array([float(lat is not None and meets_slo(lat, slo)) for lat in map(request_latency, run.records)])
    start = float(df["intended_send_s"].min()) if len(df) else 0.0
    end = float(np.nanmax(df["end_s"])) if len(df) else 0.0
    if rule.source == "output_tokens_per_s":
        return window_rates(run.token_times_s, None, start, end, rules.windows)
    done = df[df["ok"]]
    return window_rates(done["end_s"].to_numpy(dtype=float), None, start, end, rules.windows)


def judge(name: str, rule: MetricRule, baseline: RunSet, current: RunSet, rules: GateRules) -> MetricVerdict:
    slo = active_slo(baseline.runs[0].slo)  # all runs judged by one SLO set
    b = [samples(r, rule, rules, slo) for r in baseline.runs]
    c = [samples(r, rule, rules, slo) for r in current.runs]
    sides = {"baseline_runs": len(b), "current_runs": len(c)}
    b_min, c_min = min(x.size for x in b), min(x.size for x in c)
    if c_min < rules.min_samples <= b_min and rule.source in PER_REQUEST_SOURCES and rule.source != "goodput":
        # the baseline had enough; a current run lost them (failures, no tokens): that is itself a regression
        return MetricVerdict(
            name, rule, "regression", note=f"a current run has {c_min} samples, baseline runs >= {b_min}", **sides
        )
    enough = min(rules.min_samples, rules.windows) if rule.source in WINDOW_SOURCES else rules.min_samples
    if min(b_min, c_min) < enough:
        return MetricVerdict(
            name, rule, "inconclusive", note=f"too few samples in a run ({b_min} vs {c_min}; need {enough})", **sides
        )
    needed = samples_for_tail(rule.statistic, rules.min_tail_samples, rules.confidence)
    if min(b_min, c_min) < needed:
        return MetricVerdict(
            name,
            rule,
            "inconclusive",
            note=f"{rule.statistic} needs >= {needed} samples per run "
            f"to hold {rules.min_tail_samples} beyond it and be established at {rules.confidence:.0%} "
            f"({b_min} vs {c_min})",
            **sides,
        )
    stat = statistic_fn(rule.statistic)
    b_values, c_values = ([float(stat(x[None, :])[0]) for x in side] for side in (b, c))
    sides.update(baseline_spread=_spread(b_values), current_spread=_spread(c_values))
    one_run_each = len(b) == 1 and len(c) == 1
    try:
        ch = (
            bootstrap_relative_change(b[0], c[0], rule.statistic, rules.resamples, rules.confidence, rules.seed)
            if one_run_each
            else run_level_change(b_values, c_values, rules.confidence)
        )
    except ValueError as e:
        return MetricVerdict(name, rule, "inconclusive", note=str(e), **sides)
    verdict, note = verdict_for_change(ch, rule, one_run_each)
    return MetricVerdict(name, rule, verdict, ch.baseline, ch.current, ch.change, ch.ci_low, ch.ci_high, note, **sides)


def verdict_for_change(ch: RelativeChange, rule: MetricRule, one_run_each: bool) -> tuple[str, str]:
    """The gate's rule for one measured change; the history gate applies the same rule, not a copy."""
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
    if one_run_each and verdict in ("regression", "improvement") and abs(worse) <= rule.single_run_threshold:
        return "inconclusive", (
            f"one run per side: the interval misses run-to-run variation, so only a change "
            f"beyond ±{100 * rule.single_run_threshold:.0f}% counts; repeat the runs"
        )
    return verdict, ""


def _spread(values: list[float]) -> float | None:
    return float(np.std(values, ddof=1)) if len(values) > 1 else None


def samples_for_tail(statistic: str, tail: int, confidence: float) -> int:
    """The samples a run needs to judge a percentile: `tail` beyond it, and enough to establish it (bound it
    from both sides by order statistics, harness/metrics/confidence.py) at the gate's confidence."""
    if not statistic.startswith("p"):
        return 0
    q = float(statistic[1:]) / 100  # the gate writes p99.9
    beyond = 1 - q
    established = samples_needed(q, confidence) if 0 < q < 1 else 0
    return max(int(np.ceil(tail / max(beyond, 1e-9))) if beyond < 0.5 else 0, established)


def compare(baseline: RunSet, current: RunSet, rules: GateRules) -> list[MetricVerdict]:
    return [judge(name, rule, baseline, current, rules) for name, rule in rules.metrics.items()]


EXIT_REGRESSION, EXIT_INCONCLUSIVE = 1, 5


def gate_status(verdicts: list[MetricVerdict]) -> str:
    """failed (a regression), inconclusive (none, but some metric undecided) or passed."""
    if any(v.verdict == "regression" for v in verdicts):
        return "failed"
    return "inconclusive" if any(v.verdict == "inconclusive" for v in verdicts) else "passed"


def exit_code(verdicts: list[MetricVerdict], strict: bool = False) -> int:
    status = gate_status(verdicts)
    if status == "failed":
        return EXIT_REGRESSION
    return EXIT_INCONCLUSIVE if strict and status == "inconclusive" else 0


def scenario_differences(baseline: RunSet, current: RunSet) -> list[str]:
    """Scenario keys that differ besides name, workload and load (those must match, see repeats.py): a backend,
    SLO or launch change is worth a warning. The URL and the seed differ between repeats by design."""

    def flat(d, prefix=""):
        out = {}
        for k, v in (d or {}).items():
            key = f"{prefix}{k}"
            out.update(flat(v, key + ".") if isinstance(v, dict) else {key: v})
        return out

    a, b = flat(baseline.scenario), flat(current.scenario)
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k) and k not in ("backend.url", "name", "seed"))
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys]


def skipped_lines(*sides: RunSet) -> list[str]:
    """A warning per invalid run the gate left out, with its reasons (`--keep-invalid` keeps them)."""
    return [f"> **Skipped** (`--keep-invalid` keeps it): {why}\n" for side in sides for why in side.skipped]


VERDICT_ICONS = {
    "pass": "✅ pass",
    "regression": "❌ regression",
    "improvement": "🚀 improvement",
    "inconclusive": "❔ inconclusive",
}


def short_number(x: float | None) -> str:
    """A value for a table cell: thousands grouped from 100 up, else 3 significant digits; '-' when missing."""
    return "-" if x is None else (f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}")


def percent(x: float | None) -> str:
    """A relative change as a signed percentage, '-' when missing."""
    return "-" if x is None else f"{100 * x:+.1f}%"


def _value(x: float | None, spread: float | None, unit: str) -> str:
    """A side's value, ± its spread over runs where it has one, then its unit."""
    if x is None:
        return "-"
    return short_number(x) + ("" if spread is None else f" ± {short_number(spread)}") + (f" {unit}" if unit else "")


def verdict_row(v: MetricVerdict, runs: str) -> list[str]:
    """One metric's row of the verdict table; `runs` fills the column of runs (or nights) per side."""
    unit = "ms" if v.rule.source in ("ttft", "tpot", "e2e", "itl") else ""
    return [
        v.name,
        f"{v.rule.source} {v.rule.statistic}",
        runs,
        _value(v.baseline, v.baseline_spread, unit),
        _value(v.current, v.current_spread, unit),
        percent(v.change),
        "-" if v.ci_low is None else f"[{percent(v.ci_low)}, {percent(v.ci_high)}]",
        f"±{100 * v.rule.threshold:.0f}% ({v.rule.better} is better)",
        VERDICT_ICONS[v.verdict],
        v.note,
    ]


def verdict_table(rows: list[list[str]], rules: GateRules, runs_column: str) -> str:
    """The verdict table of `verdict_row`s, its runs column headed `runs_column`."""
    return md_table(
        [
            "metric",
            "statistic",
            runs_column,
            "baseline",
            "current",
            "change",
            f"{rules.confidence:.0%} CI",
            "threshold",
            "verdict",
            "note",
        ],
        rows,
    )


def render_markdown(baseline: RunSet, current: RunSet, verdicts: list[MetricVerdict], rules: GateRules) -> str:
    n_b, n_c = len(baseline.runs), len(current.runs)
    out = [
        f"## Benchmark gate: {_headline(verdicts)}",
        "",
        f"Baseline `{baseline.path}` ({n_b} run{'s' * (n_b > 1)}) vs current `{current.path}` "
        f"({n_c} run{'s' * (n_c > 1)}); {_method(rules, n_b, n_c)}",
        "",
        verdict_table(
            [verdict_row(v, f"{v.baseline_runs} / {v.current_runs}") for v in verdicts], rules, "runs (base / cur)"
        ),
        "",
    ]
    out += skipped_lines(baseline, current)
    out += _settings_warning(baseline, current)
    out += _not_the_engine_alone_warnings(baseline, current)
    return "\n".join(out)


def _headline(verdicts: list[MetricVerdict]) -> str:
    status = gate_status(verdicts)
    if status == "inconclusive":
        undecided = sum(v.verdict == "inconclusive" for v in verdicts)
        return f"inconclusive ({undecided} of {len(verdicts)} metrics undecided, none regressed)"
    return "FAILED" if status == "failed" else "passed"


def _method(rules: GateRules, n_baseline: int, n_current: int) -> str:
    """How the intervals were made: a bootstrap within one run per side, else Welch t over runs."""
    if n_baseline == 1 and n_current == 1:
        return (
            f"one run per side: {rules.confidence:.0%} block-bootstrap intervals within the runs "
            f"({rules.resamples} resamples, seed {rules.seed}); they miss run-to-run variation, so a change must "
            f"also pass the metric's single-run threshold. Repeat the runs (a folder of run-N/ folders per side) "
            f"for a firm verdict."
        )
    one_side_alone = min(n_baseline, n_current) == 1
    return (
        f"{rules.confidence:.0%} Welch t intervals over runs (each run's statistic is one sample, log scale; "
        f"values are means over runs ± their standard deviation)"
        + ("; a side with one run takes the other side's run-to-run spread." if one_side_alone else ".")
    )


def _settings_warning(baseline: RunSet, current: RunSet) -> list[str]:
    diffs = scenario_differences(baseline, current)
    return ["> **Warning**: the runs used different settings: " + "; ".join(diffs), ""] if diffs else []


def _not_the_engine_alone_warnings(baseline: RunSet, current: RunSet) -> list[str]:
    """A warning per run that was client-bound or interrupted: its latencies include the client's."""
    out = []
    for role, side in (("baseline", baseline), ("current", current)):
        for run in side.runs:
            summary = run.summary
            flags = [
                name
                for name, on in (("client_bound", summary.client_bound), ("interrupted", summary.interrupted))
                if on
            ]
            if flags:
                out += [
                    f"> **Warning**: the {role} run `{run.path}` is {' and '.join(flags)}: its latencies are not "
                    f"the engine's alone.",
                    "",
                ]
    return out
