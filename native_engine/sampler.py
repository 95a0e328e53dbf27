"""Turns a batch of logits into next tokens, one row per sequence.

Greedy rows take an argmax. Sampled rows go through temperature, min_p, top_k and top_p, then
inverse-CDF sampling with one uniform draw from the request's own generator, so a seeded
request gets the same draws whatever else is in the batch (and so the same tokens, up to a
near tie: docs/engine.md). Passes over the vocabulary run
on whole [rows, vocab] arrays; per-row Python only touches short arrays (a few hundred
top_k/top_p candidates, one 512-token block of the draw).
"""

from __future__ import annotations

import os

import numpy as np

from native_engine.sequence import Sequence

# TEST ONLY: a deliberately broken draft verifier that keeps every greedy draft, right or wrong, so that tests can
# show `bench compare-outputs` catching an engine whose speculative decoding changes the answers. Never set it in
# a measurement: the answers are then wrong by design (docs/quality.md).
BROKEN_VERIFIER_ENV = "NATIVE_ENGINE_TEST_BROKEN_VERIFIER"

# top_k/top_p sort only the tokens within these factors of a row's best token (first the
# larger): a full sort of a 49k vocabulary costs ~5 ms a row, the candidates well under 0.1 ms.
_CANDIDATE_FLOORS = (1e-3, 1e-6)
_DRAW_BLOCK = 512


def mask_stop_tokens(
    logits: np.ndarray, seqs: list[Sequence], eos_token_ids: list[int], num_output_tokens: list[int] | None = None
) -> None:
    """min_tokens: forbid EOS and stop tokens until a sequence has produced enough tokens.

    num_output_tokens: the output count each row's token would follow, where a sequence has
    several rows (speculative verification); default: each sequence's count now."""
    for row, seq in enumerate(seqs):
        p = seq.params
        done = seq.num_output_tokens if num_output_tokens is None else num_output_tokens[row]
        if p.min_tokens and done < p.min_tokens:
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
    return _draw(_probabilities(logits, seqs), np.array([s.rng.random() for s in seqs]))


def _probabilities(logits: np.ndarray, seqs: list[Sequence]) -> np.ndarray:
    """Rows of unnormalised probabilities after temperature, min_p, top_k/top_p, in logits' memory."""
    temps = np.array([s.params.temperature for s in seqs], dtype=np.float32)
    probs = logits
    probs /= temps[:, None]
    probs -= probs.max(axis=1, keepdims=True)
    np.exp(probs, out=probs)  # unnormalised; the best token of each row has weight 1

    min_p = np.array([s.params.min_p for s in seqs], dtype=np.float32)
    if min_p.any():
        probs[probs < min_p[:, None]] = 0.0  # min_p is relative to the best token, whose weight is 1

    top_k = np.array([s.params.top_k if s.params.top_k > 0 else 0 for s in seqs])
    top_p = np.array([s.params.top_p for s in seqs], dtype=np.float32)
    truncated = np.flatnonzero((top_k > 0) | (top_p < 1.0))
    if truncated.size:
        probs[truncated] = _truncate(probs[truncated], top_k[truncated], top_p[truncated])
    return probs


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
        segment = probs[r, starts[b] : starts[b] + _DRAW_BLOCK]
        within = targets[r] - (block_cdf[r, b - 1] if b else 0.0)
        i = int(np.searchsorted(np.cumsum(segment, dtype=np.float64), within, side="right"))
        if i >= len(segment):  # float rounding past the block's end: its last token with mass
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
                continue  # fewer than k candidates
            kept = -np.sort(-candidates)[:k]
            base = kept.sum() if k < vocab else totals[r]  # top_p is a share of what top_k kept
            if k == vocab and floor and kept.sum() < top_p[r] * base:
                continue  # the nucleus reaches below the floor
            cum = np.cumsum(kept)
            n_keep = min(int(np.searchsorted(cum, top_p[r] * base)) + 1, len(kept))  # the crossing token stays
            row[row < kept[n_keep - 1]] = 0.0
            break
    return p


# ---- speculative decoding: verify drafted tokens ----------------------------------------------
def sample_with_drafts(logits: np.ndarray, seqs: list[Sequence], drafts: list[list[int]]) -> list[list[int]]:
    """New tokens per sequence, where sequence i has 1 + len(drafts[i]) consecutive logits rows
    (row j scores the token after draft j-1). Returns each sequence's accepted drafts followed by
    one token of the target's own: the correction at the first rejection, or a bonus token after
    the last draft. Greedy: a draft is kept while it equals the argmax, so the output is the
    argmax chain exactly. Sampled: rejection sampling with the draft as a point mass q = 1{x}:
    keep x with probability p(x), else draw from p with x removed (max(0, p - q) renormalised),
    which leaves every emitted token distributed as the target's p (Leviathan et al., 2023)."""
    if not any(drafts):
        return [[int(t)] for t in sample(logits, seqs)]
    starts = np.cumsum([0] + [1 + len(d) for d in drafts])
    best = np.argmax(logits, axis=1)
    sampled = [i for i, s in enumerate(seqs) if not s.params.greedy]
    probs = None
    if sampled:
        rows = np.concatenate([np.arange(starts[i], starts[i + 1]) for i in sampled])
        row_seqs = [seqs[i] for i in sampled for _ in range(1 + len(drafts[i]))]
        probs = _probabilities(logits[rows], row_seqs)
        prob_start = dict(zip(sampled, np.cumsum([0] + [1 + len(drafts[i]) for i in sampled])))
    out = []
    broken = os.environ.get(BROKEN_VERIFIER_ENV) == "1"
    for i, (seq, draft) in enumerate(zip(seqs, drafts)):
        if seq.params.greedy:
            target = best[starts[i] : starts[i + 1]]
            n_ok = len(draft) if broken else 0
            while n_ok < len(draft) and draft[n_ok] == target[n_ok]:
                n_ok += 1
            out.append(list(draft[:n_ok]) + [int(target[n_ok])])
        else:
            out.append(verify_sampled(probs[prob_start[i] : prob_start[i] + 1 + len(draft)], draft, seq.rng))
    return out


def verify_sampled(probs: np.ndarray, draft: list[int], rng: np.random.Generator) -> list[int]:
    """Rejection sampling of one sequence's drafts against rows of unnormalised target
    probabilities (len(draft) + 1 rows); modifies probs."""
    for j, x in enumerate(draft):
        row = probs[j]
        if rng.random() * row.sum(dtype=np.float64) < row[x]:
            continue  # accepted with probability p(x)
        row[x] = 0.0
        if not row.any():  # p(x) was 1 within rounding: nothing else to draw; keep x
            continue
        return list(draft[:j]) + [int(_draw(row[None], np.array([rng.random()]))[0])]
    return list(draft) + [int(_draw(probs[len(draft)][None], np.array([rng.random()]))[0])]
