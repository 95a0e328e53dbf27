"""Turns a batch of logits into next tokens, one row per sequence.

Greedy rows take an argmax. Sampled rows go through temperature, min_p, top_k and top_p, then
inverse-CDF sampling with one uniform draw from the request's own generator, so a seeded
request gives the same tokens whatever else is in the batch. The work is done on whole
[rows, vocab] arrays; the only per-row Python is the uniform draw and top_k/top_p bookkeeping.
"""
from __future__ import annotations

import numpy as np

from native_engine.sequence import Sequence

# top_k/top_p sort only this many best tokens first, widening while a top_p nucleus does not
# fit: a full sort of a 49k vocabulary costs ~5 ms a row, the first try ~0.2 ms.
_CANDIDATES = (256, 4096)


def mask_stop_tokens(logits: np.ndarray, seqs: list[Sequence], eos_token_ids: list[int]) -> None:
    """min_tokens: forbid EOS and stop tokens until a sequence has produced enough tokens."""
    for row, seq in enumerate(seqs):
        p = seq.params
        if p.min_tokens and seq.num_output_tokens < p.min_tokens:
            banned = list(p.stop_token_ids) + ([] if p.ignore_eos else list(eos_token_ids))
            logits[row, banned] = -np.inf


def sample(logits: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
    """logits [n, vocab] float32 (modified in place) -> token ids [n] int64."""
    next_ids = np.empty(len(seqs), dtype=np.int64)
    greedy = np.fromiter((s.params.greedy for s in seqs), dtype=bool, count=len(seqs))
    if greedy.all():
        return np.argmax(logits, axis=1)
    if greedy.any():
        next_ids[greedy] = np.argmax(logits[greedy], axis=1)
    sampled_rows = np.flatnonzero(~greedy)
    if sampled_rows.size:
        next_ids[sampled_rows] = _sample_rows(logits[sampled_rows], [seqs[r] for r in sampled_rows])
    return next_ids


def _sample_rows(logits: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
    temps = np.array([s.params.temperature for s in seqs], dtype=np.float32)
    x = logits / temps[:, None]
    x -= x.max(axis=1, keepdims=True)
    probs = np.exp(x, out=x)
    probs /= probs.sum(axis=1, keepdims=True)

    min_p = np.array([s.params.min_p for s in seqs], dtype=np.float32)
    if min_p.any():
        probs[probs < (min_p * probs.max(axis=1))[:, None]] = 0.0

    for row, seq in enumerate(seqs):
        top_k, top_p = seq.params.top_k, seq.params.top_p
        if top_k > 0 or top_p < 1.0:
            _keep_top(probs[row], top_k, top_p)

    cdf = np.cumsum(probs, axis=1)
    u = np.array([s.rng.random() for s in seqs]) * cdf[:, -1]
    ids = (cdf < u[:, None]).sum(axis=1)
    return np.minimum(ids, probs.shape[1] - 1)


def _keep_top(p: np.ndarray, top_k: int, top_p: float) -> None:
    """Zero every entry of one probability row outside its top_k and its top_p nucleus."""
    vocab = p.shape[0]
    k = top_k if 0 < top_k < vocab else vocab
    for n in (*_CANDIDATES, vocab):
        # Sort only the n best; widen when a top_p nucleus does not fit inside them.
        n = min(max(k, n), vocab)
        order = np.argpartition(-p, n - 1)[:n] if n < vocab else np.arange(vocab)
        order = order[np.argsort(-p[order], kind="stable")]
        keep = order[:k]
        if top_p == 1.0:
            break
        base_mass = p[keep].sum() if k < vocab else p.sum()   # top_p applies after top_k
        if k < vocab or n == vocab or p[order].sum() >= top_p * base_mass:
            cum = np.cumsum(p[keep])
            # Keep the smallest head whose mass reaches top_p (the token crossing the line stays).
            keep = keep[:int(np.searchsorted(cum, top_p * base_mass)) + 1]
            break
    mask = np.zeros(vocab, dtype=bool)
    mask[keep] = True
    p[~mask] = 0.0
