"""The largest numbers the harness accepts from a user or a server, in one place (docs/running.md "Limits").

Each bound is far above any real run and far below what exhausts memory or overflows a clock:
a value past one is a typo or a broken server, and is reported naming its field instead of
becoming a MemoryError, an OverflowError or a run that never ends.
"""

from __future__ import annotations

MAX_REQUESTS = 1_000_000  # load.num_requests, max_requests, warmup_requests; a plan is kept in memory
MAX_RATE_PER_S = 100_000.0  # load.rate and open-loop load.sweep values
MAX_CONCURRENCY = 100_000  # load.concurrency and closed-loop load.sweep values: one socket each
MAX_SCHEDULE_S = 7 * 24 * 3600.0  # seconds: duration_s, timeouts, a trace's span, num_requests / rate
MAX_TOKENS_PER_REQUEST = 1_000_000  # token lengths asked or read from a trace, and a server's usage counts
MAX_WORKERS_PER_CORE = 2  # client processes: more cannot help, they only compete for the cores
DEFAULT_MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # backend.max_response_bytes: one answer, buffered whole


def is_token_count(value, least: int = 0) -> bool:
    """Whether a server's token count is one: a whole number (not a bool, not 1e12 as a float) from `least` to
    MAX_TOKENS_PER_REQUEST."""
    return isinstance(value, int) and not isinstance(value, bool) and least <= value <= MAX_TOKENS_PER_REQUEST
