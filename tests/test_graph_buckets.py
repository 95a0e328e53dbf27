"""Fixed shapes for CUDA-graph decode steps: which sizes are captured and how a step is padded (no GPU needed)."""

import numpy as np
import pytest

from native_engine.graph_buckets import bucket_for, capture_sizes, pad_decode, unpad


def test_capture_sizes_cover_every_batch_up_to_the_largest():
    assert capture_sizes(64) == [1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64]
    assert capture_sizes(3) == [1, 2, 3]
    assert capture_sizes(10)[-1] == 16
    for max_batch in range(1, 70):
        sizes = capture_sizes(max_batch)
        assert all(bucket_for(n, sizes) >= n for n in range(1, max_batch + 1))
    with pytest.raises(ValueError, match="max_batch"):
        capture_sizes(0)


def test_bucket_is_the_next_captured_size_or_none_above():
    sizes = capture_sizes(64)
    assert [bucket_for(n, sizes) for n in (1, 3, 5, 8, 9, 33, 64)] == [1, 4, 8, 8, 16, 40, 64]
    assert bucket_for(65, sizes) is None


def test_padding_rows_touch_only_the_scratch_block():
    bs, scratch = 4, 99
    padded = pad_decode(
        [11, 12, 13], [5, 0, 8], [[7, 3], [2], [1, 4, 6]], size=4, max_blocks=3, block_size=bs, scratch_block=scratch
    )
    assert padded.n == 3
    assert padded.tokens.tolist() == [11, 12, 13, 0]
    assert padded.positions.tolist() == [5, 0, 8, 0]
    assert padded.slots.tolist() == [3 * bs + 1, 2 * bs, 6 * bs, scratch * bs]  # position 5: block 1 (id 3), offset 1
    assert padded.blocks.tolist() == [[7, 3, scratch], [2, scratch, scratch], [1, 4, 6], [scratch] * 3]
    valid = np.isfinite(padded.key_bias[:, 0, 0, :]).sum(axis=1)
    assert valid.tolist() == [6, 1, 9, 1]  # each row attends to its context; a padding row to one scratch key
    assert padded.key_bias.shape == (4, 1, 1, 12)


def test_a_context_beyond_the_captured_blocks_runs_eagerly_and_too_many_rows_are_refused():
    assert pad_decode([1], [8], [[0, 1, 2]], size=1, max_blocks=2, block_size=4, scratch_block=9) is None
    with pytest.raises(ValueError, match="captured size of 1"):
        pad_decode([1, 2], [0, 0], [[0], [1]], size=1, max_blocks=2, block_size=4, scratch_block=9)


def test_unpad_keeps_the_real_rows_contiguous():
    padded = pad_decode([1, 2], [0, 0], [[0], [1]], size=4, max_blocks=1, block_size=4, scratch_block=9)
    logits = np.arange(12, dtype=np.float32).reshape(4, 3)
    got = unpad(logits, padded)
    assert got.tolist() == [[0, 1, 2], [3, 4, 5]] and got.flags.c_contiguous
