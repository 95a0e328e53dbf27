"""The results folder, written and read here only.

A run folder holds run.json (resolved scenario, versions, host), requests.jsonl (one record per
request, appended as each completes), summary.json, telemetry.csv, server_metrics.csv and the
engine's log when bench launched it. A sweep folder holds one run folder per point,
`point-NNN-<rate|concurrency>-<value>/`, and sweep.json (each point's status). A repeats folder
(one side of `bench gate`) holds run folders as direct sub-folders (`run-1/` ...).
Each JSON file is a model of harness/results/schema.py, checked as it is written (write_json) and read (read_model).
"""

from __future__ import annotations

import errno
import json
import math
import os
import platform
import re
import shutil
import socket
import sys
from dataclasses import dataclass, field, fields
from datetime import datetime, timezone
from functools import cache
from pathlib import Path

import numpy as np
import orjson
from pydantic import BaseModel, TypeAdapter, ValidationError

from harness.limits import MAX_TOKENS_PER_REQUEST, is_token_count
from harness.results.folder_lock import FolderBusy, FolderLock
from harness.results.schema import (
    SCHEMA_VERSION,
    Candidate,
    CandidatesManifest,
    Host,
    RunInfo,
    SchemaError,
    Summary,
    SweepManifest,
    SweepPoint,
    field_errors,
    validate,
)


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds from the run's t0 (perf_counter)."""

    index: int
    intended_send_s: float
    actual_send_s: float | None = None  # the client started sending
    request_written_s: float | None = None  # the HTTP library finished writing the request
    token_times_s: list[float] = field(default_factory=list)  # arrival of each token-bearing chunk
    # where token_times_s comes from: "kernel" (the socket's receive time of the read, SO_TIMESTAMPNS) or
    # "loop" (when the event loop returned the read); with kernel, token_loop_times_s holds the loop's times
    stamp_source: str = "loop"
    token_loop_times_s: list[float] = field(default_factory=list)
    tokens_per_chunk: list[int] = field(default_factory=list)
    # a reasoning model's thinking tokens, streamed apart from its answer (they are in token_times_s too), and
    # when the answer's first token came: None when no answer came (or a record from before this field)
    reasoning_tokens: int = 0
    first_answer_token_s: float | None = None
    end_s: float | None = None  # stream closed or failure noticed
    status: str = "ok"  # "ok" | "failed"
    error_reason: str | None = None
    error_detail: str | None = None
    http_status: int | None = None
    prompt_tokens: int = 0  # from usage when the server sends it, else the plan's count
    output_tokens: int = 0  # from usage when the server sends it, else counted chunks
    output_tokens_counted: int = 0
    output_tokens_usage: int | None = None
    token_count_mismatch: bool = False
    # a failed request whose token fields hold what arrived before it failed (a cut, stalled or aborted stream);
    # output_tokens is then the client's count of them
    partial: bool = False
    finish_reason: str | None = None
    # the `model` the stream's events named (None: they named none, or a record from before this field); a run
    # served by more than one is flagged in summary.json's validity (harness/metrics/validity.py)
    served_model: str | None = None
    # the engine's own account of the request, when its stream carries one: llama.cpp's `timings`
    # (prompt_ms, predicted_ms, predicted_n, ...), Ollama's durations converted to seconds (eval_s, ...)
    server_timings: dict = field(default_factory=dict)
    cap_wait_s: float = 0.0  # time spent waiting for a slot under load.concurrency
    is_warmup: bool = False
    session_id: int | None = None
    turn_index: int = 0
    # what the engine answered (workload.record_outputs, harness/scenario/answers.py): the text, or a SHA-256 of it;
    # and a
    # hash of the request's own prompt, so that two runs are compared only on the same prompts
    prompt_sha256: str | None = None
    output_text: str | None = None
    output_sha256: str | None = None
    answer_correct: bool | None = None  # a known-answer task's verdict on this answer (None: not scored)
    # an answer that generates nothing (backend.api: embeddings): how many inputs it embedded; such a record has no
    # token times, so no TTFT, ITL or TPOT, only its E2E (send to the answer's last byte, end_s)
    embedded_items: int | None = None
    model: str | None = None  # the model the request asked for, where workload.mix chose it (None: backend.model)
    # agentic sessions (harness/scenario/agentic.py): the turn's kind (user, tool_result, subagent, merge,
    # subagent_task) and, for a sub-agent's turn, the session that started it
    turn_kind: str | None = None
    parent_session_id: int | None = None
    # workload.images (harness/scenario/images.py): the image parts its user message carried and their files' bytes
    # (None: a run without images, or a record from before these fields)
    image_count: int | None = None
    image_bytes: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def fail(self, reason: str, detail: str = "") -> None:
        self.status, self.error_reason, self.error_detail = "failed", reason, detail[:500]

    def take_stream(self, parsed, t0_ns: int) -> None:
        """Fills the token fields from a parsed stream (backends.openai.ParsedStream). A count from the server that
        is not one (is_token_count) is stored as null, the local count is kept, and the request fails bad_usage. A
        stream whose tokens read but that breaks the format (parsed.malformed: events after [DONE], a model switch)
        fails with that reason and keeps its tokens."""
        bad = self._take_chunks(parsed, t0_ns)
        self.finish_reason = parsed.finish_reason
        self.server_timings = {
            k: v if not isinstance(v, float) or math.isfinite(v) else None for k, v in parsed.server_timings.items()
        }  # NaN is not JSON
        usage = parsed.usage_completion_tokens
        if usage is not None and not is_token_count(usage):
            bad.insert(0, _bad_count("usage.completion_tokens", usage))
            usage = None
        self.output_tokens_usage = usage
        # the server's count wins; a disagreement with the chunks counted is kept visible
        self.output_tokens = usage if usage is not None else self.output_tokens_counted
        self.token_count_mismatch = usage is not None and usage != self.output_tokens_counted
        if is_token_count(parsed.usage_prompt_tokens):
            self.prompt_tokens = parsed.usage_prompt_tokens
        elif parsed.usage_prompt_tokens is not None:  # the plan's count stays
            bad.append(_bad_count("usage.prompt_tokens", parsed.usage_prompt_tokens))
        self.embedded_items = parsed.embedded_items
        if parsed.malformed is not None:
            self.fail(*parsed.malformed)
        elif not parsed.token_times_ns and parsed.embedded_items is None:
            self.fail("no_tokens", "the stream carried no token")
        elif not parsed.saw_done and parsed.finish_reason is None:
            self.fail("stream_cut", "the stream ended without finish_reason or [DONE]")
        elif bad:
            self.fail("bad_usage", "; ".join(bad))

    def take_partial(self, parsed, t0_ns: int) -> None:
        """A failed request keeps what arrived before it failed: its chunks' times and the client's own count (the
        failure stays; metrics.summarize leaves failed requests out of the latency percentiles)."""
        self._take_chunks(parsed, t0_ns)
        self.output_tokens = self.output_tokens_counted
        self.partial = not self.ok and bool(self.token_times_s)

    def _take_chunks(self, parsed, t0_ns: int) -> list[str]:
        """Fills token_times_s, tokens_per_chunk and output_tokens_counted; returns what was wrong with the server's
        counts."""
        bad = []
        self.token_times_s = [(t - t0_ns) / 1e9 for t in parsed.token_times_ns]
        self.tokens_per_chunk = parsed.tokens_per_chunk
        if not all(is_token_count(k, least=1) for k in self.tokens_per_chunk):  # deltas of the running usage
            bad.append(_bad_count("tokens counted from running usage", max(self.tokens_per_chunk, key=_badness)))
            self.tokens_per_chunk = [1] * len(self.token_times_s)  # one a chunk: what the client counted itself
        self.output_tokens_counted = sum(self.tokens_per_chunk)
        self.reasoning_tokens = parsed.reasoning_tokens
        self.served_model = parsed.served_model
        # dialects without reasoning never set first_answer_chunk: their first token is the answer's
        answer = parsed.first_answer_chunk if parsed.reasoning_tokens else 0
        self.first_answer_token_s = self.token_times_s[answer] if answer is not None and self.token_times_s else None
        return bad

    def to_json(self) -> str:
        # vars, not asdict: the fields are flat (lists of numbers, one dict of numbers), and asdict's deep
        # copy of every token time cost ~1 ms a record (bench plan writes 100,000 of them). orjson, not json: the
        # same compact JSON (shortest floats that read back equal) ~10x faster on 128 token times (20 against
        # 214 us a record here), and a NaN becomes null, not json's invalid NaN; numpy numbers as numbers.
        return orjson.dumps(vars(self), option=orjson.OPT_SERIALIZE_NUMPY).decode()

    @classmethod
    def from_dict(cls, d: dict) -> RequestRecord:
        return cls(**d)


