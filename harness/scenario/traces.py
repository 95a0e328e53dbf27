"""Production request traces: when each request arrived and how long its prompt and answer were.

Three public formats are read into the same `TraceRow`s:
- Mooncake JSONL: `{"timestamp": ms since the first request, "input_length", "output_length", "hash_ids": [...]}`;
  each hash_id names one block of `load.trace_block_size` (default 512) prompt tokens, so rows
  sharing leading hash_ids share a prompt prefix.
- Azure LLM inference CSV: `TIMESTAMP,ContextTokens,GeneratedTokens`, TIMESTAMP a datetime string.
- BurstGPT CSV: `Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type`, Timestamp in seconds.
Rows come back sorted by arrival time, and the replay starts at the earliest; a file whose rows were out of
timestamp order, or held negative timestamps, is said in a warning (load_trace's `warnings`), not silently fixed.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.limits import MAX_SCHEDULE_S, MAX_TOKENS_PER_REQUEST
from harness.scenario.scenario import ScenarioError

TRACE_FORMATS = ("mooncake", "azure", "burstgpt")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
BURSTGPT_COLUMNS = ("Timestamp", "Request tokens", "Response tokens")


@dataclass(frozen=True)
class TraceRow:
    timestamp_s: float
    input_tokens: int
    output_tokens: int
    hash_ids: tuple[int, ...] | None = None
    line: int = field(default=0, compare=False)  # in the file, for error messages


def read_utf8(path: str | Path, field_path: str) -> str:
    """The file's text; a file that is not UTF-8 is a ScenarioError naming the field, file and line."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ScenarioError(
            f"{field_path}: {path} line {line}: not UTF-8 text (byte {data[error.start]:#04x}); save the file as UTF-8"
        ) from None


def detect_format(path: Path) -> str:
    """Mooncake for .jsonl/.json; for .csv the header tells Azure from BurstGPT."""
    if path.suffix in (".jsonl", ".json"):
        return "mooncake"
    if path.suffix == ".csv":
        header = next(csv.reader(io.StringIO(read_utf8(path, "load.trace"), newline="")), [])
        if all(column in header for column in AZURE_COLUMNS):
            return "azure"
        if all(column in header for column in BURSTGPT_COLUMNS):
            return "burstgpt"
        raise ScenarioError(
            f"load.trace: {path}: header {header} is neither Azure ({','.join(AZURE_COLUMNS)}) "
            f"nor BurstGPT ({','.join(BURSTGPT_COLUMNS)}); set load.trace_format"
        )
    raise ScenarioError(
        f"load.trace: {path}: cannot tell the format from the extension {path.suffix!r}; "
        f"set load.trace_format to one of {', '.join(TRACE_FORMATS)}"
    )


def load_trace(path: str | Path, trace_format: str = "auto", warnings: list[str] | None = None) -> list[TraceRow]:
    """The file's rows sorted by timestamp. `warnings` gets a line when that sort or the replay's start at the
    earliest row changes what the file says (reordering_said)."""
    path = Path(path)
    if not path.is_file():
        raise ScenarioError(f"load.trace: file {str(path)!r} not found (looked in {path.parent.resolve()})")
    if trace_format == "auto":
        trace_format = detect_format(path)
    readers = {"mooncake": _read_mooncake, "azure": _read_azure, "burstgpt": _read_burstgpt}
    if trace_format == "weka":  # sessions, not requests: harness/scenario/agentic_trace.py reads them
        raise ScenarioError("load.trace_format: weka traces hold agentic sessions; set workload.kind to agentic")
    if trace_format not in readers:
        raise ScenarioError(
            f"load.trace_format: {trace_format!r} is not valid: must be auto or one of {', '.join(TRACE_FORMATS)}"
        )
    rows = readers[trace_format](path)
    if not rows:
        raise ScenarioError(f"load.trace: {path}: no requests in the file")
    said = reordering_said(path, rows, relative=trace_format != "azure")
    if said and warnings is not None:
        warnings.append(said)
    rows.sort(key=lambda row: row.timestamp_s)  # stable: rows of one timestamp keep the file's order
    span_s = rows[-1].timestamp_s - rows[0].timestamp_s
    if span_s > MAX_SCHEDULE_S:  # a stray row would otherwise hold the run open for years, silently
        raise ScenarioError(
            f"load.trace: {path} line {rows[-1].line}: its timestamp is {span_s:.4g} s after the "
            f"first request (line {rows[0].line}), more than the limit of {MAX_SCHEDULE_S:g} s "
            "(7 days); check the row and the timestamps' unit (Mooncake: ms)"
        )
    return rows


