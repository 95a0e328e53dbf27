"""What watching a run costs the client (issue 42: under 5% of its CPU per token): real runs
(harness.runs.run.run_scenario, one client process) against the ground-truth server, a closed loop of 256 streams,
with no live view (off), the dashboard alone (redrawn once a second into a terminal-like buffer), the Prometheus
endpoint alone (scraped once a second by another process) and both, interleaved, side by side. The client's CPU is
the process's (summary.json's client_cpu_s: every thread, the endpoint's server and the redraws included) per output
token. Two figures for each view, as shares of its runs' client CPU:
- the live view's own CPU, counted where it is spent: LiveRun.observe and LiveRun.refresh on the client's thread, and
  the endpoint's thread (its event loop serves every scrape), timed by time.thread_time and that thread's CPU clock
  (direct; what it leaves out is the indirect cost: caches, the GIL);
- on vs off side by side, interleaved rounds, with a 95% interval on the mean of the rounds' log ratios (a t
  interval), which bounds the indirect cost when it is narrow.
On a machine with 2 cores or more the client (this process) runs on core 0 and the server and the scraper on core 1
(`--no-pin` to leave them to the scheduler), so the server's bursts do not take the client's core turn by turn.

Why one run's CPU per token used to move by +-24% from round to round, and what keeps it within a few percent now:
- The client's CPU per token depends on how many tokens each socket read brings, and that depended on the server's
  pace. At 10 ms a token per stream (25,600 token events a second at 256 streams) the single-threaded server on its
  one core fell behind (its mean lateness 35-340 ms, run to run, at load average 2), so several events of a stream
  piled up in the socket and came in one read: 0.37-0.81 reads per token from one run to the next, and 17-22 CPU-us
  per token with them. At 20 ms a token (12,800 token events a second, 50 tokens/s a stream: a fast engine's pace)
  the server keeps its schedule (lateness p99 ~5 ms) and every token comes in a read of its own (0.99-1.00 reads
  per token), so every run does the same work per token. Each run prints its reads per token; under 0.98 it is
  flagged, as the server (or the client) fell behind and that run's CPU per token is not comparable. The slower
  pace is the harder test for the live view: its per-second work (a frame, a scrape) is spread over half as many
  tokens. What is left is the machine: beside other work (load average 4 on 2 cores) one mode's CPU per token
  still moves by 3-10% (sd) between rounds, so the figures that count are taken alone.
- The server runs at a real-time priority (chrt -f 10, where this process may set one; `--no-rt` not) so that other
  work on its core does not push it off its schedule.
- A warm-up round (every mode once, `--warmup-rounds`) is run and left out: a process's first runs cost up to 13%
  more per token (caches, first calls). Each run starts after a full garbage collection, so no run pays for the
  garbage of the one before it.
- Each round runs every mode back to back (each mode leading a round in turn) and each live view is compared with the
  off run of its own round (a paired ratio), so a slow drift of the machine (other work, its clock) cancels.

A round of the four modes takes ~50 s at the defaults (1,024 requests of 128 tokens a run, a 10.4 s span): the
warm-up round and 10 measured ones ~9.5 minutes.

    flock /tmp/bench.lock python benchmarks/live_overhead.py --rounds 10

`--together`: what is left above is one run's own spread, ~9% (sd) on a quiet 2-core VM, and a run beside the off run
of its round differs from it as two independent runs do (the rounds' ratios scatter by sqrt 2 x that), so 10 rounds
bound a difference only to about +-9%. With --together each live view's run and an off run go at the same time, two
client processes on core 0 (each started by a line from the parent once both have imported everything), each against
a server of its own on core 1, so whatever the machine does during the pair (another guest on the host, its clock,
the servers falling behind) it does to both, and their ratio keeps only what the live view costs. The servers pace
40 ms a token (12,800 token events a second between the two, as one server at 20 ms): at 20 ms each, two servers on
one core fall behind and tokens come batched. 40 ms is also the harder test: the views' per-second work over half
the tokens again. A pair takes ~24 s; with `--modes off,both` the warm-up and 15 measured rounds ~6.5 minutes.

    flock /tmp/bench.lock python benchmarks/live_overhead.py --together --modes off,both --rounds 15
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import io
import json
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
from rich.console import Console
from scipy import stats

from harness.results.folder import read_records
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


def thread_cpu_s(thread) -> float:
    """CPU one running thread of this process has used, from its CPU clock (to the nanosecond; /proc counts ticks)."""
    return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))


def t_interval(ratios: list[float]) -> tuple[float, float, float]:
    """Mean of the rounds' on/off ratios and its 95% interval, taken on their logs."""
    logs = [math.log(r) for r in ratios]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), math.nan, math.nan
    half = stats.t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


