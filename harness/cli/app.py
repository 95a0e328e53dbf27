"""`bench`: parses the command line, calls the run pipeline (harness.runs.run), prints through harness/cli/console.py,
and maps errors to exit codes. Commands of other packages (report, gate, select, serve) come from the `bench.commands`
entry-point group in pyproject.toml, so the harness imports nothing from them.

Exit codes: 0 ok; 1 the gate found a regression (`bench gate`) or the model does not fit (`bench memory`);
2 bad input (scenario, options, folders, files); 3 the client fell behind its schedule (client-bound); 4 the run
failed or is incomplete (engine unreachable or exited, fewer than half the requests completed); 130 Ctrl-C,
143 SIGTERM.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from importlib.metadata import entry_points
from pathlib import Path

import rich.markup
import typer
from rich.console import Console
from rich.table import Table

from backends import available, load_backend
from harness.cli.conformance import probe
from harness.cli.console import ConsoleReporter, console, print_repeats, print_summary
from harness.client.ray.shards import DistributedError
from harness.client.workers import client_bound_advice
from harness.engine.launcher import BackendUnreachable
from harness.metrics.across_runs import MIN_RUNS_TO_STOP
from harness.plan.model_inspect import inspect_model
from harness.results.folder import ResultsError, ResultsWriteFailed, default_output_dir, versions
from harness.results.schema import TuneManifest
from harness.runs.candidates import run_candidates
from harness.runs.live import live_settings
from harness.runs.repeats import MANIFEST as REPEATS_MANIFEST
from harness.runs.repeats import MAX_REPEATS, run_repeats
from harness.runs.run import MIN_COMPLETED_SHARE, RunResult, Terminated, raise_on_sigterm, run_scenario
from harness.runs.sweep import capacity_line, run_sweep, sweep_kind
from harness.scenario.chat_trace import SessionTraceConfig, write_session_trace
from harness.scenario.scenario import ScenarioError, load_scenario
from harness.scenario.tokenizer_source import TokenizerError

EXIT_OK, EXIT_REGRESSION, EXIT_BAD_INPUT, EXIT_CLIENT_BOUND, EXIT_RUN_FAILED = 0, 1, 2, 3, 4
EXIT_SIGINT, EXIT_SIGTERM = 130, 143
COMMANDS_GROUP = "bench.commands"

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Benchmark LLM serving engines: replay an arrival process, measure TTFT/ITL/TPOT/E2E/goodput.",
    epilog="Exit codes: 0 ok; 1 gate regression, or bench memory: does not fit; 2 bad input; 3 client-bound; "
    "4 run failed or incomplete; 5 gate inconclusive under --strict; 130 Ctrl-C; 143 SIGTERM.",
)


def _fail(kind: str, message: str, code: int) -> typer.Exit:
    # the message is text, not markup: a scenario's YAML in it (`fitted: [results/run-a]`) must print as written
    console.print(f"[bold red]{kind}[/]: {rich.markup.escape(message)}", highlight=False)
    return typer.Exit(code)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"bench {versions()['harness']}")
        raise typer.Exit()


@app.callback()
def main(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    pass


def _load(scenario_path: Path, overrides: list[str]):
    try:
        return load_scenario(scenario_path, overrides)
    except ScenarioError as e:
        raise _fail("scenario error", f"in {scenario_path}:\n{e}", EXIT_BAD_INPUT)


@app.command()
def validate(
    scenario: Path = typer.Argument(..., help="scenario YAML"),
    set_: list[str] = typer.Option([], "--set", help="override: dotted.path=value"),
) -> None:
    """Print the resolved scenario, or its errors (exit 2)."""
    resolved = _load(scenario, set_)
    typer.echo(json.dumps(resolved.resolved_dict(), indent=2))


# bench run's and bench tune's live view (harness/runs/live.py): each run drawn as it happens
LIVE_OPTION = typer.Option(
    None,
    "--live/--no-live",
    help="a dashboard while the load runs (default where stderr is a terminal; plain lines every 10 s elsewhere)",
)
METRICS_PORT_OPTION = typer.Option(
    None, "--metrics-port", min=1, max=65535, help="serve the runs' own Prometheus metrics on 127.0.0.1:PORT"
)
LIVE_PORT_OPTION = typer.Option(
    None, "--live-port", min=1, max=65535, help="serve a live page of the runs' charts on 127.0.0.1:PORT"
)


@app.command()
def run(
    scenario: Path = typer.Argument(..., help="scenario YAML"),
    set_: list[str] = typer.Option([], "--set", help="override: dotted.path=value (repeatable)"),
    output: Path | None = typer.Option(None, "--output", help="results folder (default results/<name>-<UTC>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the run already in --output"),
    allow_client_bound: bool = typer.Option(
        False, "--allow-client-bound", help="exit 0 even if the client fell behind its schedule"
    ),
    workers: str = typer.Option("", "--workers", help="client processes: auto or N (overrides load.workers)"),
    ray: str = typer.Option(
        "",
        "--ray",
        help="send the load from a Ray cluster's nodes, one client actor each: "
        "auto (the cluster running here) or its address (sets load.ray; needs the ray extra)",
    ),
    no_trim: bool = typer.Option(
        False, "--no-trim", help="measure the whole run, ramp-up and drain included (sets load.trim=false)"
    ),
    repeats: int = typer.Option(
        1, "--repeats", min=1, max=MAX_REPEATS, help="run the scenario N times into OUT/repeat-K/: means with intervals"
    ),
    until_ci: str = typer.Option(
        "", "--until-ci", help="with --repeats: stop once every headline interval is within this of its mean, e.g. 5%"
    ),
    keep_invalid: bool = typer.Option(
        False, "--keep-invalid", help="with --repeats: count the repeats whose validity verdict is invalid"
    ),
    live: bool | None = LIVE_OPTION,
    metrics_port: int | None = METRICS_PORT_OPTION,
    live_port: int | None = LIVE_PORT_OPTION,
) -> None:
    """Replay the scenario's load against its backend and write results (exit codes: `bench --help`)."""
    raise_on_sigterm()
    resolved = _load(scenario, set_ + ([f"load.ray={ray}"] if ray else []) + (["load.trim=false"] if no_trim else []))
    out_dir = output or default_output_dir(resolved.name)
    with _before_the_load_errors(out_dir):
        reporter = ConsoleReporter()
        reporter.live = live_settings(live, metrics_port, console, live_port)  # sweeps' and repeats' runs too
        if repeats > 1 or until_ci:
            until = parse_until_ci(until_ci, repeats)
            args = (workers or None, overwrite, allow_client_bound, keep_invalid, reporter)
            _repeats(resolved, out_dir, repeats, until, *args)
            return
        if resolved.candidates or resolved.load.sweep is not None:
            many = _candidates if resolved.candidates else _sweep
            many(resolved, out_dir, workers or None, overwrite, allow_client_bound, reporter)
            return
        result = run_scenario(resolved, out_dir, workers=workers or None, overwrite=overwrite, reporter=reporter)
    print_summary(result.summary, result.out_dir)
    raise typer.Exit(_verdict(result, allow_client_bound))


