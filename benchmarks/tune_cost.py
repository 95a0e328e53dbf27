"""`bench tune` against a dense sweep of the same configurations, on the native engine, side by side.

For each configuration of a 2 x 2 grid (--max-num-seqs x chunked prefill on/off) in turn: a dense sweep
(a geometric grid of rates, every point run whole; its capacity is harness.metrics.slo_capacity's, between its last
passing
and first failing point) and `bench tune` of that one configuration (probe, bracketing search, early stops).
Both judge a load by its runs (harness/metrics/knee.py): each run on its own requests, the bracket's two ends run again
until their runs' majority is settled (a second run, a third when they disagree), the majority's verdict.
Reports per configuration both capacities, the dense sweep's bracket, whether the tuned capacity is within 10%
of the dense one or inside its bracket, and the requests each used; then the ratio of all requests.
Run it alone on the machine (nothing CPU-heavy beside it); the load (`uptime`) is printed beside the figures.

  python benchmarks/tune_cost.py [--engine native|groundtruth] [--out DIR] [--num-requests N]
      [--ttft-ms MS] [--input-tokens N] [--output-tokens N] [--grid 1.5,1.8,...] [--repeats N] [--same-engine]

--same-engine runs both sides against one launch of each configuration, interleaved in time: after each of the
tune's trials (Tuner's after_trial hook) the dense sweep runs its DENSE_PER_TRIAL unrun grid points nearest the
load that trial ran, then whatever it has left. Without it each side launches its own engine, one after the
other, and the native engine's launches differ (one saturated at 4.1-4.5 req/s, the next with the same flags at
5.0-5.4). Fair: each side keeps its own points and rule (the dense sweep runs every grid point whole and
confirms its own ends; the tune sees nothing of the dense results); only the order in time is shared, so the
runs both make near one load fall within the same minute and a drift of the engine over minutes moves both.

The defaults (DEFAULTS below) are the ones each engine was measured with. --engine groundtruth runs the same
comparison on tests/groundtruth_server.py (a real HTTP server whose capacity is set by --max-streams and
--itl-ms): minutes instead of a quarter of an hour.

Measured 2026-12-01 on the shared 2-core VM:
  --engine groundtruth (40 requests a point, dense grid 4 x 1.2^i, 16 points), load 1.3-3.0, before the
  over-saturation rule required the TTFT line to cross the SLO: requests 668 of 2624 (25%); capacity
  agrees for 2 of 4 (19.5 dense [17.2, 20.6] vs 17.4 tuned; 8.79 vs 8.84); the other two were cut by a
  false over-saturation stop (a 51 ms/s TTFT drift over a 1 s run): 53.6 vs 35.3 and 22.3 vs 20.0.
  After it (and the probe's rate between first and last completion), load 3.1 -> 0.5: requests 706 of 2624
  (27%); every capacity agrees: dense [bracket] vs tuned 18.6 [17.2, 20.6] / 19.6; 8.96 [8.29, 9.95] / 9.09;
  53.6 [51.4, 61.6] / 53.2; 22.3 [20.6, 24.8] / 23.5 req/s; 17 early stops in all.

Measured 2026-12-02 alone on the VM (the engine's own two threads: load 1.3-1.9), --engine native with the
defaults (16-token prompts, 8-token answers, constant arrivals, 20 requests + 1 warm-up a point, TTFT SLO
1000 ms, dense grid 1.5 x 1.2^i for 13 points, --no-prefix-caching), 12.8 minutes in all: requests 345 of
1092 (32%), 14 early stops; capacity agrees for 1 of 4 (req/s, dense [bracket] vs tuned [bracket]):
  max-num-seqs 2, chunked prefill on:   1.65 [1.5, 1.8]    vs 2.43 [2.43, 2.65]  no: the dense point at 1.8
      stalled (one request's 8 tokens took 2.5 s; 7 requests then queued 0.7-1.5 s), so its passes at 2.16
      and 2.59 are not trusted; without that point the dense capacity is 2.70 [2.59, 3.11] (tuned 9.9% below)
  max-num-seqs 2, chunked prefill off:  3.21 [3.11, 3.73]  vs 2.73 [2.73, 3.0]   no: 15% apart; the tune
      failed 3.0 (17 of 20 met) where the dense sweep passed 3.11 (20 of 20)
  max-num-seqs 8, chunked prefill on:   13.4 [13.4, -]     vs 11.2 [11.2, 12.3]  no: the dense sweep passed
      its top point (capacity above the grid), the tune failed 13.4 (stopped at 3 misses)
  max-num-seqs 8, chunked prefill off:  12.0 [11.1, 13.4]  vs 11.2 [11.2, 12.3]  yes (7% apart)
  So near the knee a point's verdict moved by +-10% of load between two runs of the same configuration, and
  the tuned capacity of an early-stopped bracket sits at its lower end. max-num-seqs matters (~2.7 against
  ~12 req/s); chunked prefill does not at 16-token prompts. An earlier try with Poisson arrivals (TTFT SLO
  500 ms, dense grid 1 x 1.2^i) was stopped after one configuration: bursts missed 2 of 20 at every rate from
  1 to 1.44 req/s, so attainment lay flat on the 90% target (dense 1.44 [1.44, 1.73] vs tuned 1.98 [1.98, 2.1]).
  Not yet met; a next try would widen the grid to ~20 req/s for max-num-seqs 8 (the client was flagged as
  the bottleneck from ~10 req/s in the probe) and use more requests a point near the knee.

Since then both sides judge a load by the knee rule (harness/metrics/knee.py: an uncertain point is run again, up to
--repeats more times, and judged on its pooled requests), and the defaults are 30 requests a point and a grid
to 19.259 req/s. Measured 2026-12-02 06:04-06:19 alone (load 1.0-2.1), 14.8 minutes: requests 561 of 1953
(29%); 2 of 4 capacities agree; the misses come from the engine's run-to-run throughput (3.78-5.24 req/s at
one setting), which a request-level interval cannot see (docs/tune.md has the table). With --same-engine
(06:31-06:47, alone, load 0.8-2.2), 14.4 minutes: requests 725 of 1984 (37%); 3 of 4 agree; the miss is one
engine a minute apart (3.8-4.0 req/s completed at the dense sweep's saturated points, 4.2-4.9 at the tune's).

Since then a load is judged by its runs' majority (the bracket's ends confirmed, both sides) and --same-engine
interleaves the two sides. --engine groundtruth --same-engine (12:52-12:59, beside other helpers' test runs,
load 0.6-3.1): requests 1006 of 3198 (31%); 3 of 4 agree; the miss was 8.27 req/s, a coin toss on both sides
(dense pass, fail, pass; tune pass, fail, fail), after which bracketing stepped down by 1.5 and ran out of
max_points; a load whose runs split now steps by 1 + precision. A rerun (13:04-13:14) at load 4.0-8.0 (other
helpers' suites beside it) starved the server: 0 of 4, 24%, not a measurement (docs/tune.md).
--engine native --same-engine (13:22-13:49, alone under /tmp/excl, load 1.5-2.4), 27 minutes: requests 1129 of
2294 (49%); 2 of 4 agree: NOT MET. Dense [bracket] vs tuned [bracket], req/s: max-num-seqs 2 chunked on 2.21
[2.16, 2.59] vs 2.45 (inside), off 2.21 [2.16, 2.59] vs 2.46 (inside; a stalled run outvoted on each side);
max-num-seqs 8 chunked on 6.79 [6.45, 7.74] vs 5.69 [5.69, 7.11] (16% below), off 6.67 [6.45, 7.74] vs 5.69
[5.69, 6.4] (15% below). The launch carried far less than the morning's (2.2 and 6.7 against 4.5 and 17
req/s). The misses: the tune's over-saturation stop failed knee runs after 12 of 12 met (the dense sweep runs
whole and passed 6.45), and one search ran out of max_points after a confirmation moved its bracket. The
cost: confirming passing ends (27 + 1 requests each, 8 of 11 trials in one row).

Since then the over-saturation stop fails a run only once it has missed more than its allowed share of the
requests seen so far, the bracket's failing end is confirmed first, a load whose runs tie is run again at once,
and an end a confirmation turned gives the narrowing one more load (docs/tune.md). --engine groundtruth
--same-engine (17:08-17:16, alone under /tmp/excl, load 3.5 -> 0.2; before the tie rule): requests 1370 of 3116
(44%); 4 of 4 agree (18.3 [17.2, 20.6] vs 17.9; 8.29 [8.29, 9.95] vs 8.07; 52.8 [51.4, 61.6] vs 50.5; 21.3
[20.6, 24.8] vs 20.9 req/s); again with the tie rule (17:49-17:57, alone, load 4.1 -> 0.0): 1299 of 3116 (42%),
4 of 4 agree (the same dense figures; tuned 17.9, 8.07, 53.5, 20.9).
--engine native --same-engine (2026-12-02 17:24-17:38, alone under /tmp/excl, load
average 5.6 at the start from the jobs before it, 1.0-1.7 while it ran), 14.2 minutes: requests 631 of 2139
(29%); 3 of 4 agree: NOT MET. Dense [bracket] vs tuned [bracket], req/s: max-num-seqs 2 chunked on 7.83 [7.74,
9.29] (7.74: 28, 17, 28 of 30) vs 6.53 [6.53, 7.18] (7.18: pass, fail, fail): no, 17% below; chunked off 6.62
[6.45, 7.74] vs 6.87 [6.87, 7.49] (inside); max-num-seqs 8 both: at least 19.26 (the grid's top) on both sides,
68 requests each in the tune, so the 29% leans on them: the two max-num-seqs 2 rows alone used 495 of 1085
(46%). The miss: the tune's runs at 7.63 (24 of 27, 20 of 23) and 7.18 (20 of 23, 14 of 16) were stopped as
over-saturated with 2-3 misses, no more than a 30-request run may have, so each could still have passed whole
(the dense sweep's 7.74 passed twice with 28 of 30). This launch carried 7.8 req/s at max-num-seqs 2 where the
13:22 one carried 2.2.

Since then the over-saturation stop projects the TTFT line at its slope's lower bound (benchmarks/early_stop_knee.py)
and the native grid reaches 33.3 req/s. --engine native --same-engine, alone under /tmp/excl, load 0.2-1.5:
21:12-21:26 with --max-num-seqs [2, 8]: 24% (581 of 2418), 4 of 4 agree, but max-num-seqs 8 passed the grid's
top on both sides, so the space is now --max-num-seqs [2, 4]; 21:28-21:43 with it: 37% (953 of 2542), 3 of 4
agree: NOT MET (max-num-seqs 4 chunked on: dense 14.98 [13.37, 16.05], its 16.05 runs 28, 25, 22 of 30; tuned
16.6, passed twice: 10.8% above). docs/tune.md has the tables.

Since then the native engine runs with one BLAS thread (its served rate at saturation spread 7.3-9.1 req/s with
two, 5.35-5.55 with one), 60 requests a point on a grid to 13.4 req/s, and the search steps down from a failing
load to what the engine served there. 2026-12-06 (AMD EPYC, alone, load 0.5-1.1): with one thread and 30
requests, 03:15-03:56: 45% (1125 of 2511), 3 of 4 agree; with all three, 03:46-04:23: 41% (1616 of 3965), 3 of 4
agree (max-num-seqs 4 chunked on: dense 5.54 [5.38, 6.45], its 5.375 met 31, 60, 60 of 60; tuned 4.98, its 5.37
stopped as over-saturated twice: 10.1% below). NOT MET. The served-rate step then went down to a precision step
(where the engine fell behind by more than 5%), 04:24-05:00: 35% (1352 of 3843), 4 of 4 agree (dense vs tuned:
2.68 vs 2.71, 3.19 vs 3.13, 5.56 vs 5.29, 5.56 vs 5.46 req/s). The dense sweeps of the last two runs, the same
code, found 4.63 and 5.56 for max-num-seqs 4 chunked off: a dense sweep agrees with itself 3 of 4 by this rule.
docs/tune.md has the tables.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.engine.session import engine_session
from harness.metrics.knee import run_passes
from harness.metrics.slo_capacity import LoadPoint, max_load_meeting_slo
from harness.results.folder import point_dir_name
from harness.runs.run import Reporter, raise_on_sigterm, run_scenario
from harness.scenario.scenario import Scenario
from harness.tune.search import Measured, Point, add_run, bracket, unsettled_end
from harness.tune.tune import Tuner

GT_SERVER = ROOT / "tests" / "groundtruth_server.py"
WITHIN = 0.10
ATTAINMENT = 0.9  # the tune block's default, harness.metrics.slo_capacity's
DENSE_PER_TRIAL = 2  # --same-engine: dense runs after each tune trial (~15 grid points + ends to ~10 trials)


@dataclass
class EngineDefaults:
    """What one engine's comparison runs with unless told otherwise: the values it was measured with."""

    space: dict
    input_tokens: int
    output_tokens: int
    num_requests: int  # per point, dense and tuned alike (plus one warm-up)
    ttft_ms: float  # the SLO
    grid: tuple[float, float, int]  # the dense sweep's rates: start x step^i for i < n
    arrival: str = "poisson"
    launch_args: tuple[str, ...] = ()


