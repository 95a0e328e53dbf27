"""telemetry.csv: one row per sampled value, `t_s,source,name,value`, on the run's clock.

t_s is seconds since the run's t0 (a time.perf_counter_ns() value), the same base as the
time columns of requests.jsonl, so a request and the counters around it line up by subtraction.
Rows are appended and flushed as each sample arrives (a killed run keeps what it saw), and kept
in memory too, for the summary figures. Rows that come after close() are dropped: once the
recorder has stopped, nothing more reaches the file.

source says where a value comes from: `gpu:0` (NVML), `dcgm:0` (dcgm-exporter), `host`,
`engine_process` (the engine's process tree), `engine_metrics` (the engine's /metrics).
Rows are in arrival order per source; a few (bandwidth utilisation, which needs the ceiling
measured at the end) are appended at stop with earlier t_s, so readers sort by t_s.
"""

from __future__ import annotations

import csv
import threading
from pathlib import Path

import numpy as np

COLUMNS = ["t_s", "source", "name", "value"]
Row = tuple[float, str, str, float]


class Unavailable(Exception):
    """Raised by a source (GPU, host, /metrics poller) that cannot be sampled at all here; the message
    says why, and goes into the run's `not_sampled`."""


class Timeline:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # sampler threads append concurrently
        self._file = open(self.path, "w", encoding="utf-8", newline="")
        self._csv = csv.writer(self._file)
        self._csv.writerow(COLUMNS)
        self._file.flush()
        self.rows: list[Row] = []
        self.write_error: str | None = None  # why the file stopped taking rows (a full disk); rows stay in memory
        # f(t_s, values) per sample appended, on the sampler's thread (the live view's GPU figures); one that raises
        # is dropped, never the sampler
        self.listeners: list = []

    def append(self, t_s: float, values: list[tuple[str, str, float]]) -> bool:
        """Write one sample's values at t_s. Returns False (and writes nothing) once closed."""
        rows = [(t_s, source, name, float(value)) for source, name, value in values]
        with self._lock:
            if self._file.closed:
                return False
            if self.write_error is None:
                try:
                    self._csv.writerows((f"{t:.6f}", s, n, repr(v)) for t, s, n, v in rows)
                    self._file.flush()
                except OSError as e:  # the summary's figures still come from the rows kept here
                    self.write_error = f"writing {self.path} failed: {e.strerror or e}; later samples are not in it"
            self.rows.extend(rows)
        for listener in list(self.listeners):
            try:
                listener(t_s, values)
            except Exception:  # noqa: BLE001 (a view's bug costs its figures, not the run's telemetry)
                self.listeners.remove(listener)
        return True

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                try:
                    self._file.close()
                except OSError:  # the buffer's last rows did not fit: write_error says so when append saw it
                    self.write_error = self.write_error or f"writing {self.path} failed at close"

    @property
    def closed(self) -> bool:
        return self._file.closed

    def series(self, source: str, name: str) -> tuple[np.ndarray, np.ndarray]:
        """(t_s, value) arrays of one series, sorted by time."""
        with self._lock:
            points = sorted((t, v) for t, s, n, v in self.rows if s == source and n == name)
        if not points:
            return np.empty(0), np.empty(0)
        t, v = zip(*points)
        return np.asarray(t), np.asarray(v)

    def sources_with(self, name: str) -> list[str]:
        """Every source that has a series called `name` (e.g. each GPU's DCGM_FI_PROF_DRAM_ACTIVE)."""
        with self._lock:
            return sorted({s for _, s, n, _ in self.rows if n == name})


def read_telemetry_csv(path: str | Path) -> list[Row]:
    """The rows of a telemetry.csv, sorted by t_s (for reports and tests)."""
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.reader(f)
        header = next(reader)
        if header != COLUMNS:
            raise ValueError(f"{path}: header {header} is not {COLUMNS}; is this a telemetry.csv?")
        rows = [(float(t), s, n, float(v)) for t, s, n, v in reader]
    return sorted(rows, key=lambda row: row[0])
