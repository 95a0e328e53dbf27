"""Constrained decoding: a request's JSON schema or regex masks its logits every step (llguidance).

- `grammar_from_request(body)` reads `response_format` (json_schema / json_object), `guided_json`
  or `guided_regex` into a Grammar (llguidance's grammar text); no tokenizer needed.
- `GuidedDecoding` (one per engine) holds llguidance's view of the vocabulary. `check()` refuses,
  before a request is admitted, a grammar llguidance cannot compile or one that accepts no output.
- Each constrained sequence gets an LLMatcher. Per step: `mask_logits()` fills the bitmasks of
  all constrained rows in one call and sets disallowed logits to -inf; `accept()` advances the
  matchers by the sampled tokens; unconstrained rows are never touched.
- Jump-forward: `forced_tokens()` is the run of tokens the grammar allows no choice about after
  the last token (`{"name": "` after `{`). llguidance's compute_ff_tokens() tokenizes the forced
  bytes and leaves off the tail that could merge with bytes still to come (`": "` -> `":` while the
  next `"`-opened string is undecided), so what the engine appends is a prefix of the canonical
  tokenization of the forced text, and the model then samples from that boundary.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass

import numpy as np

log = logging.getLogger(__name__)

# Compact, fixed whitespace: the JSON layout json.dumps writes. With flexible whitespace a small
# model can emit spaces and newlines forever, and fixed separators make keys and punctuation forced.
JSON_SEPARATORS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param, self.message = param, message


@dataclass(frozen=True)
class Grammar:
    param: str  # the request field it came from, for error messages
    text: str  # llguidance's grammar (its JSON form)


def grammar_from_request(body: dict) -> Grammar | None:
    """The request's output constraint, or None; GrammarError names the field and the problem."""
    import llguidance as llg

    given = [k for k in ("response_format", "guided_json", "guided_regex") if body.get(k) is not None]
    if len(given) > 1:
        raise GrammarError(
            given[1], f"send one of response_format, guided_json, guided_regex, not {' and '.join(given)}"
        )
    if not given:
        return None
    param, value = given[0], body[given[0]]
    if param == "guided_regex":
        if not isinstance(value, str) or not value:
            raise GrammarError(param, "must be a non-empty regular expression string")
        return Grammar(param, llg.LLMatcher.grammar_from_regex(value))
    if param == "guided_json":
        schema = _json_value(param, value)
    else:
        if not isinstance(value, dict) or value.get("type") not in ("text", "json_object", "json_schema"):
            raise GrammarError(
                param,
                'must be {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}}}, '
                '{"type": "json_object"} or {"type": "text"}',
            )
        if value["type"] == "text":
            return None
        if value["type"] == "json_object":
            schema = {"type": "object"}
        else:
            spec = value.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise GrammarError(param, 'json_schema must be an object with a "schema" (the JSON schema itself)')
            schema = _json_value(param, spec["schema"])
    if not isinstance(schema, dict):
        raise GrammarError(param, f"the JSON schema must be an object, got {json.dumps(schema)[:40]}")
    return Grammar(param, llg.LLMatcher.grammar_from_json_schema(schema, overrides=JSON_SEPARATORS))


def _json_value(param: str, value):
    if isinstance(value, str):  # guided_json may come as a JSON string (vLLM accepts both)
        try:
            return json.loads(value)
        except json.JSONDecodeError as exc:
            raise GrammarError(param, f"the schema string is not valid JSON ({exc})") from None
    return value


def llg_tokenizer(tokenizer):
    """llguidance's view of our GGUF vocabulary: each token's raw bytes, plus our encoder."""
    import llguidance as llg

    class Vocabulary:  # the attributes llguidance.TokenizerWrapper reads
        eos_token_id = tokenizer.eos_token_id
        bos_token_id = tokenizer.bos_token_id
        tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        special_token_ids = sorted(tokenizer.special_token_ids)

        def __call__(self, text):
            return tokenizer.encode(text.decode("utf-8", errors="replace") if isinstance(text, bytes) else text)

    return llg.LLTokenizer(llg.TokenizerWrapper(Vocabulary()), eos_token=list(tokenizer.eos_token_ids))


