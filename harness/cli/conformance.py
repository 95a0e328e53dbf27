"""The `bench probe URL` command: the conformance table (harness/engine/conformance.py), probe.json, and on request a
concurrency sweep through the run pipeline (one `bench run` sweep of a scenario written beside probe.json)
with its capacity line and `bench select`'s verdict, each in a process of its own.

The sweep is bounded: every level sends --requests-per-level requests (at least as many as its streams) of
--input-tokens prompt and --output-tokens answer tokens, so 256 streams of the defaults are 256 x 48 tokens.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import typer
import yaml
from rich.console import Console
from rich.table import Table

from harness.engine.conformance import FAIL, PASS, Prober, probe_document

VERDICT_STYLE = {PASS: "green", FAIL: "bold red"}
KINDS_BY_FAMILY = {"vllm": "vllm", "sglang": "sglang", "llamacpp": "llamacpp", "native": "native", "trtllm": "trtllm"}
console = Console(stderr=True)


def probe(
    url: str = typer.Argument(..., help="the endpoint's base URL, e.g. http://127.0.0.1:8000"),
    model: str | None = typer.Option(None, "--model", help="the model name to send (default: /v1/models' first)"),
    timeout_s: float = typer.Option(60.0, "--timeout-s", min=0.1, help="the longest wait for one answer"),
    output: Path | None = typer.Option(None, "--output", help="folder for probe.json and the sweep"),
    concurrency_sweep: str = typer.Option(
        "", "--concurrency-sweep", help="streams per level, e.g. 1,4,16,64,256: throughput and TTFT at each"
    ),
    requests_per_level: int | None = typer.Option(
        None, "--requests-per-level", min=1, help="requests at each level (default: the largest level)"
    ),
    input_tokens: int = typer.Option(32, "--input-tokens", min=1, help="the sweep's prompt length"),
    output_tokens: int = typer.Option(16, "--output-tokens", min=1, help="the sweep's answer length"),
    slo: str = typer.Option("ttft_ms=2000,tpot_ms=200", "--slo", help="the sweep's SLOs in ms, for its capacity"),
    kind: str = typer.Option("", "--kind", help="the sweep's backend.kind (default: from /metrics' names)"),
) -> None:
    """OpenAI-API conformance of an endpoint: a PASS / FAIL / UNSUPPORTED table with the evidence, probe.json;
    --concurrency-sweep adds throughput and TTFT per level and the selection line."""
    from harness.results.folder import default_output_dir

    parsed = urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise _exit(f"URL: {url!r} is not an http(s) URL; give the server's base, e.g. http://127.0.0.1:8000", 2)
    levels = _levels(concurrency_sweep)
    if levels and requests_per_level is not None and requests_per_level < max(levels):
        raise _exit(
            f"--requests-per-level: {requests_per_level} is below the largest level ({max(levels)} streams): "
            f"give at least {max(levels)} so every stream gets a request",
            2,
        )
    prober = Prober(url, model, timeout_s)
    rows = prober.run()
    if all(r.verdict == FAIL and r.evidence.startswith("no answer") for r in rows):
        raise _exit(f"run failed: {url} did not answer ({rows[0].evidence}); start the server or fix the URL", 4)
    out = output or default_output_dir("probe")
    out.mkdir(parents=True, exist_ok=True)
    document = probe_document(prober, rows)
    (out / "probe.json").write_text(json.dumps(document.model_dump(), indent=2) + "\n")
    _print_table(url, prober.model, rows)
    console.print(f"probe.json in {out}", highlight=False)
    if levels:
        api = "completions" if prober.text_api == "completions" else "chat"
        kind = kind or KINDS_BY_FAMILY.get(prober.metric_family or "", "openai")
        load = {"arrival": "closed", "sweep": levels, "num_requests": requests_per_level or max(levels)}
        scenario = {
            "name": "probe-sweep",
            "backend": {"kind": kind, "url": url, "model": prober.model, "api": api},
            "workload": {"kind": "random", "input_tokens": input_tokens, "output_tokens": output_tokens},
            "load": load,
            "slo": _slo(slo),
        }
        scenario["workload"]["ignore_eos"] = True
        path = out / "sweep_scenario.yaml"  # beside probe.json: `bench run` reruns the sweep as it was
        path.write_text(yaml.safe_dump(scenario, sort_keys=False))
        _sweep(path, out / "sweep")


def _levels(text: str) -> list[int]:
    if not text.strip():
        return []
    try:
        levels = [int(part) for part in text.split(",")]
    except ValueError:
        raise _exit(f"--concurrency-sweep: {text!r}; give streams per level as integers, e.g. 1,4,16,64,256", 2)
    if any(level < 1 for level in levels):
        raise _exit(f"--concurrency-sweep: {text!r}; every level must be at least 1 stream", 2)
    return levels


def _exit(message: str, code: int) -> typer.Exit:
    console.print(f"[bold red]error[/]: {message}", highlight=False, markup=True)
    return typer.Exit(code)


def _print_table(url: str, model: str | None, rows) -> None:
    table = Table(title=f"OpenAI API conformance of {url} (model {model})")
    for column in ("check", "verdict", "evidence"):
        table.add_column(column, overflow="fold")
    for r in rows:
        style = VERDICT_STYLE.get(r.verdict, "yellow")
        table.add_row(r.check, f"[{style}]{r.verdict}[/]", r.evidence.replace("[", r"\["))
    Console(width=max(160, Console().width)).print(table)


def _slo(text: str) -> dict:
    """`ttft_ms=2000,tpot_ms=200` as the scenario's slo: mapping (the scenario's checks name a bad key)."""
    slo = {}
    for part in filter(str.strip, text.split(",")):
        key, sep, value = part.partition("=")
        if not sep:
            raise _exit(f"--slo: {part!r}; give limits as key=ms pairs, e.g. ttft_ms=2000,tpot_ms=200", 2)
        slo[key.strip()] = yaml.safe_load(value)
    return slo


def _sweep(scenario_path: Path, sweep_dir: Path) -> None:
    """`bench run` of the sweep scenario, then `bench select` of its folder: the commands a user would run, in
    processes of their own (so the harness never imports the reports package)."""
    console.print(f"concurrency sweep: {scenario_path}", highlight=False)
    for args in (
        ["run", str(scenario_path), "--output", str(sweep_dir), "--allow-client-bound"],
        ["select", str(sweep_dir), "-o", str(sweep_dir / "selection.html")],
    ):
        code = subprocess.run([sys.executable, "-m", "harness", *args]).returncode
        if code:
            raise typer.Exit(code)
