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
from pathlib import Path

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


def steps_on_run_clock(raw: dict, t0_ns: int, start_s: float | None = None, end_s: float | None = None) -> list[dict]:
    """One dict per step, times in seconds from t0; only steps that start inside [start_s, end_s]."""
    fields = raw["fields"]
    steps = []
    for row in raw["steps"]:
        rec = dict(zip(fields, row))
        t_s = (rec["start_ns"] - t0_ns) / 1e9
        if (start_s is not None and t_s < start_s) or (end_s is not None and t_s > end_s):
            continue
        chunks = rec["prefill_chunks"]
        steps.append(
            {
                "t_s": t_s,
                "dur_s": max(rec["end_ns"] - rec["start_ns"], 1) / 1e9,
                "forward_s": rec["forward_ns"] / 1e9,
                "prefill_tokens": sum(chunks),
                "prefill_chunks": chunks,
                "decode_seqs": rec["decode_seqs"],
                "kv_blocks_used": rec["kv_blocks_used"],
                "preemptions": rec["preemptions"],
                "prefix_hit_tokens": rec["prefix_hit_tokens"],
                "bytes_read": rec["bytes_read"],
                "flops": rec["flops"],
                "running": rec["running"],
                "waiting": rec["waiting"],
                "kv_positions_read": rec.get("kv_positions_read"),
                "prefill_starts": rec.get("prefill_starts"),
            }
        )  # None: traced before it was recorded
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
    with open(path, "w", encoding="utf-8") as f:
        json.dump(chrome_trace(steps), f, separators=(",", ":"))


def read_engine_trace(path: Path) -> list[dict]:
    """The steps back from an engine_trace.json (for the report's timeline): one dict per step."""
    trace = json.loads(Path(path).read_text())
    steps = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X" and e.get("tid") == TRACKS["steps"]:
            steps.append({"t_s": e["ts"] / 1e6, "dur_s": e["dur"] / 1e6, "kind": e["name"], **e["args"]})
    return steps