DEFAULTS = {
    # the dense sweep runs its points back to back without emptying the prefix cache (bench tune empties it
    # before each trial): no prefix caching, so neither side reuses the previous point's prompts
    "native": EngineDefaults(
        space={"--max-num-seqs": [2, 4], "--no-chunked-prefill": [False, True]},  # 8 carried > 33 req/s
        input_tokens=16,
        output_tokens=8,
        # 60 a point: at 30 a run at the knee passed or failed by chance over +-10% of load (one thread: 4.8
        # req/s passed 2 of 5 runs, 5.4 1 of 5); at 60, 4.8 passed 4 of 5 and 5.4 none (2026-12-06)
        num_requests=60,
        ttft_ms=1000,
        grid=(1.5, 1.2, 13),  # to 13.4 req/s: with one BLAS thread max-num-seqs 4 serves ~5.4 at saturation
        arrival="constant",
        # one BLAS thread: the engine keeps one core and the client the other. With OpenBLAS's default two
        # threads on this 2-core VM the engine's matmuls share a core with the client, and the served rate of
        # one launch at saturation spread 7.3-9.1 req/s over eight 30-request runs (max-num-seqs 4); with one
        # thread 5.35-5.55 (2026-12-06). The knee's verdict moved with that spread.
        launch_args=("--no-prefix-caching", "--blas-threads", "1"),
    ),
    # the ground-truth server: streams at once x the gap between tokens; capacity ~ streams / (20 + 9 x gap ms)
    "groundtruth": EngineDefaults(
        space={"--max-streams": [2, 4], "--itl-ms": [10, 20]},
        input_tokens=8,
        output_tokens=10,
        num_requests=40,
        ttft_ms=250,
        grid=(4.0, 1.2, 16),
    ),
}