@contextmanager
def _before_the_load_errors(out_dir: Path):
    """bench run's typed errors as its exit codes: bad input, a run that could not start, a signal before the load."""
    try:
        yield
    except (ScenarioError, ResultsError) as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)
    except (BackendUnreachable, TokenizerError, DistributedError, ResultsWriteFailed) as e:
        raise _fail("run failed", str(e), EXIT_RUN_FAILED)
    except Terminated:
        raise _fail(
            "terminated",
            f"SIGTERM before any request was sent; the engine was stopped ({_interrupted_summary(out_dir)})",
            EXIT_SIGTERM,
        )
    except KeyboardInterrupt:  # Ctrl-C before the load began (during launch or planning)
        raise _fail("interrupted", f"Ctrl-C before any request was sent ({_interrupted_summary(out_dir)})", EXIT_SIGINT)


def _interrupted_summary(out_dir: Path) -> str:
    summary = out_dir / "summary.json"
    if summary.is_file():
        return f"{summary} says interrupted: true"
    return f"{summary} could not be written" if out_dir.is_dir() else "no results folder was made"


def _verdict(result: RunResult, allow_client_bound: bool) -> int:
    """Prints what went wrong with a finished run and returns its exit code."""
    if result.interrupted_by:
        console.print(
            f"[yellow]interrupted by {result.interrupted_by}: the summary covers the requests that finished[/]"
        )
        return EXIT_SIGTERM if result.interrupted_by == "SIGTERM" else EXIT_SIGINT
    if result.not_written:
        console.print(
            f"[bold red]run failed[/]: {'; '.join(result.not_written)}; the figures above are this run's summary",
            highlight=False,
        )
        return EXIT_RUN_FAILED
    if result.engine_exit:
        console.print(
            f"[bold red]run failed[/]: {result.engine_exit}; the load was stopped, the summary covers "
            f"the requests sent before",
            highlight=False,
        )
        return EXIT_RUN_FAILED
    if result.incomplete_reasons:
        console.print("[bold red]run incomplete[/]: " + "; ".join(result.incomplete_reasons), highlight=False)
        return EXIT_RUN_FAILED
    if result.mostly_failed:
        req = result.summary.requests
        console.print(
            f"[bold red]run failed[/]: {req.completed} of {req.measured} measured requests "
            f"completed ({result.completed_share:.0%}; at least {MIN_COMPLETED_SHARE:.0%} must); "
            f"failures: {result.summary.failures}",
            highlight=False,
        )
        return EXIT_RUN_FAILED
    if result.client_bound:
        console.print(
            "[bold red on white] CLIENT-BOUND [/] [bold red]the client fell behind its own schedule: "
            + "; ".join(result.summary.client_bound_reasons)
            + ". Latencies include client delay; "
            + _advice(result)
            + ".[/]"
        )
        return EXIT_OK if allow_client_bound else EXIT_CLIENT_BOUND
    return EXIT_OK


