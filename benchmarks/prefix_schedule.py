"""fcfs vs lpm scheduling on a prefix-thrashing workload, side by side in one run.

Runs `bench run scenarios/prefix_thrashing.yaml` (more prefix groups than the KV cache holds)
with the engine started as `--schedule-policy fcfs` and as `--schedule-policy lpm`, the same
requests and arrival times (same seed), alternating fcfs, lpm, fcfs, lpm... for --repeats pairs.
One server at a time, so neither run shares the cores with the other's engine. Reports, per policy:
  recomputed prefill tokens   native:recomputed_prefill_tokens_total (prefixes computed before,
                              evicted and computed again), with prefix-cache hits / queries
  TTFT p50 / p99              from summary.json
  max wait beyond FCFS        per request, TTFT under lpm - TTFT under fcfs (same request index,
                              same pair), the largest over all requests, next to the aging bound;
                              and within each run, the longest a request still waited for its
                              first token after one sent later than it had got its own
and `bench report` overlays the runs (OUT/report.html). Load (`uptime`) is recorded per run.

  python benchmarks/prefix_schedule.py [--repeats 1] [--num-requests 40] [--rate 1.0] [--aging-s S] [--out DIR]

Measured 2026-11-30 on the 2-core VM with other agents' builds and tests running (load average
15 on 2 cores, so every step is several times slower than on an idle machine), radix cache,
40 requests, one pair:
  rate 1.0, aging 30 s:  recomputed prefill tokens fcfs 2480, lpm 992 (0.40x); TTFT p50 14.9 s
                         vs 7.2 s (0.48x), p99 42.1 s vs 24.0 s; max wait beyond FCFS 4.3 s (bound 30 s)
  rate 1.5, aging 10 s:  overloaded: nearly every waiting request is past the bound, so lpm falls
                         back to arrival order: over 3 pairs recomputed 0.75x, 0.97x, 0.97x and
                         TTFT p50 0.38x, 1.03x, 0.71x; max wait beyond FCFS 6.9 s (bound 10 s)
The aging bound is the knob: the more waiting requests it lets lpm reorder, the more reuse.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import yaml

from harness.results.folder import read_model, read_records
from harness.results.schema import Summary

ROOT = Path(__file__).resolve().parents[1]
SCENARIO = ROOT / "scenarios" / "prefix_thrashing.yaml"


def launch_args(policy: str, aging_s: float | None = None) -> list[str]:
    """The scenario's engine flags with the policy (and aging bound) replaced."""
    args = [str(a) for a in yaml.safe_load(SCENARIO.read_text())["backend"]["launch"]["args"]]
    args[args.index("--schedule-policy") + 1] = policy
    if aging_s is not None:
        args[args.index("--schedule-aging-s") + 1] = f"{aging_s:g}"
    return args


def aging_bound_s(aging_s: float | None) -> float:
    args = launch_args("lpm", aging_s)
    return float(args[args.index("--schedule-aging-s") + 1])


def load_average() -> float:
    return os.getloadavg()[0]


def bench_run(policy: str, out: Path, num_requests: int, rate: float, aging_s: float | None) -> dict:
    cmd = [
        sys.executable,
        "-m",
        "harness",
        "run",
        str(SCENARIO),
        "--output",
        str(out),
        "--allow-client-bound",
        "--set",
        f"load.num_requests={num_requests}",
        "--set",
        f"load.rate={rate}",
        "--set",
        "backend.launch.args=[" + ", ".join(launch_args(policy, aging_s)) + "]",
    ]
    load_before = load_average()
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return {"policy": policy, "dir": str(out), "load_before": load_before, "load_after": load_average()}


