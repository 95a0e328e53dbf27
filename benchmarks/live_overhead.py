"""What watching a run costs the client (issue 42: under 5% of its CPU per token): real runs
(harness.runs.run.run_scenario, one client process) against the ground-truth server, a closed loop of 256 streams,
with the live view off and on (a dashboard redrawn twice a second into a terminal-like buffer, and the Prometheus
endpoint scraped once a second by another process), interleaved, side by side. The client's CPU is the process's
(summary.json's client_cpu_s: every thread, the endpoint's server and the redraws included) per output token.
On a shared machine the side-by-side difference drowns in noise, so the CPU the live view's own calls took on the
client's thread (LiveRun.observe and LiveRun.refresh, timed by time.thread_time) is printed too, as a share of the
"on" run's client CPU.

    flock /tmp/bench.lock python benchmarks/live_overhead.py --rounds 3
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]
from groundtruth_server import GroundTruthConfig, GroundTruthProcess
from rich.console import Console

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


def one_run(scenario_path: Path, out: Path, endpoint: MetricsEndpoint | None) -> tuple[float, int]:
    """(client CPU-s, output tokens) of one run, watched when `endpoint` is given."""
    reporter = Reporter()
    if endpoint is not None:
        screen = Console(file=io.StringIO(), force_terminal=True, width=120)  # rendered as on a terminal
        reporter.live = LiveSettings(display="dashboard", metrics=endpoint, console=screen)
    summary = run_scenario(load_scenario(scenario_path), out, reporter=reporter).summary
    return summary.client_cpu_s, summary.output_tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scrape-every-s", type=float, default=1.0)
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="live_overhead_"))
    endpoint = MetricsEndpoint(0)
    scraper = subprocess.Popen([sys.executable, "-c", SCRAPER, endpoint.url, str(args.scrape_every_s)])
    per_token_us: dict[str, list[float]] = {"off": [], "on": []}
    live_share: list[float] = []
    try:
        with GroundTruthProcess(GroundTruthConfig(ttft_ms=20, itl_ms=args.itl_ms)) as gt:
            path = work / "live.yaml"
            path.write_text(
                f"name: live_overhead\nbackend: {{kind: openai, url: '{gt.url}', model: gt}}\n"
                f"workload: {{kind: random, input_tokens: 8, output_tokens: {args.tokens}}}\n"
                f"load: {{arrival: closed, concurrency: {args.concurrency}, num_requests: {args.requests}, "
                "workers: 1}\n"
            )
            for r in range(args.rounds):
                order = ("off", "on") if r % 2 == 0 else ("on", "off")  # neither always goes first
                for mode in order:
                    LIVE_CPU_S[0] = 0.0
                    cpu_s, tokens = one_run(path, work / f"{mode}{r}", endpoint if mode == "on" else None)
                    per_token_us[mode].append(1e6 * cpu_s / tokens)
                    if mode == "on":
                        live_share.append(LIVE_CPU_S[0] / cpu_s)
                    print(
                        f"round {r} {mode:3s}: {cpu_s:.2f} CPU-s, {tokens:,} tokens, "
                        f"{per_token_us[mode][-1]:.2f} CPU-us per token",
                        flush=True,
                    )
    finally:
        scraper.kill()
        endpoint.close()
    off, on = statistics.median(per_token_us["off"]), statistics.median(per_token_us["on"])
    pairs = [b / a - 1 for a, b in zip(per_token_us["off"], per_token_us["on"])]
    print(
        f"per round, on vs off: {', '.join(f'{100 * p:+.1f}%' for p in pairs)}; the live view's own calls: "
        f"{', '.join(f'{100 * s:.1f}%' for s in live_share)} of the on run's client CPU"
    )
    print(
        f"median CPU-us per token: off {off:.2f}, on {on:.2f}: {100 * (on / off - 1):+.1f}% "
        f"(load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} cores)"
    )


if __name__ == "__main__":
    main()