def validate_record(doc: dict) -> None:
    """One requests.jsonl line checked: exactly RequestRecord's fields, each of its type (SchemaError naming them).
    Records are not checked as they are written (a plan writes 100,000); the tests check whole folders."""
    unknown = set(doc) - {f.name for f in fields(RequestRecord)}
    if unknown:
        raise SchemaError(f"requests.jsonl: keys not in RequestRecord: {', '.join(sorted(unknown))}")
    try:
        _record_adapter().validate_python(doc)
    except ValidationError as e:
        raise SchemaError(f"requests.jsonl: {field_errors(e)}") from None


@cache
def _record_adapter() -> TypeAdapter:
    return TypeAdapter(RequestRecord)


def _bad_count(name: str, value) -> str:
    return (
        f"{name}: {value!r} from the server is not valid: must be a whole number from 0 to "
        f"{MAX_TOKENS_PER_REQUEST} (stored as null; the local count is kept)"
    )


def _badness(k) -> int:
    """Sorts a chunk's count before the valid ones when it is not one (to name the worst)."""
    return 0 if is_token_count(k, least=1) else 1


RUN_FILES = ("run.json", "requests.jsonl", "summary.json", "telemetry.csv", "server_metrics.csv", "engine.log")
MANIFEST = "sweep.json"
FULL_DISK = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)  # no room, over quota, over the file size limit
POINT_DIR = re.compile(r"^point-(\d+)-(rate|concurrency)-([0-9.]+)$")
SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ResultsError(Exception):
    """A results folder that cannot be written or read; the message names the path and the fix."""


