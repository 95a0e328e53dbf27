"""Fixed shapes for captured (CUDA-graph) decode steps: the batch sizes to capture, and a decode step
padded to the next captured size. Pure numpy, so it is tested on machines without a GPU.

A graph replays the exact kernels it recorded, on the exact buffers, so a decode step must fit one
captured shape: its batch padded up to the next captured size, every block table padded to the same
number of blocks. Padding rows read and write one scratch block that the block manager never hands
out (the runner's cache has one block more), and attend to one key there, so they cannot touch a
real sequence and never divide by zero; their logits are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# vLLM's default capture sizes follow the same pattern: 1, 2, 4, then every 8.
SMALL_SIZES = (1, 2, 4)
STEP = 8


def capture_sizes(max_batch: int) -> list[int]:
    """Batch sizes to capture for up to max_batch concurrent sequences: 1, 2, 4, 8, 16, 24, ... >= max_batch."""
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    small = [s for s in SMALL_SIZES if s < max_batch]
    if max_batch <= SMALL_SIZES[-1]:
        return small + [max_batch]
    return small + list(range(STEP, max_batch + STEP, STEP))


def bucket_for(n: int, sizes: list[int]) -> int | None:
    """The smallest captured size holding n rows; None when n is above them all (the step runs eagerly)."""
    return next((s for s in sorted(sizes) if s >= n), None)


@dataclass(kw_only=True)
class PaddedDecode:
    """One decode step at a captured size; rows [0, n) are the real ones, in chunk order."""

    n: int
    tokens: np.ndarray  # [size] int64
    positions: np.ndarray  # [size] int64, for the RoPE rows
    slots: np.ndarray  # [size] int64 flat KV slot each row writes
    blocks: np.ndarray  # [size, max_blocks] int64
    key_bias: np.ndarray  # [size, 1, 1, max_blocks * block_size] float32: 0 for a valid key, -inf after


def pad_decode(
    tokens: list[int],
    positions: list[int],
    tables: list[list[int]],
    size: int,
    max_blocks: int,
    block_size: int,
    scratch_block: int,
) -> PaddedDecode | None:
    """Single-token chunks (token, position, block table each) padded to `size` rows and `max_blocks` blocks;
    None when one sequence's context needs more than max_blocks blocks (that step runs eagerly)."""
    n = len(tokens)
    if not 1 <= n <= size:
        raise ValueError(f"{n} rows do not fit a captured size of {size}")
    if any(pos // block_size >= max_blocks for pos in positions):
        return None
    blocks = np.full((size, max_blocks), scratch_block, dtype=np.int64)
    lengths = np.ones(size, dtype=np.int64)  # padding rows: one key (the scratch block's first slot)
    slots = np.full(size, scratch_block * block_size, dtype=np.int64)
    for row, (pos, table) in enumerate(zip(positions, tables)):
        used = pos // block_size + 1
        blocks[row, :used] = table[:used]
        lengths[row] = pos + 1
        slots[row] = table[pos // block_size] * block_size + pos % block_size
    valid = np.arange(max_blocks * block_size)[None, :] < lengths[:, None]
    key_bias = np.where(valid, np.float32(0), np.float32(-np.inf))[:, None, None, :]
    padded_tokens = np.zeros(size, dtype=np.int64)
    padded_tokens[:n] = tokens
    padded_positions = np.zeros(size, dtype=np.int64)
    padded_positions[:n] = positions
    return PaddedDecode(
        n=n, tokens=padded_tokens, positions=padded_positions, slots=slots, blocks=blocks, key_bias=key_bias
    )


def unpad(logits: np.ndarray, padded: PaddedDecode) -> np.ndarray:
    """The real rows' logits, C-contiguous (the sampler scans rows)."""
    return np.ascontiguousarray(logits[: padded.n])
