"""`bench` as a user runs it: a fresh process of the harness CLI, for tests of the whole path."""
from __future__ import annotations

import subprocess
import sys

BENCH = [sys.executable, "-m", "harness"]


def bench(*args, timeout_s: float = 120, env: dict | None = None) -> subprocess.CompletedProcess:
    """Runs `bench ARGS...` to the end; output captured as text. env: the whole environment, if given."""
    return subprocess.run([*BENCH, *map(str, args)], capture_output=True, text=True, timeout=timeout_s, env=env)


def bench_started(*args) -> subprocess.Popen:
    """A `bench ARGS...` left running (to interrupt it); stdout and stderr piped as text."""
    return subprocess.Popen([*BENCH, *map(str, args)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