def _advice(result: RunResult) -> str:
    return client_bound_advice(result.summary, result.cpu_count) + "; or pass --allow-client-bound to accept this"


def _sweep(scenario, out_dir: Path, workers: str | None, overwrite: bool, allow_client_bound: bool, reporter) -> None:
    """`bench run` with load.sweep: every point into OUT/point-NNN-.../, a line per point, then the capacity."""
    try:
        points = run_sweep(scenario, out_dir, workers, overwrite, reporter)
    except (BackendUnreachable, TokenizerError, DistributedError, ResultsWriteFailed) as e:
        raise _fail("run failed", f"{e}; finished points stay in {out_dir}", EXIT_RUN_FAILED)
    except Terminated:
        raise _fail("terminated", f"finished points stay in {out_dir} (see sweep.json)", EXIT_SIGTERM)
    except KeyboardInterrupt:  # between points, or before a point's load began
        raise _fail("interrupted", f"finished points stay in {out_dir} (see sweep.json)", EXIT_SIGINT)
    console.print(capacity_line(scenario, points))
    console.print(f"results in {out_dir} (`bench report {out_dir}` draws the curves)")
    last = next((p for p in reversed(points) if p.result is not None), None)
    if last is not None and last.status != "completed":
        if points[-1] is not last:
            console.print("[yellow]the points after it were not run (see sweep.json)[/]")
        raise typer.Exit(_verdict(last.result, allow_client_bound))
    if all(p.result is not None and p.result.mostly_failed for p in points):
        console.print("[bold red]run failed[/]: at every point fewer than half the requests completed")
        raise typer.Exit(EXIT_RUN_FAILED)
    bound = [p for p in points if p.client_bound]
    if bound:
        loads = ", ".join(f"{p.offered_load:g}" for p in bound)
        console.print(
            f"[bold red on white] CLIENT-BOUND [/] [bold red]the client fell behind its own schedule at "
            f"{sweep_kind(scenario)} {loads}; latencies there include client delay; "
            + _advice(bound[0].result)
            + ".[/]"
        )
        if not allow_client_bound:
            raise typer.Exit(EXIT_CLIENT_BOUND)


def parse_until_ci(text: str, repeats: int) -> float | None:
    """--until-ci: "5%" or "5" (percent of the mean) as a share, 0.05; None when not given."""
    if not text:
        return None
    try:
        percent = float(text.strip().removesuffix("%"))
    except ValueError:
        percent = float("nan")
    if not 0 < percent < 100:
        raise ScenarioError(f"--until-ci: {text!r} is not a percentage between 0 and 100; give e.g. --until-ci 5%")
    if repeats < MIN_RUNS_TO_STOP:
        raise ScenarioError(
            f"--until-ci needs --repeats {MIN_RUNS_TO_STOP} or more (it stops no earlier than after "
            f"{MIN_RUNS_TO_STOP} runs); got --repeats {repeats}"
        )
    return percent / 100


def _repeats(
    scenario,
    out_dir: Path,
    repeats: int,
    until_ci: float | None,
    workers,
    overwrite: bool,
    allow_client_bound: bool,
    keep_invalid: bool,
    reporter,
) -> None:
    """`bench run --repeats N`: N runs into OUT/repeat-K/ (fewer once --until-ci is met), then the table of means."""
    if scenario.candidates or scenario.load.sweep is not None:
        raise ScenarioError("--repeats: not with candidates or load.sweep; repeat a single run's scenario")
    where = f"finished repeats stay in {out_dir} (see {REPEATS_MANIFEST})"
    try:
        state = run_repeats(scenario, out_dir, repeats, until_ci, workers, overwrite, reporter, keep_invalid)
    except (BackendUnreachable, TokenizerError, DistributedError, ResultsWriteFailed) as e:
        raise _fail("run failed", f"{e}; {where}", EXIT_RUN_FAILED)
    except Terminated:
        raise _fail("terminated", where, EXIT_SIGTERM)
    except KeyboardInterrupt:
        raise _fail("interrupted", where, EXIT_SIGINT)
    print_repeats(state, keep_invalid)
    console.print(f"results in {out_dir} ({REPEATS_MANIFEST}; `bench report {out_dir}` draws them)")
    if state.last is not None and state.stopped in ("interrupted", "failed"):
        raise typer.Exit(_verdict(state.last, allow_client_bound=True))
    bound = [s.dir for s in state.statuses if s.result is not None and s.result.client_bound]
    if bound and not allow_client_bound:
        console.print(
            f"[bold red on white] CLIENT-BOUND [/] [bold red]the client fell behind its own schedule in "
            f"{', '.join(bound)} ({'kept' if keep_invalid else 'left out'} as invalid); " + _advice(state.last) + ".[/]"
        )
        raise typer.Exit(EXIT_CLIENT_BOUND)


