"""N-gram speculative decoding on the built-in engine: decode tokens/s with and without it, at
batch 1 and batch 32, on a workload whose answers copy their prompts (`kind: repeat`) and on one
whose answers do not (`kind: random`), with the draft acceptance rate. Printed as JSON.

Both engines share one loaded model in this process and run the same greedy requests (so the same
output tokens) in interleaved order, repetition by repetition; the figure is output tokens after
each request's first one over the time from the last first token to the end (decode only, prefill
excluded). Ratios on/off are what to read; the machine's load is printed with them.

    python benchmarks/spec_decode.py [--reps 2] [--k 4] [--output-tokens 64] [--blas-threads 1]

Measured 2026-11-30 (--reps 4, k=4, ngram 2..4, greedy, 64 output tokens, one BLAS thread; 2 shared
cores at load average 7-10 from other jobs, so read the ratios, and even those move +-30% run to run):
  batch  workload   tok/s off -> on   on/off  acceptance  mean accepted+1  decode steps off -> on
  1      copy         7.5 -> 16.2     2.17      0.93          4.7            220 -> 72
  1      no copy      8.5 ->  8.2     0.97      0.50          3.0            252 -> 236
  32     copy        46.7 -> 64.5     1.38      0.82          3.9            251 -> 145
  32     no copy     44.8 -> 45.7     1.02      0.40          2.6            252 -> 252
Greedy outputs were identical on and off in every run. The gain shrinks with the batch (at 32 a
5-token verification per sequence makes a 160-row step) and vanishes where outputs do not copy.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.scenario.scenario import Scenario
from harness.scenario.tokenizer_source import LocalTokenizer
from harness.scenario.workload import build_schedule
from native_engine.blas import set_blas_threads
from native_engine.llm_engine import EngineConfig, LLMEngine, LoadedModel
from native_engine.scheduler import SchedulerConfig
from native_engine.sequence import SamplingParams
from native_engine.spec_decode import SpeculativeConfig


def chat_prompts(model: LoadedModel, kind: str, n: int, input_tokens: int) -> list[list[int]]:
    """The user messages `bench` would send for this workload kind, through the chat template."""
    scenario = Scenario.model_validate(
        {
            "name": kind,
            "backend": {"kind": "openai", "url": "http://127.0.0.1:9", "model": "smollm2", "api": "chat"},
            "workload": {"kind": kind, "input_tokens": input_tokens, "output_tokens": 8},
            "load": {"arrival": "closed", "concurrency": 1, "num_requests": n, "warmup_requests": 0},
            "seed": 1,
        }
    )
    schedule = build_schedule(scenario, LocalTokenizer("smollm2"))
    tok = model.tokenizer
    return [
        tok.encode(tok.apply_chat_template([{"role": "user", "content": r.prompt}], add_generation_prompt=True))
        for r in schedule.requests
    ]


def spec_counters(engine: LLMEngine) -> tuple[float, float, float]:
    """(drafts, draft tokens, accepted tokens) so far, from /metrics' page; zeros without speculation."""
    values = {}
    for line in engine.metrics.render().decode().splitlines():
        if line.startswith("native:spec_decode_num_"):
            name, value = line.rsplit(" ", 1)
            values[name.split("{")[0]] = float(value)
    return (
        values.get("native:spec_decode_num_drafts_total", 0.0),
        values.get("native:spec_decode_num_draft_tokens_total", 0.0),
        values.get("native:spec_decode_num_accepted_tokens_total", 0.0),
    )