def _first_lines(error: str) -> str:
    """llguidance's errors end with the grammar and parser state; the problem is on top."""
    return " ".join(error.split("\n   1 | ")[0].split("\n<state>")[0].split())


class GuidedDecoding:
    def __init__(self, tokenizer):
        self._tokenizer = tokenizer
        self._llg_tokenizer = None  # built on first use (~0.3 s for 49k tokens)
        self._executor = None

    @property
    def llg_tokenizer(self):
        if self._llg_tokenizer is None:
            import llguidance as llg

            self._llg_tokenizer = llg_tokenizer(self._tokenizer)
            self._executor = llg.LLExecutor()
        return self._llg_tokenizer

    def matcher(self, grammar: Grammar):
        """A fresh matcher for one sequence; GrammarError when it cannot compile or start."""
        import llguidance as llg

        matcher = llg.LLMatcher(self.llg_tokenizer, grammar.text, log_level=0)
        if not matcher.is_error():
            # an empty language shows up on the first mask (e.g. the regex [^\x00-\x{10FFFF}])
            mask = np.zeros((1, self._mask_words), dtype=np.int32)
            self._executor.unsafe_compute_mask_ptr([(matcher, 0)], mask.ctypes.data, mask.nbytes, 1)
        if matcher.is_error():
            raise GrammarError(grammar.param, f"cannot be used: {_first_lines(matcher.get_error())}")
        return matcher

    def check(self, grammar: Grammar) -> None:
        self.matcher(grammar)

    @property
    def _mask_words(self) -> int:
        return (self.llg_tokenizer.vocab_size + 31) // 32

    def mask_logits(self, logits: np.ndarray, seqs: list) -> None:
        """Set to -inf each constrained row's tokens its grammar forbids (logits [len(seqs), vocab])."""
        rows = [r for r, s in enumerate(seqs) if s.grammar_matcher is not None]
        if not rows:
            return
        bitmask = np.zeros((len(rows), self._mask_words), dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr(
            [(seqs[r].grammar_matcher, i) for i, r in enumerate(rows)],
            bitmask.ctypes.data,
            bitmask.shape[1] * 4,
            len(rows),
        )
        allowed = np.unpackbits(bitmask.view(np.uint8), axis=1, bitorder="little").astype(bool)
        vocab = logits.shape[1]
        allowed = (
            allowed[:, :vocab]
            if allowed.shape[1] >= vocab
            else np.pad(allowed, ((0, 0), (0, vocab - allowed.shape[1])))
        )
        for i, r in enumerate(rows):
            if not allowed[i].any():  # a matcher in error (it should not happen): end the sequence
                log.warning(
                    "grammar allows no token for %s (%s); ending it",
                    seqs[r].request_id,
                    _first_lines(seqs[r].grammar_matcher.get_error()),
                )
                allowed[i, self.llg_tokenizer.eos_token] = True
        sub = logits[rows]
        sub[~allowed] = -np.inf
        logits[rows] = sub

    @staticmethod
    def accept(seqs: list, token_ids: list[int]) -> None:
        for seq, token_id in zip(seqs, token_ids):
            if seq.grammar_matcher is not None:
                seq.grammar_matcher.consume_token(token_id)

    @staticmethod
    def forced_tokens(seq, limit: int) -> list[int]:
        """Up to `limit` tokens the grammar forces next; the matcher has consumed them."""
        matcher = seq.grammar_matcher
        if matcher is None or limit <= 0 or matcher.is_stopped():
            return []
        forced = matcher.compute_ff_tokens()[:limit]
        if forced and not matcher.consume_tokens(forced):
            return []
        return forced