def _candidates(
    scenario, out_dir: Path, workers: str | None, overwrite: bool, allow_client_bound: bool, reporter
) -> None:
    """`bench run` with candidates: each deployment in turn into OUT/<name>/, a line per candidate."""
    try:
        statuses = run_candidates(scenario, out_dir, workers, overwrite, reporter)
    except Terminated:
        raise _fail("terminated", f"finished candidates stay in {out_dir} (see candidates.json)", EXIT_SIGTERM)
    except KeyboardInterrupt:
        raise _fail("interrupted", f"finished candidates stay in {out_dir} (see candidates.json)", EXIT_SIGINT)
    slo = ",".join(f"{k}={v:g}" for k, v in scenario.slo.model_dump().items() if v is not None)
    console.print(f"results in {out_dir}; compare them: bench select {out_dir}" + (f" --slo {slo}" if slo else ""))
    if statuses and statuses[-1].status == "interrupted":
        raise typer.Exit(EXIT_SIGINT)
    if not any(s.status == "completed" for s in statuses):
        raise _fail("run failed", "no candidate completed; see candidates.json for each one's reason", EXIT_RUN_FAILED)
    bound = [s.name for s in statuses if s.client_bound]
    if bound and not allow_client_bound:
        console.print(
            f"[bold red on white] CLIENT-BOUND [/] [bold red]the client fell behind its own schedule in "
            f"{', '.join(bound)}; latencies there include client delay[/]"
        )
        raise typer.Exit(EXIT_CLIENT_BOUND)


@app.command("tune")
def tune(
    scenario: Path = typer.Argument(..., help="scenario YAML with a tune: block"),
    output: Path = typer.Option(..., "--output", help="the tune folder: tune.json, a folder per configuration"),
    set_: list[str] = typer.Option([], "--set", help="override: dotted.path=value (repeatable)"),
    resume: bool = typer.Option(
        False, "--resume", help="continue the search in --output; finished trials are not run again"
    ),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the configurations, the plan and its cost"),
    workers: str = typer.Option("", "--workers", help="client processes: auto or N (overrides load.workers)"),
    live: bool | None = LIVE_OPTION,
    metrics_port: int | None = METRICS_PORT_OPTION,
    live_port: int | None = LIVE_PORT_OPTION,
) -> None:
    """Find the engine settings that carry the most load within the SLOs (the scenario's tune: block)."""
    from harness.tune.preflight import check_engine
    from harness.tune.tune import TUNE_MANIFEST, Tuner

    raise_on_sigterm()
    resolved = _load(scenario, set_)
    if resolved.tune is None:
        raise _fail(
            "scenario error",
            f"in {scenario}:\ntune: missing; add a tune: block (space, load, budget), "
            "e.g. tune: {space: {--max-num-seqs: [4, 8]}, load: {rate: {min: 0.5, max: 8}}}",
            EXIT_BAD_INPUT,
        )
    check = check_engine(resolved)
    if dry_run:
        _tune_dry_run(resolved, output, check)
        return
    if check is not None and not check.startable:
        raise _fail("tune", f"{check.line}; no configuration was launched", EXIT_RUN_FAILED)
    if check is not None:
        console.print(check.line, highlight=False, markup=False)
    if (output / TUNE_MANIFEST).exists() and not resume:
        raise _fail(
            "error",
            f"--output: {output} already holds a search ({TUNE_MANIFEST}); pass --resume to "
            "continue it, or choose a new folder",
            EXIT_BAD_INPUT,
        )
    try:
        reporter = ConsoleReporter()
        reporter.live = live_settings(live, metrics_port, console, live_port)  # each trial's run drawn as it goes
        doc = Tuner(resolved, output, reporter, resume, workers or None).run()
    except (ScenarioError, ResultsError) as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)
    except Terminated:
        raise _fail(
            "terminated", f"{output / TUNE_MANIFEST} lists the finished trials; --resume continues", EXIT_SIGTERM
        )
    except KeyboardInterrupt:
        raise _fail(
            "interrupted", f"{output / TUNE_MANIFEST} lists the finished trials; --resume continues", EXIT_SIGINT
        )
    _print_tune_result(doc, output)


