"""Side-by-side measurements of the built-in engine (native_engine), printed as a JSON report.

  (a) single-stream decode tok/s next to the memory-bandwidth roofline measured in the same run, and the
      engine's own overhead per step at batch 64, for each runtime (numpy, torch:int4, torch:int8, torch:bf16)
  (b) total output tok/s through the HTTP server at 1, 8, 32, 64 concurrent streams for each runtime, side by
      side with llama.cpp's llama-server on the same GGUF, jobs and threads (benchmarks/build_llama_server.sh
      builds it): all servers up, all but the measured one paused, turns interleaved per level
  (c) continuous vs static batching on mixed output lengths
  (d) chunked prefill on/off: ITL p99 of running streams while long prompts arrive
  (e) prefix caching on/off: TTFT on a shared-prefix workload

Servers run as subprocesses (`python -m native_engine serve`) so the client's event loop does
not share a GIL with the engine. Run (timings: under the shared lock):
  flock /tmp/bench.lock python benchmarks/engine.py [--only a,b] [--quick] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time

import aiohttp
import numpy as np

from harness.engine.launcher import free_port

WORDS = (
    "paged attention keeps the kv cache in blocks so requests share memory and the scheduler "
    "batches every step while long prompts are split into chunks"
).split()


SERVER_FLAGS: list[str] = []  # given to every server (from --blas-threads)


def text_of(n_words: int, offset: int = 0) -> str:
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n_words))


# ---- (a) in-process single stream vs roofline ----------------------------------------------
def decode_step_times(engine) -> tuple[list[float], list[float]]:
    """Runs the engine's queued requests to their end, every prompt prefilled first (untimed); returns each
    decode step's time and its forward pass's (s)."""
    while engine.scheduler.waiting or any(seq.num_output_tokens == 0 for seq in engine.scheduler.running):
        engine.step()
    step_s, forward_s = [], []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - start)
        forward_s.append(engine.last_forward_s)
    return step_s, forward_s


def single_stream(output_tokens: int, blas_threads: int, runtime: str = "numpy") -> dict:
    from native_engine.blas import measure_read_bandwidth_gbs, set_blas_threads
    from native_engine.llm_engine import EngineConfig, LLMEngine
    from native_engine.sequence import SamplingParams

    if blas_threads:
        set_blas_threads(blas_threads)

    runtime, _, dtype = runtime.partition(":")
    engine = LLMEngine(EngineConfig(kv_cache_tokens=4096, runtime=runtime, dtype=dtype or "int4", threads=blas_threads))
    prompt = engine.tokenizer.encode(text_of(20))
    engine.generate([prompt], SamplingParams(max_tokens=4, temperature=0.0))  # warm up
    engine.add_request("a", prompt, SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True))
    engine.step()  # the prefill step, not timed
    step_s, bytes_read = [], []
    while engine.has_work():
        start = time.perf_counter()
        engine.step()
        step_s.append(time.perf_counter() - start)
        bytes_read.append(engine.runner.last_step_bytes_read)
    # Engine overhead (scheduling, sampling, detokenizing) next to the forward pass, at batch 64.
    for i in range(64):
        engine.add_request(
            f"b{i}",
            engine.tokenizer.encode(text_of(20, i)),
            SamplingParams(max_tokens=16, temperature=0.8, top_p=0.95, seed=i, ignore_eos=True),
        )
    batch_step_s, batch_forward_s = decode_step_times(engine)
    bandwidth_gbs = measure_read_bandwidth_gbs(engine.runner.weight_bytes)
    decode_tok_s = len(step_s) / sum(step_s)
    roofline_tok_s = bandwidth_gbs * 1e9 / float(np.mean(bytes_read))
    return {
        "decode_tok_s": round(decode_tok_s, 1),
        "bytes_read_per_step_mb": round(np.mean(bytes_read) / 1e6, 1),
        "read_bandwidth_gbs": round(bandwidth_gbs, 1),
        "roofline_tok_s": round(roofline_tok_s, 1),
        "fraction_of_roofline": round(decode_tok_s / roofline_tok_s, 2),
        "steps": len(step_s),
        "batch64_step_ms": round(1000 * float(np.median(batch_step_s)), 1),
        "batch64_engine_overhead_ms": round(1000 * float(np.median(np.subtract(batch_step_s, batch_forward_s))), 1),
    }


# ---- HTTP server and client ----------------------------------------------------------------
@contextlib.asynccontextmanager
async def server(*flags: str):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "native_engine", "serve", "--port", str(port), *SERVER_FLAGS, *flags],
        stdout=subprocess.PIPE,
        text=True,
    )  # stderr: a failed start says why
    try:
        proc.stdout.readline()  # the "serving on" line: model loaded, socket bound
        yield f"http://127.0.0.1:{port}", proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)  # a paused process cannot act on SIGTERM
    proc.terminate()
    proc.wait(timeout=30)


@contextlib.asynccontextmanager
async def llama_server(binary: str, parallel: int, threads: int):
    """llama.cpp's server on the same GGUF, with continuous batching over `parallel` slots."""
    from native_engine.model_files import resolve_model

    port = free_port()
    proc = subprocess.Popen(
        [
            binary,
            "-m",
            str(resolve_model("smollm2")),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--parallel",
            str(parallel),
            "--cont-batching",
            "-t",
            str(threads),
            "-c",
            str(512 * parallel),
            "-a",
            "smollm2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as http:
            for _ in range(600):  # /health answers 503 while the model loads
                if proc.poll() is not None:
                    raise RuntimeError(f"{binary} exited with status {proc.returncode} before it was healthy")
                with contextlib.suppress(aiohttp.ClientError):
                    async with http.get(url + "/health") as resp:
                        if resp.status == 200:
                            break
                await asyncio.sleep(0.1)
        yield url, proc
    finally:
        stop(proc)


async def stream_request(
    http: aiohttp.ClientSession, url: str, prompt: str, max_tokens: int, started: list | None = None
) -> dict:
    """One streamed completion: arrival times of its content chunks and its token count.

    started, if given, gets an entry when the first token arrives.
    """
    body = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    chunk_s, tokens = [], 0
    async with http.post(url + "/v1/completions", json=body) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            event = json.loads(line[6:])
            if any(choice.get("text") for choice in event["choices"]):  # token-bearing, not the final empty one
                chunk_s.append(time.perf_counter())
                if started is not None and len(chunk_s) == 1:
                    started.append(1)
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    end = time.perf_counter()
    return {"ttft_s": chunk_s[0] - start, "itl_s": list(np.diff(chunk_s)), "tokens": tokens, "start": start, "end": end}


async def run_clients(url: str, jobs: list[tuple[str, int]], concurrency: int) -> list[dict]:
    """Closed loop: `concurrency` clients take the next job as soon as their last one finishes."""
    queue = list(reversed(jobs))
    results = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as http:

        async def client():
            while queue:
                prompt, max_tokens = queue.pop()
                results.append(await stream_request(http, url, prompt, max_tokens))

        await asyncio.gather(*[client() for _ in range(concurrency)])
    return results


def summarize(results: list[dict]) -> dict:
    span_s = max(r["end"] for r in results) - min(r["start"] for r in results)
    itl = [x for r in results for x in r["itl_s"]]
    return {
        "requests": len(results),
        "output_tok_s": round(sum(r["tokens"] for r in results) / span_s, 1),
        "ttft_p50_ms": round(1000 * float(np.median([r["ttft_s"] for r in results])), 1),
        "itl_p50_ms": round(1000 * float(np.percentile(itl, 50)), 1) if itl else None,
        "itl_p99_ms": round(1000 * float(np.percentile(itl, 99)), 1) if itl else None,
        "e2e_mean_s": round(float(np.mean([r["end"] - r["start"] for r in results])), 2),
    }


# ---- (b)-(e) -------------------------------------------------------------------------------
async def concurrency_sweep(
    levels: list[int],
    output_tokens: int,
    llama_server_binary: str | None,
    runtimes: tuple[str, ...] = ("numpy",),
    threads: int = 2,
    rounds: int = 3,
) -> dict:
    """Total output tok/s at each level for each native runtime ('numpy', or 'torch:int8' style names) and
    llama-server's on the same GGUF, jobs and threads. All servers start at once, all paused (SIGSTOP) but
    the one measured. At each level every engine takes `rounds` short turns, round-robin (the order
    rotating), so load from elsewhere on the shared cores falls on all alike; tok/s is over all turns,
    and each ratio to llama-server is the median of the per-round ratios (robust to load swings)."""
    starts = {}
    for name in runtimes:
        runtime, _, dtype = name.partition(":")
        flags = [
            "--max-num-seqs",
            str(max(levels)),
            "--runtime",
            runtime,
            "--dtype",
            dtype or "int4",
            "--kv-cache-tokens",
            "16384",
        ]  # room for 64 streams; the default's 1.5 GB x 3 servers is not needed
        starts[f"native_{runtime}" + (f"_{dtype}" if dtype else "")] = lambda flags=flags: server(*flags)
    if llama_server_binary:
        starts["llama_server"] = lambda: llama_server(llama_server_binary, max(levels), threads)
    out = {"uptime_before": uptime(), "rounds": rounds, "output_tokens_per_request": output_tokens}
    async with contextlib.AsyncExitStack() as stack:
        engines = {}
        for name, start in starts.items():
            url, proc = await stack.enter_async_context(start())
            await run_clients(url, [(text_of(8), 4)], 1)  # warm up, then wait paused
            os.kill(proc.pid, signal.SIGSTOP)
            engines[name] = (url, proc)
        names = list(engines)
        for n in levels:
            jobs = [(text_of(20, offset=i), output_tokens) for i in range(n)]
            per_round: list[dict[str, float]] = []
            results: dict[str, list] = {name: [] for name in names}
            for r in range(rounds):
                tok_s = {}
                for name in names[r % len(names) :] + names[: r % len(names)]:
                    url, proc = engines[name]
                    os.kill(proc.pid, signal.SIGCONT)
                    await run_clients(url, [(text_of(8), 2)], 1)  # woken and serving
                    got = await run_clients(url, jobs, n)
                    os.kill(proc.pid, signal.SIGSTOP)
                    results[name].append(got)
                    tok_s[name] = summarize(got)["output_tok_s"]
                per_round.append(tok_s)
            level = {name: summarize_rounds(results[name]) for name in names}
            level["tok_s_per_round"] = per_round
            if "llama_server" in engines:
                level["tok_s_over_llama_server"] = {
                    name: round(float(np.median([t[name] / t["llama_server"] for t in per_round])), 2)
                    for name in names
                    if name != "llama_server"
                }
            out[f"streams_{n}"] = level
            print(json.dumps({f"streams_{n}": level}), flush=True)
    out["uptime_after"] = uptime()
    return out


def summarize_rounds(rounds: list[list[dict]]) -> dict:
    """summarize() over all turns, tok/s as all tokens over the turns' summed spans (pauses between excluded)."""
    merged = summarize([r for turn in rounds for r in turn])
    span_s = sum(max(r["end"] for r in turn) - min(r["start"] for r in turn) for turn in rounds)
    merged["output_tok_s"] = round(sum(r["tokens"] for turn in rounds for r in turn) / span_s, 1)
    return merged


def uptime() -> str:
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


async def batching_modes(n_requests: int, concurrency: int, max_output_tokens: int) -> dict:
    rng = np.random.default_rng(0)
    jobs = [(text_of(20, offset=i), int(rng.integers(8, max_output_tokens))) for i in range(n_requests)]
    out = {}
    for name, flags in (("continuous", ()), ("static", ("--static-batching",))):
        async with server("--max-num-seqs", str(concurrency), *flags) as (url, _):
            out[name] = summarize(await run_clients(url, jobs, concurrency))
    out["continuous_over_static_tok_s"] = round(out["continuous"]["output_tok_s"] / out["static"]["output_tok_s"], 2)
    return out


async def chunked_prefill(n_running: int, n_long: int, long_words: int, running_tokens: int) -> dict:
    out = {}
    for name, flags in (("chunked", ()), ("whole", ("--no-chunked-prefill", "--max-num-batched-tokens", "4096"))):
        async with server(*flags) as (url, _):
            async with aiohttp.ClientSession() as http:
                started = []
                running = [
                    asyncio.create_task(stream_request(http, url, text_of(10, i), running_tokens, started))
                    for i in range(n_running)
                ]
                while sum(started) < n_running:  # long prompts arrive while the streams decode
                    await asyncio.sleep(0.1)
                await asyncio.sleep(1.0)
                longs = [
                    asyncio.create_task(stream_request(http, url, text_of(long_words, 7 * i), 4)) for i in range(n_long)
                ]
                results = await asyncio.gather(*running)
                long_results = await asyncio.gather(*longs)
            out[name] = {**summarize(results), "long_prompt_ttft_p50_ms": summarize(long_results)["ttft_p50_ms"]}
    out["itl_p99_whole_over_chunked"] = round(out["whole"]["itl_p99_ms"] / out["chunked"]["itl_p99_ms"], 2)
    return out


async def prefix_caching(n_requests: int, prefix_words: int) -> dict:
    prefix = text_of(prefix_words)
    jobs = [(f"{prefix} question {i}: {text_of(6, i)}", 8) for i in range(n_requests)]
    out = {}
    for name, flags in (("on", ()), ("off", ("--no-prefix-caching",))):
        async with server(*flags) as (url, _):
            out[name] = summarize(await run_clients(url, jobs, 2))
    out["ttft_p50_off_over_on"] = round(out["off"]["ttft_p50_ms"] / out["on"]["ttft_p50_ms"], 2)
    return out


def default_llama_server() -> str:
    """$LLAMA_SERVER, else a cached build (a -noamx one first: the AMX build dies of SIGILL where the
    kernel does not grant AMX)."""
    if os.environ.get("LLAMA_SERVER"):
        return os.environ["LLAMA_SERVER"]
    found = glob.glob(os.path.expanduser("~/.cache/llm-serving-bench/llama-server-*/bin/llama-server"))
    return sorted(found, key=lambda path: ("noamx" in path, path))[-1] if found else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="a,b,c,d,e", help="comma-separated parts to run")
    parser.add_argument("--quick", action="store_true", help="smaller workloads, for a smoke run")
    parser.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads of every server in (b)-(e): OpenBLAS's (numpy), torch's, llama-server's -t "
        "(default: one per core)",
    )
    parser.add_argument(
        "--llama-server",
        default=default_llama_server(),
        help="llama-server binary for the side-by-side in (b); default: the cached build of "
        "benchmarks/build_llama_server.sh, if any ('' to skip)",
    )
    parser.add_argument(
        "--runtimes",
        default="numpy,torch:int4,torch:int8,torch:bf16" if importlib.util.find_spec("torch") else "numpy",
        help="native runtimes to compare in (a) and (b), comma-separated, torch as torch:DTYPE, "
        "auto as auto (it picks at start-up; its log says which) "
        "(default: numpy, and torch int4, int8 and bf16 when installed)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="(b): turns of each engine per level")
    parser.add_argument(
        "--levels",
        help="(b): concurrent streams, comma-separated (default 1,8,32,64; --quick 1,8); "
        "e.g. --only b --runtimes numpy,auto --levels 1,64: what auto chose against numpy",
    )
    parser.add_argument("--output-tokens", type=int, help="(b): tokens per request (default 64; --quick 16)")
    args = parser.parse_args()
    SERVER_FLAGS.extend(["--blas-threads", str(args.threads)])
    parts, q = set(args.only.split(",")), args.quick
    report = {}
    if "a" in parts:
        report["a_single_stream"] = {
            name: single_stream(32 if q else 128, args.threads, name) for name in args.runtimes.split(",")
        }
        print(json.dumps({"a_single_stream": report["a_single_stream"]}), flush=True)
    levels = [int(n) for n in args.levels.split(",")] if args.levels else [1, 8] if q else [1, 8, 32, 64]
    runs = {
        "b_concurrency": lambda: concurrency_sweep(
            levels,
            args.output_tokens or (16 if q else 64),
            args.llama_server or None,
            tuple(args.runtimes.split(",")),
            args.threads,
            2 if q else args.rounds,
        ),
        "c_batching": lambda: batching_modes(8 if q else 64, 4 if q else 16, 48 if q else 192),
        "d_chunked_prefill": lambda: chunked_prefill(
            4 if q else 8, 2 if q else 4, 300 if q else 1200, 48 if q else 160
        ),
        "e_prefix_caching": lambda: prefix_caching(6 if q else 16, 300 if q else 800),
    }
    for key, run in runs.items():
        if key[0] in parts:
            report[key] = asyncio.run(run())
            print(json.dumps({key: report[key]}), flush=True)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