def reordering_said(path: Path, rows: list[TraceRow], relative: bool) -> str | None:
    """What replaying the rows (in the file's order) changes, or None: rows earlier than a row above them are
    sorted; a negative timestamp (`relative` formats count from the trace's start: Mooncake, BurstGPT) becomes the
    replay's start, so every row is sent that much later than its timestamp says."""
    parts = []
    out_of_order: list[TraceRow] = []
    latest_s = -math.inf
    for row in rows:
        if row.timestamp_s < latest_s:
            out_of_order.append(row)
        latest_s = max(latest_s, row.timestamp_s)
    if out_of_order:
        first = out_of_order[0].line
        parts.append(
            f"1 row out of timestamp order (line {first}) was sorted into place"
            if len(out_of_order) == 1
            else f"{len(out_of_order)} rows out of timestamp order (first at line {first}) were sorted into place"
        )
    negative = [row for row in rows if row.timestamp_s < 0] if relative else []
    if negative:
        earliest = min(negative, key=lambda row: row.timestamp_s)
        where = f"line {earliest.line}, {earliest.timestamp_s:g} s"
        if len(negative) > 1:
            where = (
                f"first at line {negative[0].line}; the earliest {earliest.timestamp_s:g} s, at line {earliest.line}"
            )
        parts.append(
            f"{len(negative)} negative timestamp{'s' if len(negative) > 1 else ''} ({where}): the replay starts at "
            f"the earliest, so every row is sent {-earliest.timestamp_s:g} s later than its timestamp says"
        )
    return f"load.trace: {path}: {'; '.join(parts)}" if parts else None


def _whole_number(value: Any, where: str, limit: int | None = None) -> int:
    if isinstance(value, str):
        value = value.strip()
        value = int(value) if value.lstrip("-").isdigit() and len(value) < 30 else value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ScenarioError(f"{where}: {value!r} is not valid: must be a whole number >= 0")
    if limit is not None and value > limit:
        raise ScenarioError(f"{where}: {value} is not valid: must be at most the limit of {limit} tokens")
    return value


def _seconds(value: Any, where: str) -> float:
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ScenarioError(f"{where}: {value!r} is not valid: must be a number") from None
    if isinstance(value, bool) or not math.isfinite(seconds):
        raise ScenarioError(f"{where}: {value!r} is not valid: must be a finite number")
    return seconds


def read_jsonl(path, field: str):
    """Yields (where, record) for each non-blank line, `where` naming the scenario field, the file and
    the line for error messages; a line that is not JSON raises ScenarioError with its column."""
    for _, where, record in _numbered_jsonl(path, field):
        yield where, record


