"""`bench`: run a scenario, validate one, serve the built-in engine."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True,
                  help="Benchmark LLM serving engines: replay an arrival process, measure TTFT/ITL/TPOT/E2E/goodput.")
console = Console(stderr=True)

EXIT_SCENARIO_ERROR = 2
EXIT_UNREACHABLE = 1
EXIT_CLIENT_BOUND = 3
EXIT_INTERRUPTED = 130


def _version(value: bool) -> None:
    if value:
        from harness.results import versions
        typer.echo(f"bench {versions()['harness']}")
        raise typer.Exit()


@app.callback()
def main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the version and exit.")) -> None:
    pass


def _load(scenario_path: Path, overrides: list[str]):
    from harness.scenario import ScenarioError, load_scenario
    try:
        return load_scenario(scenario_path, overrides)
    except ScenarioError as e:
        console.print(f"[bold red]scenario error[/] in {scenario_path}:\n{e}")
        raise typer.Exit(EXIT_SCENARIO_ERROR)


@app.command()
def validate(scenario: Path = typer.Argument(..., help="scenario YAML"),
             set_: list[str] = typer.Option([], "--set", help="override: dotted.path=value")) -> None:
    """Print the resolved scenario, or its errors (exit 2)."""
    resolved = _load(scenario, set_)
    typer.echo(json.dumps(resolved.resolved_dict(), indent=2))


@app.command()
def run(scenario: Path = typer.Argument(..., help="scenario YAML"),
        set_: list[str] = typer.Option([], "--set", help="override: dotted.path=value (repeatable)"),
        output: Optional[Path] = typer.Option(None, "--output", help="results folder (default results/<name>-<UTC>)"),
        allow_client_bound: bool = typer.Option(False, "--allow-client-bound",
                                                help="exit 0 even if the client fell behind its schedule"),
        workers: str = typer.Option("", "--workers", help="client processes: auto or N (overrides load.workers)"),
        ) -> None:
    """Replay the scenario's load against its backend and write results."""
    from harness.launcher import BackendUnreachable
    from harness.results import ResultWriter, default_output_dir

    resolved = _load(scenario, set_)
    out_dir = output or default_output_dir(resolved.name)
    if resolved.load.sweep is not None:
        _run_sweep(resolved, out_dir, workers or None, allow_client_bound)
        return
    writer = ResultWriter(out_dir)
    try:
        summary = execute(resolved, writer, workers_option=workers or None, console=console)
    except BackendUnreachable as e:
        console.print(f"[bold red]backend unreachable[/]: {e}")
        raise typer.Exit(EXIT_UNREACHABLE)
    except KeyboardInterrupt:  # Ctrl-C before the load began (during launch or planning)
        console.print("[yellow]interrupted before any request was sent[/]")
        raise typer.Exit(EXIT_INTERRUPTED)
    finally:
        writer.close()
    print_summary(summary, out_dir)
    if summary["interrupted"]:
        console.print("[yellow]interrupted: the summary covers the requests that finished[/]")
        raise typer.Exit(EXIT_INTERRUPTED)
    if summary["client_bound"]:
        console.print("[bold red on white] CLIENT-BOUND [/] [bold red]the client fell behind its own schedule: "
                      + "; ".join(summary["client_bound_reasons"])
                      + ". Latencies include client delay. Use --workers, lower the load, or pass "
                      "--allow-client-bound to accept this.[/]")
        if not allow_client_bound:
            raise typer.Exit(EXIT_CLIENT_BOUND)


def _run_sweep(scenario, out_dir: Path, workers_option: str | None, allow_client_bound: bool) -> None:
    """`bench run` with load.sweep: every point into OUT/point-NNN-.../, a line per point, then the capacity."""
    from harness.launcher import BackendUnreachable
    from harness.sweep import capacity_line, run_sweep, sweep_kind

    try:
        points = run_sweep(scenario, out_dir, workers_option, console)
    except BackendUnreachable as e:
        console.print(f"[bold red]backend unreachable[/]: {e}; finished points stay in {out_dir}")
        raise typer.Exit(EXIT_UNREACHABLE)
    except KeyboardInterrupt:  # between points, or before a point's load began
        console.print(f"[yellow]interrupted: finished points stay in {out_dir} (see sweep.json)[/]")
        raise typer.Exit(EXIT_INTERRUPTED)
    if any(p.status == "completed" for p in points):
        console.print(capacity_line(out_dir, scenario))
    console.print(f"results in {out_dir} (`bench report {out_dir}` draws the curves)")
    if any(p.status == "interrupted" for p in points):
        console.print("[yellow]interrupted: the points after it were not run (see sweep.json)[/]")
        raise typer.Exit(EXIT_INTERRUPTED)
    bound = [f"{p.offered_load:g}" for p in points if p.client_bound]
    if bound:
        console.print(f"[bold red on white] CLIENT-BOUND [/] [bold red]the client fell behind its own schedule at "
                      f"{sweep_kind(scenario)} {', '.join(bound)}; latencies there include client delay. "
                      "Use --workers, lower the loads, or pass --allow-client-bound to accept this.[/]")
        if not allow_client_bound:
            raise typer.Exit(EXIT_CLIENT_BOUND)