def backend(args) -> dict:
    if args.engine == "native":
        return {"kind": "native", "launch": {"args": list(DEFAULTS["native"].launch_args)}}
    command = f"{sys.executable} {GT_SERVER} --port {{port}} --ttft-ms 20"
    return {
        "kind": "openai",
        "model": "gt",
        "tokenizer": "smollm2",
        "launch": {"command": command, "args": [], "ready_timeout_s": 60},
    }


def scenario(args, setting: dict | None, sweep: list[float] | None, url: str | None = None) -> Scenario:
    """The dense sweep's (`sweep`) or the tune's; `url`: the tune of an engine already running, no space."""
    launched = backend(args)
    data = {
        "name": "tune-cost",
        "backend": launched if url is None else {**{k: v for k, v in launched.items() if k != "launch"}, "url": url},
        "workload": {"input_tokens": args.input_tokens, "output_tokens": args.output_tokens},
        "load": {
            "arrival": DEFAULTS[args.engine].arrival,
            "num_requests": args.num_requests,
            "warmup_requests": 1,
            "rate": args.grid[0],
            "workers": 1,
        },
        "slo": {"ttft_ms": args.ttft_ms},
        "seed": 0,
    }
    if sweep is not None:
        data["load"]["sweep"] = sweep
        args_for = [
            a for flag, v in setting.items() for a in ([flag] if v is True else [] if v is False else [flag, str(v)])
        ]
        data["backend"]["launch"]["args"] += args_for
    else:
        data["tune"] = {
            "space": {k: [v] for k, v in setting.items()} if url is None else {},
            "load": {"rate": {"min": args.grid[0], "max": args.grid[-1]}},
            "probe_requests": args.probe_requests,
            "precision": WITHIN,
            "repeats": args.repeats,
        }
    return Scenario.model_validate(data, context={"base_dir": str(ROOT)})


