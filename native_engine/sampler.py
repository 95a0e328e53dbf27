"""Turns a batch of logits into next tokens, one row per sequence.

Greedy rows take an argmax. Sampled rows go through temperature, min_p, top_k and top_p, then
inverse-CDF sampling with one uniform draw from the request's own generator, so a seeded
request gives the same tokens whatever else is in the batch. Passes over the vocabulary run
on whole [rows, vocab] arrays; per-row Python only touches short arrays (a few hundred
top_k/top_p candidates, one 512-token block of the draw).
"""
from __future__ import annotations

import numpy as np

from native_engine.sequence import Sequence

# top_k/top_p sort only the tokens within these factors of a row's best token (first the
# larger): a full sort of a 49k vocabulary costs ~5 ms a row, the candidates well under 0.1 ms.
_CANDIDATE_FLOORS = (1e-3, 1e-6)
_DRAW_BLOCK = 512


def mask_stop_tokens(logits: np.ndarray, seqs: list[Sequence], eos_token_ids: list[int]) -> None:
    """min_tokens: forbid EOS and stop tokens until a sequence has produced enough tokens."""
    for row, seq in enumerate(seqs):
        p = seq.params
        if p.min_tokens and seq.num_output_tokens < p.min_tokens:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
            logits[row, banned] = -np.inf


def sample(logits: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
    """logits [n, vocab] float32 (modified in place) -> token ids [n] int64."""
    greedy = np.fromiter((s.params.greedy for s in seqs), dtype=bool, count=len(seqs))
    if greedy.all():
        return np.argmax(logits, axis=1)
    if not greedy.any():
        return _sample_rows(logits, seqs)
    next_ids = np.argmax(logits, axis=1)
    sampled_rows = np.flatnonzero(~greedy)
    next_ids[sampled_rows] = _sample_rows(logits[sampled_rows], [seqs[r] for r in sampled_rows])
    return next_ids


def _sample_rows(logits: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
    """Temperature, min_p, top_k/top_p, then one inverse-CDF draw per row; logits is overwritten."""
    temps = np.array([s.params.temperature for s in seqs], dtype=np.float32)
    probs = logits
    probs /= temps[:, None]
    probs -= probs.max(axis=1, keepdims=True)
    np.exp(probs, out=probs)            # unnormalised; the best token of each row has weight 1

    min_p = np.array([s.params.min_p for s in seqs], dtype=np.float32)
    if min_p.any():
        probs[probs < min_p[:, None]] = 0.0   # min_p is relative to the best token, whose weight is 1

    top_k = np.array([s.params.top_k if s.params.top_k > 0 else 0 for s in seqs])
    top_p = np.array([s.params.top_p for s in seqs], dtype=np.float32)
    truncated = np.flatnonzero((top_k > 0) | (top_p < 1.0))
    if truncated.size:
        probs[truncated] = _truncate(probs[truncated], top_k[truncated], top_p[truncated])
    return _draw(probs, np.array([s.rng.random() for s in seqs]))


def _draw(probs: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Inverse-CDF draw per row, u in [0, 1). Two levels (blocks of the vocabulary, then one
    block) so no [rows, vocab] cumulative sum is ever built."""
    vocab = probs.shape[1]
    starts = np.arange(0, vocab, _DRAW_BLOCK)
    block_cdf = np.cumsum(np.add.reduceat(probs, starts, axis=1), axis=1, dtype=np.float64)
    targets = u * block_cdf[:, -1]
    ids = np.empty(len(probs), dtype=np.int64)
    for r in range(len(probs)):
        # side="right": never a zero-mass block or token.
        b = min(int(np.searchsorted(block_cdf[r], targets[r], side="right")), len(starts) - 1)
        segment = probs[r, starts[b]:starts[b] + _DRAW_BLOCK]
        within = targets[r] - (block_cdf[r, b - 1] if b else 0.0)
        i = int(np.searchsorted(np.cumsum(segment, dtype=np.float64), within, side="right"))
        if i >= len(segment):   # float rounding past the block's end: its last token with mass
            i = int(np.flatnonzero(segment)[-1])
        ids[r] = starts[b] + i
    return ids


def _truncate(p: np.ndarray, top_k: np.ndarray, top_p: np.ndarray) -> np.ndarray:
    """Zero entries outside each row's top_k (0: off) and top_p nucleus (taken after top_k).

    p is unnormalised with each row's best token at weight 1. Only candidates above a floor are
    sorted; the floor drops when they cannot hold the answer, down to a full sort.
    """
    vocab = p.shape[1]
    totals = p.sum(axis=1)
    for r, row in enumerate(p):
        k = int(top_k[r]) if 0 < top_k[r] < vocab else vocab
        for floor in (*_CANDIDATE_FLOORS, 0.0):
            candidates = row[row >= floor] if floor else row
            if len(candidates) < k < vocab:
                continue                                     # fewer than k candidates
            kept = -np.sort(-candidates)[:k]
            base = kept.sum() if k < vocab else totals[r]    # top_p is a share of what top_k kept
            if k == vocab and floor and kept.sum() < top_p[r] * base:
                continue                                     # the nucleus reaches below the floor
            cum = np.cumsum(kept)
            n_keep = min(int(np.searchsorted(cum, top_p[r] * base)) + 1, len(kept))  # the crossing token stays
            row[row < kept[n_keep - 1]] = 0.0
            break
    return p
