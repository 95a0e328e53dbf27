"""µs per send on the kernel-stamp path: how fast one core puts a closed loop's first wave on the wire.

A closed loop starts its N streams at t0 together, so the last request of that wave is sent
N sends after the first: (last written − first written) / (N − 1) is the whole per-request send path
(StampedClient.send_wave: one tight loop of sends, each request's bookkeeping after the wave) with nothing
else going on. The ground-truth server runs in its own process with a long TTFT so no answer arrives
during the wave. To compare two versions, run each checkout's copy of this file in turn (it imports the
harness next to it).

    flock /tmp/bench.lock python benchmarks/send_cost.py --streams 512 --pin
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent.parent), str(Path(__file__).resolve().parent.parent / "tests")]
from groundtruth_server import GroundTruthConfig, GroundTruthProcess, gt_request

from harness.client.runner import Runner, Target, run_blocking


def one_wave_us_per_send(url: str, streams: int) -> float:
    reqs = [gt_request(i, None, 2) for i in range(streams)]
    out = run_blocking(lambda: Runner(Target(url=url, stamps="kernel"), reqs, streams))
    written = sorted(r.request_written_s for r in out.records if r.request_written_s is not None)
    return (written[-1] - written[0]) / (len(written) - 1) * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=512)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument(
        "--pin",
        action="store_true",
        help="as benchmarks/fidelity.py --pin --client-rt: server on core 0, "
        "client on core 1, both at real-time priority (Linux, root)",
    )
    args = p.parse_args()
    prefix = ()
    if args.pin:
        prefix = ("chrt", "-f", "50", "taskset", "-c", "0")
        os.sched_setaffinity(0, {1})
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(40))
    with GroundTruthProcess(GroundTruthConfig(ttft_ms=200, itl_ms=1), prefix) as gt:
        url = f"http://127.0.0.1:{gt.port}"
        runs = [one_wave_us_per_send(url, args.streams) for _ in range(args.repeats)]
    # the least is the path's own cost; other processes on the shared cores only ever add to it
    print(
        f"{args.streams} streams, first wave: least {min(runs):.1f}, median {statistics.median(runs):.1f} µs per "
        f"send ({args.repeats} waves: {', '.join(f'{r:.1f}' for r in runs)})"
    )


if __name__ == "__main__":
    main()