class DenseSweep:
    """Every grid point run whole against one engine, then its bracket's ends confirmed as `bench tune` confirms
    its own (harness/metrics/knee.py: run again until their runs' majority is settled), so both judge a load alike.
    One run per `step`, so `--same-engine` can interleave it with the tune's trials."""

    def __init__(self, args, setting: dict, out: Path, session):
        self.args, self.out, self.session = args, out, session
        self.scenario = scenario(args, setting, args.grid)
        self.grid = list(self.scenario.sweep_points())
        self.todo = list(range(len(self.grid)))  # grid points not run yet
        self.points: list[Point] = []
        self.rows: dict[float, dict] = {}  # per load: its runs' counts
        self.seconds = 0.0

    def step(self, near: float | None = None) -> bool:
        """Run one run: the unrun grid point nearest `near` (in ratio; else the lowest), else a bracket end whose
        majority is unsettled. False when nothing is left."""
        if self.todo:
            key = (lambda i: abs(math.log(self.grid[i].load.rate / near))) if near else (lambda i: i)
            index = min(self.todo, key=key)
            self.todo.remove(index)
        else:
            load = unsettled_end(self.points, 1 + self.args.repeats)
            if load is None:
                return False
            index = next(i for i, g in enumerate(self.grid) if math.isclose(g.load.rate, load))
        self._run(index)
        return True

    def _run(self, index: int) -> None:
        point = self.grid[index]
        rate = point.load.rate
        row = self.rows.setdefault(rate, {"rate": rate, "met": [], "judged": [], "tokens_per_s": []})
        repeat = len(row["met"])
        begun = time.monotonic()
        result = run_scenario(
            point.model_copy(update={"seed": point.seed + repeat}),
            self.out / point_dir_name(index, "rate", rate) / f"run-{repeat}",
            workers="1",
            session=self.session,
            reporter=Reporter(),
        )
        self.seconds += time.monotonic() - begun
        if result.interrupted_by or result.engine_exit:  # Ctrl-C, SIGTERM or a dead engine: stop here
            raise KeyboardInterrupt
        summary = result.summary
        judged = summary.requests.measured
        met = round(summary.goodput.fraction * judged)
        row["met"].append(met)
        row["judged"].append(judged)
        row["tokens_per_s"].append(summary.throughput.output_tokens_per_s)
        passed = run_passes(met, judged, ATTAINMENT, None)
        fraction = met / judged if judged else 0.0
        add_run(self.points, Measured(rate, passed, fraction, summary.throughput.requests_per_s))
        print(f"dense {rate:g} req/s run {repeat + 1}: {met}/{judged} met ({'pass' if passed else 'FAIL'})", flush=True)

    def result(self) -> dict:
        """harness.metrics.slo_capacity's rule over each load's median run (its majority's side:
        harness/metrics/knee.py)."""
        by_load = {p.offered_load: p for p in self.points}
        loads = [
            LoadPoint(rate, p.goodput_fraction, p.requests_per_s, statistics.median(self.rows[rate]["tokens_per_s"]))
            for rate, p in sorted(by_load.items())
        ]
        cap = max_load_meeting_slo(loads, ATTAINMENT)
        warmups = sum(len(r["met"]) for r in self.rows.values()) * self.scenario.load.warmup_requests
        lo, hi = bracket(self.points)
        return {
            "capacity": cap.offered_load,
            "status": cap.status,
            "bracket": [lo, hi],
            "bracket_runs_passed": [None if end is None else [r.passed for r in by_load[end].runs] for end in (lo, hi)],
            "requests": sum(sum(r["judged"]) for r in self.rows.values()) + warmups,
            "points": [{k: r[k] for k in ("rate", "met", "judged")} for _, r in sorted(self.rows.items())],
            "minutes": self.seconds / 60,
        }


