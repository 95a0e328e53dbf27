"""The measured window: the stretch of a run where its load was steady, without the ramp-up and the drain
(docs/confidence.md#the-measured-window-ramp-up-and-drain-cut).

A run starts from an idle engine: the requests in flight climb from 0 to the load's steady level (the
ramp-up), and after the last request is sent they fall back to 0 (the drain). Requests measured there see
a lighter engine than the load's, and a window stretched over them dilutes its throughput. The rule:

- steady level: the time-weighted median of the requests in flight (intended send to stream end, so those
  a client-side cap holds back count too) between the first and the last send;
- ramp-up: until the in-flight count first reaches that level; drain: from the last send on, when no
  request arrives any more and the count can only fall. The window is the stretch in between;
- throughput and goodput per second count what happened inside the window (completions, output tokens by
  their arrival time) over its length; latencies come from the requests sent inside it, at least one median
  E2E before the drain, so a typical request's whole life lies in the window. Requests are chosen by their
  send time, never by their end: choosing by end would drop the long ones near the drain and flatter the tail.

The window is not cut (the whole run is measured, as before the rule) when its steady level is one request in
flight or none (requests one at a time: no batch to fill or to empty), when the load never settled: the
ramp-up would take more than MAX_RAMP_SHARE of the sending span (the in-flight count kept rising: an
over-saturated engine), or nothing is left between ramp-up and drain. `load.trim: false` (`bench run
--no-trim`) keeps everything too.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.results import schema
from harness.results.folder import RequestRecord

MAX_RAMP_SHARE = 1 / 3  # a ramp-up longer than this share of the sending span is no ramp-up: the load never settled
RULE = "in flight from first reaching its steady level (time-weighted median) to the last send"


@dataclass
class Window:
    start_s: float
    end_s: float
    latency_sent_until_s: float  # latencies: requests sent in [start_s, latency_sent_until_s]
    trimmed: bool
    note: str  # how the window was chosen, or why the run was not cut
    steady_in_flight: float | None = None

    @property
    def duration_s(self) -> float:
        return max(self.end_s - self.start_s, 0.0)

    def sent_inside(self, rec: RequestRecord) -> bool:
        """Whether the request's latencies count: sent after the ramp-up, early enough to live in the window."""
        return self.start_s <= rec.intended_send_s <= self.latency_sent_until_s

    def ended_inside(self, rec: RequestRecord) -> bool:
        """Whether the request's completion counts in the window's throughput."""
        return rec.end_s is not None and self.start_s <= rec.end_s <= self.end_s

    def summary(self, measured: list[RequestRecord]) -> schema.Window:
        """summary.json's `window`: its bounds (s from t0), how it was chosen and the requests it left out."""
        return schema.Window(
            start_s=self.start_s,
            end_s=self.end_s,
            latency_sent_until_s=self.latency_sent_until_s,
            trimmed=self.trimmed,
            note=self.note,
            steady_in_flight=self.steady_in_flight,
            duration_s=self.duration_s,
            rule=RULE,
            excluded=schema.Excluded(
                ramp_up=sum(r.intended_send_s < self.start_s for r in measured),
                drain=sum(r.intended_send_s > self.latency_sent_until_s for r in measured),
            ),
            latency_requests=sum(self.sent_inside(r) for r in measured),
        )


def whole_run(measured: list[RequestRecord], note: str = "not cut (load.trim: false)") -> Window:
    """The window of every measured request: first intended send to last end."""
    if not measured:
        return Window(0.0, 0.0, 0.0, False, "no measured request")
    start = min(r.intended_send_s for r in measured)
    end = max(max((r.end_s if r.end_s is not None else r.intended_send_s) for r in measured), start)
    return Window(start, end, end, False, note)


def steady_window(measured: list[RequestRecord]) -> Window:
    """The run's steady-state window by the rule above, or the whole run (with why) when it never settled."""
    sent = [r for r in measured if r.end_s is not None]
    if len(sent) < 2:
        return whole_run(measured, "not cut: fewer than 2 requests were sent")
    times, levels = in_flight_steps(sent)
    first_s, last_send_s = min(r.intended_send_s for r in sent), max(r.intended_send_s for r in sent)
    if last_send_s <= first_s:
        return whole_run(measured, "not cut: every request was sent at once (no steady stretch)")
    level = weighted_median_level(times, levels, first_s, last_send_s)
    if level <= 1:
        return whole_run(measured, f"not cut: {level:g} in flight at the steady level, no ramp-up or drain to cut")
    reached = np.nonzero((levels >= level) & (times <= last_send_s))[0]
    start_s = float(times[reached[0]]) if reached.size else last_send_s
    if start_s - first_s > MAX_RAMP_SHARE * (last_send_s - first_s):
        return whole_run(
            measured,
            f"not cut: the requests in flight took {start_s - first_s:.2f} s of the {last_send_s - first_s:.2f} s "
            f"of sending to reach their median ({level:g}): the load never settled",
        )
    e2e_s = [r.end_s - r.intended_send_s for r in sent if r.ok]
    median_e2e_s = float(np.median(e2e_s)) if e2e_s else 0.0
    latency_until_s = max(start_s, last_send_s - median_e2e_s)
    note = (
        f"ramp-up until {level:g} in flight, drain after the last send; latencies of the requests sent "
        f"by {latency_until_s:.2f} s (a median E2E before it)"
    )
    return Window(start_s, last_send_s, latency_until_s, True, note, level)


def in_flight_steps(records: list[RequestRecord]) -> tuple[np.ndarray, np.ndarray]:
    """The requests in flight as a step function: (event times, the count just after each event). A request counts
    from its intended send: one a client-side cap (load.concurrency) holds back is part of the load too, so a
    queue growing behind the cap reads as a load that never settles."""
    events = sorted([(r.intended_send_s, 1) for r in records] + [(r.end_s, -1) for r in records])
    times = np.array([t for t, _ in events], dtype=np.float64)
    levels = np.cumsum([step for _, step in events])
    return times, levels


def weighted_median_level(times: np.ndarray, levels: np.ndarray, start_s: float, end_s: float) -> float:
    """The in-flight count held for at least half of [start_s, end_s] at or below it (time-weighted median)."""
    edges = np.clip(np.append(times, end_s), start_s, end_s)
    held_s = np.diff(edges)  # how long each level lasted inside [start_s, end_s]
    order = np.argsort(levels, kind="stable")
    cumulative = np.cumsum(held_s[order])
    return float(levels[order][np.searchsorted(cumulative, cumulative[-1] / 2)])


def window_text(window: schema.Window) -> str:
    """summary.json's `window` in one line (console, reports): its bounds and what it left out, or why the run was
    not cut."""
    if not window.trimmed:
        return f"measured window: the whole run, {window.start_s:.2f}-{window.end_s:.2f} s ({window.note})"
    return (
        f"measured window: {window.start_s:.2f}-{window.end_s:.2f} s ({window.duration_s:.2f} s; "
        f"{window.note}); latencies of {window.latency_requests} requests, {window.excluded.ramp_up} sent in the "
        f"ramp-up and {window.excluded.drain} near the drain left out (--no-trim keeps them)"
    )
