"""A run watched as it happens (harness/runs/live.py), against the ground-truth server on loopback: the last frame is
summary.json's, the Prometheus endpoint's counts grow during the run and end equal to the records', and in a
pseudo-terminal the dashboard is redrawn at least once a second (frames counted by their numbers, against the run's
own span), while CI=true gives plain lines."""

import io
import json
import os
import pty
import re
import select
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import pytest
from bench_process import bench
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from prometheus_client.parser import text_string_to_metric_families
from rich.console import Console

from harness.metrics.latencies import request_latency
from harness.results.folder import read_records
from harness.runs.live import LiveSettings, live_settings
from harness.runs.live_metrics import MetricsEndpoint
from harness.runs.run import Reporter, run_scenario
from harness.scenario.scenario import ScenarioError, load_scenario
from native_engine.tiny_gguf import write_tiny_llama_gguf

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def gt():
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=5)) as server:
        yield server


def write_scenario(tmp_path, url, rate=20, requests=40) -> Path:
    path = tmp_path / "live.yaml"
    path.write_text(
        f"name: live\nbackend: {{kind: openai, url: '{url}', model: gt}}\n"
        "workload: {kind: random, input_tokens: 16, output_tokens: 8}\n"
        f"load: {{arrival: constant, rate: {rate}, num_requests: {requests}}}\nslo: {{ttft_ms: 100}}\n"
    )
    return path


