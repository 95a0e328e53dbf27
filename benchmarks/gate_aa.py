"""How often does `bench gate` cry wolf, and does it catch a real 20% slowdown?

One built-in engine (SmolLM2-135M) serves every run. Ten A/A pairs of a small closed-loop
scenario (scenarios/nightly.yaml, shrunk) are gated pair by pair: any regression verdict is a
false alarm. Then the same scenario runs through a proxy that stretches every stream by 20%
(each chunk is held until 1.2x its delay from the request's arrival: TTFT and every gap grow
20%, as from an engine 20% slower) and is gated against A runs: it should fail.

Run (CPU heavy, ~5 minutes on 2 cores): python benchmarks/gate_aa.py [--pairs 10] [--out /tmp/gate_aa]
Prints one JSON report.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import aiohttp
from aiohttp import web

SCENARIO = "scenarios/nightly.yaml"
SMALL = ["load.num_requests=24", "load.warmup_requests=2", "workload.input_tokens=32", "workload.output_tokens=16"]


def bench_run(url: str, out: Path, seed: int) -> None:
    # a new seed per run: same distribution, new prompts; with one seed every run after the first
    # would find its prompts in the engine's prefix cache, and the A/A pair would not be A/A
    sets = [f"backend.url={url}", "backend.kind=openai", "backend.launch=null", f"seed={seed}"] + SMALL
    cmd = [sys.executable, "-m", "harness", "run", SCENARIO, "--output", str(out), "--allow-client-bound"]
    for s in sets:
        cmd += ["--set", s]
    print(f"bench run -> {out}", file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"bench run failed ({proc.returncode}): {proc.stderr[-1500:]}")


def gate(base: Path, cur: Path) -> list[dict]:
    from reports.gate import compare, load_rules
    from reports.load import load_run
    verdicts = compare(load_run(base), load_run(cur), load_rules(Path("ci/gate.yaml")))
    return [{"metric": v.name, "verdict": v.verdict, "change": v.change, "ci": [v.ci_low, v.ci_high]}
            for v in verdicts]


# ---- the slowdown proxy (its own process, so it keeps its own time) -------------------------
def proxy_main(upstream: str, factor: float, port: int) -> None:
    async def forward(request: web.Request) -> web.StreamResponse:
        arrived = time.perf_counter()
        body = await request.read()
        session: aiohttp.ClientSession = request.app["session"]
        async with session.request(request.method, upstream + request.path_qs, data=body,
                                   headers={"Content-Type": "application/json"}) as up:
            resp = web.StreamResponse(status=up.status, headers={"Content-Type": up.headers.get("Content-Type", "")})
            await resp.prepare(request)
            # stamp arrivals in a reader task: sleeping before a write must not delay the next stamp
            queue: asyncio.Queue = asyncio.Queue()

            async def read():
                async for data in up.content.iter_any():
                    queue.put_nowait((time.perf_counter(), data))
                queue.put_nowait((None, b""))
            reader = asyncio.create_task(read())
            while True:
                t, data = await queue.get()
                if t is None:
                    break
                due = arrived + factor * (t - arrived)
                await asyncio.sleep(max(0.0, due - time.perf_counter()))
                try:
                    await resp.write(data)
                except ConnectionResetError:  # the client left (it only opened the connection)
                    reader.cancel()
                    return resp
            await reader
            await resp.write_eof()
            return resp

    async def main():
        app = web.Application()
        app["session"] = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=None))
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", port)
        await site.start()
        print(f"PORT {site._server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()
    asyncio.run(main())


def start_proxy(upstream: str, factor: float) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, __file__, "--proxy", upstream, "--factor", str(factor)],
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("PORT "):
        proc.kill()
        raise RuntimeError(f"proxy did not start: {line!r}")
    return proc, f"http://127.0.0.1:{int(line.split()[1])}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pairs", type=int, default=10)
    p.add_argument("--slow-runs", type=int, default=3)
    p.add_argument("--factor", type=float, default=1.2)
    p.add_argument("--out", type=Path, default=Path("/tmp/gate_aa"))
    p.add_argument("--max-minutes", type=float, default=12.0, help="start no new A/A pair after this")
    p.add_argument("--proxy", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.proxy:
        return proxy_main(args.proxy, args.factor, args.port)

    from harness.launcher import launch
    from harness.scenario import LaunchConfig

    args.out.mkdir(parents=True, exist_ok=True)
    engine = launch("native", LaunchConfig(), None, "smollm2", args.out / "engine.log")
    deadline = time.perf_counter() + args.max_minutes * 60
    started = time.perf_counter()
    pairs, slow = [], []
    try:
        bench_run(engine.url, args.out / "warmup", seed=0)  # a cold engine's first requests are slow: not measured
        # the first A/A pair, then the slowed runs, then the other pairs: a cut-short run still answers both questions
        for i in range(args.pairs):
            if i == 1 or (args.pairs == 1 and not slow):
                proxy, slow_url = start_proxy(engine.url, args.factor)
                try:
                    for k in range(args.slow_runs):
                        bench_run(slow_url, args.out / f"slow-{k:02d}", seed=1000 + k)
                        slow.append(args.out / f"slow-{k:02d}")
                finally:
                    proxy.terminate()
                    proxy.wait(timeout=10)
                write_report(args, pairs, slow, started)
            if time.perf_counter() > deadline:
                print(f"--max-minutes {args.max_minutes} reached after {len(pairs)} pairs", file=sys.stderr)
                break
            a, b = args.out / f"aa-{i:02d}-a", args.out / f"aa-{i:02d}-b"
            bench_run(engine.url, a, seed=2 * i + 1)
            bench_run(engine.url, b, seed=2 * i + 2)
            pairs.append((a, b))
            write_report(args, pairs, slow, started)
    finally:
        engine.stop()
    print(json.dumps(write_report(args, pairs, slow, started), indent=1))


def write_report(args, pairs, slow, started) -> dict:
    """Gates every pair so far and writes gate_aa.json (again after each step)."""
    aa = [gate(a, b) for a, b in pairs]
    false_alarms = [i for i, vs in enumerate(aa) if any(v["verdict"] == "regression" for v in vs)]
    injected = [gate(pairs[k % len(pairs)][0], s) for k, s in enumerate(slow)] if pairs else []
    caught = [i for i, vs in enumerate(injected) if any(v["verdict"] == "regression" for v in vs)]
    per_metric: dict = {}
    for vs in aa:
        for v in vs:
            per_metric.setdefault(v["metric"], {}).setdefault(v["verdict"], 0)
            per_metric[v["metric"]][v["verdict"]] += 1
    report = {
        "pairs": len(pairs), "false_alarm_pairs": len(false_alarms),
        "false_alarm_rate": len(false_alarms) / len(pairs) if pairs else None,
        "aa_verdicts_per_metric": per_metric, "aa_regressions": {i: aa[i] for i in false_alarms},
        "slowdown_factor": args.factor, "slow_runs": len(slow), "slowdown_caught": len(caught),
        "slowdown_verdicts": injected, "wall_s": round(time.perf_counter() - started, 1), "out": str(args.out)}
    (args.out / "gate_aa.json").write_text(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()
