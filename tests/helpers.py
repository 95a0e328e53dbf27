"""Helpers shared by several test modules (a test module never imports another test module)."""
from __future__ import annotations

import math

import numpy as np

from native_engine.model_runner import ModelRunner, SeqChunk

# What "the same output alone, batched, chunked, cached or preempted" really guarantees on any CPU.
# A step's shape picks the BLAS kernel (a matrix-vector product for one row, blocked gemm for many, and
# OpenBLAS's Haswell, Zen and SkylakeX kernels each sum in their own order), so the same token's logits
# differ in their last bits between shapes: up to 5.2e-5 on SmolLM2, 1.4e-5 on the tiny model
# (`python benchmarks/logit_noise.py`, the same under OPENBLAS_CORETYPE=Haswell and SkylakeX; docs/engine.md).
# Where the two best choices are closer than that, either may win. So tokens must be equal up to the first
# position where the decision was a near tie, and the tie is checked: a real divergence still fails.
NEAR_TIE_LOGIT_GAP = 1e-3  # greedy: top-1 minus top-2 logit, ~20x the largest shape-to-shape difference seen
NEAR_TIE_CDF_SHARE = 1e-4  # seeded sampling: the draw's distance from the two tokens' shared CDF edge, of the mass


def assert_same_tokens_up_to_near_tie(loaded, prompt: list[int], params, got: list[int], expected: list[int]):
    """got == expected, or they part at a position whose decision (from `expected`'s own logits there, one
    sequence alone) was a near tie between exactly the two tokens they chose. Returns where they parted
    (None: equal). params: the request's SamplingParams, greedy or plain temperature sampling with a seed."""
    if got == expected:
        return None
    position = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), None)
    assert position is not None, f"one output is a prefix of the other: {len(got)} vs {len(expected)} tokens"
    logits = _logits_after(loaded, prompt + expected[:position]).astype(np.float64)
    pair = (got[position], expected[position])
    if params.temperature == 0.0:
        _assert_greedy_tie(logits, pair, position)
    else:
        _assert_sampled_tie(logits, pair, position, params)
    return position


def _assert_greedy_tie(logits: np.ndarray, pair: tuple[int, int], position: int):
    top2 = np.argsort(-logits)[:2]
    gap = logits[top2[0]] - logits[top2[1]]
    assert set(pair) == set(top2.tolist()) and gap < NEAR_TIE_LOGIT_GAP, (
        f"greedy tokens part at output {position} ({pair[0]} vs {pair[1]}) where the best two are {top2.tolist()} "
        f"with a logit gap of {gap:.2e}, not a near tie (< {NEAR_TIE_LOGIT_GAP}): a real divergence")


def _assert_sampled_tie(logits: np.ndarray, pair: tuple[int, int], position: int, params):
    assert (params.top_k, params.top_p, params.min_p) in ((0, 1.0, 0.0), (-1, 1.0, 0.0)), \
        "near ties are worked out for plain temperature sampling only: set no top_k, top_p or min_p"
    rng = np.random.default_rng(params.seed)
    u = [rng.random() for _ in range(position + 1)][position]  # one draw per output token
    scaled = logits / params.temperature
    cdf = np.cumsum(np.exp(scaled - scaled.max()))
    low, high = sorted(pair)
    edge = cdf[low]  # where `low`'s share ends and, with nothing between them, `high`'s begins
    share = abs(u * cdf[-1] - edge) / cdf[-1]
    assert math.isclose(cdf[high - 1], edge) and share < NEAR_TIE_CDF_SHARE, (
        f"sampled tokens part at output {position} ({pair[0]} vs {pair[1]}) where the draw lies {share:.2e} of the "
        f"mass from their edge, not a near tie (< {NEAR_TIE_CDF_SHARE}): a real divergence")


def _logits_after(loaded, token_ids: list[int]) -> np.ndarray:
    """Next-token logits after token_ids, one sequence in one prefill chunk."""
    block_size = 16
    n_blocks = -(-len(token_ids) // block_size)
    runner = ModelRunner(loaded.config, loaded.weights, num_kv_blocks=n_blocks, kv_block_size=block_size)
    chunk = SeqChunk(token_ids, start_pos=0, block_table=list(range(n_blocks)), need_logits=True)
    return runner.forward([chunk])[0]
