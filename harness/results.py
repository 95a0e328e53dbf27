"""What one run leaves on disk: run.json, requests.jsonl (written as requests finish), summary.json."""
from __future__ import annotations

import json
import os
import platform
import socket
import sys
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path


@dataclass
class RequestRecord:
    """One request as the client saw it. Times are seconds from the run's t0 (perf_counter)."""
    index: int
    intended_send_s: float
    actual_send_s: float | None = None  # the client started sending
    request_written_s: float | None = None  # the HTTP library finished writing the request
    token_times_s: list[float] = field(default_factory=list)  # arrival of each token-bearing chunk
    tokens_per_chunk: list[int] = field(default_factory=list)
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
    finish_reason: str | None = None
    # the engine's own account of the request, when its stream carries one: llama.cpp's `timings`
    # (prompt_ms, predicted_ms, predicted_n, ...), Ollama's durations converted to seconds (eval_s, ...)
    server_timings: dict = field(default_factory=dict)
    cap_wait_s: float = 0.0  # time spent waiting for a slot under load.concurrency
    is_warmup: bool = False
    session_id: int | None = None
    turn_index: int = 0

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def fail(self, reason: str, detail: str = "") -> None:
        self.status, self.error_reason, self.error_detail = "failed", reason, detail[:500]

    def take_stream(self, parsed, t0_ns: int) -> None:
        """Fills the token fields from a parsed stream (backends.openai.ParsedStream)."""
        self.token_times_s = [(t - t0_ns) / 1e9 for t in parsed.token_times_ns]
        self.tokens_per_chunk = parsed.tokens_per_chunk
        self.finish_reason = parsed.finish_reason
        self.server_timings = dict(parsed.server_timings)
        self.output_tokens_counted = parsed.counted_tokens
        self.output_tokens_usage = usage = parsed.usage_completion_tokens
        # the server's count wins; a disagreement with the chunks counted is kept visible
        self.output_tokens = usage if usage is not None else parsed.counted_tokens
        self.token_count_mismatch = usage is not None and usage != parsed.counted_tokens
        if parsed.usage_prompt_tokens is not None:
            self.prompt_tokens = parsed.usage_prompt_tokens
        if not parsed.token_times_ns:
            self.fail("no_tokens", "the stream carried no token")
        elif not parsed.saw_done and parsed.finish_reason is None:
            self.fail("stream_cut", "the stream ended without finish_reason or [DONE]")

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_dict(cls, d: dict) -> "RequestRecord":
        return cls(**d)


def default_output_dir(name: str, root: str | Path = "results") -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return Path(root) / f"{name}-{stamp}"


def versions() -> dict:
    import aiohttp
    from importlib import metadata

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


def host_info() -> dict:
    return {"hostname": socket.gethostname(), "platform": platform.platform(),
            "cpu_count": os.cpu_count(), "machine": platform.machine()}


class ResultWriter:
    """Owns the results folder. Each record is appended and flushed when it completes,
    so a killed run still leaves every finished request on disk."""

    def __init__(self, out_dir: str | Path):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self._requests = open(self.dir / "requests.jsonl", "w", encoding="utf-8")  # a rerun into the same folder starts afresh
        self.records_written = 0

    def write_run_info(self, run_info: dict) -> None:
        self._write_json("run.json", run_info)

    def append(self, record: RequestRecord) -> None:
        self._requests.write(record.to_json() + "\n")
        self._requests.flush()
        self.records_written += 1

    def write_summary(self, summary: dict) -> None:
        self._write_json("summary.json", summary)

    def close(self) -> None:
        if not self._requests.closed:
            self._requests.close()

    def _write_json(self, name: str, obj: dict) -> None:
        write_json(self.dir / name, obj)


def write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)  # readers never see half a file


def read_records(out_dir: str | Path) -> list[RequestRecord]:
    path = Path(out_dir) / "requests.jsonl"
    return [RequestRecord.from_dict(json.loads(line)) for line in path.read_text().splitlines() if line]