def _tune_dry_run(resolved, output: Path, check) -> None:
    """`bench tune --dry-run`: the configurations and the search's cost; whether the engine can start here; with a
    plan: block, bench plan's predicted capacity of each configuration (simulated, nothing launched)."""
    from harness.tune.summary import plan_lines
    from harness.tune.tune import Tuner

    for line in plan_lines(resolved):
        console.print(line, highlight=False, markup=False)
    if check is not None:
        console.print(check.line + ("" if check.startable else " (a real tune would stop here)"), highlight=False)
    if resolved.plan is None:
        console.print("predicted capacities: none without a plan: block (docs/tune.md)", highlight=False)
        return
    console.print("bench plan's predicted capacity of each configuration (simulated, nothing launched):")
    try:
        Tuner(resolved, output, ConsoleReporter(), False, None).predict()
    except (ScenarioError, ValueError) as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)


def _print_tune_result(doc: TuneManifest, output: Path) -> None:
    """Each configuration's capacity, the recommendation (exit 5 when none met the SLOs), the search's cost,
    and the tune folder's HTML report."""
    from harness.tune.summary import capacity_text

    for c in doc.configurations:
        console.print(f"{c.name}: {c.status}; {capacity_text(c.capacity, doc.kind)}", highlight=False)
    best = doc.recommended
    if best is None:
        raise _fail("tune", "no configuration met the SLOs at any load tried; see tune.json", EXIT_RUN_FAILED)
    margin = f", {100 * best.margin:.0f}% above {best.next}" if best.margin is not None else ""
    console.print(
        f"recommended: {best.name} ({' '.join(best.launch_args) or 'the launch as written'}): "
        f"{best.capacity:.3g} {doc.unit}{margin}",
        highlight=False,
    )
    cost, dense = doc.cost.search, doc.cost.dense_sweep
    console.print(
        f"search: {cost.runs} runs, {cost.requests} requests, {cost.minutes:.1f} min; a dense "
        f"sweep: {dense.runs} runs, {dense.requests} requests",
        highlight=False,
    )
    reports = output / "reports"
    reports.mkdir(exist_ok=True)
    app(["report", str(output), "-o", str(reports / "tune.html")], standalone_mode=False)  # reports' own command


@app.command("make-trace")
def make_trace(
    out: Path = typer.Argument(..., help="the JSONL file to write (Mooncake format)"),
    sessions: int = typer.Option(12, help="chat sessions"),
    turns: int = typer.Option(4, help="turns per session; each resends the history"),
    block_tokens: int = typer.Option(16, help="tokens per hash_id block (the scenario's load.trace_block_size)"),
    system_blocks: int = typer.Option(2, help="system prompt blocks shared by every session (0: none)"),
    user_blocks: tuple[int, int] = typer.Option((3, 6), help="a user message: MIN MAX blocks"),
    output_tokens: tuple[int, int] = typer.Option((12, 24), help="an answer: MIN MAX tokens"),
    session_gap_s: float = typer.Option(3.0, help="mean seconds between session starts"),
    think_time_s: tuple[float, float] = typer.Option((10.0, 18.0), help="MIN MAX seconds between turns"),
    seed: int = typer.Option(0, help="same seed and options: the same file"),
) -> None:
    """Write a Mooncake trace of interleaved multi-turn chat sessions (turn k extends turn k-1's hash_ids)."""
    config = SessionTraceConfig(
        sessions, turns, block_tokens, system_blocks, user_blocks, output_tokens, session_gap_s, think_time_s, seed
    )
    try:
        rows = write_session_trace(config, out)
    except ValueError as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)
    span_s = rows[-1]["timestamp"] / 1000
    console.print(
        f"{len(rows)} requests ({sessions} sessions x {turns} turns) over {span_s:.1f} s, prompts of "
        f"{min(r['input_length'] for r in rows)}-{max(r['input_length'] for r in rows)} tokens, "
        f"written to {out}; replay it with load.arrival: trace, load.trace_block_size: {block_tokens}",
        highlight=False,
    )


