"""`bench report --history DB`: each series' metrics over nights, change points marked, the gate's interval shaded.

One section per series (a scenario on a kind of runner). A metric's findings are those `bench gate --history`
would list tonight (reports.changepoint over every night). The shaded band is the 95% interval the gate
applies to a night: from the `last` nights before it, none from before a step (as reports.history_gate
compares), a night outside it differs from them beyond noise; a regression also needs the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from reports.changepoint import Finding, findings
from reports.gate import GateRules, MetricRule
from reports.history import Night, nights, series_keys
from reports.run_values import metric_key

DEFAULT_LAST = 20


@dataclass
class MetricTrend:
    name: str
    rule: MetricRule
    nights: list[Night]  # the nights with a value for it
    values: list[float]
    findings: list[Finding]
    band: list[tuple[float, float] | None]  # per night: the gate's interval from the nights before it


@dataclass
class SeriesTrend:
    scenario_name: str
    scenario_hash: str
    runner_kind: str
    runs: int
    nights: list[Night]
    metrics: list[MetricTrend] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"{self.scenario_name} ({self.scenario_hash}) on {self.runner_kind}"

    @property
    def row(self) -> list[str]:
        first, last = (self.nights[0], self.nights[-1]) if self.nights else (None, None)

        def when(n):
            return "-" if n is None else f"{n.finished_at[:16].replace('T', ' ')} {(n.commit or '?')[:7]}"

        return [
            self.scenario_name,
            self.scenario_hash,
            self.runner_kind,
            str(len(self.nights)),
            str(self.runs),
            when(first),
            when(last),
        ]


@dataclass
class TrendContent:
    title: str
    db: Path
    series: list[SeriesTrend]
    rows: list[list[str]]  # one per finding
    figures: list = field(default_factory=list)  # (heading, plotly Figure)


def gate_band(values: list[float], steps: list[int], last: int, confidence: float) -> list[tuple[float, float] | None]:
    """For night k: the interval around the nights before it (the last `last`, none before the latest step at or
    before k-1) within which run_level_change(those, [night k]) would include no change."""
    band = []
    for k in range(len(values)):
        start = max([s for s in steps if s <= k - 1] + [0, k - last])
        base = np.asarray(values[start:k], dtype=float)
        if base.size < 2:
            band.append(None)
            continue
        log = bool((base > 0).all())
        x = np.log(base) if log else base
        half = scipy_stats.t.ppf(0.5 + confidence / 2, x.size - 1) * x.std(ddof=1) * np.sqrt(1 + 1 / x.size)
        lo, hi = x.mean() - half, x.mean() + half
        band.append((float(np.exp(lo)), float(np.exp(hi))) if log else (float(lo), float(hi)))
    return band


def build_trends(db: str | Path, rules: GateRules, last: int = DEFAULT_LAST) -> TrendContent:
    from reports.history_gate import describe

    keys = [(name, metric_key(rule), rule) for name, rule in rules.metrics.items()]
    content = TrendContent(f"Benchmark trends: {Path(db).name}", Path(db), [], [])
    for scenario_name, scenario, runner, runs in series_keys(db):
        all_nights = nights(db, scenario, runner, [k for _, k, _ in keys])
        series = SeriesTrend(scenario_name, scenario, runner, runs, all_nights)
        for name, key, rule in keys:
            had = [n for n in all_nights if n.values.get(key) is not None]
            values = [n.values[key] for n in had]
            found = findings(values, rule.threshold)
            steps = [f.index for f in found if f.kind == "step"]
            series.metrics.append(
                MetricTrend(name, rule, had, values, found, gate_band(values, steps, last, rules.confidence))
            )
            content.rows += [[series.title] + describe(name, had, f, rule) for f in found]
        content.series.append(series)
    return content


def write_trend_report(
    db: str | Path, out_html: str | Path, rules: GateRules, last: int = DEFAULT_LAST
) -> TrendContent:
    """The HTML trend report, and a Markdown file of its findings beside it."""
    from reports.html import render
    from reports.markdown import md_table
    from reports.trend_figures import trend_figure

    content = build_trends(db, rules, last)
    content.figures = [(s.title, trend_figure(s)) for s in content.series]
    out_html = Path(out_html)
    out_html.parent.mkdir(parents=True, exist_ok=True)
    out_html.write_text(
        render(
            "history.html.j2",
            content.figures,
            title=content.title,
            c=content,
            finding_columns=FINDING_COLUMNS,
            last=last,
        ),
        encoding="utf-8",
    )
    md = [f"# {content.title}", ""]
    md += ([md_table(FINDING_COLUMNS, content.rows)] if content.rows else ["No change point or drift."]) + [""]
    out_html.with_suffix(".md").write_text("\n".join(md), encoding="utf-8")
    return content


FINDING_COLUMNS = ["series", "metric", "change", "from night", "first commit", "date", "before", "after", "direction"]