def execute(scenario, writer, workers_option: str | None = None, console: Console = console,
            launched=None) -> dict:
    """Launch (if asked), probe, plan, run with telemetry and server metrics, summarize.
    Returns the summary written to summary.json. `launched`: an engine already started (a sweep
    starts it once for all its points); it is used as is and left running."""
    import asyncio
    import os
    import time

    from backends import load_backend
    from harness.launcher import launch, probe
    from harness.metrics import client_bound_reasons, summarize
    from harness.observers import RunObservers
    from harness.results import host_info, versions
    from harness.runner import Target
    from harness.scenario import ScenarioError
    from harness.server_metrics import counter_deltas
    from harness.tokenizer_source import resolve_tokenizer
    from harness.workers import resolve_workers
    from harness.workload import build_plan

    backend, load = scenario.backend, scenario.load
    engine = load_backend(backend.kind, tuple(backend.eos_token_ids))
    try:
        engine.endpoint_path(backend.api)
    except ValueError as e:
        console.print(f"[bold red]scenario error[/]: {e}")
        raise typer.Exit(EXIT_SCENARIO_ERROR)
    if scenario.workload.ignore_eos and not engine.forces_length:
        console.print(f"[yellow]warning[/]: workload.ignore_eos: {engine.name} cannot force the output length; "
                      f"answers may be shorter than planned (records show the server's count)")
    started_here = None
    if launched is None and backend.launch is not None:
        console.print(f"starting the {backend.kind} engine (log: {writer.dir / 'engine.log'})")
        launched = started_here = launch(engine, backend.launch, backend.url, backend.model,
                                         writer.dir / "engine.log", backend.headers)
    try:
        url = launched.url if launched else backend.url
        probe(url, backend.headers, ready_paths=engine.ready_paths)  # one clear error before any load
        tokenizer = resolve_tokenizer(scenario, url)
        try:
            plan = build_plan(scenario, tokenizer)
        except ScenarioError as e:  # problems only visible while building requests (files, traces)
            console.print(f"[bold red]scenario error[/]: {e}")
            raise typer.Exit(EXIT_SCENARIO_ERROR)
        for warning in plan.warnings:
            console.print(f"[yellow]warning[/]: {warning}")
        option = workers_option or getattr(load, "workers", None)
        try:
            n_workers = resolve_workers(option, plan.requests, load.concurrency, plan.duration_s,
                                        os.cpu_count() or 1)
        except ValueError as e:
            console.print(f"[bold red]scenario error[/]: {e}")
            raise typer.Exit(EXIT_SCENARIO_ERROR)
        target = Target(url, backend.api, backend.model, backend.request_timeout_s, dict(backend.headers),
                        scenario.workload.ignore_eos, backend.kind, tuple(backend.eos_token_ids))
        run_info = {"scenario": scenario.resolved_dict(), "versions": versions(), "host": host_info(),
                    "backend": {"kind": backend.kind, "url": url, "model": backend.model, "api": backend.api,
                                "launched": launched is not None, "engine_version": engine.version(url, backend.headers),
                                "engine_pid": launched.pid if launched else None},
                    "token_count_method": plan.token_count_method, "workers": n_workers,
                    "time_unit": "seconds from t0 (perf_counter_ns)"}
        writer.write_run_info(run_info)
        # t0 is fixed before the run so telemetry and server metrics share the requests' clock
        lead_s = 0.3 if n_workers <= 1 else 3.0 + 0.5 * n_workers  # spawned workers take a while to start
        t0_ns = time.perf_counter_ns() + int(lead_s * 1e9)
        observers = RunObservers(scenario, engine, url, launched, t0_ns, writer.dir)
        observers.start(console)
        try:
            try:
                import uvloop
                run_loop = uvloop.run
            except ImportError:
                run_loop = asyncio.run
            outcome = run_loop(_run_with_progress(plan, target, load.concurrency, n_workers, writer, console, t0_ns))
        finally:
            run_info.update(observers.stop())
        run_info["t0_perf_counter_ns"] = outcome.t0_ns
        if outcome.t0_ns != t0_ns:
            run_info["telemetry_t0_offset_s"] = (outcome.t0_ns - t0_ns) / 1e9  # workers started late
        writer.write_run_info(run_info)
    finally:
        if started_here:
            started_here.stop()
    summary = summarize(outcome.records, scenario.slo.model_dump(), outcome.loop_lag_s)
    reasons = client_bound_reasons(summary)
    summary.update(client_bound=bool(reasons), client_bound_reasons=reasons, interrupted=outcome.interrupted,
                   workers=n_workers, token_count_method=plan.token_count_method)
    summary["telemetry"] = observers.derived(outcome)
    summary["engine_counters"] = counter_deltas(writer.dir / "server_metrics.csv")
    writer.write_summary(summary)
    return summary


