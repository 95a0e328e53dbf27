"""What watching a run costs the client (issue 42: under 5% of its CPU per token): real runs
(harness.runs.run.run_scenario, one client process) against the ground-truth server, a closed loop of 256 streams,
with no live view (off), the dashboard alone (redrawn twice a second into a terminal-like buffer), the Prometheus
endpoint alone (scraped once a second by another process) and both, interleaved, side by side. The client's CPU is
the process's (summary.json's client_cpu_s: every thread, the endpoint's server and the redraws included) per output
token. Two figures for each view, as shares of its runs' client CPU:
- the live view's own CPU, counted where it is spent: LiveRun.observe and LiveRun.refresh on the client's thread, each
  scrape's request thread (prometheus_client serves a request on a thread of its own) and the endpoint's accept
  loop, timed by time.thread_time and /proc (direct; what it leaves out is the indirect cost: caches, the GIL);
- on vs off side by side, interleaved rounds, with a 95% interval on the mean of the rounds' log ratios (a t
  interval), which bounds the indirect cost when it is narrow.
On a machine with 2 cores or more the client (this process) runs on core 0 and the server and the scraper on core 1
(`--no-pin` to leave them to the scheduler), so the server's bursts do not take the client's core turn by turn.

    flock /tmp/bench.lock python benchmarks/live_overhead.py --rounds 12
"""

from __future__ import annotations

import argparse
import io
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from prometheus_client.exposition import ThreadingWSGIServer
from rich.console import Console
from scipy import stats

from harness.runs.live import LiveRun, LiveSettings
from harness.runs.live_metrics import MetricsEndpoint
from harness.runs.run import Reporter, run_scenario
from harness.scenario.scenario import load_scenario

# a scraper in its own process, so its HTTP work is not counted as the client's
SCRAPER = """
import sys, time, urllib.request
while True:
    try:
        urllib.request.urlopen(sys.argv[1], timeout=5).read()
    except OSError:
        pass
    time.sleep(float(sys.argv[2]))
"""


LIVE_CPU_S = [0.0]  # CPU the live view's calls took on the client's thread, summed over a run


def timed(method):
    """`method`, its thread CPU time added to LIVE_CPU_S."""

    def wrapper(*args, **kwargs):
        start = time.thread_time()
        try:
            return method(*args, **kwargs)
        finally:
            LIVE_CPU_S[0] += time.thread_time() - start

    return wrapper


LiveRun.observe, LiveRun.refresh = timed(LiveRun.observe), timed(LiveRun.refresh)
# every scrape is served on a new thread: its whole CPU is the endpoint's
ThreadingWSGIServer.process_request_thread = timed(ThreadingWSGIServer.process_request_thread)


def thread_cpu_s(native_id: int) -> float:
    """CPU (user + system) one thread of this process has used, from /proc."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def t_interval(ratios: list[float]) -> tuple[float, float, float]:
    """Mean of the rounds' on/off ratios and its 95% interval, taken on their logs."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


MODES = ("off", "dashboard", "endpoint", "both")


def one_run(scenario_path: Path, out: Path, mode: str, scrape_every_s: float, pin: bool) -> tuple[float, int]:
    """(client CPU-s, output tokens) of one run. mode: off (no live view at all), dashboard (drawn, no endpoint),
    endpoint (an endpoint of its own, scraped every `scrape_every_s` by another process; nothing drawn), both."""
    reporter = Reporter()
    if mode == "off":
        return run_tallies(scenario_path, out, reporter)
    display = "dashboard" if mode in ("dashboard", "both") else "off"
    screen = Console(file=io.StringIO(), force_terminal=True, width=120)  # rendered as on a terminal
    if mode == "dashboard":
        reporter.live = LiveSettings(display=display, console=screen)
        return run_tallies(scenario_path, out, reporter)
    endpoint = MetricsEndpoint(0)
    scraper = subprocess.Popen([*taskset(pin, 1), sys.executable, "-c", SCRAPER, endpoint.url, str(scrape_every_s)])
    reporter.live = LiveSettings(display=display, metrics=endpoint, console=screen)
    accept_loop_before_s = thread_cpu_s(endpoint._thread.native_id)
    try:
        return run_tallies(scenario_path, out, reporter)
    finally:
        LIVE_CPU_S[0] += thread_cpu_s(endpoint._thread.native_id) - accept_loop_before_s
        scraper.kill()
        endpoint.close()