class ResultsWriteFailed(Exception):
    """Writing a results file failed mid-run (a full disk, a folder gone read-only): the run ends (exit 4) with
    what was written so far; the message names the file, the OS's reason and the fix."""

    def __init__(self, path: Path, error: OSError) -> None:
        self.path, self.error = path, error
        super().__init__(
            f"writing {path} failed: {error.strerror or error}"
            + (" (the disk is full: free space or choose another --output)" if error.errno in FULL_DISK else "")
        )


# --- writing --------------------------------------------------------------------------------------


def default_output_dir(name: str, root: str | Path = "results") -> Path:
    """results/<name>-<UTC time>; a name that could leave `root` (`../x`, `a/b`) is refused."""
    if not SAFE_NAME.match(name):
        raise ResultsError(
            f"name: {name!r} cannot name a results folder; use letters, digits, '.', '_' and '-' "
            f"(no '/' and no leading '.'), or give --output"
        )
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(root) / f"{name}-{stamp}"


def holds_run(path: Path) -> bool:
    return any((path / name).exists() for name in ("run.json", "requests.jsonl", "summary.json"))


def lock_folder(path: str | Path) -> FolderLock:
    """Creates the folder and takes its lock (harness/results/folder_lock.py); a live run's folder is refused."""
    path = Path(path)
    _make_dir(path)
    try:
        return FolderLock.take(path)
    except FolderBusy as e:
        raise ResultsError(str(e)) from None
    except OSError as e:
        raise ResultsError(f"--output: cannot write in {path} ({e.strerror}); choose a writable folder") from None


def prepare_run_dir(path: str | Path, overwrite: bool = False) -> Path:
    """Empties a locked folder for a run: one that already holds a run is refused (a rerun would mix two runs'
    files), or with `overwrite` emptied of the run's files first."""
    path = Path(path)
    if holds_run(path):
        if not overwrite:
            raise ResultsError(
                f"--output: {path} already holds a run (run.json / requests.jsonl); choose a new "
                f"folder, or pass --overwrite to replace it"
            )
        for name in RUN_FILES:
            (path / name).unlink(missing_ok=True)
    return path


def prepare_sweep_dir(path: str | Path, overwrite: bool = False) -> FolderLock:
    """As prepare_run_dir, for a sweep: refused when it holds sweep.json, point folders or a run, or when a live run
    writes it or one of its points. Returns the sweep folder's lock: hold it while the sweep runs."""
    lock = lock_folder(path)
    try:
        _empty_sweep_dir(Path(path), overwrite)
    except BaseException:
        lock.release()
        raise
    return lock


