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

import csv
import functools
import io
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
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


class PeerFormat:
    """One shape of one tool's result file: how it is known by its content, and how it is read.

    A subclass names its tool, its shape (the versions it covers), the file suffixes it takes and `signature`, the
    top-level keys every file of the shape has: a file holding all of them is this shape; one holding some of them is
    a near miss, and the refusal names the keys it lacks (reports/peers/diagnose.py). `document` is the parsed file."""

    tool: str = ""
    shape: str = ""
    suffixes: tuple[str, ...] = (".json",)
    signature: tuple[str, ...] = ()
    hints: tuple[str, ...] = ()  # keys only this tool writes, not required: they tell a damaged file's tool apart
    top: type = dict  # what the file holds at its top: an object, or a list (JSON lines, vLLM's sweep summary)

    def keys(self, path: Path) -> set[str]:
        """The keys of the file's top-level object (of its last line, for JSON lines; of its first item, for a list)."""
        doc = document(path)
        if isinstance(doc, list) and doc:
            doc = doc[-1] if path.suffix == ".jsonl" else doc[0]
        return set(doc) if isinstance(doc, dict) else set()

    def matches(self, path: Path) -> bool:
        if path.suffix not in self.suffixes or not isinstance(document(path), self.top):
            return False
        return set(self.signature) <= self.keys(path)

    def load(self, path: Path) -> PeerRun:
        raise NotImplementedError

    def part_of(self, path: Path) -> Path | None:
        """The file this one is read with when both are there (AIPerf's records beside its figures), else None: a
        folder holding both is the other file's."""
        return None


def document(path: Path) -> Any:
    """The file parsed by its suffix (JSON, JSON lines as a list, YAML, CSV as rows of cells); None when it does not
    parse. Cached by path and modification time: every format's `matches` reads the same file."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return _parsed(path, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=64)
def _parsed(path: Path, _mtime_ns: int, _size: int) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".jsonl":
            return [json.loads(line) for line in text.splitlines() if line.strip()]
        if path.suffix in (".yaml", ".yml"):
            return yaml.safe_load(text)
        if path.suffix == ".csv":
            return [row for row in csv.reader(io.StringIO(text))]
        return json.loads(text)
    except (OSError, ValueError, UnicodeDecodeError, yaml.YAMLError):
        return None


def stats_of(given: dict | None, to_ms: float, names: dict[str, str] | None = None) -> dict:
    """Our statistics (ms) from a tool's statistics dict (`mean`, `median`/`p50`, `std`/`stddev`/`std_dev`, `min`,
    `max`, `p90`, `p95`, `p99`, `p999`/`p99.9`/`p99p9`), each times to_ms; `names` maps other keys of the tool onto
    ours. None for every statistic the tool does not give."""
    given = given or {}
    aliases = {
        "mean": ("mean", "avg"),
        "p50": ("median", "p50"),
        "std": ("std", "stddev", "std_dev"),
        "min": ("min",),
        "max": ("max",),
        "p90": ("p90",),
        "p95": ("p95",),
        "p99": ("p99",),
        "p999": ("p999", "p99.9", "p99p9"),
    }
    for theirs, ours in (names or {}).items():
        aliases[ours] = (theirs, *aliases[ours])
    out = {}
    for ours, keys in aliases.items():
        value = next((given[k] for k in keys if isinstance(given.get(k), (int, float))), None)
        out[ours] = None if value is None else float(value) * to_ms
    return stats_ms(**out)


def figures_summary(
    *,
    completed: int,
    failed: int,
    window_s: float | None,
    requests_per_s: float | None,
    output_tokens_per_s: float | None = None,
    total_tokens_per_s: float | None = None,
    output_tokens: int | None = None,
    latencies: dict[str, dict] | None = None,
) -> dict:
    """Our summary's shape with a tool's figures: counts, window, throughput and the latencies it gives (ms).

    A latency of a run with no completed request is left out: a tool writes 0.0 for a statistic of no sample (vLLM's
    failed runs), and that is not a latency of 0 ms."""
    summary = {
        "requests": {"measured": completed + failed, "completed": completed, "failed": failed},
        "window_s": window_s,
        "throughput": {
            "requests_per_s": requests_per_s,
            "output_tokens_per_s": output_tokens_per_s,
            "total_tokens_per_s": total_tokens_per_s,
        },
        "output_tokens": output_tokens,
    }
    if completed > 0:
        summary |= {name: stats for name, stats in (latencies or {}).items()}
    return summary


SUMMARY_ONLY = (
    "the file holds the tool's figures only, no per-request data: its percentiles are shown as the tool wrote them, "
    "but no distribution, goodput or SLO share can be computed from it (not established: no samples)"
)


def peer_run(path: Path, tool: str, version: str, run_info: dict, summary: dict, **kw) -> PeerRun:
    """A PeerRun of keyword parts (records, differences, warnings default empty)."""
    return PeerRun(
        tool, version, path, run_info, summary, kw.get("records", []), kw.get("differences", []), kw.get("warnings", [])
    )


def info(name: str, tool: str, *, model: str | None = None, load: dict | None = None, **peer) -> dict:
    """The run.json parts a peer file gives: the scenario's name and load, the model, and what it says of itself."""
    return {
        "scenario": {"name": name, "load": {k: v for k, v in (load or {}).items() if v is not None}},
        "backend": {"kind": f"{tool} (peer file)", "model": model},
        "peer": {"tool": tool, **peer},
    }
