"""A synthetic Mooncake trace of multi-turn chat sessions, for workloads where routing matters.

Each session is a conversation: turn k's prompt is turn k-1's prompt, then turn k-1's answer, then the
new user message, so turn k's hash_ids are turn k-1's hash_ids followed by new blocks. Optionally every
session starts with the same system prompt blocks. Sessions start at Poisson times and their turns come
a think time apart, so the sessions interleave. The same config and seed write the same file.

Every block is whole (input_length = blocks x block_tokens, the answer rounded up to whole blocks in the
history): a Mooncake hash_id names a full block, and whole blocks keep turn k-1's prompt an exact
prefix of turn k's when the harness replays the trace (harness/scenario/workload.py, `load.trace_block_size`).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from harness.limits import MAX_REQUESTS, MAX_TOKENS_PER_REQUEST


@dataclass(frozen=True)
class SessionTraceConfig:
    sessions: int = 12
    turns: int = 4
    block_tokens: int = 16  # the scenario's load.trace_block_size must match
    system_blocks: int = 2  # shared by every session's prompt; 0: none
    user_blocks: tuple[int, int] = (3, 6)  # a user message, in blocks (uniform, inclusive)
    output_tokens: tuple[int, int] = (12, 24)  # an answer (uniform, inclusive)
    session_gap_s: float = 3.0  # mean time between session starts (exponential)
    think_time_s: tuple[float, float] = (10.0, 18.0)  # between a session's turns (uniform)
    seed: int = 0

    def check(self) -> None:
        """Raises ValueError naming the option and the fix."""
        for name in ("sessions", "turns", "block_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')}: must be at least 1, got {getattr(self, name)}")
        if self.sessions * self.turns > MAX_REQUESTS:
            raise ValueError(
                f"--sessions x --turns: {self.sessions * self.turns} requests, more than the limit of "
                f"{MAX_REQUESTS}; use fewer sessions"
            )
        if self.system_blocks < 0:
            raise ValueError(f"--system-blocks: must be 0 or more, got {self.system_blocks}")
        for name, (low, high), floor in (
            ("user_blocks", self.user_blocks, 1),
            ("output_tokens", self.output_tokens, 1),
            ("think_time_s", self.think_time_s, 0),
        ):
            if not floor <= low <= high:
                raise ValueError(f"--{name.replace('_', '-')}: {low}..{high} is not valid: need {floor} <= min <= max")
        if self.session_gap_s < 0:
            raise ValueError(f"--session-gap-s: must be 0 or more, got {self.session_gap_s}")
        longest = self.block_tokens * (
            self.system_blocks
            + self.turns * self.user_blocks[1]
            + (self.turns - 1) * math.ceil(self.output_tokens[1] / self.block_tokens)
        )
        if longest > MAX_TOKENS_PER_REQUEST:
            raise ValueError(
                f"--turns/--user-blocks: a last turn could reach {longest} tokens, more than the limit "
                f"of {MAX_TOKENS_PER_REQUEST}; use fewer turns or shorter messages"
            )


def session_trace_rows(config: SessionTraceConfig) -> list[dict]:
    """Mooncake rows (timestamp in ms, input_length, output_length, hash_ids) sorted by timestamp,
    each with its `session_id` and `turn` besides (a reader of the format ignores extra fields)."""
    config.check()
    rng = np.random.default_rng([config.seed, 11])
    next_id = config.system_blocks  # ids 0 .. system_blocks-1 are the shared system prompt

    def new_blocks(n: int) -> list[int]:
        nonlocal next_id
        next_id += n
        return list(range(next_id - n, next_id))

    rows = []
    start_s = 0.0
    for session in range(config.sessions):
        if session:
            start_s += float(rng.exponential(config.session_gap_s))
        context, at_s = list(range(config.system_blocks)), start_s
        for turn in range(config.turns):
            context += new_blocks(int(rng.integers(config.user_blocks[0], config.user_blocks[1] + 1)))
            output_tokens = int(rng.integers(config.output_tokens[0], config.output_tokens[1] + 1))
            rows.append(
                {
                    "timestamp": round(at_s * 1000),
                    "input_length": len(context) * config.block_tokens,
                    "output_length": output_tokens,
                    "hash_ids": list(context),
                    "session_id": session,
                    "turn": turn,
                }
            )
            context += new_blocks(math.ceil(output_tokens / config.block_tokens))  # the answer, in the history
            at_s += float(rng.uniform(*config.think_time_s))
    rows.sort(key=lambda row: (row["timestamp"], row["session_id"]))
    return rows


def write_session_trace(config: SessionTraceConfig, path: str | Path) -> list[dict]:
    """Writes the rows as JSONL (one row a line, the file ends with a newline); returns them."""
    rows = session_trace_rows(config)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return rows