@app.command("plan")
def plan(
    scenario: Path | None = typer.Argument(None, help="scenario YAML with a plan: block (docs/planner.md)"),
    set_: list[str] = typer.Option([], "--set", help="override: dotted.path=value (repeatable)"),
    output: Path | None = typer.Option(None, "--output", help="results folder (default results/<name>-plan-<UTC>)"),
    overwrite: bool = typer.Option(False, "--overwrite", help="replace the results already in --output"),
    search: bool = typer.Option(
        False,
        "--search",
        help="per GPU type in plan.prices, the cheapest deployment (replicas x TP) meeting the SLOs with --headroom at "
        "each --traffic level, on the roofline: its capacity, its load, and the engine's launch command",
    ),
    max_gpus: int = typer.Option(64, "--max-gpus", min=1, help="--search: most GPUs a deployment may use"),
    time_budget_s: float = typer.Option(600.0, "--time-budget-s", min=1, help="--search: stop after this"),
    headroom: str = typer.Option(
        "30%", "--headroom", help="--search: the share above load.rate each deployment must carry within the SLOs"
    ),
    traffic: str = typer.Option("1,2", "--traffic", help="--search: traffic levels, multiples of load.rate"),
    disaggregate_splits: str | None = typer.Option(
        None, "--disaggregate-splits", help="--search: prefill:decode splits beside each choice, e.g. 1:1,1:2"
    ),
    memory: bool = typer.Option(False, "--memory", hidden=True, help="deprecated: bench memory"),
    model: str = typer.Option(
        "llama-3.1-8b", "--model", hidden=True, help="--memory: built-in name, .gguf or config.json"
    ),
    weight_bits: float | None = typer.Option(
        None, "--weight-bits", hidden=True, help="--memory: e.g. 4.5 (default: the model's own)"
    ),
    context: int = typer.Option(4096, "--context", min=1, hidden=True, help="--memory: tokens a sequence holds"),
    concurrency: int = typer.Option(1, "--concurrency", min=1, hidden=True, help="--memory: sequences at once"),
    gpu_memory: str | None = typer.Option(
        None, "--gpu-memory", hidden=True, help="--memory: e.g. 16GiB (default: --hardware's)"
    ),
    hardware: str = typer.Option("H100", "--hardware", hidden=True, help="--memory: a GPU of the table"),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", min=1, hidden=True, help="--memory: GPUs per replica"),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", hidden=True, help="--memory"),
    kv_dtype: str = typer.Option("auto", "--kv-dtype", hidden=True, help="--memory: auto, bf16, fp16 or fp8"),
) -> None:
    """Simulate the scenario's load on the deployment its plan: block describes (the engine's own scheduler,
    a fitted or roofline step model) and write a results folder as `bench run` does, marked simulated.
    --search: the cheapest deployment per GPU type. (`--memory` is the deprecated spelling of `bench memory`.)"""
    if memory:
        typer.echo("bench plan --memory is deprecated: use bench memory (same options)", err=True)
        return memory_command(
            model,
            weight_bits,
            context,
            concurrency,
            gpu_memory,
            hardware,
            tensor_parallel,
            gpu_memory_utilization,
            kv_dtype,
            None,
        )
    if scenario is None:
        raise _fail("error", "bench plan needs a SCENARIO (the memory a model needs: bench memory)", EXIT_BAD_INPUT)
    options = _search_options(search, max_gpus, time_budget_s, headroom, traffic, disaggregate_splits)
    _plan_scenario(_load(scenario, set_), output, options, overwrite)


def _search_options(search: bool, max_gpus: int, time_budget_s: float, headroom: str, traffic: str, splits: str | None):
    """--search's options (None without --search, which --disaggregate-splits needs)."""
    from harness.plan.search import SearchOptions

    if not search:
        if splits:
            raise _fail("error", "--disaggregate-splits compares splits in a --search; add --search", EXIT_BAD_INPUT)
        return None
    try:
        return SearchOptions.parse(max_gpus, time_budget_s, headroom, traffic, splits)
    except ValueError as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)


def _plan_scenario(resolved, output: Path | None, search, overwrite: bool):
    """bench plan of a scenario: a search (`search`: its SearchOptions), its candidates, its sweep's points or the one
    deployment, simulated."""
    from harness.plan.folders import simulate_candidates, simulate_sweep
    from harness.plan.simulator import simulate_scenario

    try:
        shown = _searched_as_first_gpu(resolved) if search is not None else resolved
        if (precision := _plan_precision_line(shown)) is not None:
            console.print(precision, highlight=False, markup=False)
        if (engine := _plan_engine_line(shown)) is not None:
            console.print(engine, highlight=False, markup=False)
        out_dir = output or default_output_dir(f"{resolved.name}-plan")
        if search is not None:
            plan_search_report(resolved, out_dir, search, overwrite)
        elif resolved.candidates:
            statuses = simulate_candidates(resolved, out_dir, overwrite)
            console.print(f"{len(statuses)} candidates simulated into {out_dir}; rank them with bench select {out_dir}")
        elif resolved.load.sweep is not None:
            points = simulate_sweep(resolved, out_dir, overwrite)
            console.print(capacity_line(resolved, points))
            console.print(f"{len(points)} points simulated into {out_dir}")
        else:
            print_summary(simulate_scenario(resolved, out_dir, overwrite=overwrite), out_dir)
    except (ScenarioError, ResultsError) as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)
    except TokenizerError as e:
        raise _fail("plan failed", str(e), EXIT_BAD_INPUT)