MODES = ("off", "dashboard", "endpoint", "both")
# A run whose tokens came fewer than this many reads per token was paced by someone falling behind (see the docstring)
MIN_READS_PER_TOKEN = 0.98


def reads_per_token(out: Path) -> float:
    """Socket reads per output token over a run's records: the tokens one read brought share its loop time."""
    reads = tokens = 0
    for rec in read_records(out):
        if rec.ok and not rec.is_warmup:
            reads += len(set(rec.token_loop_times_s or rec.token_times_s))
            tokens += len(rec.token_times_s)
    return reads / tokens if tokens else math.nan


def can_use_rt_priority() -> bool:
    try:
        return subprocess.run(["chrt", "-f", "10", "true"], capture_output=True).returncode == 0
    except OSError:
        return False


def one_run(scenario_path: Path, out: Path, mode: str, scrape_every_s: float, pin: bool) -> tuple[float, int]:
    """(client CPU-s, output tokens) of one run. mode: off (no live view at all), dashboard (drawn, no endpoint),
    endpoint (an endpoint of its own, scraped every `scrape_every_s` by another process; nothing drawn), both."""
    gc.collect()  # the run before this one's garbage is collected here, not during this run
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
    server_before_s = thread_cpu_s(endpoint.thread)  # the scrapes' thread: its whole CPU is the endpoint's
    try:
        return run_tallies(scenario_path, out, reporter)
    finally:
        LIVE_CPU_S[0] += thread_cpu_s(endpoint.thread) - server_before_s
        scraper.kill()
        endpoint.close()


def measure(scenario_path: Path, out: Path, mode: str, scrape_every_s: float, pin: bool) -> dict:
    """One run's figures: client CPU-s, output tokens, the live view's own CPU-s and reads per token."""
    LIVE_CPU_S[0] = 0.0
    cpu_s, tokens = one_run(scenario_path, out, mode, scrape_every_s, pin)
    return {"mode": mode, "cpu_s": cpu_s, "tokens": tokens, "live_cpu_s": LIVE_CPU_S[0], "reads": reads_per_token(out)}


def child(args: argparse.Namespace) -> None:
    """`--child MODE`: one run in this process, started when the parent writes a line (so that the two clients of a
    pair start together), its figures as one JSON line on stdout."""
    if args.pin:
        os.sched_setaffinity(0, {0})
    print("ready", flush=True)
    sys.stdin.readline()
    figures = measure(args.scenario, args.out, args.child, args.scrape_every_s, args.pin)
    print(json.dumps(figures), flush=True)


def together(args: argparse.Namespace, scenarios: list[Path], work: Path, tag: str, mode: str) -> tuple[dict, dict]:
    """The off run and `mode`'s run at the same time, each a client process of its own against a server of its own:
    whatever the machine does during the pair (another VM on the host, its clock) it does to both."""
    children = []
    for i, child_mode in enumerate(("off", mode)):
        command = [sys.executable, __file__, "--child", child_mode, "--scenario", str(scenarios[i])]
        command += ["--out", str(work / f"{tag}-{i}-{child_mode}"), "--scrape-every-s", str(args.scrape_every_s)]
        command += [] if args.pin else ["--no-pin"]
        children.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    for c in children:
        assert c.stdout.readline().strip() == "ready"
    for c in children:
        c.stdin.write("go\n")
        c.stdin.flush()
    off, on = (json.loads(c.communicate()[0].strip().splitlines()[-1]) for c in children)
    return off, on


