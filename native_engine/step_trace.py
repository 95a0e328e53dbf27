"""What each engine step did, kept when the server runs with --step-trace (off by default).

One record per step that ran a forward pass: when it started and ended (perf_counter_ns, the
same monotonic clock as the harness on this machine, so steps line up with requests), the
forward pass's share, the batch (prefill tokens and their chunk sizes, decode sequences), KV
blocks in use, preemptions and prefix-cache hit tokens since the previous step, the bytes
read and FLOPs done, the KV positions the step's attention read (`bench plan`'s fitted step
model takes it as the batch's context) and where each prefill chunk starts in its sequence (a chunk's
attention grows with the tokens before it). GET /step_trace returns them; harness/engine/step_trace.py
turns them into a Chrome/Perfetto trace. Records are slotted StepRecords in a bounded deque: building and appending
one costs about a microsecond against steps of milliseconds (benchmarks/step_trace_cost.py measures it).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, fields
from operator import attrgetter


@dataclass(kw_only=True, slots=True)
class StepRecord:
    """One step that ran a forward pass; the field order is the order of /step_trace's columns."""

    start_ns: int  # perf_counter_ns when the step began (before the inbox was drained)
    end_ns: int
    forward_ns: int  # the forward pass's share of the step
    prefill_chunks: list[int]  # each prefill chunk's token count, in batch order
    decode_seqs: int
    kv_blocks_used: int
    preemptions: int  # since the previous step
    prefix_hit_tokens: int  # since the previous step
    bytes_read: int
    flops: int
    running: int
    waiting: int
    kv_positions_read: int  # the KV positions the step's attention read: the batch's context
    prefill_starts: list[int]  # where each prefill chunk starts in its sequence


FIELDS = tuple(f.name for f in fields(StepRecord))
_row = attrgetter(*FIELDS)


def step_flops(
    weight_params: int, lm_head_params: int, n_layers: int, q_dim: int, chunks: list[tuple[int, int]], n_logits: int
) -> int:
    """FLOPs of one forward pass: 2 per weight per token (matmuls), 2 per lm_head weight per
    sampled row, and attention's QK^T and AV, 4 * q_dim per (query token, context position).
    `chunks`: (start_pos, n_tokens) per sequence; a chunk attends to its own earlier tokens too."""
    n_tokens = sum(n for _, n in chunks)
    context_pairs = sum(n * start + n * (n + 1) // 2 for start, n in chunks)
    return 2 * weight_params * n_tokens + 2 * lm_head_params * n_logits + 4 * n_layers * q_dim * context_pairs


class StepTrace:
    def __init__(self, max_steps: int = 200_000):
        self.steps: deque[StepRecord] = deque(maxlen=max_steps)
        self.recorded = 0

    def record(self, step: StepRecord) -> None:
        self.steps.append(step)
        self.recorded += 1

    def as_dict(self) -> dict:
        """The JSON /step_trace answers: field names once, then one row per step."""
        rows = list(self.steps)
        return {
            "clock": "perf_counter_ns",
            "fields": list(FIELDS),
            "steps": [list(_row(r)) for r in rows],
            "dropped": self.recorded - len(rows),
        }
