"""Prompt text of an exact token count, and the one rule for counting prompt and answer tokens.

The rule, the same for every workload kind (docs/metrics.md states it): a prompt's token count is
the count the engine's tokenizer gives for the prompt text, so it includes a BOS token when that
tokenizer adds one. `input_tokens` (random, multi_turn), `prefix_tokens + input_tokens`
(shared_prefix) and a trace row's input length are such totals; a file prompt is counted the same
way. An answer's count never includes a BOS: answer text counts its tokens minus the added ones.

Random prompts are drawn from "word tokens": ids whose text is one space-prefixed common English
word (" river"). Joined, they re-encode to the same ids in byte-level BPE tokenizers, so a drawn
length is hit exactly with one encode call, and their text is known locally (no detokenize calls).
"""

from __future__ import annotations

import functools

import numpy as np

from harness.scenario.tokenizer_source import WORDS, TokenizerError, TokenizerSource

DISCOVERY_MAX_WORDS = 400  # bounds the /tokenize calls made once per run when words split unevenly


def prompt_tokens(tokenizer: TokenizerSource, text: str) -> int:
    """A prompt's length as the engine counts it (any BOS included)."""
    return len(tokenizer.encode(text))


def answer_tokens(tokenizer: TokenizerSource, text: str) -> int:
    """An answer's length: its tokens without the ones every encoding carries (a BOS)."""
    return max(len(tokenizer.encode(text)) - tokenizer.added_tokens, 1)


@functools.lru_cache(maxsize=8)
def prompt_builder(tokenizer: TokenizerSource) -> PromptBuilder:
    """One builder per tokenizer: word-token discovery costs a few /tokenize calls, once."""
    return PromptBuilder(tokenizer)


class PromptBuilder:
    def __init__(self, tokenizer: TokenizerSource):
        self.tokenizer = tokenizer
        self._text_by_id = self._discover_word_tokens()
        self.word_ids = np.array(sorted(self._text_by_id), dtype=np.int64)
        self._texts = np.empty(int(self.word_ids[-1]) + 1, dtype=object)  # a word token's text by its id
        self._texts[self.word_ids] = [self._text_by_id[int(i)] for i in self.word_ids]
        added = self._reencoding_added_ids()
        self._added_ids = None if added is None else np.array(added, dtype=np.int64)

    def text_of(self, word_ids) -> str:
        """Text of a sequence of word tokens, without a decode round trip."""
        return "".join(self._texts[np.asarray(word_ids, dtype=np.int64)])

    def _reencoding_added_ids(self) -> list[int] | None:
        """The ids every encoding starts with (a BOS), when joined word tokens re-encode to exactly those ids and
        themselves (byte-level BPE: GPT-2's, Llama 3's, SmolLM2's); None when they do not. Checked on two random
        texts; then a prompt's ids and count are known without encoding it (an encode of a 600-token prompt costs
        ~1-3 ms, the whole of building a 100,000-request plan)."""
        rng = np.random.default_rng(0)
        added = None
        for size in (257, 64):
            ids = rng.choice(self.word_ids, size=size).tolist()
            encoded = self.tokenizer.encode(self.text_of(ids))
            head = len(encoded) - len(ids)
            if head != self.tokenizer.added_tokens or encoded[head:] != ids or added not in (None, encoded[:head]):
                return None
            added = encoded[:head]
        return added

    def _discover_word_tokens(self) -> dict[int, str]:
        words = WORDS[:DISCOVERY_MAX_WORDS]
        skip = self.tokenizer.added_tokens
        ids = self.tokenizer.encode("".join(" " + w for w in words))[skip:]
        if len(ids) == len(words):  # every word is one token: map them by position, one call in all
            return {i: " " + w for i, w in zip(ids, words)}
        found = {}
        for word in words:
            word_ids = self.tokenizer.encode(" " + word)[skip:]
            if len(word_ids) == 1:
                found[word_ids[0]] = " " + word
        if len(found) < 16:
            raise TokenizerError(
                f"{self.tokenizer.method}: only {len(found)} common English words are single "
                "tokens; cannot draw random prompts from this tokenizer (set backend.tokenizer "
                "to the model's own tokenizer)"
            )
        return found

    def random_text(self, rng: np.random.Generator, n_tokens: int, prefix_ids=()) -> tuple[str, int]:
        """Text of n_tokens tokens as the engine counts them (BOS included) and the count actually reached.

        The text starts with the word tokens `prefix_ids` (cut if longer than n_tokens) and is
        filled up with random word tokens; only the fill is adjusted, so a shared prefix stays shared.
        """
        body = max(n_tokens - self.tokenizer.added_tokens, 1)
        fixed = np.asarray(prefix_ids, dtype=np.int64)[:body]
        fill = rng.choice(self.word_ids, size=body - len(fixed))
        if self._added_ids is not None:  # the ids are known: the tokenizer is told them rather than asked
            ids = np.concatenate([self._added_ids, fixed, fill])
            text = self.text_of(ids[len(self._added_ids) :])
            self.tokenizer.remember(text, ids)  # an array: a plan keeps it as one (harness/plan/prompt_ids.py)
            return text, len(ids)
        count = 0
        for _ in range(4):  # word tokens re-encode exactly in BPE tokenizers; this loop covers the rest
            text = self.text_of(np.concatenate([fixed, fill]))
            count = prompt_tokens(self.tokenizer, text)
            excess = count - n_tokens
            if excess == 0 or (excess > 0 and len(fixed) + len(fill) == 1):
                break
            if excess < 0:
                fill = np.concatenate([fill, rng.choice(self.word_ids, size=-excess)])
            elif excess <= len(fill):
                fill = fill[: len(fill) - excess]
            else:
                fixed, fill = fixed[: max(len(fixed) - (excess - len(fill)), 1)], fill[:0]
        return text, count