def dense(args, setting: dict, out: Path) -> dict:
    """The dense sweep alone, against its own launch."""
    out.mkdir(parents=True, exist_ok=True)
    with engine_session(scenario(args, setting, args.grid), out / "engine.log", print) as session:
        sweep = DenseSweep(args, setting, out, session)
        while sweep.step():
            pass
    return sweep.result()


def interleaved(args, setting: dict, name: str) -> tuple[dict, dict]:
    """Both sides against one launch, in step: after each of the tune's trials the dense sweep runs its
    DENSE_PER_TRIAL unrun grid points nearest the load that trial ran, then whatever is left. Each side keeps
    its own points and its own rule; only their order in time is shared, so the runs both make near one load
    fall within the same minute and a drift of the engine's throughput over minutes moves both alike."""
    out = args.out / "dense" / name
    out.mkdir(parents=True, exist_ok=True)
    with engine_session(scenario(args, setting, args.grid), out / "engine.log", print) as session:
        sweep = DenseSweep(args, setting, out, session)

        def between(load: float) -> None:
            for _ in range(DENSE_PER_TRIAL):
                sweep.step(near=load)

        t = tuned(args, setting, args.out / "tune" / name, session.url, after_trial=between)
        while sweep.step():
            pass
    return sweep.result(), t