def _empty_sweep_dir(path: Path, overwrite: bool) -> None:
    points = [p for p in path.iterdir() if p.is_dir() and POINT_DIR.match(p.name)]
    if (path / MANIFEST).exists() or points or holds_run(path):
        if not overwrite:
            raise ResultsError(
                f"--output: {path} already holds results (sweep.json or point folders); choose a "
                f"new folder, or pass --overwrite to replace them"
            )
        for p in points:
            try:
                FolderLock.check_free(p)
            except FolderBusy as e:
                raise ResultsError(str(e)) from None
        for p in points:
            shutil.rmtree(p)
        for name in (MANIFEST, *RUN_FILES):
            (path / name).unlink(missing_ok=True)


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ResultsError(
            f"--output: {path} (or a folder above it) is a file, not a folder; choose another path"
        ) from None
    except NotADirectoryError:
        raise ResultsError(f"--output: a part of {path} is a file, not a folder; choose another path") from None
    except PermissionError:
        raise ResultsError(f"--output: cannot create {path} (permission denied); choose a writable folder") from None
    except OSError as e:  # a read-only file system (EROFS), a full disk (ENOSPC)
        raise ResultsError(f"--output: cannot create {path} ({e.strerror}); choose a writable folder") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ResultsError(f"--output: {path} is not writable; choose a writable folder")


def versions() -> dict:
    from importlib import metadata

    import aiohttp

    try:
        harness_version = metadata.version("llm-serving-bench")
    except metadata.PackageNotFoundError:
        harness_version = "unknown"
    out = {"harness": harness_version, "python": sys.version.split()[0], "aiohttp": aiohttp.__version__}
    try:
        import uvloop

        out["uvloop"] = uvloop.__version__
    except ImportError:
        out["uvloop"] = None
    return out


def host_info() -> Host:
    return Host(
        hostname=socket.gethostname(),
        platform=platform.platform(),
        cpu_count=os.cpu_count(),
        machine=platform.machine(),
    )


class ResultWriter:
    """Owns the results folder, locked from here to close() (one writer per folder). Each record is appended and
    flushed when it completes, so a killed run still leaves every finished request on disk. A write that fails
    raises ResultsWriteFailed; after a failed append, later records are counted (records_unwritten), not written."""

    def __init__(self, out_dir: str | Path, overwrite: bool = False):
        self._lock = lock_folder(out_dir)
        try:
            self.dir = prepare_run_dir(out_dir, overwrite)
            self._requests = open(self.dir / "requests.jsonl", "w", encoding="utf-8")
        except OSError as e:
            self._lock.release()
            why = f"--output: cannot write in {out_dir} ({e.strerror}); choose a writable folder"
            raise ResultsError(why) from None
        except BaseException:
            self._lock.release()
            raise
        self.records_written = self.records_unwritten = 0
        self.write_failure: ResultsWriteFailed | None = None  # the first failed append

    def write_run_info(self, run_info: RunInfo) -> None:
        write_json(self.dir / "run.json", run_info)

    def append(self, record: RequestRecord) -> None:
        if self.write_failure is not None:
            self.records_unwritten += 1
            return
        line = record.to_json() + "\n"
        try:
            self._requests.write(line)
            self._requests.flush()
        except OSError as e:
            self.write_failure = ResultsWriteFailed(self.dir / "requests.jsonl", e)
            self.records_unwritten += 1
            raise self.write_failure from None
        self.records_written += 1

    def write_summary(self, summary: Summary) -> None:
        write_json(self.dir / "summary.json", summary)

    def close(self) -> None:
        if not self._requests.closed:
            try:
                self._requests.close()
            except OSError:  # the buffer's last bytes did not fit: append already said so
                pass
        self._lock.release()


def write_json(path: Path, doc: BaseModel) -> None:
    """A results file (its model in harness/results/schema.py) written whole or not at all: stamped with
    schema_version (in place: the caller's model is what the file holds), the fields its writer set (a key a run
    never reached stays out, a null it set stays in), then checked against the model; one that does not fit (a
    value assigned unchecked) is still written (a long run keeps its summary), then refused."""
    doc.schema_version = SCHEMA_VERSION
    data = doc.model_dump(exclude_unset=True)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(json.dumps(data, indent=2, default=str) + "\n", encoding="utf-8")
        os.replace(tmp, path)  # readers never see half a file
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise ResultsWriteFailed(path, e) from None
    validate(path.name, data)


# --- reading --------------------------------------------------------------------------------------


