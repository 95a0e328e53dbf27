"""The engine's per-step trace (native engine, --step-trace) as engine_trace.json, a Chrome trace
that ui.perfetto.dev and chrome://tracing open, on the run's clock (microseconds from t0).

Tracks, one per kind of event (thread names in the file):
  tid 1 "steps"      one complete event (ph X) per step, named by its batch: prefill, decode or mixed
  tid 2 "forward"    the forward pass inside each step (the rest of a step is scheduling and sampling)
  tid 3 "scheduler"  instant events (ph i): preemption, prefix_hit
Counters (ph C, each its own track): batch (prefill_tokens, decode_seqs), kv_blocks_used,
requests (running, waiting).
Each step also keeps its numbers in `args`: prefill chunk sizes, bytes read, FLOPs.
"""

from __future__ import annotations

import json
import urllib.error
from dataclasses import dataclass, fields
from pathlib import Path

import orjson

from backends.base import http_get

PID = 1
TRACKS = {"steps": 1, "forward": 2, "scheduler": 3}


def fetch_steps(url: str, headers: dict | None = None, timeout_s: float = 30.0) -> tuple[dict | None, str | None]:
    """(the engine's /step_trace answer, None) or (None, why not)."""
    try:
        return json.loads(http_get(url, headers, timeout_s=timeout_s)), None
    except urllib.error.HTTPError as e:
        return None, f"{url} answers HTTP {e.code} (is the engine started with --step-trace?)"
    except (OSError, ValueError) as e:
        return None, f"{url}: {type(e).__name__}: {e}"


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One row of the engine's /step_trace answer (its `fields` name the columns)."""

    start_ns: int  # the engine's perf_counter_ns
    end_ns: int
    forward_ns: int
    prefill_chunks: list[int]
    decode_seqs: int
    kv_blocks_used: int
    preemptions: int
    prefix_hit_tokens: int
    bytes_read: int
    flops: int
    running: int
    waiting: int
    kv_positions_read: int | None = None  # None: an engine from before it was traced
    prefill_starts: list[int] | None = None  # the same


_ENGINE_STEP_COLUMNS = frozenset(f.name for f in fields(EngineStep))


def _engine_steps(raw: dict) -> list[EngineStep]:
    """The rows of a /step_trace answer; columns this version does not know are left out."""
    known = [(i, name) for i, name in enumerate(raw["fields"]) if name in _ENGINE_STEP_COLUMNS]
    return [EngineStep(**{name: row[i] for i, name in known}) for row in raw["steps"]]


def steps_on_run_clock(raw: dict, t0_ns: int, start_s: float | None = None, end_s: float | None = None) -> list[dict]:
    """One dict per step, times in seconds from t0; only steps that start inside [start_s, end_s]."""
    steps = []
    for rec in _engine_steps(raw):
        t_s = (rec.start_ns - t0_ns) / 1e9
        if (start_s is not None and t_s < start_s) or (end_s is not None and t_s > end_s):
            continue
        steps.append(
            {
                "t_s": t_s,
                "dur_s": max(rec.end_ns - rec.start_ns, 1) / 1e9,
                "forward_s": rec.forward_ns / 1e9,
                "prefill_tokens": sum(rec.prefill_chunks),
                "prefill_chunks": rec.prefill_chunks,
                "decode_seqs": rec.decode_seqs,
                "kv_blocks_used": rec.kv_blocks_used,
                "preemptions": rec.preemptions,
                "prefix_hit_tokens": rec.prefix_hit_tokens,
                "bytes_read": rec.bytes_read,
                "flops": rec.flops,
                "running": rec.running,
                "waiting": rec.waiting,
                "kv_positions_read": rec.kv_positions_read,
                "prefill_starts": rec.prefill_starts,
            }
        )
    return steps


def step_kind(step: dict) -> str:
    if step["prefill_tokens"] and step["decode_seqs"]:
        return "mixed"
    return "prefill" if step["prefill_tokens"] else "decode"


STEP_ARGS = (
    "prefill_tokens",
    "prefill_chunks",
    "decode_seqs",
    "kv_blocks_used",
    "bytes_read",
    "flops",
    "running",
    "waiting",
    "kv_positions_read",
    "prefill_starts",
)


def chrome_trace(steps: list[dict]) -> dict:
    events = [{"ph": "M", "pid": PID, "name": "process_name", "args": {"name": "native engine"}}]
    events += [
        {"ph": "M", "pid": PID, "tid": tid, "name": "thread_name", "args": {"name": name}}
        for name, tid in TRACKS.items()
    ]
    timed = [event for s in steps for event in _step_events(s)]
    timed.sort(key=lambda e: e["ts"])
    return {
        "traceEvents": events + timed,
        "displayTimeUnit": "ms",
        "otherData": {"clock": "microseconds from the run's t0 (requests.jsonl's clock)"},
    }


def _step_events(s: dict) -> list[dict]:
    """One step's slices (the step, its forward pass), counters (batch, KV blocks, requests) and instants."""
    ts, dur = s["t_s"] * 1e6, s["dur_s"] * 1e6
    args = {k: s.get(k) for k in STEP_ARGS}
    forward_us = max(min(s["forward_s"] * 1e6, dur), 0.001)
    batch = {"prefill_tokens": s["prefill_tokens"], "decode_seqs": s["decode_seqs"]}
    out = [
        {"ph": "X", "pid": PID, "tid": TRACKS["steps"], "name": step_kind(s), "ts": ts, "dur": dur, "args": args},
        {"ph": "X", "pid": PID, "tid": TRACKS["forward"], "name": "forward", "ts": ts, "dur": forward_us},
        {"ph": "C", "pid": PID, "name": "batch", "ts": ts, "args": batch},
        {"ph": "C", "pid": PID, "name": "kv_blocks_used", "ts": ts, "args": {"blocks": s["kv_blocks_used"]}},
        {
            "ph": "C",
            "pid": PID,
            "name": "requests",
            "ts": ts,
            "args": {"running": s["running"], "waiting": s["waiting"]},
        },
    ]
    for name, key in (("preemption", "preemptions"), ("prefix_hit", "prefix_hit_tokens")):
        if s[key]:
            scheduler = TRACKS["scheduler"]
            out.append(
                {"ph": "i", "s": "t", "pid": PID, "tid": scheduler, "name": name, "ts": ts, "args": {key: s[key]}}
            )
    return out


def write_engine_trace(path: Path, steps: list[dict]) -> None:
    # orjson: the same compact JSON ~10x faster than json's C encoder (a 20,000-request plan's 200,000 steps took
    # 4.2 of its 41 CPU-s in json.dumps here); numpy numbers as numbers
    Path(path).write_bytes(orjson.dumps(chrome_trace(steps), option=orjson.OPT_SERIALIZE_NUMPY))


def read_engine_trace(path: Path) -> list[dict]:
    """The steps back from an engine_trace.json (for the report's timeline): one dict per step."""
    trace = json.loads(Path(path).read_text())
    steps = []
    for e in trace["traceEvents"]:
        if e["ph"] == "X" and e["tid"] == TRACKS["steps"]:  # every event has a ph, every slice a tid
            steps.append({"t_s": e["ts"] / 1e6, "dur_s": e["dur"] / 1e6, "kind": e["name"], **e["args"]})
    return steps
