"""`bench gate --history DB`: tonight's runs against the recent nights of the same scenario on the same runner.

Per metric of the rules:
  - the verdict as `bench gate` gives it (reports.gate's thresholds and verdicts), from a Welch t interval
    over nights: each night's value is its runs' mean (reports.history.batch_value), tonight is one more
    night and takes the history's night-to-night spread, so day-to-day drift of the runner is in the
    interval. The history side is the last N nights, none from before the latest step already known;
  - change points over the history and tonight (reports.changepoint): steps and drifts, each with the
    first night (and commit) after it. A finding that the history without tonight did not show is new:
    it fails the gate once, on the night it is found; later nights list it as seen (SEEN_NIGHTS).
Fails (exit 1) on a regression verdict or a new finding in the worse direction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from reports.changepoint import Finding, findings
from reports.gate import (  # the gate's own rules, not a copy of them
    PER_REQUEST_SOURCES,
    WINDOW_SOURCES,
    GateRules,
    MetricRule,
    MetricVerdict,
    samples_for_tail,
    short_number,
    skipped_lines,
    verdict_for_change,
    verdict_row,
    verdict_table,
)
from reports.history import Night, batch_value, nights
from reports.markdown import md_table
from reports.peers.history import identify_peer
from reports.repeats import RunSet, check_same_scenario, load_run_set
from reports.run_identity import identify, revision, runner_kind, scenario_hash
from reports.run_values import metric_key, run_values
from reports.stats import run_level_change

SEEN_NIGHTS = 3  # a finding the analyses of any of the last 3 nights showed is not new (measured on seeded
# 1%/night drifts: 4 repeated alarms in 18 series with 1 night, 1 with 2, none with 3)


@dataclass
class MetricHistory:
    verdict: MetricVerdict
    nights: list[Night]  # history and tonight (last), the nights that have this metric
    findings: list[Finding]
    new: list[Finding]  # findings not seen without tonight


@dataclass
class HistoryGate:
    db: Path
    current: RunSet
    scenario_hash: str
    runner_kind: str
    history_nights: int
    metrics: list[MetricHistory] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(
            m.verdict.verdict == "regression" or any(worse(m.verdict.rule, f) for f in m.new) for m in self.metrics
        )


def tonight(current: RunSet, rules: GateRules) -> Night:
    """The current runs as one more night of the series."""
    per_run = [run_values(r, rules) for r in current.runs]
    commit, branch = revision()
    night = Night(
        "tonight",
        datetime.now(timezone.utc).isoformat(timespec="seconds"),
        commit,
        branch,
        [(identify_peer if r.peer else identify)(r.path, r.run_info).run_id for r in current.runs],
    )
    for name in per_run[0]:
        night.values[name] = batch_value([v[name][0] for v in per_run])
        counts = [v[name][1] for v in per_run if v[name][1] is not None]
        if counts:
            night.samples[name] = min(counts)
    return night


def gate_history(
    db: Path, current_path: Path, rules: GateRules, last: int, min_history: int, keep_invalid: bool = False
) -> HistoryGate | None:
    """The verdicts against the history, or None when it has fewer than min_history comparable nights. Invalid
    current runs are left out (reports.repeats.load_run_set) unless `keep_invalid`."""
    current = load_run_set(current_path, keep_invalid)
    check_same_scenario(current)
    info = current.runs[0].run_info
    scenario, runner = scenario_hash(info.scenario), runner_kind(info)
    now = tonight(current, rules)
    keys = [metric_key(rule) for rule in rules.metrics.values()]
    history = nights(db, scenario, runner, keys, exclude_runs=now.run_ids) if Path(db).is_file() else []
    if len(history) < min_history:  # a first night (no file yet) too
        return None
    gate = HistoryGate(db, current, scenario, runner, len(history))
    for name, rule in rules.metrics.items():
        gate.metrics.append(judge_metric(name, rule, history, now, rules, last))
    return gate


def judge_metric(
    name: str, rule: MetricRule, history: list[Night], now: Night, rules: GateRules, last: int
) -> MetricHistory:
    key = metric_key(rule)
    had = [n for n in history if n.values.get(key) is not None]
    values = [n.values[key] for n in had]
    sides = {"baseline_runs": len(values), "current_runs": len(now.run_ids)}
    # what the last nights' gates saw: a change near the noise can drop out for a night and come back
    views = [findings(values[: len(values) - m], rule.threshold) for m in range(SEEN_NIGHTS) if len(values) > m]
    before = views[0] if views else []
    series, found, new = had, before, []
    if now.values.get(key) is not None:
        series = had + [now]
        found = findings(values + [now.values[key]], rule.threshold)
        new = [f for f in found if not any(f.matches(g) for view in views for g in view)]
    start = max([f.index for f in before if f.kind == "step"], default=0)
    start = max(start, len(values) - last)
    result = MetricHistory(MetricVerdict(name, rule, "inconclusive", **sides), series, found, new)
    base = values[start:]
    result.verdict.baseline_runs = len(base)
    have = now.samples.get(key, 0)
    enough = min(rules.min_samples, rules.windows) if rule.source in WINDOW_SOURCES else rules.min_samples
    past = min((n.samples.get(key, 0) for n in had[start:]), default=0)
    if have < rules.min_samples <= past and rule.source in PER_REQUEST_SOURCES and rule.source != "goodput":
        result.verdict.verdict = "regression"  # the history had the samples; tonight lost them (failures)
        result.verdict.note = f"a current run has {have} samples, the history's runs >= {past}"
        return result
    needed = max(enough, samples_for_tail(rule.statistic, rules.min_tail_samples, rules.confidence))
    if have < needed or len(base) < 2:
        result.verdict.note = (
            f"a current run has {have} samples; {rule.statistic} needs >= {needed}"
            if have < needed
            else f"{len(base)} night(s) since the last step: too few to compare against"
        )
        return result
    ch = run_level_change(base, [now.values[key]], rules.confidence)
    verdict, note = verdict_for_change(ch, rule, one_run_each=False)
    v = result.verdict
    v.verdict, v.note, v.baseline, v.current, v.change, v.ci_low, v.ci_high = (
        verdict,
        note,
        ch.baseline,
        ch.current,
        ch.change,
        ch.ci_low,
        ch.ci_high,
    )
    v.baseline_spread = float(np.std(base, ddof=1))
    return result


def worse(rule: MetricRule, f: Finding) -> bool:
    return (f.change > 0) == (rule.better == "lower")


def describe(name: str, series: list[Night], f: Finding, rule: MetricRule) -> list[str]:
    """A finding as a table row: metric, what, the first night after it (its commit, date), levels, direction."""
    night = series[f.index]
    what = (
        f"step {100 * f.change:+.1f}%"
        if f.kind == "step"
        else (f"drift {100 * f.change:+.1f}% over {f.end - f.index + 1} nights")
    )
    return [
        name,
        what,
        f"#{f.index + 1} of {len(series)}",
        (night.commit or "?")[:10],
        night.finished_at[:10],
        short_number(f.before),
        short_number(f.after),
        "worse" if worse(rule, f) else "better",
    ]


def render_markdown(gate: HistoryGate, rules: GateRules) -> str:
    n = len(gate.current.runs)
    out = [
        f"## Benchmark gate against history: {'FAILED' if gate.failed else 'passed'}",
        "",
        f"Current `{gate.current.path}` ({n} run{'s' * (n > 1)}, one more night) against the history in "
        f"`{gate.db}`: {gate.history_nights} comparable nights (scenario `{gate.current.scenario.get('name')}` "
        f"{gate.scenario_hash}, runner `{gate.runner_kind}`). Verdicts: {rules.confidence:.0%} Welch t intervals "
        f"over nights (a night's value is the mean of its runs; tonight takes the history's night-to-night spread) "
        f"against the last nights since the latest known step. Change points: e-divisive means "
        f"(permutation test) over the nights; a step counts beyond the metric's threshold, a drift beyond half of "
        f"it; a new one in the worse direction fails the gate once.",
        "",
        # tonight is one night, however many runs it has
        verdict_table(
            [verdict_row(m.verdict, f"{m.verdict.baseline_runs} / 1") for m in gate.metrics],
            rules,
            "nights (base / cur)",
        ),
        "",
        *skipped_lines(gate.current),
    ]
    return "\n".join(out + _change_points(gate.metrics))


def _change_points(metrics: list[MetricHistory]) -> list[str]:
    """The table of every metric's change points, each marked new tonight or seen before."""
    found = []
    for m in metrics:
        v = m.verdict
        for f in m.findings:
            status = ("❌ new tonight" if worse(v.rule, f) else "🚀 new tonight") if f in m.new else "seen before"
            found.append(describe(v.name, m.nights, f, v.rule) + [status])
    if not found:
        return ["No change point or drift in the history.", ""]
    columns = ["metric", "change", "from night", "first commit", "date", "before", "after", "direction", "status"]
    return ["### Change points", "", md_table(columns, found), ""]
