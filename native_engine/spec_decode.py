"""Speculative decoding with an n-gram (prompt-lookup) proposer: no second model.

Before a step, each decoding sequence looks for the most recent earlier place where its last n
tokens (n from ngram_max down to ngram_min) occurred, in its prompt or its own output, and drafts
the k tokens that followed there. The step then runs the last token plus the k drafts as one
chunk of k+1 tokens with logits at every position; the sampler keeps the drafts the target
agrees with plus one token of its own (sampler.sample_with_drafts), and the engine rolls the
sequence's KV length back over the rejected ones. Pays off where outputs copy their input
(summaries, edits, extraction, code), and costs a wider forward pass where they do not.
"""

from __future__ import annotations

import numpy as np

from native_engine.config import SpeculativeConfig  # defined with the other settings; imported from here too


def propose_ngram(token_ids: list[int] | np.ndarray, k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Up to k tokens that followed the most recent earlier occurrence of the longest suffix
    of token_ids with length in [ngram_min, ngram_max]; [] when there is none."""
    tokens = np.asarray(token_ids, dtype=np.int64)
    n_tokens = len(tokens)
    if k < 1 or n_tokens < ngram_min + 1:
        return []
    # Candidates: earlier positions holding the last token; then extend each match backwards.
    ends = np.flatnonzero(tokens[:-1] == tokens[-1])
    if not len(ends):
        return []
    match_len = np.ones(len(ends), dtype=np.int64)
    for back in range(1, min(ngram_max, n_tokens - 1)):
        alive = (match_len == back) & (ends >= back)
        if not alive.any():
            break
        same = tokens[np.where(alive, ends - back, 0)] == tokens[-1 - back]
        match_len[alive & same] += 1
    best = int(match_len.max())
    if best < ngram_min:
        return []
    end = int(ends[np.flatnonzero(match_len == best)[-1]])  # the most recent of the longest matches
    return tokens[end + 1 : end + 1 + k].tolist()


class NgramProposer:
    def __init__(self, config: SpeculativeConfig):
        self.config = config

    def propose(self, token_ids: list[int], max_drafts: int) -> list[int]:
        """Drafts for a sequence that may still emit max_drafts + 1 tokens (the +1 is the target's own)."""
        c = self.config
        return propose_ngram(token_ids, min(c.num_speculative_tokens, max_drafts), c.ngram_min, c.ngram_max)
