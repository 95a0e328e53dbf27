"""`bench history add|show` (registered in harness/cli/app.py), and the --history parts of `bench gate` and `bench
report`.

Exit codes as reports/cli.py: 0 fine, 1 the gate found a regression, 2 bad input.
"""

from __future__ import annotations

from pathlib import Path

import typer

from reports.console import EXIT_REGRESSION, console
from reports.console import fail as _fail

history_app = typer.Typer(no_args_is_help=True, help="The results store: record runs, print their series over nights.")
DEFAULT_DB = Path("history.db")


@history_app.command("add")
def add(
    run_dirs: list[Path] = typer.Argument(
        ..., help="run folders, folders of run-N/ repeats, or other tools' result files (docs/peers.md)"
    ),
    db: Path = typer.Option(DEFAULT_DB, "--db", help="history file (SQLite; created if missing)"),
    batch: str | None = typer.Option(
        None, "--batch", envvar="GITHUB_RUN_ID", help="runs of one night share it (default: one per call)"
    ),
    commit: str | None = typer.Option(None, "--commit", help="default: $GITHUB_SHA, else git rev-parse HEAD"),
    branch: str | None = typer.Option(None, "--branch", help="default: $GITHUB_REF_NAME, else git's branch"),
    runner: str | None = typer.Option(
        None, "--runner-kind", envvar="BENCH_RUNNER_KIND", help="kind of machine (default: OS-arch-Ncpu from run.json)"
    ),
    rules: Path | None = typer.Option(None, "--rules", help="gate rules whose metrics to store as well"),
    keep_invalid: bool = typer.Option(
        False, "--keep-invalid", help="record runs whose summary.json validity is invalid (skipped by default)"
    ),
) -> None:
    """Record finished runs (identity and per-run statistics). Adding a run again changes nothing."""
    from harness.results.folder import ResultsError
    from reports.gate import GateRulesError, load_rules
    from reports.history import add_runs
    from reports.peers import find_peer_file
    from reports.repeats import run_dirs as expand
    from reports.run_identity import HistoryError

    try:  # a peer tool's file is one run as it is (reports/peers)
        paths = [p for d in run_dirs for p in ([d] if find_peer_file(d) is not None else expand(d))]
        result = add_runs(db, paths, batch, commit, branch, runner, load_rules(rules), keep_invalid)
    except (HistoryError, ResultsError, GateRulesError) as e:
        raise _fail(f"{e}\nnothing was added")
    for p in result.already:
        console.print(f"{p}: already recorded")
    for p, why in result.skipped:
        console.print(
            f"[yellow]skipped[/] {p}: invalid: {why} (--keep-invalid records it)", highlight=False, soft_wrap=True
        )
    console.print(
        f"{db}: added {len(result.added)} run(s), {len(result.already)} already there, "
        f"{len(result.skipped)} invalid skipped"
    )


@history_app.command("show")
def show(
    db: Path = typer.Argument(..., help="history file"),
    metric: list[str] = typer.Option(
        [], "--metric", help="metric name, e.g. tpot_p50 or summary.ttft_ms.p99 (default: the gate's metrics)"
    ),
    last: int = typer.Option(30, "--last", help="nights to print per series"),
) -> None:
    """Print each series (scenario x runner kind) night by night."""
    import pandas as pd

    from reports.gate import load_rules
    from reports.history import metric_names, nights, series_keys
    from reports.run_identity import HistoryError
    from reports.run_values import metric_key

    names = metric or [metric_key(r) for r in load_rules(None).metrics.values()]
    try:
        keys = series_keys(db)
        if not keys:
            raise _fail(f"{db}: no runs recorded yet")
        recorded = metric_names(db)
        unknown = sorted(set(names) - set(recorded))
        if unknown:
            gate_metrics = ", ".join(m for m in recorded if not m.startswith("summary."))
            raise _fail(
                f"--metric: {', '.join(unknown)} not recorded; recorded are {gate_metrics}, and summary.json's "
                f"figures as summary.<path> (e.g. summary.ttft_ms.p99)"
            )
        for name, scenario, runner, n_runs in keys:
            every = nights(db, scenario, runner, names)
            series, first = every[-last:], max(0, len(every) - last)
            rows = [
                {
                    "night": first + i + 1,
                    "date (UTC)": n.finished_at[:16].replace("T", " "),
                    "commit": (n.commit or "-")[:10],
                    "branch": n.branch or "-",
                    "runs": len(n.run_ids),
                    **{m: "-" if n.values.get(m) is None else f"{n.values[m]:.4g}" for m in names},
                }
                for i, n in enumerate(series)
            ]
            typer.echo(f"{name} ({scenario}) on {runner}: {n_runs} runs, the last {len(series)} nights")
            typer.echo(pd.DataFrame(rows).to_string(index=False) + "\n")
    except HistoryError as e:
        raise _fail(str(e))


def gate_against_history(
    db: Path,
    current: Path,
    rules: Path | None,
    last: int,
    min_history: int,
    summary_md: Path | None,
    baseline: Path | None,
    keep_invalid: bool = False,
) -> str:
    """`bench gate --history`: exits with the verdict when the history is long enough; else returns a note for
    the gate against BASELINE (or, without one, exits 0: nothing to compare against)."""
    from harness.results.folder import ResultsError
    from reports.gate import GateRulesError, load_rules
    from reports.history_gate import gate_history, render_markdown
    from reports.run_identity import HistoryError

    try:
        gate_rules = load_rules(rules)
        result = gate_history(db, current, gate_rules, last, min_history, keep_invalid)
    except (GateRulesError, HistoryError, ResultsError) as e:
        raise _fail(str(e))
    if result is None:
        note = f"> History `{db}` has fewer than {min_history} comparable nights (--min-history): " + (
            "gated against the committed baseline instead.\n\n" if baseline else "no gate tonight.\n\n"
        )
        if baseline is None:
            typer.echo(note)
            if summary_md:
                summary_md.write_text(note, encoding="utf-8")
            raise typer.Exit(0)
        return note
    text = render_markdown(result, gate_rules)
    typer.echo(text)
    if summary_md:
        summary_md.write_text(text, encoding="utf-8")
    raise typer.Exit(EXIT_REGRESSION if result.failed else 0)


def report_history(db: Path, output: Path, rules: Path | None, run_dirs) -> None:
    """`bench report --history DB`: the trend report."""
    from reports.gate import GateRulesError, load_rules
    from reports.run_identity import HistoryError
    from reports.trends import write_trend_report

    if run_dirs:
        raise _fail("--history draws the trend report alone; give results folders or --history, not both")
    try:
        content = write_trend_report(db, output, load_rules(rules))
    except (GateRulesError, HistoryError) as e:
        raise _fail(str(e))
    console.print(f"trend report: {output} ({len(content.figures)} series, {len(content.rows)} findings)")