def run_tallies(scenario_path: Path, out: Path, reporter: Reporter) -> tuple[float, int]:
    summary = run_scenario(load_scenario(scenario_path), out, reporter=reporter).summary
    return summary.client_cpu_s, summary.output_tokens


def taskset(pin: bool, core: int) -> tuple[str, ...]:
    return ("taskset", "-c", str(core)) if pin else ()


def scenario_text(url: str, args: argparse.Namespace) -> str:
    return (
        f"name: live_overhead\nbackend: {{kind: openai, url: '{url}', model: gt}}\n"
        f"workload: {{kind: random, input_tokens: 8, output_tokens: {args.tokens}}}\n"
        f"load: {{arrival: closed, concurrency: {args.concurrency}, num_requests: {args.requests}, workers: 1}}\n"
    )


def run_line(label: str, figures: dict) -> str:
    cpu_s, tokens, reads = figures["cpu_s"], figures["tokens"], figures["reads"]
    flag = "  BATCHED: someone fell behind the pace" if reads < MIN_READS_PER_TOKEN else ""
    return (
        f"{label} {figures['mode']:9s}: {cpu_s:.2f} CPU-s, {tokens:,} tokens, "
        f"{1e6 * cpu_s / tokens:.2f} CPU-us per token, {reads:.3f} reads per token{flag}"
    )


