"""What `bench` prints: the run's summary table, its intervals, counters and accuracy, the repeats' and tune's
results, and the live progress of a run (ConsoleReporter), all on stderr through one rich Console."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from harness.metrics.confidence import INTERVAL_PERCENTILES, interval_text
from harness.metrics.explain import explanation_lines
from harness.metrics.latencies import INTERVAL_METRICS
from harness.metrics.steady_window import window_text
from harness.results.schema import Summary
from harness.runs.run import Reporter

console = Console(stderr=True)


class ConsoleReporter(Reporter):
    """The pipeline's messages on the console, and a progress bar while requests run."""

    def __init__(self) -> None:
        super().__init__()
        self._progress = None
        self._failed = 0

    def info(self, text: str) -> None:
        console.print(text, highlight=False)

    def warning(self, text: str) -> None:
        console.print(f"[yellow]warning[/]: {text}", highlight=False)

    def start_requests(self, total: int) -> None:
        self._failed = 0
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("failed {task.fields[failed]}"),
            TimeElapsedColumn(),
            console=console,
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("requests", total=total, failed=0)
        self._progress.start()

    def request_done(self, record) -> None:
        self._failed += not record.ok
        self._progress.update(self._task, advance=1, failed=self._failed)

    def end_requests(self) -> None:
        if self._progress:
            self._progress.stop()
            self._progress = None


def print_repeats(state, keep_invalid: bool = False) -> None:
    """The headline metrics' means across the valid repeats, with their intervals, and why the repeats stopped."""
    done = [s for s in state.statuses if s.status == "completed"]
    counted = done if keep_invalid else [s for s in done if s.valid]
    kind = "" if keep_invalid else " valid"
    table = Table(title=f"across {len(counted)}{kind} of {len(done)} completed repeats (mean, Student t interval)")
    for col in ("metric", "unit", "mean", "interval", "±", "per repeat"):
        table.add_column(col, justify="left" if col in ("metric", "unit", "per repeat") else "right")
    for name, m in state.intervals.items():
        interval = "-" if m.low is None else f"{m.low:,.2f} – {m.high:,.2f}"
        share = "-" if m.relative_half_width is None else f"{100 * m.relative_half_width:.1f}%"
        mean = "-" if m.mean is None else f"{m.mean:,.2f}"
        table.add_row(name, m.unit, mean, interval, share, ", ".join(f"{v:,.1f}" for v in m.values))
    console.print(table)
    for s in done:
        if not s.valid:
            what = "kept (--keep-invalid)" if keep_invalid else "left out"
            console.print(f"  {s.dir} {what}, invalid: {'; '.join(s.reasons)}", markup=False, highlight=False)
    console.print(f"stopped: {state.stopped} after {len(done)} repeat(s)", highlight=False)


def print_summary(summary: Summary, out_dir: Path) -> None:
    req = summary.requests
    console.print(
        f"\n[bold]{req.completed}[/] completed, [bold]{req.failed}[/] failed "
        f"({req.warmup} warm-up excluded) in {summary.run_span_s:.2f} s; results in {out_dir}"
    )
    console.print(window_text(summary.window), highlight=False, markup=False)
    if summary.failures:
        console.print("failures: " + ", ".join(f"{k}={v}" for k, v in sorted(summary.failures.items())))
    t, g = summary.throughput, summary.goodput
    console.print(
        f"throughput {t.requests_per_s:.2f} req/s, {t.output_tokens_per_s:.1f} output tok/s, "
        f"{t.total_tokens_per_s:.1f} total tok/s; goodput {g.requests_per_s:.2f} req/s "
        f"({100 * g.fraction:.1f}% meet {g.slo or 'no SLO'})"
    )
    if summary.token_count_method == "approximate":
        console.print("[yellow]prompt token counts are approximate[/] (set backend.tokenizer for exact ones)")
    print_engine_counters(summary)
    table = Table(title="latency (ms)")
    cols = ("mean", "p50", "p90", "p99", "p999", "max")
    table.add_column("metric")
    for c in cols:
        table.add_column(c, justify="right")
    thinking = summary.reasoning_tokens  # a reasoning model's: then the first answer token's time too
    rows = {"ttft": summary.ttft_ms, **({"ttft_answer": summary.ttft_answer_ms} if thinking else {})}
    rows |= {"itl": summary.itl_ms, "tpot": summary.tpot_ms, "e2e": summary.e2e_ms}
    rows |= {"schedule_lag": summary.schedule_lag_ms, "event_loop_lag": summary.event_loop_lag_ms}
    for name, stats in rows.items():
        values = stats.model_dump()
        table.add_row(name, *("-" if values[c] is None else f"{values[c]:.2f}" for c in cols))
    console.print(table)
    print_intervals(summary)
    if thinking:
        console.print(
            f"{thinking} of {summary.output_tokens} output tokens were reasoning; ttft counts the first "
            "token of either kind, ttft_answer the first answer token"
        )
    for line in explanation_lines(summary):
        console.print(line, markup=False)
    print_accuracy(summary)


def print_engine_counters(summary: Summary) -> None:
    """Speculative decoding and the prefix cache over the window, when the engine's counters had them."""
    spec = summary.speculative
    if spec is not None and spec.acceptance_rate is not None:
        console.print(
            f"speculative decoding: {100 * spec.acceptance_rate:.1f}% of drafted tokens accepted"
            + (f", {spec.mean_acceptance_length:.2f} tokens a verification" if spec.drafts is not None else "")
        )
    if cache := summary.prefix_cache:
        console.print(
            f"prefix cache: {100 * cache.hit_rate:.1f}% of the {cache.queried_tokens:.0f} prompt tokens "
            "looked up over the window came from it (engine counters)"
        )


def print_accuracy(summary: Summary) -> None:
    """A known-answer task's accuracy (harness/scenario/answers.py), when the run had one."""
    from harness.scenario.answers import accuracy_line

    if summary.accuracy is not None:
        console.print(accuracy_line(summary.accuracy), markup=False, highlight=False)


def print_intervals(summary: Summary) -> None:
    """Each latency percentile's confidence interval, and the run's validity verdict."""
    ci = summary.percentile_ci
    table = Table(title=f"{ci.confidence:.0%} confidence intervals (ms; {ci.method})")
    table.add_column("metric")
    for key in INTERVAL_PERCENTILES:
        table.add_column(key, justify="right")
    for metric in INTERVAL_METRICS:
        intervals = getattr(ci, metric)  # ci's latencies, by the names INTERVAL_METRICS lists
        row = [interval_text(getattr(intervals, key)) for key in INTERVAL_PERCENTILES]
        table.add_row(metric.removesuffix("_ms"), *row)
    console.print(table)
    verdict = summary.validity
    if verdict and verdict.valid:
        console.print("validity: [green]valid[/]")
    elif verdict:
        console.print("validity: [bold red]INVALID[/]", highlight=False)
        for reason in verdict.reasons:
            console.print(f"  - {reason}", markup=False, highlight=False)