def _searched_as_first_gpu(resolved):
    """A search sets plan.hardware per GPU type; its precision and engine lines are said on the first priced one."""
    plan = resolved.plan
    if plan is None or plan.hardware is not None or not plan.prices:
        return resolved
    return resolved.model_copy(update={"plan": plan.model_copy(update={"hardware": next(iter(plan.prices))})})


def _plan_precision_line(resolved) -> str | None:
    """What a roofline plan assumed for weights, matmuls and KV cache (harness/scenario/precision.py)."""
    from harness.plan.roofline_scenario import precision_line

    try:
        return precision_line(resolved)
    except ValueError as e:
        raise ScenarioError(str(e)) from None


def _plan_engine_line(resolved) -> str | None:
    """The engine profile a plan simulates and where each of its settings came from (harness/plan/deployment.py)."""
    from harness.plan.deployment import assumptions_line, engine_choice

    if resolved.plan is None:
        return None
    try:
        return assumptions_line(resolved, engine_choice(resolved))
    except ValueError as e:
        raise ScenarioError(str(e)) from None


@app.command("memory")
def memory_command(
    model: str = typer.Option("llama-3.1-8b", "--model", help="built-in name, .gguf or config.json"),
    weight_bits: float | None = typer.Option(None, "--weight-bits", help="e.g. 4.5 (default: the model's own)"),
    context: int = typer.Option(4096, "--context", min=1, help="tokens a sequence holds"),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="sequences at once"),
    gpu_memory: str | None = typer.Option(None, "--gpu-memory", help="e.g. 16GiB (default: --hardware's)"),
    hardware: str = typer.Option("H100", "--hardware", help="a GPU of the table"),
    tensor_parallel: int = typer.Option(1, "--tensor-parallel", min=1, help="GPUs per replica"),
    gpu_memory_utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="the engine's share"),
    kv_dtype: str = typer.Option(
        "auto", "--kv-cache-dtype", "--kv-dtype", help="auto (bf16), bf16, fp16, fp8 (fp8_e4m3, fp8_e5m2)"
    ),
    weight_dtype: str | None = typer.Option(
        None, "--weight-dtype", help="bf16, fp16, fp8, int8, int4 or fp4 (default: the model's own)"
    ),
) -> None:
    """The memory a model needs on a GPU: weights, KV cache per token, and what fits (sequences at --context,
    tokens each at --concurrency). Exit 1 when it does not fit, so a script can ask."""
    from harness.plan.architectures import load_architecture
    from harness.plan.memory import load_fit, memory_lines, parse_bytes, plan_memory
    from harness.plan.precision import memory_precision, stored_architecture
    from harness.scenario.gpus import gpu_spec

    try:
        precision = memory_precision(weight_dtype, kv_dtype)
        arch = stored_architecture(load_architecture(model), weight_dtype, weight_bits, "--weight-bits")
        total = parse_bytes(gpu_memory, "--gpu-memory") if gpu_memory else gpu_spec(hardware, "--hardware").hbm_bytes
        memory_plan = plan_memory(arch, total, gpu_memory_utilization, tensor_parallel, precision.kv_bytes)
    except (ValueError, FileNotFoundError) as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)
    for line in memory_lines(arch, memory_plan, context, concurrency, precision):
        typer.echo(line)
    if not load_fit(memory_plan, context, concurrency)["fits"]:
        raise typer.Exit(EXIT_REGRESSION)  # the answer is no: 1, as a check that failed


def plan_search_report(resolved, out_dir: Path, options, overwrite: bool) -> None:
    """`bench plan --search`: each traffic level's table, capacity, load and recommendation; on Ctrl-C, what was
    simulated so far (written too), then exit 130."""
    from harness.plan.search import Search, write_search

    try:
        search = Search(resolved, out_dir, overwrite=overwrite, **options.search_kwargs())
    except ValueError as e:
        raise ScenarioError(str(e)) from None
    search.progress = lambda line: console.print(line, highlight=False, markup=False)  # which deployment it is on
    if resolved.load.rate is None:
        console.print("load: not paced by a rate, so no capacity, headroom or traffic levels: the scenario's load only")
    try:
        for traffic in options.traffic if resolved.load.rate is not None else (1.0,):
            search.run(traffic)
    except KeyboardInterrupt:
        for line in write_search(search, interrupted=True):
            typer.echo(line)
        raise _fail(
            "interrupted",
            f"Ctrl-C after {search.simulations} simulations: the tables above hold what was simulated (written "
            f"to {out_dir}); the search did not finish",
            EXIT_SIGINT,
        )
    for line in write_search(search):
        typer.echo(line)
    console.print(
        f"{search.simulations} simulations; the tables and every simulated folder are in {out_dir} "
        f"(bench report {out_dir}; bench select {out_dir})",
        highlight=False,
    )