def per_token_us(figures: dict) -> float:
    return 1e6 * figures["cpu_s"] / figures["tokens"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, default=256)
    p.add_argument("--requests", type=int, default=1024)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument(
        "--itl-ms", type=float, help="the server's pace: ms between a stream's tokens (default 20; 40 with --together)"
    )
    p.add_argument("--rounds", type=int, default=10, help="measured rounds, each mode once a round")
    p.add_argument("--warmup-rounds", type=int, default=1, help="rounds run first and left out")
    p.add_argument("--scrape-every-s", type=float, default=1.0)
    p.add_argument("--modes", default=",".join(MODES), help="off and the live views to compare with it")
    p.add_argument(
        "--together",
        action="store_true",
        help="each live view's run at the same time as an off run: two client processes on core 0, two servers",
    )
    p.add_argument("--no-pin", dest="pin", action="store_false", help="leave the processes to the scheduler")
    p.add_argument("--no-rt", dest="rt", action="store_false", help="the server at normal priority")
    p.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)  # one run of a --together pair
    p.add_argument("--scenario", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    args.pin = args.pin and len(os.sched_getaffinity(0)) >= 2
    args.rt = args.rt and can_use_rt_priority()
    args.itl_ms = args.itl_ms or (40.0 if args.together else 20.0)
    if args.pin:
        os.sched_setaffinity(0, {0})  # the client, and every thread and process it starts
    modes = args.modes.split(",")
    if set(modes) - set(MODES) or "off" not in modes:
        p.error(f"--modes: {args.modes!r}: use off and any of {', '.join(MODES[1:])}, comma-separated")
    work = Path(tempfile.mkdtemp(prefix="live_overhead_"))
    # per live view: the off run's and its own CPU-us per token, paired by round; its own share of its runs' CPU
    pairs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in modes[1:]}
    off_us: list[float] = []
    live_share: dict[str, list[float]] = {mode: [] for mode in modes[1:]}
    batched: list[str] = []  # runs whose tokens came batched, "round mode"
    load_before = os.getloadavg()[0]
    server_prefix = ("chrt", "-f", "10") * args.rt + taskset(args.pin, 1)
    config = GroundTruthConfig(ttft_ms=20, itl_ms=args.itl_ms)
    with contextlib.ExitStack() as servers:
        urls = [
            servers.enter_context(GroundTruthProcess(config, prefix=server_prefix)).url
            for _ in range(1 + args.together)
        ]
        scenarios = []
        for i, url in enumerate(urls):
            scenarios.append(work / f"live{i}.yaml")
            scenarios[-1].write_text(scenario_text(url, args))
        for r in range(-args.warmup_rounds, args.rounds):
            label = "warm-up" if r < 0 else "round"
            if args.together:
                for mode in modes[1:]:
                    off, on = together(args, scenarios, work, f"{r}-{mode}", mode)
                    print(run_line(f"{label} {r} pair", off) + "\n" + run_line(f"{label} {r} pair", on), flush=True)
                    if r >= 0:
                        pairs[mode].append((per_token_us(off), per_token_us(on)))
                        off_us.append(per_token_us(off))
                        live_share[mode].append(on["live_cpu_s"] / on["cpu_s"])
                        batched += [f"{r} {f['mode']}" for f in (off, on) if f["reads"] < MIN_READS_PER_TOKEN]
                continue
            this_round = {}
            for mode in modes[r % len(modes) :] + modes[: r % len(modes)]:  # each mode leads a round in turn
                figures = measure(scenarios[0], work / f"{mode}{r}", mode, args.scrape_every_s, args.pin)
                print(run_line(f"{label} {r}", figures), flush=True)
                this_round[mode] = figures
            if r >= 0:
                off_us.append(per_token_us(this_round["off"]))
                for mode in modes[1:]:
                    pairs[mode].append((off_us[-1], per_token_us(this_round[mode])))
                    live_share[mode].append(this_round[mode]["live_cpu_s"] / this_round[mode]["cpu_s"])
                batched += [f"{r} {m}" for m, f in this_round.items() if f["reads"] < MIN_READS_PER_TOKEN]
    report(pairs, off_us, live_share)
    print(
        "median CPU-us per token: "
        + ", ".join(
            [f"off {statistics.median(off_us):.2f}"]
            + [f"{mode} {statistics.median(on for _, on in pairs[mode]):.2f}" for mode in modes[1:]]
        )
        + f"; load average {load_before:.2f} before, {os.getloadavg()[0]:.2f} after; {os.cpu_count()} cores; "
        + ("client on core 0, server and scraper on core 1" if args.pin else "not pinned")
        + ("; server at real-time priority" if args.rt else "")
        + (f"; each live view run beside an off run, {args.itl_ms:g} ms a token" if args.together else "")
        + (f"; BATCHED runs (not comparable): {', '.join(batched)}" if batched else "")
    )


def spread(values: list[float]) -> float:
    return statistics.stdev(values) / statistics.fmean(values) if len(values) > 1 else math.nan


def report(
    pairs: dict[str, list[tuple[float, float]]], off_us: list[float], live_share: dict[str, list[float]]
) -> None:
    print(f"off: CPU-us per token {min(off_us):.2f}-{max(off_us):.2f}, {100 * spread(off_us):.1f}% sd between runs")
    for mode, paired in pairs.items():
        values = [on for _, on in paired]
        print(
            f"{mode}: CPU-us per token {min(values):.2f}-{max(values):.2f}, {100 * spread(values):.1f}% sd between runs"
        )
    for mode, paired in pairs.items():
        ratios = [on / off for off, on in paired]
        mean, low, high = t_interval(ratios)
        share = live_share[mode]
        print(
            f"{mode} vs off, per round: {', '.join(f'{100 * (r - 1):+.1f}%' for r in ratios)}\n"
            f"  side by side {100 * (mean - 1):+.1f}% (95% interval {100 * (low - 1):+.1f}% to "
            f"{100 * (high - 1):+.1f}%); its own CPU (observe, refresh, the scrapes' thread) median "
            f"{100 * statistics.median(share):.1f}% of the run's client CPU "
            f"(range {100 * min(share):.1f}-{100 * max(share):.1f}%)"
        )


if __name__ == "__main__":
    main()