async def _run_with_progress(plan, target, concurrency, n_workers, writer, console, t0_ns=None):
    import asyncio
    import signal

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from harness.workers import run_plan

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGINT, stop.set)
    failed = 0
    with Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TextColumn("failed {task.fields[failed]}"), TimeElapsedColumn(),
                  console=console, refresh_per_second=4) as progress:
        task = progress.add_task("requests", total=len(plan.requests), failed=0)

        def on_record(rec):
            nonlocal failed
            writer.append(rec)
            failed += not rec.ok
            progress.update(task, advance=1, failed=failed)
        outcome = await run_plan(plan.requests, target, concurrency, n_workers, on_record, stop, plan.duration_s,
                                 t0_ns=t0_ns)
    loop.remove_signal_handler(signal.SIGINT)
    return outcome


def print_summary(summary: dict, out_dir: Path) -> None:
    req = summary["requests"]
    console.print(f"\n[bold]{req['completed']}[/] completed, [bold]{req['failed']}[/] failed "
                  f"({req['warmup']} warm-up excluded) in {summary['window_s']:.2f} s; results in {out_dir}")
    if summary["failures"]:
        console.print("failures: " + ", ".join(f"{k}={v}" for k, v in sorted(summary["failures"].items())))
    t, g = summary["throughput"], summary["goodput"]
    console.print(f"throughput {t['requests_per_s']:.2f} req/s, {t['output_tokens_per_s']:.1f} output tok/s, "
                  f"{t['total_tokens_per_s']:.1f} total tok/s; goodput {g['requests_per_s']:.2f} req/s "
                  f"({100 * g['fraction']:.1f}% meet {g['slo'] or 'no SLO'})")
    table = Table(title="latency (ms)")
    cols = ("mean", "p50", "p90", "p99", "p999", "max")
    table.add_column("metric")
    for c in cols:
        table.add_column(c, justify="right")
    for key in ("ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "schedule_lag_ms", "event_loop_lag_ms"):
        stats = summary.get(key) or {}
        table.add_row(key.removesuffix("_ms"), *("-" if stats.get(c) is None else f"{stats[c]:.2f}" for c in cols))
    console.print(table)


@app.command("backends")
def list_backends() -> None:
    """List the installed engine backends (the `bench.backends` entry-point group)."""
    from backends import available, load_backend
    table = Table(title="backends")
    for col in ("kind", "apis", "metrics", "what"):
        table.add_column(col)
    for kind, where in available().items():
        try:
            b = load_backend(kind)
            table.add_row(kind, ", ".join(b.paths), b.metrics_path or "-", b.description)
        except Exception as e:  # a broken third-party plug-in is listed, not fatal
            table.add_row(kind, "-", "-", f"cannot load {where}: {type(e).__name__}: {e}")
    Console().print(table)


try:  # the reports commands, when that package is present
    from reports.cli import gate, report, select
    app.command("report")(report)
    app.command("gate")(gate)
    app.command("select")(select)
except ImportError:
    pass

try:  # the built-in engine's server, when its package provides the command
    from native_engine.cli import serve as _serve
    app.command("serve")(_serve)
except ImportError:
    pass


if __name__ == "__main__":
    app()
