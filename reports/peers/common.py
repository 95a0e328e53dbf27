"""What every peer tool's loader shares: the run it becomes, its statistics in our shape, its records.

Each tool's file is read into small pydantic models of its own shape (`PeerModel`: the fields read, the rest
ignored), then becomes a `PeerRun`: `summary` holds the tool's own figures under our keys (`ttft_ms`, `tpot_ms`,
`itl_ms` / `itl_chunk_ms`, `e2e_ms`: mean, std, min, p50 ... max in ms, None where the tool gives none;
`requests`, `throughput`, `window_s`), so a report shows what the tool printed; `records` rebuild each request
from the tool's per-request data (times in seconds from the tool's first send), so distributions, goodput and
the gate's per-request samples follow our definitions; `differences` says where the tool's definitions are not
ours (docs/peers.md).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

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


class PeerModel(BaseModel):
    """A part of another tool's file: the fields read here, every other key ignored, and a null read as the field's
    default (the tools write null where they have no value, and their versions add and drop keys)."""

    model_config = ConfigDict(extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_as_absent(cls, data: Any) -> Any:
        if data is None:
            return {}
        if isinstance(data, dict):
            return {key: value for key, value in data.items() if value is not None}
        return data


Model = TypeVar("Model", bound=BaseModel)


def parse(model: type[Model], obj: Any, path: Path, tool: str) -> Model:
    """`obj` read as `model`; ResultsError naming the file and the first field that does not fit."""
    try:
        return model.model_validate(obj)
    except ValidationError as e:
        item = e.errors()[0]
        where = ".".join(str(part) for part in item["loc"])
        raise ResultsError(
            f"{path}: not a {tool} result file this reader knows ({where}: {item['msg']}); "
            "pass the file the tool saved, unedited"
        ) from None


class FlatLatency(PeerModel):
    """One latency's statistics as vLLM and SGLang write them, a key each: mean_ttft_ms, median_ttft_ms,
    std_ttft_ms, p99_ttft_ms ... (vLLM's percentiles as --metric-percentiles asked: p99.9_ttft_ms)."""

    mean: float | None = None
    median: float | None = None
    std: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    p999: float | None = Field(default=None, alias="p99.9")

    @classmethod
    def of(cls, obj: dict, metric: str, percentiles: Iterable[str]) -> FlatLatency:
        """The statistics of `metric` among a file's keys: mean, median, std and the `percentiles` named."""
        suffix = f"_{metric}_ms"
        wanted = {"mean", "median", "std", *percentiles}
        stats = {key.removesuffix(suffix): value for key, value in obj.items() if key.endswith(suffix)}
        return cls.model_validate({stat: value for stat, value in stats.items() if stat in wanted})

    def stats_ms(self) -> dict:
        """Ours: the median is our p50; min and max are not in the file."""
        return stats_ms(
            mean=self.mean, std=self.std, p50=self.median, p90=self.p90, p95=self.p95, p99=self.p99, p999=self.p999
        )


def read_json_file(path: Path) -> dict:
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not a readable JSON file ({e})") from None
    if not isinstance(obj, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_json_lines(path: Path) -> list:
    """Each line's JSON value (blank lines skipped)."""
    try:
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    except (OSError, ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not a readable JSON-lines file ({e})") from None


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