def tuned(args, setting: dict, out: Path, url: str | None = None, after_trial=None) -> dict:
    s = scenario(args, setting, None, url)
    doc = Tuner(s, out, Reporter(), resume=False, workers="1", after_trial=after_trial).run()
    capacity = doc.configurations[0].capacity
    points = [t for t in doc.trials if t.kind == "point" and t.status == "completed"]
    return {
        "capacity": capacity.offered_load,
        "status": capacity.status,
        "bracket": capacity.bracket,
        "bracket_runs_passed": capacity.bracket_runs_passed,
        "requests": doc.cost.search.requests + len(points),  # one warm-up request a point run
        "points": [
            {"offered_load": t.offered_load, "repeat": t.repeat, "met": t.met, "judged": t.judged, "passed": t.passed}
            for t in points
        ],
        "early_stops": sum(t.stopped_early is not None for t in doc.trials),
        "seconds_saved": doc.cost.search.seconds_saved_by_early_stops,
        "minutes": sum(t.wall_s for t in doc.trials) / 60,
    }


def agrees(d: dict, t: dict) -> bool:
    if d["capacity"] is None or t["capacity"] is None:
        return d["capacity"] is None and t["capacity"] is None
    lo, hi = d["bracket"]
    inside = lo is not None and lo <= t["capacity"] <= (hi if hi is not None else lo)
    return abs(t["capacity"] / d["capacity"] - 1) <= WITHIN or inside


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("results/tune-cost"))
    p.add_argument("--engine", choices=sorted(DEFAULTS), default="native")
    p.add_argument("--num-requests", type=int, help="per point (default: the engine's, below)")
    p.add_argument("--probe-requests", type=int, default=6)
    p.add_argument("--repeats", type=int, default=2, help="more runs of a bracket end, both sides (knee.py)")
    p.add_argument(
        "--same-engine",
        action="store_true",
        help="the dense sweep and the tune against one launch of each configuration (else each launches its own)",
    )
    p.add_argument("--ttft-ms", type=float, help="the SLO")
    p.add_argument("--input-tokens", type=int)
    p.add_argument("--output-tokens", type=int)
    p.add_argument("--grid", type=lambda s: [float(x) for x in s.split(",")], help="the dense sweep's req/s: 1,2,4")
    args = p.parse_args()
    d = DEFAULTS[args.engine]
    args.num_requests = args.num_requests or d.num_requests
    args.ttft_ms = args.ttft_ms or d.ttft_ms
    args.input_tokens = args.input_tokens or d.input_tokens
    args.output_tokens = args.output_tokens or d.output_tokens
    start, step, n = d.grid
    args.grid = args.grid or [round(start * step**i, 3) for i in range(n)]
    raise_on_sigterm()  # a kill unwinds: the engines are stopped
    from harness.scenario.tuning import TuneConfig, config_name

    space = {"space": d.space, "load": {"rate": {"min": 1, "max": 2}}}
    settings = TuneConfig.model_validate(space).configurations()
    rows = []
    for setting in settings:
        name = config_name(setting)
        load_before = os.getloadavg()[0]
        if args.same_engine:  # one launch for both, interleaved: the launch's spread and its drift left out
            d, t = interleaved(args, setting, name)
        else:
            d = dense(args, setting, args.out / "dense" / name)
            t = tuned(args, setting, args.out / "tune" / name)
        rows.append(
            {
                "config": name,
                "dense": d,
                "tune": t,
                "agrees": agrees(d, t),
                "load_avg_1m": [load_before, os.getloadavg()[0]],
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    dense_requests = sum(r["dense"]["requests"] for r in rows)
    tune_requests = sum(r["tune"]["requests"] for r in rows)
    print(f"\n{'configuration':40} {'dense cap [bracket]':>26} {'tuned cap [bracket]':>26} agrees  requests d/t")
    for r in rows:
        d, t = r["dense"], r["tune"]
        print(
            f"{r['config']:40} {_cap(d):>26} {_cap(t):>26} {r['agrees']!s:6} {d['requests']:5}/{t['requests']:<5}"
            f" load {r['load_avg_1m'][0]:.1f}->{r['load_avg_1m'][1]:.1f}"
        )
    ratio = tune_requests / dense_requests
    print(
        f"requests: tune {tune_requests} of the dense sweep's {dense_requests} ({ratio:.0%}; target <= 40%); "
        f"every capacity agrees: {all(r['agrees'] for r in rows)}"
    )
    (args.out / "tune_cost.json").write_text(json.dumps({"rows": rows, "requests_ratio": ratio}, indent=2))


def _cap(r: dict) -> str:
    lo, hi = r["bracket"]
    value = "none" if r["capacity"] is None else f"{r['capacity']:.3g}"
    return f"{value} [{lo if lo is None else f'{lo:.3g}'}, {hi if hi is None else f'{hi:.3g}'}]"


if __name__ == "__main__":
    main()
