"""How often does `bench gate` cry wolf, and does it catch a real 20% slowdown? With repeated runs per side.

One built-in engine (SmolLM2-135M, launched with the nightly scenario's own launch options) serves
every run. Each side of a gate is N runs of scenarios/nightly.yaml (fewer requests than the nightly
job, the same request shape, a fresh seed per run so no run finds its prompts in the prefix cache),
written as run-1/ .. run-N/, exactly what `bench gate` reads in CI. Ten A/A pairs are gated: any
regression verdict (exit 1) is a false alarm. For the first pairs a third side runs against the same
engine made 20% slower (`Throttle`: stopped 1/6 of every 60 ms) and is gated against the pair's A
side: each such gate should fail (exit 1). The sides of a pair take turns run by run (a1 b1 a2 b2
..., order flipped every other round), so slow drift of the shared machine is not read as a change.

Four runs a side, not the nightly job's five: 88 runs of 20 requests (~25 s each on 2 cores) keep it
near half an hour. Fewer runs and fewer requests per run make the gate's intervals wider, not less
valid, so the nightly job's power to catch a slowdown is at least what is measured here. Its false
alarms can be more frequent than here: its baseline is from another day, and drift of the runner
between days is not in the interval (hence: refresh the baseline when the runner changes).

Run (CPU heavy, ~35 minutes on 2 cores): python benchmarks/gate_aa.py [--pairs 10] [--runs 4] [--out /tmp/gate_aa]
Prints one JSON report (also written to OUT/gate_aa.json after every pair);
python benchmarks/gate_aa.py --report OUT gates the runs already in OUT again; the same command as
before with the same OUT resumes a cut-short study (complete pairs are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

SCENARIO = "scenarios/nightly.yaml"
RULES = "ci/gate.yaml"
# fewer requests than the nightly job (48) to keep ~90 runs near half an hour; 20 keeps every run at the
# rules' min_samples, so TTFT/TPOT medians are judged as in CI
SMALL = ["load.num_requests=20", "load.warmup_requests=2"]
RUNS_PER_SIDE = 4


def bench_run(url: str, out: Path, seed: int) -> None:
    sets = [f"backend.url={url}", "backend.kind=openai", "backend.launch=null", f"seed={seed}"] + SMALL
    # --overwrite: a resumed, cut-short call reruns into the folders of its unfinished pair
    cmd = [
        sys.executable,
        "-m",
        "harness",
        "run",
        SCENARIO,
        "--output",
        str(out),
        "--allow-client-bound",
        "--overwrite",
    ]
    for s in sets:
        cmd += ["--set", s]
    print(f"bench run -> {out}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench run failed ({proc.returncode}): {proc.stderr[-1500:]}")


def runs_in(side: Path) -> int:
    return len(list(side.glob("run-*/summary.json")))  # summary.json: written when a run has finished


def gate(base: Path, cur: Path) -> dict:
    from reports.gate import compare, exit_code, load_rules
    from reports.repeats import check_same_scenario, load_run_set

    # keep_invalid: every 20-request run is invalid by the validity verdict (its p90s need 36 samples), and
    # the study measures the gate on exactly such runs; skipping them would leave nothing to gate
    b, c = load_run_set(base, keep_invalid=True), load_run_set(cur, keep_invalid=True)
    check_same_scenario(b, c)
    verdicts = compare(b, c, load_rules(Path(RULES)))
    return {
        "exit_code": exit_code(verdicts),
        "metrics": [
            {"metric": v.name, "verdict": v.verdict, "change": v.change, "ci": [v.ci_low, v.ci_high]} for v in verdicts
        ],
    }


def run_to_run_spread(sides: list[Path]) -> dict:
    """Per metric, over every A/A run: the per-run values' coefficient of variation (std / mean), and its
    median within one side (the spread the gate sees)."""
    from reports.gate import load_rules, samples
    from reports.repeats import load_run_set
    from reports.stats import statistic_fn

    rules = load_rules(Path(RULES))
    out = {}
    for name, rule in rules.metrics.items():
        per_side = []
        for side in sides:
            runs = load_run_set(side, keep_invalid=True).runs  # as gate() judges them
            vals = [samples(r, rule, rules, runs[0].slo) for r in runs]
            per_side.append([float(statistic_fn(rule.statistic)(v[None, :])[0]) for v in vals if v.size])
        flat = np.concatenate([np.asarray(v) for v in per_side]) if per_side else np.zeros(0)
        within = [np.std(v, ddof=1) / np.mean(v) for v in per_side if len(v) > 1 and np.mean(v) > 0]
        if flat.size > 1 and flat.mean() > 0:
            out[name] = {
                "mean": round(float(flat.mean()), 3),
                "cv_all_runs": round(float(flat.std(ddof=1) / flat.mean()), 3),
                "cv_within_side_median": round(float(np.median(within)), 3) if within else None,
            }
    return out


class Throttle:
    """Makes the running engine `factor` times slower while active: SIGSTOP / SIGCONT in a fixed duty cycle
    (stopped 1 - 1/factor of every `period_s`), so every step, prefill and decode, takes `factor` times the
    wall time, as from an engine that needs that much more work per token.

    Why not a proxy that delays each stream by 20% (this script's first design): the nightly scenario is a
    closed loop on a saturated engine, where latency = concurrency / throughput (Little's law). Delaying
    delivery only lowers the engine's batch while it keeps its throughput, so the client saw the same TPOT
    and tokens/s (measured: TPOT -5% to +8%, tok/s within 6%, through a 1.2x proxy). A slower engine
    lowers the throughput, and so raises every latency."""

    def __init__(self, pid: int, factor: float, period_s: float = 0.06):
        self.pid, self.run_s, self.stop_s = pid, period_s / factor, period_s * (1 - 1 / factor)
        self.active = threading.Event()
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._cycle, daemon=True)
        self.thread.start()

    def _cycle(self) -> None:
        while not self.done.is_set():
            if not self.active.wait(timeout=0.1):
                continue
            os.kill(self.pid, signal.SIGSTOP)
            try:
                time.sleep(self.stop_s)
            finally:
                os.kill(self.pid, signal.SIGCONT)
            time.sleep(self.run_s)

    def close(self) -> None:
        self.done.set()
        self.thread.join(timeout=5)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--runs", type=int, default=RUNS_PER_SIDE, help="runs per side of each gate")
    p.add_argument("--slow-sides", type=int, default=2, help="slowed sides (of --runs runs) to gate")
    p.add_argument("--factor", type=float, default=1.2)
    p.add_argument("--out", type=Path, default=Path("/tmp/gate_aa"))
    p.add_argument("--max-minutes", type=float, default=50.0, help="start no new A/A pair after this")
    p.add_argument("--report", type=Path, metavar="OUT", help="only gate the runs already in OUT and print the report")
    args = p.parse_args()
    if args.report:
        return print(json.dumps(write_report(args.report, args.factor), indent=1))

    from itertools import count

    from harness.engine.launcher import launch
    from harness.scenario.scenario import load_scenario

    args.out.mkdir(parents=True, exist_ok=True)
    scenario = load_scenario(SCENARIO)
    engine = launch("native", scenario.backend.launch, None, scenario.backend.model, args.out / "engine.log")
    deadline = time.perf_counter() + args.max_minutes * 60
    started = time.perf_counter()
    seeds = count(1)  # a new seed per run: same distribution, new prompts (the engine's prefix cache stays cold)
    pairs = 0
    throttle = Throttle(engine.pid, args.factor)
    try:
        bench_run(engine.url, args.out / "warmup", seed=0)  # a cold engine's first requests are slow: not measured
        for i in range(args.pairs):
            if time.perf_counter() > deadline:
                print(f"--max-minutes {args.max_minutes} reached after {pairs} pairs", file=sys.stderr)
                break
            a, b = args.out / f"aa-{i:02d}-a", args.out / f"aa-{i:02d}-b"
            # the first pairs also get a slowed side, gated against their A side: a cut-short run answers both
            s = args.out / f"slow-{i:02d}" if i < args.slow_sides else None
            if all(runs_in(side) == args.runs for side in (a, b, s) if side):  # done by an earlier, cut-short call
                pairs += 1
                continue
            for k in range(args.runs):
                # the sides take turns, run by run: a neighbour's job starting or stopping on this shared box
                # then falls on both sides alike instead of passing for a difference between them
                turn = [a, b] + ([s] if s else [])
                for side in turn if k % 2 == 0 else turn[::-1]:
                    if side == s:
                        throttle.active.set()
                    try:
                        bench_run(engine.url, side / f"run-{k + 1}", seed=next(seeds))
                    finally:
                        throttle.active.clear()
            pairs += 1
            report(args)
    finally:
        throttle.close()
        engine.stop()
    report(args)
    print(f"{pairs} pairs in {time.perf_counter() - started:.0f} s", file=sys.stderr)


def report(args) -> None:
    """Gates what is in OUT so far in a fresh process: the code it reads is the code on disk now (a
    half-hour run must not mix a harness it imported at the start with runs a newer one wrote)."""
    subprocess.run([sys.executable, __file__, "--report", str(args.out), "--factor", str(args.factor)], check=True)


def write_report(out: Path, factor: float) -> dict:
    """Gates every complete pair in OUT (aa-NN-a/ against aa-NN-b/; slow-NN/ against aa-NN-a/), writes
    OUT/gate_aa.json."""
    pairs = [(a, a.with_name(a.name[:-1] + "b")) for a in sorted(out.glob("aa-*-a"))]
    pairs = [(a, b) for a, b in pairs if runs_in(a) >= 2 and runs_in(a) == runs_in(b)]
    slow = [(out / f"aa-{s.name.split('-')[1]}-a", s) for s in sorted(out.glob("slow-*"))]
    slow = [(a, s) for a, s in slow if runs_in(s) >= 2 and runs_in(a) == runs_in(s)]
    aa = [gate(a, b) for a, b in pairs]
    false_alarms = [i for i, g in enumerate(aa) if g["exit_code"] == 1]
    injected = [gate(a, s) for a, s in slow]  # each slowed side against the A side it took turns with
    per_metric: dict = {}
    for g in aa:
        for v in g["metrics"]:
            per_metric.setdefault(v["metric"], {}).setdefault(v["verdict"], 0)
            per_metric[v["metric"]][v["verdict"]] += 1
    report = {
        "runs_per_side": sorted({runs_in(a) for a, _ in pairs}),
        "requests_per_run": SMALL,
        "pairs": len(pairs),
        "false_alarm_pairs": len(false_alarms),
        "false_alarm_rate": len(false_alarms) / len(pairs) if pairs else None,
        "aa_verdicts_per_metric": per_metric,
        "aa_regressions": {i: aa[i] for i in false_alarms},
        "run_to_run": run_to_run_spread([side for pair in pairs for side in pair]),
        "slowdown_factor": factor,
        "slow_sides": len(slow),
        "slowdown_exit_codes": [g["exit_code"] for g in injected],
        "slowdown_caught": sum(g["exit_code"] == 1 for g in injected),
        "slowdown_verdicts": injected,
        "out": str(out),
    }
    (out / "gate_aa.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
