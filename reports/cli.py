"""The `bench report`, `bench gate` and `bench select` commands (declared in pyproject.toml, group bench.commands).

Exit codes: 0 fine, 1 the gate found a regression, 2 bad input (folder, rules file, option),
5 `bench gate --strict` could not decide some metric (and none regressed).
The reports modules are imported when a command runs: pandas and plotly take about a second to
import, which every `bench run` would otherwise pay.
"""

from __future__ import annotations

from pathlib import Path

import typer

from harness.results.folder import ResultsError
from reports.console import console
from reports.console import fail as _fail
from reports.console import warn as _warn


def report(
    run_dirs: list[Path] = typer.Argument(None, help="results folders (runs or sweeps); several are overlaid"),
    output: Path = typer.Option(
        Path("report.html"),
        "-o",
        "--output",
        help="HTML file; the Markdown summary goes beside it, same name with .md (report.html -> report.md)",
    ),
    label: list[str] = typer.Option([], "--label", help="a name per folder, in order (default: folder names)"),
    attainment: float = typer.Option(
        0.9, "--attainment", help="share of requests that must meet the SLOs at a sweep point"
    ),
    history: Path | None = typer.Option(None, "--history", help="instead: trends of a history file"),
    rules: Path | None = typer.Option(None, "--rules", help="with --history: gate rules (metrics, thresholds)"),
) -> None:
    """Write one self-contained HTML report (offline) and a Markdown summary; or, with --history, trend charts."""
    from reports.report import write_report

    if output.suffix.lower() != ".html":
        raise _fail(f"-o/--output: {output} should end in .html (the Markdown summary is written beside it as .md)")
    if history is not None:
        from reports.history_cli import report_history

        return report_history(history, output, rules, run_dirs)
    if not run_dirs:
        raise _fail("RUN_DIRS: give results folders, or --history DB for the trend report")
    from reports.tune_report import is_tune_dir, write_tune_report

    if len(run_dirs) == 1 and is_tune_dir(run_dirs[0]):  # a `bench tune` folder
        try:
            tuned = write_tune_report(run_dirs[0], output)
        except (ResultsError, ValueError) as e:
            raise _fail(str(e))
        console.print(f"{tuned.recommendation}\nreport: {output} and {output.with_suffix('.md')}")
        return
    try:
        content = write_report(run_dirs, output, labels=label or None, attainment=attainment)
    except (ResultsError, ValueError) as e:
        raise _fail(str(e))
    _warn(content.runs + [p.run for s in content.sweeps for p in s.sweep.points])
    for s in content.sweeps:
        console.print(f"{s.sweep.label}: highest {s.sweep.load_kind} within SLOs: {s.capacity.describe()}")
    console.print(f"report: {output} and {output.with_suffix('.md')} ({len(content.figures)} plots)")


def gate(
    baseline: Path = typer.Argument(..., help="baseline: a run folder, or a folder of run-N/ repeats"),
    current: Path | None = typer.Argument(None, help="current: a run folder, or a folder of run-N/ repeats"),
    rules: Path | None = typer.Option(None, "--rules", help="gate rules YAML (default: built-in, as ci/gate.yaml)"),
    summary_md: Path | None = typer.Option(None, "--summary-md", help="also write the Markdown summary here"),
    strict: bool = typer.Option(False, "--strict", help="exit 5 when a metric is inconclusive (for CI)"),
    history: Path | None = typer.Option(
        None,
        "--history",
        help="judge CURRENT against this history file (`bench history add`); BASELINE, if given, while it is short",
    ),
    last: int = typer.Option(20, "--last", min=2, help="with --history: the nights to compare against"),
    min_history: int = typer.Option(10, "--min-history", min=2, help="with --history: nights it needs"),
    keep_invalid: bool = typer.Option(
        False, "--keep-invalid", help="judge runs whose summary.json validity is invalid (skipped by default)"
    ),
) -> None:
    """Compare runs metric by metric; exit 1 on a significant regression beyond its threshold."""
    from reports import gate as g
    from reports.repeats import check_same_scenario, load_run_set

    note = ""
    if history is not None:
        from reports.history_cli import gate_against_history

        baseline, current = (None, baseline) if current is None else (baseline, current)
        note = gate_against_history(history, current, rules, last, min_history, summary_md, baseline, keep_invalid)
    elif current is None:
        raise _fail("CURRENT: missing; pass BASELINE CURRENT, or CURRENT --history DB")
    try:
        gate_rules = g.load_rules(rules)
        base, cur = load_run_set(baseline, keep_invalid), load_run_set(current, keep_invalid)
        check_same_scenario(base, cur)
    except (g.GateRulesError, ResultsError) as e:
        raise _fail(str(e))
    _warn(base.runs + cur.runs)
    verdicts = g.compare(base, cur, gate_rules)
    text = note + g.render_markdown(base, cur, verdicts, gate_rules)
    typer.echo(text)
    if summary_md:
        summary_md.write_text(text, encoding="utf-8")
    raise typer.Exit(g.exit_code(verdicts, strict))


def select(
    results: list[Path] = typer.Argument(
        ...,
        help="one results folder (sweep or run) per engine, or a "
        "folder of candidates (`bench run` of a scenario with candidates:)",
    ),
    slo: str = typer.Option(
        "",
        "--slo",
        help="SLO limits in ms, e.g. ttft_ms=500,tpot_ms=50 (default: the "
        "SLOs the runs were made with, when they share them)",
    ),
    gpu_cost_per_hour: float | None = typer.Option(
        None,
        "--gpu-cost-per-hour",
        help="price of one accelerator-hour (without it: ranked by output tokens/s per accelerator)",
    ),
    accelerators: int = typer.Option(1, "--accelerators", help="accelerators each engine ran on"),
    label: list[str] = typer.Option([], "--label", help="an engine name per folder, in order"),
    attainment: float = typer.Option(0.9, "--attainment", help="share of requests that must meet the SLOs"),
    output: Path = typer.Option(
        Path("selection.html"), "-o", "--output", help="HTML file; the Markdown goes beside it, same name with .md"
    ),
) -> None:
    """Engine or deployment selection: capacity within SLOs, tokens/s per accelerator, cost per million tokens,
    a ranking and why."""
    from reports.select import parse_slo, write_selection

    if output.suffix.lower() != ".html":
        raise _fail(f"-o/--output: {output} should end in .html (the Markdown is written beside it as .md)")
    try:
        sel = write_selection(
            results,
            output,
            slo=parse_slo(slo) if slo else None,
            gpu_cost_per_hour=gpu_cost_per_hour,
            accelerators=accelerators,
            labels=label or None,
            attainment=attainment,
        )
    except (ResultsError, ValueError) as e:
        raise _fail(str(e))
    typer.echo(sel.recommendation)
    for engine in sel.engines:  # what the table's start-up column says, where a terminal shows it
        typer.echo(f"start-up of {engine.label}: {engine.startup}")
    console.print(f"selection report: {output} and {output.with_suffix('.md')}")