def _numbered_jsonl(path, field: str):
    for line_number, line in enumerate(read_utf8(path, field).split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{field}: {path} line {line_number}"
        try:
            yield line_number, where, json.loads(line.rstrip("\r"))
        except json.JSONDecodeError as error:
            raise ScenarioError(f"{where} column {error.colno}: not valid JSON: {error.msg}") from None
        except RecursionError:
            raise ScenarioError(f"{where}: nested too deeply to read as JSON") from None


class _MooncakeRecord(BaseModel):
    """A line of a Mooncake trace; keys it does not name are ignored. Its values are checked as the CSV
    formats' columns are (_seconds, _whole_number), so every format says the same of a bad number."""

    model_config = ConfigDict(extra="ignore")
    timestamp: Any  # ms since the first request
    input_length: Any
    output_length: Any
    hash_ids: list[Any] | None = None  # one id per block of load.trace_block_size prompt tokens

    @classmethod
    def read(cls, where: str, record: Any) -> _MooncakeRecord:
        if not isinstance(record, dict):
            raise ScenarioError(f"{where}: expected a JSON object, got {type(record).__name__}")
        try:
            return cls.model_validate(record)
        except ValidationError as error:
            first = error.errors()[0]
            if first["type"] == "missing":
                raise ScenarioError(
                    f"{where}: field {first['loc'][0]!r} is missing (Mooncake rows have timestamp in ms, "
                    "input_length, output_length, hash_ids)"
                ) from None
            # the other fields take any value here: only hash_ids can be of the wrong shape
            raise ScenarioError(
                f"{where} field 'hash_ids': {record['hash_ids']!r} is not valid: must be a list of ints"
            ) from None


def _read_mooncake(path: Path) -> list[TraceRow]:
    rows = []
    for line_number, where, record in _numbered_jsonl(path, "load.trace"):
        row = _MooncakeRecord.read(where, record)
        hash_ids = row.hash_ids
        if hash_ids is not None:
            hash_ids = tuple(_whole_number(h, f"{where} field 'hash_ids'") for h in hash_ids)
        rows.append(
            TraceRow(
                timestamp_s=_seconds(row.timestamp, f"{where} field 'timestamp'") / 1000.0,
                input_tokens=_whole_number(row.input_length, f"{where} field 'input_length'", MAX_TOKENS_PER_REQUEST),
                output_tokens=_whole_number(
                    row.output_length, f"{where} field 'output_length'", MAX_TOKENS_PER_REQUEST
                ),
                hash_ids=hash_ids,
                line=line_number,
            )
        )
    return rows


def _csv_records(path: Path, needed: tuple[str, ...]):
    """(line_number, record) pairs, after checking that the header has the needed columns."""
    reader = csv.DictReader(io.StringIO(read_utf8(path, "load.trace"), newline=""))
    missing = [column for column in needed if column not in (reader.fieldnames or [])]
    if missing:
        raise ScenarioError(
            f"load.trace: {path} line 1: header lacks column(s) {', '.join(missing)} (found {reader.fieldnames})"
        )
    for record in reader:
        yield reader.line_num, record


def _read_azure(path: Path) -> list[TraceRow]:
    rows = []
    for line_number, record in _csv_records(path, AZURE_COLUMNS):
        where = f"load.trace: {path} line {line_number} column"
        try:
            # Python 3.11 reads the trace's 7 fractional digits (it keeps 6).
            arrival = datetime.fromisoformat(record["TIMESTAMP"].strip())
        except (ValueError, AttributeError):
            raise ScenarioError(
                f"{where} TIMESTAMP: {record['TIMESTAMP']!r} is not valid: "
                "must be a datetime like 2023-11-16 18:15:46.6805900"
            ) from None
        rows.append(
            TraceRow(
                # Naive times read as UTC, so a daylight-saving change here cannot bend the gaps.
                timestamp_s=(arrival if arrival.tzinfo else arrival.replace(tzinfo=timezone.utc)).timestamp(),
                input_tokens=_whole_number(record["ContextTokens"], f"{where} ContextTokens", MAX_TOKENS_PER_REQUEST),
                output_tokens=_whole_number(
                    record["GeneratedTokens"], f"{where} GeneratedTokens", MAX_TOKENS_PER_REQUEST
                ),
                line=line_number,
            )
        )
    return rows


def _read_burstgpt(path: Path) -> list[TraceRow]:
    rows = []
    for line_number, record in _csv_records(path, BURSTGPT_COLUMNS):
        where = f"load.trace: {path} line {line_number} column"
        rows.append(
            TraceRow(
                timestamp_s=_seconds(record["Timestamp"], f"{where} Timestamp"),
                input_tokens=_whole_number(record["Request tokens"], f"{where} Request tokens", MAX_TOKENS_PER_REQUEST),
                output_tokens=_whole_number(
                    record["Response tokens"], f"{where} Response tokens", MAX_TOKENS_PER_REQUEST
                ),
                line=line_number,
            )
        )
    return rows