def engine_counters(run_dir: Path) -> dict:
    """The last scraped value of each native: counter the comparison needs."""
    wanted = {
        "native:recomputed_prefill_tokens_total": "recomputed_prefill_tokens",
        "native:prefix_cache_hits_total": "prefix_cache_hits_tokens",
        "native:prefix_cache_queries_total": "prefix_cache_queries_tokens",
        "native:num_preemptions_total": "preemptions",
    }
    last = {}
    with open(run_dir / "server_metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            if row["name"] in wanted:
                last[wanted[row["name"]]] = int(float(row["value"]))
    return last


def ttft_by_index(run_dir: Path) -> dict[int, float]:
    return {
        r.index: r.token_times_s[0] - r.intended_send_s
        for r in read_records(run_dir)
        if r.ok and not r.is_warmup and r.token_times_s
    }


def max_wait_after_overtaken_s(run_dir: Path) -> float:
    """Within one run: the longest a request still waited for its first token after a request sent
    later than it had got one (0 when nobody overtook it)."""
    rows = sorted((r.intended_send_s, r.token_times_s[0]) for r in read_records(run_dir) if r.ok and r.token_times_s)
    worst, earliest_later = 0.0, float("inf")
    for _sent_s, first_s in reversed(rows):  # latest sent first
        worst = max(worst, first_s - earliest_later)
        earliest_later = min(earliest_later, first_s)
    return worst


def describe(run: dict) -> dict:
    run_dir = Path(run["dir"])
    summary: Summary = read_model(run_dir / "summary.json")
    return {
        **run,
        **engine_counters(run_dir),
        "completed": summary.requests.completed,
        "ttft_p50_ms": round(summary.ttft_ms.p50),
        "ttft_p99_ms": round(summary.ttft_ms.p99),
        "max_wait_after_overtaken_s": round(max_wait_after_overtaken_s(run_dir), 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=1, help="fcfs/lpm pairs, alternated")
    parser.add_argument("--num-requests", type=int, default=40)
    parser.add_argument("--rate", type=float, default=1.0, help="Poisson arrivals, requests/s")
    parser.add_argument("--aging-s", type=float, default=None, help="lpm aging bound (default: the scenario's)")
    parser.add_argument("--out", type=Path, default=Path("results/prefix_schedule"))
    a = parser.parse_args()

    runs = []
    for rep in range(a.repeats):
        for policy in ("fcfs", "lpm"):
            runs.append(describe(bench_run(policy, a.out / f"{policy}-{rep}", a.num_requests, a.rate, a.aging_s)))
            print(json.dumps(runs[-1]), file=sys.stderr)
    extra_waits = []
    for rep in range(a.repeats):
        fcfs, lpm = (ttft_by_index(a.out / f"{p}-{rep}") for p in ("fcfs", "lpm"))
        extra_waits += [lpm[i] - fcfs[i] for i in fcfs.keys() & lpm.keys()]
    report = {
        "scenario": str(SCENARIO.relative_to(ROOT)),
        "num_requests": a.num_requests,
        "rate": a.rate,
        "aging_bound_s": aging_bound_s(a.aging_s),
        "runs": runs,
        "max_wait_beyond_fcfs_s": round(max(extra_waits), 2),
        "requests_later_than_fcfs_by_more_than_bound": sum(w > aging_bound_s(a.aging_s) for w in extra_waits),
        "cpu_count": os.cpu_count(),
    }
    for key in ("recomputed_prefill_tokens", "ttft_p50_ms", "ttft_p99_ms"):
        by = {p: sum(r[key] for r in runs if r["policy"] == p) / a.repeats for p in ("fcfs", "lpm")}
        report[f"{key}_lpm_over_fcfs"] = round(by["lpm"] / by["fcfs"], 3) if by["fcfs"] else None
    subprocess.run(
        [
            sys.executable,
            "-m",
            "harness",
            "report",
            *(r["dir"] for r in runs),
            "--output",
            str(a.out / "report.html"),
            *[x for r in runs for x in ("--label", Path(r["dir"]).name)],
        ],
        cwd=ROOT,
        check=False,
        stdout=subprocess.DEVNULL,
    )
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
