"""One run's statistics as the history keeps them: the gate's per-run values, and summary.json's figures.

The gate's values are computed exactly as `bench gate` computes each run's statistic (reports.gate.samples,
then the rule's statistic), and named `<source>_<statistic>` (ttft_p50, output_tokens_per_s_mean), so a
rule finds its value whatever the rule is called. A standard set is always stored (so a rule added later
has its past); the rules passed in add their own. Summary figures are stored as `summary.<dotted.path>`
(summary.ttft_ms.p99, summary.throughput.output_tokens_per_s).
"""

from __future__ import annotations

import numpy as np

from reports.gate import GateRules, MetricRule, load_rules, samples
from reports.load import RunData
from reports.stats import statistic_fn

LATENCY_SOURCES = ("ttft", "tpot", "itl", "e2e")
LATENCY_STATISTICS = ("mean", "p50", "p90", "p99")


def metric_key(rule: MetricRule) -> str:
    return f"{rule.source}_{rule.statistic}"


def standard_rules() -> list[MetricRule]:
    rules = [
        MetricRule(source=s, statistic=stat, better="lower", threshold=0.1)
        for s in LATENCY_SOURCES
        for stat in LATENCY_STATISTICS
    ]
    return rules + [
        MetricRule(source=s, statistic="mean", better="higher", threshold=0.1)
        for s in ("goodput", "output_tokens_per_s", "requests_per_s")
    ]


def run_values(run: RunData, rules: GateRules | None = None) -> dict[str, tuple[float | None, int | None]]:
    """name -> (value, samples behind it); value None when the run has no sample for it."""
    rules = rules or load_rules(None)
    slo = {k: v for k, v in run.slo.items() if v is not None}
    out: dict[str, tuple[float | None, int | None]] = {}
    for rule in standard_rules() + list(rules.metrics.values()):
        x = samples(run, rule, rules, slo)
        out[metric_key(rule)] = (float(statistic_fn(rule.statistic)(x[None, :])[0]) if x.size else None, int(x.size))
    for name, value in _numbers(run.summary.model_dump(exclude_unset=True), "summary"):  # as summary.json holds it
        out[name] = (value, None)
    return out


def _numbers(tree, prefix: str):
    """(dotted name, value) for every number in a JSON tree (booleans left out: flags, not figures)."""
    if isinstance(tree, dict):
        for k, v in tree.items():
            yield from _numbers(v, f"{prefix}.{k}")
    elif isinstance(tree, (int, float)) and not isinstance(tree, bool) and np.isfinite(tree):
        yield prefix, float(tree)
