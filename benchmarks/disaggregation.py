"""Prefill/decode disaggregation vs colocated serving: the running streams' ITL while long prompts arrive.

The same Mooncake-format trace for every deployment: --streams short prompts (64 tokens) with long
answers (--stream-tokens) start at t=0 and keep a steady decode load; long prompts (--long-prompts
tokens, 8-token answers) arrive one every --gap-s seconds from 1.5 s on. Each deployment is launched
by the harness (`harness.runs.run.run_scenario` on a scenario, so the figures are the harness's records:
client-side token arrival times) with SmolLM2-135M on numpy:
  colocated-chunked  one engine on both cores, --colocated-threads BLAS threads (default 1), chunked
                     prefill (256-token steps)
  colocated-whole    the same, each prompt prefilled whole in one step beside the decodes
                     (--no-chunked-prefill --max-num-batched-tokens 2048)
  disaggregated      `--disaggregate prefill=1,decode=1 --pin-cpus`: prefill worker on core 0, decode
                     worker on core 1, one BLAS thread each
  disaggregated-floating  the same without --pin-cpus (both workers may run on either core)
The same 2 cores are open to each. The colocated engine gets one BLAS thread by default: its HTTP
thread still has the other core, and with two BLAS threads on 2 cores that other programs share,
OpenBLAS's threads spin waiting for a descheduled partner (a smoke run at load ~5 had the colocated
ITL p50 at 2.2 s with 2 threads). So the disaggregated pair computes on two cores where the colocated
engine's matmuls use one: that is part of what disaggregation buys on this machine, and is said so.
Only one deployment runs at a time, and the deployments take turns in each of --rounds rounds (the
order rotated each round), so that a change in the machine's load falls on all of them.

Reported per deployment: ITL p50/p99/max of the running streams (gaps between their token-bearing
chunks), TTFT mean/max of the long prompts, and the KV handoff per long prompt (bytes, the prefill
worker's copy out, the decode worker's copy in, from each request's server timings).

  PYTHONPATH=. flock /tmp/bench.lock python benchmarks/disaggregation.py [--rounds 2] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from harness.results.folder import read_records
from harness.runs.run import run_scenario
from harness.scenario.scenario import load_scenario

COMMON = ["--kv-cache-tokens", "8192"]
DEPLOYMENTS = {
    "colocated-chunked": ["--max-num-batched-tokens", "256"],
    # without chunking a prompt over the step budget only runs in a step of its own, after every running
    # stream has finished (it starved for 130 s in a first try); a budget over the longest prompt lets
    # it run whole beside the decodes, as vLLM's does with max_num_batched_tokens >= max_model_len
    "colocated-whole": ["--no-chunked-prefill", "--max-num-batched-tokens", "2048"],
    "disaggregated": ["--disaggregate", "prefill=1,decode=1", "--pin-cpus"],
    # the same without taskset: on a machine other programs load, a pinned worker waits for its one core
    "disaggregated-floating": ["--disaggregate", "prefill=1,decode=1"],
}
STREAM_PROMPT_TOKENS = 64
BLOCK = 16  # trace_block_size: each hash id one block of distinct tokens, so no prompt shares a prefix


def write_trace(path: Path, streams: int, stream_tokens: int, long_prompts: list[int], gap_s: float) -> None:
    rows, next_id = [], 0
    arrivals = [(0.0, STREAM_PROMPT_TOKENS, stream_tokens)] * streams
    arrivals += [(1.5 + i * gap_s, n, 8) for i, n in enumerate(long_prompts)]
    for t_s, n_in, n_out in arrivals:
        n_blocks = -(-n_in // BLOCK)
        rows.append(
            {
                "timestamp": int(t_s * 1000),
                "input_length": n_in,
                "output_length": n_out,
                "hash_ids": list(range(next_id, next_id + n_blocks)),
            }
        )
        next_id += n_blocks
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def write_scenario(path: Path, name: str, trace: Path, colocated_threads: int) -> None:
    threads = [] if name.startswith("disaggregated") else ["--blas-threads", str(colocated_threads)]
    args = ", ".join(json.dumps(a) for a in COMMON + DEPLOYMENTS[name] + threads)
    path.write_text(
        f"name: {name}\n"
        f"backend: {{kind: native, model: smollm2, launch: {{args: [{args}], ready_timeout_s: 180}}}}\n"
        "workload: {kind: random, ignore_eos: true}\n"
        f"load: {{arrival: trace, trace: '{trace}', trace_block_size: {BLOCK}, workers: 1}}\n"
        "telemetry: {interval_ms: 500, gpu: false}\n"
        "seed: 0\n"
    )


def figures(run_dir: Path) -> dict:
    records = [r for r in read_records(run_dir) if not r.is_warmup]
    failed = [r for r in records if not r.ok]
    streams = [r for r in records if r.ok and r.prompt_tokens <= 2 * STREAM_PROMPT_TOKENS]
    longs = [r for r in records if r.ok and r.prompt_tokens > 2 * STREAM_PROMPT_TOKENS]
    itl_ms = np.concatenate([np.diff(r.token_times_s) for r in streams]) * 1e3
    ttft_ms = np.array([r.token_times_s[0] - r.actual_send_s for r in longs]) * 1e3
    out = {
        "failed": len(failed),
        "streams": len(streams),
        "long": len(longs),
        "itl_p50_ms": float(np.percentile(itl_ms, 50)),
        "itl_p99_ms": float(np.percentile(itl_ms, 99)),
        "itl_max_ms": float(itl_ms.max()),
        "ttft_long_mean_ms": float(ttft_ms.mean()),
        "ttft_long_max_ms": float(ttft_ms.max()),
    }
    if any("kv_transfer_bytes" in r.server_timings for r in longs):
        # handoff_ms: what the client waited past the prefill worker's queue and prefill: the copies, the
        # HTTP hops, and the decode worker's next step boundary
        out["kv_per_long_prompt"] = [
            {
                "prompt_tokens": t["prompt_n"] + t["cache_n"],
                "bytes": t["kv_transfer_bytes"],
                "export_ms": t["kv_export_ms"],
                "import_ms": t["kv_import_ms"],
                "handoff_ms": round(ttft - t["queue_ms"] - t["prefill_ms"], 1),
            }
            for t, ttft in zip((r.server_timings for r in longs), ttft_ms)
            if "kv_transfer_bytes" in t
        ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--streams", type=int, default=6)
    ap.add_argument("--stream-tokens", type=int, default=120)
    ap.add_argument("--long-prompts", default="500,900,1200,1500")
    ap.add_argument("--gap-s", type=float, default=2.0)
    ap.add_argument("--colocated-threads", type=int, default=1, help="BLAS threads of the colocated engine")
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temporary one)")
    a = ap.parse_args()
    out = Path(a.out or tempfile.mkdtemp(prefix="disagg-bench-"))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / "trace.jsonl"
    write_trace(trace, a.streams, a.stream_tokens, [int(n) for n in a.long_prompts.split(",")], a.gap_s)
    uptime = [subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()]
    names = list(DEPLOYMENTS)
    results: dict[str, list[dict]] = {n: [] for n in names}
    for round_index in range(a.rounds):
        order = names[round_index % len(names) :] + names[: round_index % len(names)]
        for name in order:
            scenario_path = out / f"{name}.yaml"
            write_scenario(scenario_path, name, trace, a.colocated_threads)
            run_dir = out / f"round{round_index}-{name}"
            run_scenario(load_scenario(scenario_path), run_dir)
            results[name].append(figures(run_dir))
            print(f"round {round_index} {name}: {json.dumps(results[name][-1])}", flush=True)
    uptime.append(subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip())
    print(f"\nuptime before: {uptime[0]}\nuptime after:  {uptime[1]}\nruns in {out}\n")
    print(
        f"{'deployment':20} {'ITL p50':>8} {'ITL p99':>8} {'ITL max':>8} {'TTFT long mean':>15} {'TTFT long max':>14}"
        "   (ms; median over rounds)"
    )
    for name in names:
        med = {
            k: float(np.median([r[k] for r in results[name]]))
            for k in ("itl_p50_ms", "itl_p99_ms", "itl_max_ms", "ttft_long_mean_ms", "ttft_long_max_ms")
        }
        print(
            f"{name:20} {med['itl_p50_ms']:8.0f} {med['itl_p99_ms']:8.0f} {med['itl_max_ms']:8.0f} "
            f"{med['ttft_long_mean_ms']:15.0f} {med['ttft_long_max_ms']:14.0f}"
        )
    base = {k: np.median([r[k] for r in results["colocated-chunked"]]) for k in ("itl_p99_ms", "ttft_long_mean_ms")}
    for name in names:
        p99 = np.median([r["itl_p99_ms"] for r in results[name]]) / base["itl_p99_ms"]
        ttft = np.median([r["ttft_long_mean_ms"] for r in results[name]]) / base["ttft_long_mean_ms"]
        print(f"  {name:20} ITL p99 x{p99:.2f}, TTFT(long) mean x{ttft:.2f} of colocated-chunked (per-round medians)")
    print(
        "\nKV handoff per long prompt (both disaggregated deployments, every round; handoff = TTFT - the "
        "prefill worker's queue and prefill):"
    )
    for r in results["disaggregated"] + results["disaggregated-floating"]:
        for kv in r.get("kv_per_long_prompt", []):
            print(
                f"  {kv['prompt_tokens']:5d} tokens  {kv['bytes'] / 2**20:6.1f} MiB  "
                f"export {kv['export_ms']:6.1f} ms  "
                f"import {kv['import_ms']:6.1f} ms  handoff {kv['handoff_ms']:6.0f} ms"
            )
    (out / "figures.json").write_text(json.dumps({"uptime": uptime, "results": results}, indent=1))


if __name__ == "__main__":
    main()
