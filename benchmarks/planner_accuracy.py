"""How close `bench plan` (fitted step model) comes to measured runs of the native engine on this machine.

Calibrates on one measured run (SmolLM2 on the native engine, backend.trace: true, prompt and answer
lengths drawn over a range, past capacity), then judges five other cases, each measured REPEATS times and
predicted once from the calibration run alone:
  low_rate      128-token prompts, 64-token answers at 0.25 req/s
  saturated     the same at 2 req/s, past the engine's capacity (the queue grows)
  mix           other prompt/output lengths (384 in, 24 out) at 0.5 req/s
  no_chunked    the mix with --no-chunked-prefill (384-token prompts over a 256-token step budget), 0.25 req/s
  cache_aware   2 replicas behind the cache_aware router on the multi-turn shared-prefix chat trace
Printed per case and metric: the measured mean of the repeats with their spread (min-max), the
prediction and the absolute percentage error; then the mean absolute percentage error (MAPE) per
metric over the cases, against the targets (10% for TTFT p50, TPOT p50 and output throughput, 20% for
TTFT p90). step-drift: each measured run's own steps timed against the calibration's step model on the
same batches (1.00: the machine as fast as when calibrated). The load average is read before and after
each run, and a client-bound run is flagged. Run it alone, under the machine's measurement lock: it takes
no lock of its own, and the runs compared must share one quiet stretch.

Measured 2026-12-02 01:27-01:49, one lock hold, nothing else running (load average 0.7-1.3, 2 cores), MAPE
over the cases: TTFT p50 12.9% (target 10%: NOT met), TTFT p90 13.7%, TPOT p50 9.0%, output tok/s 3.0% (met).
Misses: saturated (TTFT p50 18.9%, drift 1.12/1.13: the fit puts a decoding sequence's cost on its context,
and saturated's contexts are shorter than the calibration's) and mix (TTFT p50 26.7%, its repeats 3288 and
4702 ms apart, the second at drift 1.19). docs/planner.md.

  PYTHONPATH=. python benchmarks/planner_accuracy.py --out DIR [--repeats 2] [--cases low_rate,mix]
  PYTHONPATH=. python benchmarks/planner_accuracy.py --out DIR --predict-only   # measured runs already in DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parent.parent
ENGINE = {"kind": "native", "model": "smollm2", "trace": True}
BLAS = ["--blas-threads", "1"]  # one thread per engine: on 2 shared cores, two threads fight other work
BASE_WORKLOAD = {"kind": "random", "input_tokens": 128, "output_tokens": 64, "ignore_eos": True}
MIX_WORKLOAD = {"kind": "random", "input_tokens": 384, "output_tokens": 24, "ignore_eos": True}
BASE_RATE = 0.5
NUM_REQUESTS = 30


def scenario(name: str, workload: dict, load: dict, launch_args: list[str]) -> dict:
    return {
        "name": name,
        "backend": {**ENGINE, "launch": {"args": BLAS + launch_args}},
        "workload": workload,
        "load": load,
        "slo": {"ttft_ms": 5000, "tpot_ms": 300},
        "seed": 0,
    }


def poisson(rate: float) -> dict:
    return {"arrival": "poisson", "rate": rate, "num_requests": NUM_REQUESTS, "warmup_requests": 2}


# The calibration's batches must span the ones predicted: prompt and answer lengths drawn over a range (a
# fixed prompt length makes a prefill's per-token and per-sequence costs one unknown), at a rate somewhat
# past capacity so the batch grows to ~25 requests in flight, then drains one answer at a time to a batch of 1.
CALIBRATION_WORKLOAD = {
    "kind": "random",
    "input_tokens": {"dist": "uniform", "min": 32, "max": 512},
    "output_tokens": {"dist": "uniform", "min": 8, "max": 128},
    "ignore_eos": True,
}
CALIBRATION = scenario(
    "calibration",
    CALIBRATION_WORKLOAD,
    {"arrival": "poisson", "rate": 0.7, "num_requests": 40, "warmup_requests": 2},
    [],
)
CASES = {
    "low_rate": scenario("low_rate", BASE_WORKLOAD, poisson(BASE_RATE / 2), []),
    "saturated": scenario("saturated", BASE_WORKLOAD, poisson(BASE_RATE * 4), []),
    "mix": scenario("mix", MIX_WORKLOAD, poisson(BASE_RATE), []),
    # below capacity: without chunking a 384-token prompt holds the engine ~1.3 s, and past capacity the TTFT is
    # the backlog, which multiplies any step-time error by the requests queued (the saturated case judges that)
    "no_chunked": scenario("no_chunked", MIX_WORKLOAD, poisson(BASE_RATE / 2), ["--no-chunked-prefill"]),
    "cache_aware": scenario(
        "cache_aware",
        {"kind": "random", "ignore_eos": True},
        {
            "arrival": "trace",
            "trace": str(ROOT / "scenarios/traces/chat_sessions.jsonl"),
            "trace_block_size": 16,
            "warmup_requests": 0,
        },
        ["--data-parallel", "2", "--router-policy", "cache_aware"],
    ),
}
METRICS = {
    "ttft_p50_ms": (("ttft_ms", "p50"), 0.10),
    "ttft_p90_ms": (("ttft_ms", "p90"), 0.20),
    "tpot_p50_ms": (("tpot_ms", "p50"), 0.10),
    "output_tok_per_s": (("throughput", "output_tokens_per_s"), 0.10),
}


def load_average() -> float:
    return os.getloadavg()[0]


def measure(spec: dict, run_dir: Path) -> dict:
    """One `bench run` (the caller holds the machine's measurement lock); returns what the table needs about it."""
    path = run_dir.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(spec))
    before = load_average()
    res = subprocess.run(
        [sys.executable, "-m", "harness", "run", str(path), "--output", str(run_dir), "--allow-client-bound"],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    after = load_average()
    if res.returncode != 0:
        raise SystemExit(f"{run_dir.name}: bench run exited {res.returncode}:\n{res.stderr[-2000:]}")
    info = {"load_before": before, "load_after": after}
    (run_dir / "load.json").write_text(json.dumps(info))
    return info


def figures(summary: dict) -> dict:
    return {name: summary[a][b] for name, ((a, b), _) in METRICS.items()}


def predict(spec: dict, calibration_dir: Path, out_dir: Path) -> dict:
    from harness.plan.simulator import simulate_scenario
    from harness.scenario import load_scenario

    path = out_dir.with_suffix(".yaml")
    path.write_text(yaml.safe_dump({**spec, "plan": {"step_model": {"fitted": [str(calibration_dir)]}}}))
    return simulate_scenario(load_scenario(path), out_dir, overwrite=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--predict-only", action="store_true", help="use the measured runs already in --out")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    cases = args.cases.split(",")
    calibration_dir = args.out / "calibration"
    runs = {c: [args.out / f"{c}-{i + 1}" for i in range(args.repeats)] for c in cases}
    # every case's first repeat before any second one: a stretch cut short still covers every case
    order = [calibration_dir] + [runs[c][i] for i in range(args.repeats) for c in cases]
    todo = [d for d in order if not (d / "summary.json").is_file()]
    if todo and not args.predict_only:
        for run_dir in todo:  # all in one stretch, under the machine's measurement lock held by the caller
            spec = CALIBRATION if run_dir == calibration_dir else CASES[run_dir.name.rsplit("-", 1)[0]]
            info = measure(spec, run_dir)
            print(f"measured {run_dir.name}: load {info['load_before']:.1f} -> {info['load_after']:.1f}", flush=True)
    report(cases, runs, calibration_dir, args.out)


def step_drift(run_dir: Path, calibration_dir: Path) -> float | None:
    """A measured run's own steps against the calibration's step model on the same batches: the sum of their
    measured times over the sum of the modelled ones. Above 1: this machine ran slower than when calibrated,
    an error no simulator of the schedule can remove."""
    from harness.engine_trace import read_engine_trace
    from harness.plan.step_model import fit_step_model, shape_of

    if not (run_dir / "engine_trace.json").is_file():
        return None  # a deployment behind the router: its replicas' steps are not traced
    model = fit_step_model([calibration_dir])
    steps = read_engine_trace(run_dir / "engine_trace.json")
    return sum(s["dur_s"] for s in steps) / sum(model.step_time_s(shape_of(s, 16)) for s in steps)


def report(cases: list[str], runs: dict, calibration_dir: Path, out: Path) -> None:
    errors = {m: [] for m in METRICS}
    print(
        f"\n{'case':12} {'metric':17} {'measured (spread)':>26} {'predicted':>10} {'error':>7}"
        "  load  client-bound  step-drift"
    )
    for case in cases:
        done = [d for d in runs[case] if (d / "summary.json").is_file()]  # --predict-only: what was measured
        if not done:
            continue
        summaries = [json.loads((d / "summary.json").read_text()) for d in done]
        loads = [json.loads((d / "load.json").read_text()) for d in done]
        predicted = figures(predict(CASES[case], calibration_dir, out / f"{case}-predicted"))
        measured = [figures(s) for s in summaries]
        load_text = "/".join(f"{x['load_before']:.0f}-{x['load_after']:.0f}" for x in loads)
        bound = "/".join("yes" if s["client_bound"] else "no" for s in summaries)
        drift = "/".join("-" if (x := step_drift(d, calibration_dir)) is None else f"{x:.2f}" for d in done)
        for m in METRICS:
            values = [f[m] for f in measured]
            mean = float(np.mean(values))
            err = abs(predicted[m] - mean) / mean
            errors[m].append(err)
            print(
                f"{case:12} {m:17} {mean:10.1f} ({min(values):7.1f}-{max(values):7.1f}) {predicted[m]:10.1f} "
                f"{100 * err:6.1f}%  {load_text}  {bound}  {drift}"
            )
    print("\nMAPE over the cases (target):")
    for m, (_, target) in METRICS.items():
        mape = float(np.mean(errors[m]))
        print(f"  {m:17} {100 * mape:6.1f}%  ({100 * target:.0f}%)  {'met' if mape <= target else 'NOT met'}")


if __name__ == "__main__":
    main()
