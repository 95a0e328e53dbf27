"""The built-in engine's time outside the model's forward pass, per decode step, at 1 and 64 streams.

Two views, per source tree (compare two: `--trees ../main,.` with another checkout beside this one, run side by
side, turns interleaved)
and per runtime (greedy, ignore_eos, so every step is a decode of the whole batch):
  in_process  engine.step() in a loop in a child process; overhead = step time - runner.forward time
              (median over decode steps): scheduling, block manager, sampling, detokenizing, stop checks,
              metrics, the step trace.
  http        the real server (`python -m native_engine serve --step-trace`, a subprocess of that tree),
              streamed to by this process (aiohttp, the closed loop of benchmarks/engine.py):
              itl_ms        the client's mean interval between a stream's token chunks
              forward_ms    the server's own forward time per step (its step trace, same steps)
              outside_ms    itl_ms - forward_ms: everything else a token waits for, end to end
              in_step_ms    step - forward inside the server (as in_process, under the server's load)
              between_ms    from one step's end to the next one's start (the engine thread's loop, emit)
              loop_cpu_ms   CPU time of the server's main thread (the asyncio loop: SSE encoding, socket
                            writes, queue hand-offs) per step, read from /proc
              step_end_to_client_ms  median time from the end of the step that made a token to its chunk's
                            arrival at the client (is a token held until the next step? then ~ a forward)
All servers are up at once, all paused (SIGSTOP) but the measured one, the order rotating per round.
The machine's 2 cores are shared with other work: compare trees within one run, not across runs.

  flock /tmp/bench.lock python benchmarks/engine_overhead.py --trees ../main,. [--rounds 3]

Measured 2026-11-30, 2 shared cores (load average 0.9 before, 2.2 after; other sessions were busy),
--threads 2, defaults (64 tokens at 1 stream, 16 at 64), medians of 2 interleaved rounds; "before" is main
at 3a4224f, "after" this branch. All figures in ms.
  in process, step - forward      torch int8: 1 stream 0.31 -> 0.26   64 streams 1.57 -> 1.35
                                  numpy:      1 stream 0.25 -> 0.24   64 streams 2.18 -> 2.12
  http, torch int8, 1 stream      before: itl 30.0, forward 29.7, outside 0.34 (in step 0.28, between 0.04),
                                          loop CPU 0.25 a token, step end to client 0.79
                                  after:  itl 23.0, forward 22.7, outside 0.30 (0.25, 0.04), loop 0.22, 0.63
  http, torch int8, 64 streams    before: outside 1.97 a step (in step 1.59), loop CPU 2.58, to client 3.36
                                  after:  outside 2.09 (in step 1.88), loop CPU 2.27, to client 2.89
  http, numpy, 1 / 64 streams     before: outside 0.53 / 2.42;  after: 0.36 / 2.79
The forward time swung 2x between turns (load), and the HTTP figures with it: differences under ~0.3 ms
there are noise. With the forward replaced by stored logits (a probe, same engine code, 3 turns each,
alternating): 1 stream 0.043 -> 0.036 ms a step, 64 streams 1.21-1.29 -> 1.00-1.11 ms.
What the time is: at 64 streams about half of the in-step time is np.argmax over the [64, 49152] fp32 logits
(12.6 MB, memory-bound, 0.5-1 ms); the rest is Python a sequence (~8 us: schedule, detokenize, stop checks,
one RequestOutput, the ITL histogram). At 1 stream the argmax of a row written by torch's threads on the
other core costs 40-75 us (7 us once in cache); the other ~0.2 ms is the step's Python after the forward
evicted its caches. The event loop's ~35 us a token at 64 streams is mostly the socket send; at 1 stream its
0.22 ms is mostly the send that wakes the client (~0.13 ms). A token is not held until the next step: it
reaches the client 0.6-0.8 ms after its step ends at 1 stream, 3-5 ms at 64 (the loop waits for the GIL
while the engine thread runs the next step's Python: schedule and the runner's plan). Not engine overhead but
inside forward_ms: the runner's _plan costs ~1.8 ms a step at 64 streams (0.02 ms at 1).
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time

import aiohttp
import numpy as np

PROMPT_IDS = [1, 9690, 28, 314, 253, 1345, 2777, 30]  # 8 tokens; the text of the HTTP prompt is below
PROMPT_TEXT = "Tell me a long story about a little robot"


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


# ---- in process (a child per tree, so each imports its own native_engine) ----------------------
def in_process(runtime: str, streams: dict[int, int], threads: int) -> dict:
    """streams: output tokens per stream at each number of streams."""
    from engine import decode_step_times  # benchmarks/engine.py, beside this file

    from native_engine.llm_engine import EngineConfig, LLMEngine
    from native_engine.sequence import SamplingParams

    runtime, _, dtype = runtime.partition(":")
    engine = LLMEngine(EngineConfig(kv_cache_tokens=16384, runtime=runtime, dtype=dtype or "int8", threads=threads))
    engine.generate([PROMPT_IDS], SamplingParams(max_tokens=4, temperature=0.0))  # warm up
    out = {}
    for n, tokens in streams.items():
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        for i in range(n):
            engine.add_request(f"s{n}-{i}", PROMPT_IDS[:-1] + [100 + i], params)
        step_s, forward_s = decode_step_times(engine)
        step_s, forward_s = step_s[:-1], forward_s[:-1]  # the last step finishes every request: not typical
        out[f"streams_{n}"] = {
            "forward_ms": ms(statistics.median(forward_s)),
            "overhead_ms": ms(statistics.median(np.subtract(step_s, forward_s))),
        }
    return out


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


def in_process_child(tree: str, runtime: str, streams: dict[int, int], threads: int) -> dict:
    code = (
        f"import sys, json; sys.path.insert(0, {os.path.abspath(tree)!r}); sys.path.insert(1, {HERE!r}); "
        f"import engine_overhead as b; print(json.dumps(b.in_process({runtime!r}, {streams!r}, {threads})))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tree, capture_output=True, text=True, check=True, timeout=600
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


HERE = os.path.dirname(os.path.abspath(__file__))


# ---- through the HTTP server ------------------------------------------------------------------
@contextlib.asynccontextmanager
async def server(tree: str, runtime: str, threads: int):
    runtime, _, dtype = runtime.partition(":")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "native_engine",
            "serve",
            "--port",
            str(port),
            "--runtime",
            runtime,
            "--dtype",
            dtype or "int8",
            "--blas-threads",
            str(threads),
            "--step-trace",
            "--kv-cache-tokens",
            "16384",
        ],
        cwd=tree,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        proc.stdout.readline()  # "serving on ...": loaded and bound
        yield f"http://127.0.0.1:{port}", proc
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=30)


async def stream(http: aiohttp.ClientSession, url: str, max_tokens: int, i: int) -> tuple[list[int], int]:
    """Arrivals of the chunks that carry a choice (perf_counter_ns, the step trace's clock; the last one is
    the finish chunk, the last token's) and the completion's tokens. Chunks are not tokens (text can be held
    back), so intervals are taken per token from usage."""
    body = {
        "prompt": f"{PROMPT_TEXT} number {i}",
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    arrivals, tokens = [], 0
    async with http.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            now_ns = time.perf_counter_ns()
            event = json.loads(line[6:])
            if event["choices"]:
                arrivals.append(now_ns)
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return arrivals, tokens


def main_thread_cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/task/{pid}/schedstat") as f:  # ns on a CPU, waiting, timeslices
        return int(f.read().split()[0]) / 1e9


async def http_turn(url: str, pid: int, n: int, tokens: int) -> dict:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as http:
        await stream(http, url, 2, 0)  # woken and serving
        async with http.get(url + "/step_trace") as resp:
            seen = (await resp.json())["steps"]
        cpu0 = main_thread_cpu_s(pid)
        arrivals = await asyncio.gather(*[stream(http, url, tokens, i) for i in range(n)])
        cpu1 = main_thread_cpu_s(pid)
        async with http.get(url + "/step_trace") as resp:
            trace = await resp.json()
    fields = trace["fields"]
    col = {name: fields.index(name) for name in ("start_ns", "end_ns", "forward_ns", "prefill_chunks", "decode_seqs")}
    steps = trace["steps"][len(seen) :]
    ends_ns = sorted(s[col["end_ns"]] for s in steps)
    itl_s, forward_s, emit_s = [], [], []
    for chunk_ns, count in arrivals:  # each stream against the steps that ran while it decoded
        first_ns, last_ns = chunk_ns[0], chunk_ns[-1]
        itl_s.append((last_ns - first_ns) / (count - 1) / 1e9)
        forward_s.append(np.mean([s[col["forward_ns"]] for s in steps if first_ns < s[col["end_ns"]] <= last_ns]) / 1e9)
        # from the end of the step that made a token to its chunk at the client (the latest step end before it)
        emit_s += [(t - ends_ns[bisect.bisect_right(ends_ns, t) - 1]) / 1e9 for t in chunk_ns]
    decode = [s for s in steps if s[col["decode_seqs"]] == n and not s[col["prefill_chunks"]]]
    return {
        "itl_ms": ms(np.mean(itl_s)),
        "forward_ms": ms(np.mean(forward_s)),
        "outside_ms": ms(np.mean(np.subtract(itl_s, forward_s))),
        "in_step_ms": ms(
            np.median([s[col["end_ns"]] - s[col["start_ns"]] - s[col["forward_ns"]] for s in decode]) / 1e9
        ),
        "between_ms": ms(np.median([b[col["start_ns"]] - a[col["end_ns"]] for a, b in zip(decode, decode[1:])]) / 1e9),
        "loop_cpu_ms": ms((cpu1 - cpu0) / max(len(steps), 1)),
        "step_end_to_client_ms": ms(np.median(emit_s)),
    }


async def http_side_by_side(
    trees: list[str], runtimes: list[str], streams: list[int], tokens: dict[int, int], threads: int, rounds: int
) -> dict:
    results: dict[str, dict[int, list[dict]]] = {}
    async with contextlib.AsyncExitStack() as stack:
        servers = {}
        for tree in trees:
            for runtime in runtimes:
                url, proc = await stack.enter_async_context(server(tree, runtime, threads))
                async with aiohttp.ClientSession() as http:
                    await stream(http, url, 4, 0)
                os.kill(proc.pid, signal.SIGSTOP)
                servers[f"{tree} {runtime}"] = (url, proc)
                results[f"{tree} {runtime}"] = {n: [] for n in streams}
        names = list(servers)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                url, proc = servers[name]
                os.kill(proc.pid, signal.SIGCONT)
                for n in streams:
                    turn = await http_turn(url, proc.pid, n, tokens[n])
                    results[name][n].append(turn)
                    print(json.dumps({"round": r + 1, "server": name, "streams": n, **turn}), flush=True)
                os.kill(proc.pid, signal.SIGSTOP)
    return {
        name: {
            f"streams_{n}": {k: round(float(np.median([t[k] for t in turns])), 3) for k in turns[0]}
            for n, turns in per_n.items()
        }
        for name, per_n in results.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", default=".", help="source trees to compare, comma-separated (e.g. ../main,.)")
    parser.add_argument("--runtimes", default="torch:int8,numpy", help="comma-separated; torch as torch:DTYPE")
    parser.add_argument("--streams", default="1,64")
    parser.add_argument("--tokens", default="64,16", help="output tokens per stream, one per --streams level")
    parser.add_argument("--threads", type=int, default=2, help="torch's / OpenBLAS's threads (llama-server: -t 2)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--only", default="in_process,http")
    args = parser.parse_args()
    trees, runtimes = args.trees.split(","), args.runtimes.split(",")
    streams = [int(s) for s in args.streams.split(",")]
    tokens = dict(zip(streams, (int(t) for t in args.tokens.split(","))))
    report = {"uptime_before": uptime()}
    if "in_process" in args.only:
        runs: dict[str, list[dict]] = {f"{t} {r}": [] for t in trees for r in runtimes}
        for k in range(args.rounds):
            for name in list(runs)[k % len(runs) :] + list(runs)[: k % len(runs)]:
                tree, runtime = name.split(" ")
                runs[name].append(in_process_child(tree, runtime, tokens, args.threads))
                print(json.dumps({"round": k + 1, "in_process": name, **runs[name][-1]}), flush=True)
        report["in_process"] = {
            name: {
                level: {key: round(float(np.median([t[level][key] for t in turns])), 3) for key in turns[0][level]}
                for level in turns[0]
            }
            for name, turns in runs.items()
        }
    if "http" in args.only:
        report["http"] = asyncio.run(http_side_by_side(trees, runtimes, streams, tokens, args.threads, args.rounds))
    report["uptime_after"] = uptime()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