def run_tallies(scenario_path: Path, out: Path, reporter: Reporter) -> tuple[float, int]:
    summary = run_scenario(load_scenario(scenario_path), out, reporter=reporter).summary
    return summary.client_cpu_s, summary.output_tokens


def taskset(pin: bool, core: int) -> tuple[str, ...]:
    return ("taskset", "-c", str(core)) if pin else ()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--scrape-every-s", type=float, default=1.0)
    p.add_argument("--modes", default=",".join(MODES), help="off and the live views to compare with it")
    p.add_argument("--no-pin", dest="pin", action="store_false", help="leave the processes to the scheduler")
    args = p.parse_args()
    args.pin = args.pin and len(os.sched_getaffinity(0)) >= 2
    if args.pin:
        os.sched_setaffinity(0, {0})  # the client, and every thread it starts
    modes = args.modes.split(",")
    if set(modes) - set(MODES) or "off" not in modes:
        p.error(f"--modes: {args.modes!r}: use off and any of {', '.join(MODES[1:])}, comma-separated")
    work = Path(tempfile.mkdtemp(prefix="live_overhead_"))
    per_token_us: dict[str, list[float]] = {mode: [] for mode in modes}
    live_share: dict[str, list[float]] = {mode: [] for mode in modes}
    load_before = os.getloadavg()[0]
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=args.itl_ms), prefix=taskset(args.pin, 1)) as gt:
        path = work / "live.yaml"
        path.write_text(
            f"name: live_overhead\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
            f"workload: {{kind: random, input_tokens: 8, output_tokens: {args.tokens}}}\n"
            f"load: {{arrival: closed, concurrency: {args.concurrency}, num_requests: {args.requests}, "
            "workers: 1}\n"
        )
        for r in range(args.rounds):
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:  # each mode leads a round in turn
                LIVE_CPU_S[0] = 0.0
                cpu_s, tokens = one_run(path, work / f"{mode}{r}", mode, args.scrape_every_s, args.pin)
                per_token_us[mode].append(1e6 * cpu_s / tokens)
                live_share[mode].append(LIVE_CPU_S[0] / cpu_s)
                print(
                    f"round {r} {mode:9s}: {cpu_s:.2f} CPU-s, {tokens:,} tokens, "
                    f"{per_token_us[mode][-1]:.2f} CPU-us per token",
                    flush=True,
                )
    for mode in modes[1:]:
        ratios = [b / a for a, b in zip(per_token_us["off"], per_token_us[mode])]
        mean, low, high = t_interval(ratios)
        print(
            f"{mode} vs off, per round: {', '.join(f'{100 * (r - 1):+.1f}%' for r in ratios)}\n"
            f"  side by side {100 * (mean - 1):+.1f}% (95% interval {100 * (low - 1):+.1f}% to "
            f"{100 * (high - 1):+.1f}%); its own CPU (observe, refresh, scrapes, accept loop) median "
            f"{100 * statistics.median(live_share[mode]):.1f}% of the run's client CPU "
            f"(range {100 * min(live_share[mode]):.1f}-{100 * max(live_share[mode]):.1f}%)"
        )
    print(
        "median CPU-us per token: "
        + ", ".join(f"{mode} {statistics.median(per_token_us[mode]):.2f}" for mode in modes)
        + f"; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; {os.cpu_count()} cores; "
        + ("client on core 0, server and scraper on core 1" if args.pin else "not pinned")
    )


if __name__ == "__main__":
    main()