def decode_run(engine: LLMEngine, prompts: list[list[int]], params: SamplingParams) -> dict:
    ids = [f"b{time.perf_counter_ns()}-{i}" for i in range(len(prompts))]
    for request_id, prompt in zip(ids, prompts):
        engine.add_request(request_id, prompt, params)
    tokens = {i: [] for i in ids}
    drafts0, drafted0, accepted0 = spec_counters(engine)
    steps = 0
    decode_start_s = None
    while engine.has_work():
        for out in engine.step():
            tokens[out.request_id] += out.new_token_ids
        steps += 1
        if decode_start_s is None and all(tokens.values()):
            decode_start_s, decode_steps0 = time.perf_counter(), steps
    elapsed_s = time.perf_counter() - decode_start_s
    drafts, drafted, accepted = spec_counters(engine)
    decoded = sum(len(t) - 1 for t in tokens.values())
    return {
        "tokens": [tokens[i] for i in ids],
        "decode_tokens": decoded,
        "decode_s": elapsed_s,
        "decode_steps": steps - decode_steps0,
        "drafts": drafts - drafts0,
        "draft_tokens": drafted - drafted0,
        "accepted_tokens": accepted - accepted0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--k", type=int, default=4, help="--num-speculative-tokens")
    parser.add_argument("--ngram-max", type=int, default=4)
    parser.add_argument("--ngram-min", type=int, default=2)
    parser.add_argument("--input-tokens", type=int, default=48, help="passage / prompt words")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--batches", default="1,32")
    parser.add_argument("--blas-threads", type=int, default=1, help="1 on a shared 2-core machine (0: numpy's)")
    args = parser.parse_args()
    if args.blas_threads:
        set_blas_threads(args.blas_threads)
    batches = [int(b) for b in args.batches.split(",")]
    model = LoadedModel.load("smollm2")
    workloads = {
        "copy (repeat)": chat_prompts(model, "repeat", max(batches), args.input_tokens),
        "no copy (random)": chat_prompts(model, "random", max(batches), args.input_tokens),
    }
    scheduler = SchedulerConfig(max_num_seqs=max(batches), max_num_batched_tokens=512)
    engines = {
        "off": LLMEngine(EngineConfig(kv_cache_tokens=16384, scheduler=scheduler), model),
        "on": LLMEngine(
            EngineConfig(
                kv_cache_tokens=16384,
                scheduler=scheduler,
                speculative=SpeculativeConfig(
                    num_speculative_tokens=args.k, ngram_max=args.ngram_max, ngram_min=args.ngram_min
                ),
            ),
            model,
        ),
    }
    params = SamplingParams(max_tokens=args.output_tokens, temperature=0.0)
    runs: dict[tuple, list[dict]] = {}
    load_before = os.getloadavg()
    for rep in range(args.reps):
        for batch in batches:
            for workload, prompts in workloads.items():
                order = ("off", "on") if rep % 2 == 0 else ("on", "off")  # neither always goes first
                for mode in order:
                    run = decode_run(engines[mode], prompts[:batch], params)
                    runs.setdefault((batch, workload, mode), []).append(run)
                    print(
                        f"rep {rep} batch {batch} {workload} {mode}: {run['decode_tokens'] / run['decode_s']:.1f} "
                        f"tok/s",
                        file=sys.stderr,
                    )
    results = []
    for batch in batches:
        for workload in workloads:
            off, on = runs[(batch, workload, "off")], runs[(batch, workload, "on")]
            same = all(a["tokens"] == b["tokens"] for a, b in zip(off, on))
            rate = {
                mode: sum(r["decode_tokens"] for r in rs) / sum(r["decode_s"] for r in rs)
                for mode, rs in (("off", off), ("on", on))
            }
            drafted, accepted = sum(r["draft_tokens"] for r in on), sum(r["accepted_tokens"] for r in on)
            drafts = sum(r["drafts"] for r in on)
            results.append(
                {
                    "batch": batch,
                    "workload": workload,
                    "decode_tok_s_off": round(rate["off"], 1),
                    "decode_tok_s_on": round(rate["on"], 1),
                    "speedup_on_over_off": round(rate["on"] / rate["off"], 3),
                    "acceptance_rate": round(accepted / drafted, 3) if drafted else None,
                    # tokens a sequence gains per verification, the target's own one included (as vLLM logs it)
                    "mean_acceptance_length": round(1 + accepted / drafts, 2) if drafts else None,
                    "decode_steps_off": sum(r["decode_steps"] for r in off),
                    "decode_steps_on": sum(r["decode_steps"] for r in on),
                    "greedy_output_identical": same,
                    "decode_tokens_per_run": off[0]["decode_tokens"],
                }
            )
    print(
        json.dumps(
            {
                "k": args.k,
                "ngram": [args.ngram_min, args.ngram_max],
                "reps": args.reps,
                "output_tokens": args.output_tokens,
                "blas_threads": args.blas_threads,
                "loadavg_before": load_before,
                "loadavg_after": os.getloadavg(),
                "results": results,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
