"""What every peer tool's loader shares: the run it becomes, its statistics in our shape, its records.

A peer file becomes a `PeerRun`: `summary` holds the tool's own figures under our keys (`ttft_ms`, `tpot_ms`,
`itl_ms` / `itl_chunk_ms`, `e2e_ms`: mean, std, min, p50 ... max in ms, None where the tool gives none;
`requests`, `throughput`, `window_s`), so a report shows what the tool printed; `records` rebuild each request
from the tool's per-request data (times in seconds from the tool's first send), so distributions, goodput and
the gate's per-request samples follow our definitions; `differences` says where the tool's definitions are not
ours (docs/peers.md).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from harness.metrics.latencies import STAT_KEYS
from harness.results.folder import RequestRecord, ResultsError

# said of every peer file: the tools time a request from their own send, we from the schedule's (docs/metrics.md)
FROM_ACTUAL_SEND = (
    "TTFT and E2E count from the tool's own send of each request; ours count from the intended send, so a client "
    "that fell behind its schedule shows in ours and not in the tool's"
)


@dataclass
class PeerRun:
    tool: str  # "vLLM bench serve"
    version: str  # of the tool, as its file records it ("unknown" when it does not)
    path: Path
    run_info: dict  # our run.json shape: scenario (name, workload, load), backend, peer
    summary: dict  # our summary.json shape, the tool's figures
    records: list[RequestRecord]
    differences: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def stats_ms(**given) -> dict:
    """Our latency statistics (ms) with the tool's values where it has them, None elsewhere."""
    unknown = set(given) - set(STAT_KEYS)
    if unknown:
        raise ValueError(f"not a statistic of ours: {', '.join(sorted(unknown))}")
    return {k: None if given.get(k) is None else float(given[k]) for k in STAT_KEYS}


def read_json_file(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(obj, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def json_object_or_none(path: Path) -> dict | None:
    """The file's JSON object, or None when it is not one: how each tool's `matches` tells its files apart."""
    try:
        return read_json_file(path)
    except ResultsError:
        return None


def require(obj: dict, keys, path: Path, tool: str) -> None:
    missing = [k for k in keys if k not in obj]
    if missing:
        raise ResultsError(
            f"{path}: a {tool} result file lacks {', '.join(missing)}; pass the file the tool saved, unedited"
        )


def streamed_record(
    index: int,
    send_s: float,
    chunk_times_s: list[float],
    output_tokens: int,
    prompt_tokens: int,
    error: str = "",
    tokens_per_chunk: list[int] | None = None,
) -> RequestRecord:
    """One request rebuilt from a tool's times: sent at send_s, its token-bearing chunks at chunk_times_s."""
    rec = RequestRecord(index=index, intended_send_s=send_s, actual_send_s=send_s)
    rec.token_times_s = list(chunk_times_s)
    rec.tokens_per_chunk = list(tokens_per_chunk or [])
    rec.output_tokens = rec.output_tokens_counted = int(output_tokens or 0)
    rec.prompt_tokens = int(prompt_tokens or 0)
    rec.end_s = chunk_times_s[-1] if chunk_times_s else send_s
    if error or not chunk_times_s:
        rec.fail("peer_failed", error or "the tool recorded no token for this request")
    return rec


def chunk_times(send_s: float, ttft_s: float, gaps_s: list[float]) -> list[float]:
    """First chunk at send + TTFT, then each gap after the one before."""
    times = [send_s + ttft_s]
    for gap in gaps_s:
        times.append(times[-1] + gap)
    return times


def one_token_per_chunk(records: list[RequestRecord]) -> bool:
    """True when every completed request's chunks carried one token each (per-chunk ITL is then per-token ITL)."""
    done = [r for r in records if r.ok]
    return bool(done) and all(len(r.token_times_s) == r.output_tokens for r in done)