def read_records(out_dir: str | Path, warnings: list[str] | None = None) -> list[RequestRecord]:
    """Every record of requests.jsonl. A torn last line (a run killed while writing it) and keys this
    version does not know are skipped with a warning appended to `warnings`; any other bad line is a
    ResultsError naming the file and line."""
    path = Path(out_dir) / "requests.jsonl"
    warnings = [] if warnings is None else warnings
    try:
        lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    except OSError as e:
        raise ResultsError(f"{path}: cannot read ({e.strerror})") from None
    known = {f.name for f in fields(RequestRecord)}
    unknown: set[str] = set()
    records = []
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            if not isinstance(obj, dict):
                raise ValueError("not a JSON object")
            unknown |= set(obj) - known
            records.append(RequestRecord.from_dict({k: v for k, v in obj.items() if k in known}))
        except (ValueError, TypeError) as e:
            if i == last:
                warnings.append(f"{path} line {i + 1}: skipped a torn last line (the run was cut while writing it)")
                continue
            raise ResultsError(
                f"{path} line {i + 1}: not a request record ({e}); the file was edited or damaged"
            ) from None
    if unknown:
        warnings.append(f"{path}: ignored record keys this version does not know: {', '.join(sorted(unknown))}")
    return records


def read_model(path: Path) -> BaseModel | None:
    """A results file read into its model (harness/results/schema.MODELS, by file name); None when absent,
    ResultsError naming the field when it does not fit."""
    doc = read_json(path)
    if not doc:
        return None
    try:
        return validate(path.name, doc)
    except SchemaError as e:
        raise ResultsError(f"{path}: {e}") from None


def read_json(path: Path) -> dict:
    """A JSON file of the folder, {} when absent."""
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path}: not valid JSON ({e}); the run may have been cut while writing it") from None
    if not isinstance(obj, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def is_run_dir(path: Path) -> bool:
    return (path / "requests.jsonl").is_file()


def run_dirs(path: Path) -> list[Path]:
    """The run folders of one gate side: the folder itself, or its sub-folders that are runs (repeats)."""
    if not path.is_dir():
        raise ResultsError(f"{path}: not a folder; pass a run folder (with run.json) or a folder of run-N/ folders")
    if is_run_dir(path):
        return [path]
    dirs = sorted(p for p in path.iterdir() if p.is_dir() and is_run_dir(p))
    if not dirs:
        raise ResultsError(
            f"{path}: neither a run folder (no requests.jsonl) nor a folder of runs (no sub-folder "
            f"has one); pass what `bench run --output` wrote, or a folder of such run-N/ folders"
        )
    return dirs


# --- sweeps ---------------------------------------------------------------------------------------


def point_dir_name(index: int, kind: str, value: float) -> str:
    """point-NNN-rate-R or point-NNN-concurrency-C; positional digits (no exponent) so POINT_DIR reads it back."""
    return f"point-{index:03d}-{kind}-{np.format_float_positional(value, trim='-')}"


def parse_point_dir(name: str) -> tuple[int, str, float] | None:
    """(index, "rate"|"concurrency", offered load) from a point folder's name; None for other names."""
    match = POINT_DIR.match(name)
    return None if match is None else (int(match[1]), match[2], float(match[3]))


def point_dirs(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_dir() and POINT_DIR.match(p.name) and is_run_dir(p))


def write_manifest(out_dir: Path, kind: str, scenario: dict, points: list[SweepPoint]) -> None:
    """sweep.json: the load kind, the scenario and each point's index, offered load, folder and status."""
    unit = "requests/s" if kind == "rate" else "requests in flight"
    write_json(out_dir / MANIFEST, SweepManifest(kind=kind, unit=unit, scenario=scenario, points=points))


def read_statuses(out_dir: Path) -> dict[str, str]:
    """Point folder name -> status, from sweep.json; empty when the folder has none."""
    manifest: SweepManifest | None = read_model(Path(out_dir) / MANIFEST)
    return {p.dir: p.status for p in manifest.points} if manifest else {}


# --- candidates (harness/runs/candidates.py) -------------------------------------------------------------

CANDIDATES_MANIFEST = "candidates.json"


def write_candidates(out_dir: Path, scenario: dict, candidates: list[Candidate]) -> None:
    """candidates.json: the scenario and each candidate's name, folder, launch arguments, status."""
    write_json(out_dir / CANDIDATES_MANIFEST, CandidatesManifest(scenario=scenario, candidates=candidates))


def read_candidates(path: Path) -> list[Candidate]:
    """The candidates listed in a folder's candidates.json ([] for any other folder)."""
    manifest: CandidatesManifest | None = read_model(Path(path) / CANDIDATES_MANIFEST)
    return manifest.candidates if manifest else []