def scrape(url: str) -> dict[tuple[str, str], float]:
    """(sample name, status label or "") -> value, for the run's samples."""
    text = urllib.request.urlopen(url, timeout=5).read().decode()
    return {
        (sample.name, sample.labels.get("status", "") + sample.labels.get("le", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_the_last_frame_is_the_summary_and_the_endpoint_ends_with_the_records_counts(gt, tmp_path):
    endpoint = MetricsEndpoint(0)
    assert endpoint.url.startswith("http://127.0.0.1:")  # loopback only
    shown = io.StringIO()
    reporter = Reporter()
    reporter.live = LiveSettings(display="lines", metrics=endpoint, refresh_s=0.2, console=Console(file=shown))
    during: list[float] = []
    done = threading.Event()

    def scrape_while_running():
        while not done.is_set():
            during.append(scrape(endpoint.url).get(("bench_ttft_seconds_count", ""), 0.0))
            done.wait(0.1)

    scraper = threading.Thread(target=scrape_while_running)
    scraper.start()
    try:  # 40 requests at 20/s: a 2 s run, scraped every 0.1 s
        result = run_scenario(load_scenario(write_scenario(tmp_path, gt.url)), tmp_path / "out", reporter=reporter)
    finally:
        done.set()
        scraper.join()
        final = scrape(endpoint.url)
        endpoint.close()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    frame = result.live_frame
    assert frame.final and frame.completed == summary["requests"]["completed"] == 40
    assert frame.due == frame.planned == 40  # every record reached the live view
    assert frame.ttft_ms.p50 == summary["ttft_ms"]["p50"]
    assert any(0 < count < 40 for count in during), during  # the counts grew while the run went on
    records = [r for r in read_records(tmp_path / "out") if not r.is_warmup]
    lats = [request_latency(r) for r in records if r.ok]
    assert final[("bench_requests_total", "ok")] == sum(r.ok for r in records) == 40
    assert final[("bench_ttft_seconds_count", "")] == final[("bench_e2e_seconds_count", "")] == len(lats)
    assert final[("bench_itl_seconds_count", "")] == sum(len(lat.itl_token_s) for lat in lats)  # 40 x 7 gaps
    assert final[("bench_ttft_seconds_sum", "")] == pytest.approx(sum(lat.ttft_s for lat in lats))
    assert final[("bench_requests_in_flight", "")] == 0
    lines = shown.getvalue().splitlines()
    assert re.search(r"live / out frame 1 t=", lines[0]) and lines[-1].startswith("live / out final")


def test_the_live_options_change_nothing_unasked_where_there_is_no_terminal(tmp_path):
    plain = Console(file=io.StringIO())  # a pipe or a file: no terminal
    assert live_settings(None, None, plain) is None  # unsaid: scripts and logs read what they read before
    assert live_settings(True, None, plain).display == "auto"  # --live: plain lines there (LiveRun decides)
    assert live_settings(False, None, Console(file=io.StringIO(), force_terminal=True)) is None  # --no-live
    taken = MetricsEndpoint(0)
    try:  # a port already served is a usage error naming the option, in the library and from bench run (exit 2)
        with pytest.raises(ScenarioError, match=f"--metrics-port {taken.port}: cannot serve"):
            live_settings(None, taken.port, plain)
        scenario = write_scenario(tmp_path, "http://127.0.0.1:9")
        res = bench("run", scenario, "--output", tmp_path / "out", "--metrics-port", taken.port)
        assert res.returncode == 2 and f"--metrics-port {taken.port}: cannot serve" in res.stderr, res.stderr
        assert not (tmp_path / "out").exists()  # refused before anything was sent or written
    finally:
        taken.close()


def run_in_pty(args: list[str], env: dict, timeout_s: float = 120.0) -> str:
    """What a process writes to its terminal, when its stdout and stderr are a pseudo-terminal."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(args, stdout=follower, stderr=follower, stdin=subprocess.DEVNULL, env=env, cwd=ROOT)
    os.close(follower)
    out = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], timeout_s)
            if not ready:
                raise AssertionError(f"no output for {timeout_s} s: {out[-2000:]!r}")
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the process ended
                break
            if not chunk:
                break
            out += chunk
    finally:
        proc.wait(timeout=timeout_s)
        os.close(leader)
    assert proc.returncode == 0, out[-3000:]
    return out.decode("utf-8", "replace")


@pytest.mark.parametrize("ci", ["", "true"])
def test_in_a_terminal_the_dashboard_is_redrawn_at_least_once_a_second(gt, tmp_path, ci):
    scenario = write_scenario(tmp_path, gt.url, rate=10, requests=40)  # a 4 s run
    env = {**os.environ, "CI": ci, "PYTHONPATH": str(ROOT), "COLUMNS": "120", "TERM": "xterm"}
    # bench run as typed: unasked in a terminal, the dashboard; with CI=true, --live asks for plain lines
    command = [sys.executable, "-m", "harness", "run", str(scenario), "--output", str(tmp_path / "out")]
    shown = run_in_pty(command + ["--allow-client-bound"] + (["--live"] if ci else []), env)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    frames = {int(n) for n in re.findall(r"frame (\d+) ", shown)}
    if ci:  # CI=true: plain lines, one every 10 s (none in a 4 s run) and the final one; no table
        assert re.search(r"live / out final t=\S+ due 40/40 done 40 ", shown) and "due / planned" not in shown
        return
    # drawn as the run starts, then on every second from t0 to the end: at least one frame per second of the
    # run's span (first intended send to the last answer's end), the summary's own clock
    assert len(frames) >= summary["run_span_s"] >= 3.5, (len(frames), summary["run_span_s"])
    assert frames == set(range(1, max(frames) + 1))  # numbered in order, none lost
    assert "final (the summary's figures)" in shown


def test_a_launched_engines_own_gauges_reach_the_final_line(tmp_path):
    # the built-in engine (a tiny GGUF) serves /metrics; the run's scraper hands each page to the live view, so the
    # final line carries the engine's running / waiting / KV figures read off its last page
    model = write_tiny_llama_gguf(tmp_path / "tiny.gguf", tokenizer="smollm2")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(
        f'name: live-engine\nbackend: {{kind: native, launch: {{args: ["--model", "{model}"], ready_timeout_s: 60}}}}\n'
        "workload: {kind: random, input_tokens: 16, output_tokens: 8, ignore_eos: true}\n"
        "load: {arrival: poisson, rate: 10, num_requests: 10, warmup_requests: 0}\n"
        "telemetry: {interval_ms: 200, gpu: false}\n"
    )
    env = {**os.environ, "CI": "true"}
    res = bench("run", scenario, "--output", tmp_path / "out", "--live", "--allow-client-bound", timeout_s=180, env=env)
    assert res.returncode == 0, res.stderr
    final = next(line for line in res.stderr.splitlines() if " final t=" in line)
    assert re.search(r" engine run \d+ wait \d+ kv \d+\.\d% prefix hits \d+\.\d%", final), final