@app.command("compare-outputs")
def compare_outputs(
    run_a: Path = typer.Argument(..., help="a run folder (the reference)"),
    run_b: Path = typer.Argument(..., help="a run folder of the same scenario's prompts"),
    tokenizer: str = typer.Option(
        "", "--tokenizer", help="re-tokenize the answers with this (GGUF, HF folder or name; default: run A's)"
    ),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON"),
) -> None:
    """Do two runs answer the same prompts the same? Exact-match share, where answers part, token agreement.
    Exit 1 when greedy runs answer differently (flagged), 2 when they cannot be compared."""
    from harness.metrics.output_agreement import agreement_lines, compare_runs
    from harness.scenario.tokenizer_source import local_tokenizer

    try:
        result = compare_runs(run_a, run_b, local_tokenizer(tokenizer) if tokenizer else None)
    except (ResultsError, TokenizerError) as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)
    if as_json:
        typer.echo(json.dumps(result.model_dump(exclude_unset=True), indent=2))
    else:
        for line in agreement_lines(result):
            typer.echo(line)
    raise typer.Exit(EXIT_REGRESSION if result.flagged else EXIT_OK)


@app.command("export")
def export_run(
    run_dir: Path = typer.Argument(..., help="a run folder"),
    fmt: str = typer.Option("csv", "--format", help="csv | parquet (the records, one row each) | llm-d (a report)"),
    output: Path = typer.Option(None, "--output", "-o", help="the file to write (default: beside the run)"),
) -> None:
    """A run's records as one flat table (CSV, Parquet) or the run as an llm-d Benchmark Report v0.2."""
    from harness.metrics.export import export

    try:
        typer.echo(f"wrote {export(run_dir, fmt, output)}")
    except ResultsError as e:
        raise _fail("error", str(e), EXIT_BAD_INPUT)


@app.command("schema")
def schema(
    write: bool = typer.Option(False, "--write", help="write docs/schema/*.json (else list them and what differs)"),
) -> None:
    """The JSON Schema of each results file, generated from harness/results/schema.py into docs/schema/."""
    from harness.results.schema_files import SCHEMA_DIR, rendered, write_schemas

    if write:
        for path in write_schemas():
            typer.echo(f"wrote {path}")
        return
    for name, text in rendered().items():
        path = SCHEMA_DIR / name
        same = path.is_file() and path.read_text(encoding="utf-8") == text
        typer.echo(f"{name}: {'up to date' if same else 'differs from the models (bench schema --write)'}")


@app.command("backends")
def list_backends() -> None:
    """List the installed engine backends (the `bench.backends` entry-point group)."""
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


app.command("inspect-model")(inspect_model)
app.command("probe")(probe)


def add_declared_commands(app: typer.Typer, declared=None) -> None:
    """Adds the commands declared in the `bench.commands` entry-point group (this project's report, gate,
    select and serve; a third party's the same way). One that cannot be loaded, or that takes the name of
    a command already there, stops `bench` with its name: a command must never vanish quietly."""
    taken = {info.name or info.callback.__name__ for info in app.registered_commands}
    taken |= {info.name for info in app.registered_groups}
    for ep in sorted(entry_points(group=COMMANDS_GROUP) if declared is None else declared, key=lambda e: e.name):
        where = f"{ep.value!r} (entry-point group {COMMANDS_GROUP!r})"
        if ep.name in taken:
            raise RuntimeError(f"bench command {ep.name!r} from {where}: a command of that name already exists")
        try:
            command = ep.load()
        except Exception as e:
            raise RuntimeError(
                f"bench command {ep.name!r} cannot be loaded from {where}: {type(e).__name__}: {e}"
            ) from e
        if isinstance(command, typer.Typer):  # a group of subcommands (`bench history add|show`)
            app.add_typer(command, name=ep.name)
        elif callable(command):
            app.command(ep.name)(command)
        else:
            raise RuntimeError(
                f"bench command {ep.name!r} from {where} is a {type(command).__name__}, not a function or a typer.Typer"
            )
        taken.add(ep.name)


add_declared_commands(app)


if __name__ == "__main__":
    app()
