"""`bench` as a user runs it: a fresh process of the harness CLI, for tests of the whole path."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

BENCH = [sys.executable, "-m", "harness"]


def bench(*args, timeout_s: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `bench ARGS...` to the end; output captured as text. env: the whole environment, if given."""
    return subprocess.run([*BENCH, *map(str, args)], capture_output=True, text=True, timeout=timeout_s, env=env)


def default_sigint() -> None:
    """In the child before exec: SIGINT's default disposition. A suite started as a background job (`pytest &` in a
    script, nohup) runs with SIGINT ignored, the child would inherit that, and bench rightly keeps an ignored
    SIGINT ignored (docs/faults.md): a test that sends Ctrl-C must give its bench a terminal's disposition."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bench_started(*args, env: dict | None = None) -> subprocess.Popen:
    """A `bench ARGS...` left running (to interrupt it); stdout and stderr piped as text; SIGINT as in a terminal."""
    return subprocess.Popen(
        [*BENCH, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=default_sigint,
    )


def wait_until_written(requests_file: Path, n_lines: int, timeout_s: float = 60) -> bool:
    """Waits until a running bench's requests_file holds n_lines records; False if timeout_s passed first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if requests_file.exists() and requests_file.read_text().count("\n") >= n_lines:
            return True
        time.sleep(0.05)
    return False


def interrupt_once_written(proc: subprocess.Popen, requests_file: Path, n_lines: int, timeout_s: float = 60) -> str:
    """Ctrl-C for a running `bench` once requests_file holds n_lines records (or timeout_s passed);
    returns its stderr after it exits."""
    wait_until_written(requests_file, n_lines, timeout_s)
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=timeout_s)[1]
