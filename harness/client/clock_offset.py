"""How far another process's wall clock is from ours, and how well we know it: NTP's min-round-trip estimate.

One exchange: we read our clock (sent), the other side reads its clock (remote), we read ours again (back).
The remote reading happened somewhere in [sent, back] on our clock, so its offset (remote minus ours)
lies in [remote - back, remote - sent]: the midpoint is the estimate, half the round trip its bound.
Of many exchanges the one with the shortest round trip is kept, since its bound is the tightest (a
delay on either leg only widens the interval, it never moves the truth out of it).
Distributed runs (harness.client.ray.shards) use this to place every node's requests on the driver's timeline.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_EXCHANGES = 32


@dataclass
class ClockOffset:
    offset_s: float  # the other clock minus ours: add it to one of our times to get the other's reading
    uncertainty_s: float  # the true offset is within offset_s ± this (half the shortest round trip)
    round_trip_min_s: float
    exchanges: int


def measure_offset(
    read_remote_ns: Callable[[], int], exchanges: int = DEFAULT_EXCHANGES, clock_ns: Callable[[], int] = time.time_ns
) -> ClockOffset:
    """read_remote_ns: one round trip that returns the other side's wall clock (ns) read on its side."""
    if exchanges < 1:
        raise ValueError(f"exchanges: {exchanges} is not valid: at least one round trip is needed")
    best_rtt_ns, best_offset_ns = None, 0
    for _ in range(exchanges):
        sent = clock_ns()
        remote = read_remote_ns()
        back = clock_ns()
        rtt_ns = back - sent
        if best_rtt_ns is None or rtt_ns < best_rtt_ns:
            best_rtt_ns, best_offset_ns = rtt_ns, remote - (sent + back) // 2
    return ClockOffset(best_offset_ns / 1e9, best_rtt_ns / 2e9, best_rtt_ns / 1e9, exchanges)
