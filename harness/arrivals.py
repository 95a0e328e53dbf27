"""When each request is due: offsets in seconds after the run starts, on one absolute timeline.

Open-loop arrivals do not wait for answers (the engine falls behind, the queue grows, as in
production); a closed loop keeps `concurrency` requests in flight and has no schedule (None).
- constant: gaps of exactly 1/rate
- poisson:  exponential gaps with mean 1/rate (coefficient of variation 1)
- gamma:    gamma gaps with shape = burstiness and scale = 1/(rate*shape): mean 1/rate,
            coefficient of variation 1/sqrt(burstiness); burstiness < 1 gives bursts and lulls
- trace:    the trace's own timestamps, relative to the first, times time_scale
The first arrival is at offset 0 so a run does not open with an idle gap.
"""

from __future__ import annotations

import numpy as np

OPEN_LOOP_ARRIVALS = ("constant", "poisson", "gamma")


def gaps_s(arrival: str, rate: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n gaps between consecutive arrivals, in seconds."""
    if arrival == "constant":
        return np.full(n, 1.0 / rate)
    if arrival == "poisson":
        return rng.exponential(1.0 / rate, size=n)
    if arrival == "gamma":
        return rng.gamma(burstiness, 1.0 / (rate * burstiness), size=n)
    raise ValueError(f"arrival {arrival!r} has no gaps; expected one of {', '.join(OPEN_LOOP_ARRIVALS)}")


def open_loop_offsets_s(arrival: str, rate: float, burstiness: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """Offsets of n arrivals: 0, then the running sum of n-1 gaps."""
    offsets = np.zeros(n)
    if n > 1:
        offsets[1:] = np.cumsum(gaps_s(arrival, rate, burstiness, n - 1, rng))
    return offsets


def open_loop_offsets_until_s(
    arrival: str, rate: float, burstiness: float, end_s: float, rng: np.random.Generator, max_count: int
) -> np.ndarray | None:
    """All arrivals with offset < end_s, or None when more than max_count would be needed."""
    offsets = [np.zeros(1)]
    last_s = 0.0
    count = 1
    # Draw in chunks sized by the expected count so a long run needs few calls.
    chunk = max(16, int(rate * end_s * 0.25))
    while last_s < end_s and count <= max_count:
        more = last_s + np.cumsum(gaps_s(arrival, rate, burstiness, chunk, rng))
        offsets.append(more)
        last_s = float(more[-1])
        count += chunk
    all_offsets = np.concatenate(offsets)
    all_offsets = all_offsets[all_offsets < end_s]
    if len(all_offsets) > max_count:
        return None
    return all_offsets


def trace_offsets_s(timestamps_s: np.ndarray | list[float], time_scale: float) -> np.ndarray:
    """Trace timestamps (any origin, sorted) as offsets from the first, scaled."""
    timestamps = np.asarray(timestamps_s, dtype=np.float64)
    if len(timestamps) == 0:
        return timestamps
    return (timestamps - timestamps[0]) * time_scale
