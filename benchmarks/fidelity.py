"""How truthful is the client? The harness against the ground-truth server at growing concurrency.

The server (its own process) streams TTFT 50 ms then one token every 10 ms and records when it
really wrote each chunk; the error is measured minus that truth, per request (TTFT) and per
gap (ITL). Open arrivals (default) are spaced so that `concurrency` streams are in flight;
`--arrival closed` runs N workers back to back (streams then start and end in bursts).

Token stamps (`--stamps`): `kernel` runs the stamped client (harness/client/stamped_http.py), whose records
hold the kernel's receive time and the loop's time of every chunk, so both are judged in the same run
(rows `kernel` and `kernel:loop`); `loop` runs the aiohttp path. Several are interleaved per level.
`--pin` puts the server on core 0 at real-time priority (chrt -f) and the client on core 1.

    python benchmarks/fidelity.py                      # 1, 16, 64, 128, 256
    python benchmarks/fidelity.py --concurrency 1 16 64 256 1024 --workers 2
    python benchmarks/fidelity.py --arrival closed --tokens 128 --concurrency 64 256 512 1024 --pin \
        --stamps kernel loop
    ray start --head --num-cpus 1 && ray start --address 127.0.0.1:6379 --num-cpus 1 \
        && python benchmarks/fidelity.py --mode ray --arrival closed --concurrency 64 256   # then: ray stop
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]
from groundtruth_server import GroundTruthConfig, GroundTruthProcess, errors_against_truth, fetch_stats, gt_request

from harness.client.runner import Target
from harness.client.workers import run_plan
from harness.metrics.latencies import client_bound_reasons, summarize


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)  # finished workers only; the server still runs
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _runqueue_wait_s() -> float:
    """Time this process's main thread was runnable but waited for a CPU (Linux schedstat)."""
    try:
        return int(Path("/proc/self/schedstat").read_text().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return float("nan")


def steady_concurrency(records, stream_s: float) -> float:
    """Streams in flight, sampled every ms, leaving out the first and last stream length
    (ramp-up and ramp-down)."""
    sends = np.array([r.actual_send_s for r in records])
    ends = np.array([r.end_s for r in records])
    grid = np.arange(sends.min() + stream_s, ends.max() - stream_s, 0.001)
    if grid.size == 0:
        return float("nan")
    return float(np.mean([np.count_nonzero((sends <= t) & (ends > t)) for t in grid]))


def run_local(reqs, target: Target, cap: int | None, workers: int):
    """The load from this machine's client processes (harness.client.workers)."""

    async def go():
        return await run_plan(reqs, target, cap, workers, lambda rec: None, asyncio.Event())

    import uvloop

    return uvloop.run(go())


def run_ray(reqs, target: Target, cap: int | None, workers: int):
    """The load from one client actor per node of a running Ray cluster (harness.client.ray.shards), the same path as
    `bench run --ray`: its address from RAY_ADDRESS (default auto: the cluster started on this machine with
    `ray start --head`, plus `ray start --address ...` for a second node). `workers` does not apply."""
    from harness.client.ray.shards import start_crew

    crew = start_crew(os.environ.get("RAY_ADDRESS", "auto"), reqs, cap)
    try:
        return asyncio.run(crew.run(target, lambda rec: None, asyncio.Event(), None, time.perf_counter_ns()))
    finally:
        crew.close()


# How the load is generated: this machine's client processes, or the actors of a Ray cluster
LOAD_MODES = {"local": run_local, "ray": run_ray}


def measure(
    url: str,
    concurrency: int,
    rounds: int,
    tokens: int,
    workers: int,
    ttft_ms: float,
    itl_ms: float,
    arrival: str,
    stamps: str = "auto",
    mode: str = "local",
) -> list[dict]:
    n = max(concurrency * rounds, 32)
    stream_s = (ttft_ms + (tokens - 1) * itl_ms) / 1e3
    if arrival == "closed":  # streams start and end together: the client sees bursts
        reqs = [gt_request(i, None, tokens) for i in range(n)]
    else:  # evenly spaced arrivals so that `concurrency` streams are in flight (Little's law)
        reqs = [gt_request(i, i * stream_s / concurrency, tokens) for i in range(n + concurrency)]
    fetch_stats(url)  # clear the server's records
    cpu0, wall0, wait0 = _cpu_s(), time.perf_counter(), _runqueue_wait_s()

    out = LOAD_MODES[mode](reqs, Target(url=url, stamps=stamps), concurrency if arrival == "closed" else None, workers)
    wall_s, cpu_s, wait_s = time.perf_counter() - wall0, _cpu_s() - cpu0, _runqueue_wait_s() - wait0
    stats = fetch_stats(url)
    sources = {r.stamp_source for r in out.records if r.ok}
    rows = [
        _row(
            out,
            stats,
            False,
            ("kernel" if sources == {"kernel"} else "loop") + f"/{stamps}",
            concurrency,
            workers,
            arrival,
            itl_ms,
            stream_s,
            wall_s,
            cpu_s,
            wait_s,
        )
    ]
    if sources == {"kernel"}:  # the loop's stamps of the same chunks, same run
        rows.append(
            _row(
                out, stats, True, "kernel:loop", concurrency, workers, arrival, itl_ms, stream_s, wall_s, cpu_s, wait_s
            )
        )
    return rows


def _end_read_lag_ms(records) -> float:
    """Mean time from the last token's arrival (kernel stamp) to the client reading it (loop stamp); nan without
    kernel stamps."""
    lags = [
        (r.token_loop_times_s[-1] - r.token_times_s[-1]) * 1e3
        for r in records
        if r.stamp_source == "kernel" and r.token_times_s and r.token_loop_times_s
    ]
    return float(np.mean(lags)) if lags else float("nan")


def shared_stamp_fraction(records) -> float:
    """Token chunks whose stamp is the previous chunk's: they came in one read (an upper bound for the first)."""
    shared = total = 0
    for r in records:
        shared += sum(a == b for a, b in zip(r.token_times_s, r.token_times_s[1:]))
        total += max(0, len(r.token_times_s) - 1)
    return shared / total if total else 0.0


def _row(out, stats, loop_stamps, stamps, concurrency, workers, arrival, itl_ms, stream_s, wall_s, cpu_s, wait_s):
    err = errors_against_truth(out.records, out.t0_ns, stats["records"], loop_stamps)
    summary = summarize(out.records, {}, out.loop_lag_s)
    client_part = np.add(err["send_lag_ms"], err["first_delivery_ms"])
    ttft_err, itl_err = np.asarray(err["ttft_err_ms"]), np.asarray(err["itl_err_ms"])
    ok = [r for r in out.records if r.ok]
    return {
        "stamps": stamps,
        "concurrency": concurrency,
        "workers": workers,
        "arrival": arrival,
        "nominal_tokens_per_s": concurrency * 1e3 / itl_ms,
        "streamed_tokens_per_s": summary.throughput.output_tokens_per_s,
        "achieved_concurrency_mean": summary.concurrency.mean,
        "steady_concurrency_mean": steady_concurrency(out.records, stream_s),
        "achieved_concurrency_max": summary.concurrency.max,
        "completed": summary.requests.completed,
        "failed": summary.requests.failed,
        "compared": len(ttft_err),
        "ttft_err_mean_ms": float(ttft_err.mean()),
        "ttft_err_p99_ms": float(np.percentile(ttft_err, 99)),
        "ttft_client_part_mean_ms": float(client_part.mean()),
        "way_in_mean_ms": float(np.mean(err["way_in_ms"])),
        "server_queue_mean_ms": float(np.mean(err["server_queue_ms"])),
        "delivery_p99_ms": float(np.percentile(err["delivery_ms"], 99)),
        # a closed loop's first wave (all due at t0) apart from the later sends (each due when its stream's previous
        # request ended)
        "send_lag_first_wave_mean_ms": _mean_send_lag_ms([r for r in ok if r.intended_send_s == 0.0]),
        "send_lag_later_mean_ms": _mean_send_lag_ms([r for r in ok if r.intended_send_s != 0.0]),
        # a closed loop's next request is due when the client read the previous answer's end (the loop's time), so
        # the client's lateness in reading it lowers the offered load instead of showing as send lag: shown here
        "end_read_lag_mean_ms": _end_read_lag_ms(ok),
        "itl_err_mean_ms": float(itl_err.mean()),
        "itl_err_p99_ms": float(np.percentile(np.abs(itl_err), 99)),
        "measured_ttft_mean_ms": summary.ttft_ms.mean,
        "measured_itl_p99_ms": summary.itl_ms.p99,
        "server_lateness_mean_ms": stats["lateness_ms"]["mean"],
        "server_lateness_p99_ms": stats["lateness_ms"]["p99"],
        "send_lag_p99_ms": summary.client_lag_ms.p99,
        "loop_lag_p99_ms": summary.event_loop_lag_ms.p99,
        "client_cpu_cores": cpu_s / wall_s,
        "wall_s": wall_s,
        "client_cpu_us_per_token": cpu_s / max(1, sum(r.output_tokens for r in ok)) * 1e6,
        "send_to_written_mean_ms": float(
            np.mean(
                [(r.request_written_s - r.actual_send_s) * 1e3 for r in ok if r.request_written_s is not None]
                or [np.nan]
            )
        ),
        "shared_stamp_fraction": shared_stamp_fraction(ok),
        "client_cpu_wait_ms_per_s": wait_s / wall_s * 1e3,  # runnable, no core free (workers not counted)
        "client_bound": bool(client_bound_reasons(summary)),
    }


def _mean_send_lag_ms(records) -> float:
    """Intended send -> request written, mean over `records` (nan for none)."""
    lags = [(r.request_written_s - r.intended_send_s) * 1e3 for r in records if r.request_written_s is not None]
    return float(np.mean(lags)) if lags else float("nan")


_FLOOR_RECEIVER = """
import asyncio, struct, sys, time
lat = []
class P(asyncio.Protocol):
    def data_received(self, d):
        now = time.perf_counter_ns()
        lat.extend((now - struct.unpack_from("q", d, i)[0]) / 1e6 for i in range(0, len(d) - 7, 8))
async def main():
    srv = await asyncio.get_running_loop().create_server(P, "127.0.0.1", 0)
    print(srv.sockets[0].getsockname()[1], flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    print(" ".join(f"{x:.4f}" for x in lat), flush=True)
asyncio.run(main())
"""


def machine_floor_ms(samples: int = 500, gap_s: float = 0.005) -> dict:
    """One-way latency of a bare loopback socket between two processes, 8 bytes at a time:
    what any client on this machine, at this moment, cannot beat."""
    import socket
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-c", _FLOOR_RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    port = int(proc.stdout.readline())
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for _ in range(samples):
            time.sleep(gap_s)
            sock.sendall(time.perf_counter_ns().to_bytes(8, "little", signed=True))
        time.sleep(0.05)
    proc.stdin.write("\n")
    proc.stdin.flush()
    lat = np.array([float(x) for x in proc.stdout.readline().split()])
    proc.wait(timeout=10)
    return {"p50": float(np.percentile(lat, 50)), "p99": float(np.percentile(lat, 99)), "max": float(lat.max())}


COLUMNS = [
    ("stamps", "stamps", "{}"),
    ("concurrency", "conc", "{:d}"),
    ("streamed_tokens_per_s", "tok/s", "{:.0f}"),
    ("steady_concurrency_mean", "in flight", "{:.1f}"),
    ("ttft_err_mean_ms", "TTFT err mean", "{:+.2f}"),
    ("ttft_err_p99_ms", "TTFT err p99", "{:+.2f}"),
    ("ttft_client_part_mean_ms", "client part", "{:+.2f}"),
    ("way_in_mean_ms", "way in", "{:.3f}"),
    ("server_queue_mean_ms", "srv read queue", "{:.2f}"),
    ("send_lag_first_wave_mean_ms", "send lag 1st wave", "{:.2f}"),
    ("send_lag_later_mean_ms", "send lag later", "{:.2f}"),
    ("end_read_lag_mean_ms", "end read lag", "{:.2f}"),
    ("itl_err_mean_ms", "ITL err mean", "{:+.3f}"),
    ("itl_err_p99_ms", "|ITL err| p99", "{:.2f}"),
    ("delivery_p99_ms", "delivery p99", "{:.2f}"),
    ("client_cpu_cores", "client CPU", "{:.2f}"),
    ("client_cpu_wait_ms_per_s", "CPU wait ms/s", "{:.0f}"),
    ("client_cpu_us_per_token", "CPU us/token", "{:.1f}"),
    ("send_to_written_mean_ms", "send->written", "{:.3f}"),
    ("shared_stamp_fraction", "shared stamps", "{:.3f}"),
    ("server_lateness_mean_ms", "srv late mean", "{:.2f}"),
    ("server_lateness_p99_ms", "srv late p99", "{:.2f}"),
    ("client_bound", "client-bound", "{}"),
]


def print_table(rows: list[dict]) -> None:
    print(" | ".join(h for _, h, _ in COLUMNS))
    print(" | ".join("---" for _ in COLUMNS))
    for row in rows:
        print(" | ".join(fmt.format(row[key]) for key, _, fmt in COLUMNS))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 128, 256])
    p.add_argument("--rounds", type=int, default=3, help="requests per stream slot")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per request")
    p.add_argument("--workers", type=int, default=1, help="client processes")
    p.add_argument(
        "--arrival",
        choices=["open", "closed"],
        default="open",
        help="open: evenly spaced arrivals keep `concurrency` streams in flight; closed: N workers",
    )
    p.add_argument("--ttft-ms", type=float, default=50.0)
    p.add_argument("--itl-ms", type=float, default=10.0)
    p.add_argument(
        "--stamps",
        nargs="+",
        choices=["auto", "kernel", "loop"],
        default=["auto"],
        help="kernel: the stamped client (kernel and loop stamps of one run); loop: aiohttp; interleaved",
    )
    p.add_argument("--mode", choices=sorted(LOAD_MODES), default="local", help="how the load is generated")
    p.add_argument(
        "--pin",
        action="store_true",
        help="server on core 0 at real-time priority (chrt -f 50), the client on core 1 (Linux, root)",
    )
    p.add_argument(
        "--client-rt",
        action="store_true",
        help="with --pin: the client at real-time priority too (chrt -f 40), out of other processes' way",
    )
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args()
    prefix = ()
    if args.pin:
        prefix = ("chrt", "-f", "50", "taskset", "-c", "0")
        os.sched_setaffinity(0, {1})
        if args.client_rt:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(40))
    floors = [machine_floor_ms()]
    rows = []
    uptimes = [_loadavg()]
    with GroundTruthProcess(GroundTruthConfig(args.ttft_ms, args.itl_ms), prefix) as gt:
        for c in args.concurrency:
            for stamps in args.stamps:
                for row in measure(
                    gt.url,
                    c,
                    args.rounds,
                    args.tokens,
                    args.workers,
                    args.ttft_ms,
                    args.itl_ms,
                    args.arrival,
                    stamps,
                    args.mode,
                ):
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    uptimes.append(_loadavg())
    floors.append(machine_floor_ms())
    print(
        f"\nground truth: TTFT {args.ttft_ms:g} ms, ITL {args.itl_ms:g} ms, {args.tokens} tokens/request, "
        f"{args.arrival} arrivals, {args.rounds} rounds, {args.workers} client process(es); "
        "errors are measured minus what "
        f"the server really did (ms)\n"
    )
    print_table(rows)
    print()
    for when, floor in zip(("before", "after"), floors):
        print(
            f"machine floor {when} (bare loopback socket, one way, two processes): p50 {floor['p50']:.2f} ms, "
            f"p99 {floor['p99']:.2f} ms, max {floor['max']:.2f} ms"
        )
    print(
        f"load average before {uptimes[0]}, after {uptimes[1]}"
        + (
            f" (server pinned to core 0, real-time; client core 1{', real-time' if args.client_rt else ''})"
            if args.pin
            else ""
        )
    )
    if args.json:
        args.json.write_text(json.dumps({"floor_ms": floors, "rows": rows}, indent=2))


def _loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "unknown"


if __name__ == "__main__":
    main()
