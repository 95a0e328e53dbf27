"""Where token counts come from while building prompts, best first:

1. "server_tokenize": the engine's own `POST /tokenize` (vLLM shape {"model","prompt"} -> {"tokens"};
   llama.cpp's {"content"} -> {"tokens"} is read too), so counts match what the engine will see;
2. "local_tokenizer": the GGUF tokenizer of the local model (SmolLM2 by default);
3. "approximate": about one token per common word (~4 characters), when neither is available.

Random prompts are drawn from "word tokens": ids whose text is one space-prefixed common English
word (" river"). Joined, they re-encode to the same ids in byte-level BPE tokenizers, so a drawn
length is hit exactly with one encode call, and their text is known locally (no detokenize calls).
"""
from __future__ import annotations

import functools
import json
import re
import urllib.error
import urllib.request
import zlib

import numpy as np

WORDS = list(dict.fromkeys("""the of and to in is that for it as was with be by on not he this are or his from at which but have an
they you were her she there been one all we their has would when if so no will more can who some out other them
time only new about like into its then these two first any my now such our after most made over also did many
before must through back where much your way well down should because each just those people how too little
state good very make world still own see men work long get here between both life being under never day same
another know while last might great old year off come since against go came right used take three place small
found part again light water river house stone field music paper market garden table window letter energy
system number group city night power family story money school point law company question order fire animal
model memory server token request queue batch cache block engine speed load user answer reply data text
island mountain forest winter summer morning evening bridge road train ship voice color picture
""".split()))

DISCOVERY_MAX_WORDS = 400  # bounds the /tokenize calls made once per run when words split unevenly


class TokenizerSource:
    """encode/decode plus the word tokens random prompts are drawn from."""

    method: str = ""
    vocab_size: int | None = None

    def __init__(self) -> None:
        self._encode_cache: dict[str, list[int]] = {}
        self._word_text_by_id: dict[int, str] | None = None
        self._word_ids: np.ndarray | None = None
        self._added_tokens: int | None = None

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, ids: list[int]) -> str:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        ids = self._encode_cache.get(text)
        if ids is None:
            if len(self._encode_cache) >= 4096:
                self._encode_cache.clear()
            ids = self._encode_cache[text] = list(self._encode(text))
        return list(ids)

    @property
    def added_tokens(self) -> int:
        """Tokens every encoding carries regardless of text (a BOS, for some servers)."""
        if self._added_tokens is None:
            self._added_tokens = len(self.encode(""))
        return self._added_tokens

    def word_token_ids(self) -> np.ndarray:
        if self._word_ids is None:
            self._word_ids = np.array(sorted(self._word_texts()), dtype=np.int64)
        return self._word_ids

    def text_of(self, word_ids: np.ndarray | list[int]) -> str:
        """Text of a sequence of word tokens, without a decode round trip."""
        texts = self._word_texts()
        return "".join(texts[int(i)] for i in word_ids)

    def _word_texts(self) -> dict[int, str]:
        if self._word_text_by_id is None:
            self._word_text_by_id = self._discover_word_tokens()
        return self._word_text_by_id

    def _discover_word_tokens(self) -> dict[int, str]:
        words = WORDS[:DISCOVERY_MAX_WORDS]
        skip = self.added_tokens
        ids = self.encode("".join(" " + w for w in words))[skip:]
        if len(ids) == len(words):  # every word is one token: map them by position, one call in all
            return {i: " " + w for i, w in zip(ids, words)}
        found = {}
        for word in words:
            word_ids = self.encode(" " + word)[skip:]
            if len(word_ids) == 1:
                found[word_ids[0]] = " " + word
        if len(found) < 16:
            raise RuntimeError(f"{self.method}: only {len(found)} common English words are single tokens; "
                               "cannot draw random prompts from this tokenizer")
        return found

    def random_text(self, rng: np.random.Generator, n_tokens: int,
                    prefix_ids: np.ndarray | list[int] = ()) -> tuple[str, int]:
        """Text of n_tokens tokens (counting added tokens such as BOS) and the count actually reached.

        The text starts with the word tokens `prefix_ids` (cut if longer than n_tokens) and is
        filled up with random word tokens; only the fill is adjusted, so a shared prefix stays shared.
        """
        word_ids = self.word_token_ids()
        body = max(n_tokens - self.added_tokens, 1)
        fixed = np.asarray(prefix_ids, dtype=np.int64)[:body]
        fill = rng.choice(word_ids, size=body - len(fixed))
        count = 0
        for _ in range(4):  # word tokens re-encode exactly in BPE tokenizers; this loop covers the rest
            text = self.text_of(np.concatenate([fixed, fill]))
            count = len(self.encode(text))
            excess = count - n_tokens
            if excess == 0 or (excess > 0 and len(fixed) + len(fill) == 1):
                break
            if excess < 0:
                fill = np.concatenate([fill, rng.choice(word_ids, size=-excess)])
            elif excess <= len(fill):
                fill = fill[: len(fill) - excess]
            else:
                fixed, fill = fixed[: max(len(fixed) - (excess - len(fill)), 1)], fill[:0]
        return text, count


class ServerTokenizer(TokenizerSource):
    method = "server_tokenize"

    def __init__(self, url: str, model: str, headers: dict[str, str] | None = None, timeout_s: float = 30.0):
        super().__init__()
        self.url, self.model, self.headers, self.timeout_s = url.rstrip("/"), model, headers or {}, timeout_s

    def _post(self, route: str, body: dict) -> dict:
        request = urllib.request.Request(
            self.url + route, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json", **self.headers},
        )
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return json.loads(response.read())

    def _encode(self, text: str) -> list[int]:
        # "prompt" is vLLM's field and "content" llama.cpp's; each server ignores the other.
        return self._post("/tokenize", {"model": self.model, "prompt": text, "content": text})["tokens"]

    def decode(self, ids: list[int]) -> str:
        reply = self._post("/detokenize", {"model": self.model, "tokens": [int(i) for i in ids]})
        return reply.get("prompt", reply.get("content", ""))

    def reachable(self, timeout_s: float = 5.0) -> bool:
        """True when the server answers /tokenize; a server without it is not an error, just unused."""
        saved_timeout_s, self.timeout_s = self.timeout_s, timeout_s
        try:
            return isinstance(self._encode("hello"), list)
        except (urllib.error.URLError, OSError, ValueError, KeyError, TypeError):
            return False
        finally:
            self.timeout_s = saved_timeout_s


class LocalTokenizer(TokenizerSource):
    method = "local_tokenizer"

    def __init__(self, model: str):
        super().__init__()
        self.tokenizer = _load_gguf_tokenizer(model)
        self.vocab_size = self.tokenizer.vocab_size

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special=True)  # as the engine counts a prompt

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode([int(i) for i in ids])


@functools.lru_cache(maxsize=4)
def _load_gguf_tokenizer(model: str):
    # Lazy import: the harness works without native_engine; reading the GGUF takes seconds, so once.
    from native_engine.model_files import resolve_model
    from native_engine.tokenizer import Tokenizer

    return Tokenizer.from_gguf(resolve_model(model))


class ApproximateTokenizer(TokenizerSource):
    """One id per known word, one per 4 characters of anything else: a stand-in for counts only."""

    method = "approximate"

    def __init__(self) -> None:
        super().__init__()
        self.words = WORDS
        self.id_by_word = {w: i for i, w in enumerate(self.words)}
        self.vocab_size = len(self.words) + 65536

    def _encode(self, text: str) -> list[int]:
        ids = []
        for piece in re.findall(r"\w+|[^\w\s]", text):
            if piece in self.id_by_word:
                ids.append(self.id_by_word[piece])
                continue
            for start in range(0, len(piece), 4):  # unknown text: a hashed id per 4 characters
                ids.append(len(self.words) + zlib.crc32(piece[start:start + 4].encode()) % 65536)
        return ids

    def decode(self, ids: list[int]) -> str:
        return "".join(" " + self.words[i] if i < len(self.words) else " ?" for i in ids)


def resolve_tokenizer(scenario, url: str | None = None) -> TokenizerSource:
    """The best source available for this scenario; `url` overrides backend.url (e.g. after a launch)."""
    backend = scenario.backend
    url = url or backend.url
    if url:
        server = ServerTokenizer(url, backend.model, backend.headers, timeout_s=min(backend.request_timeout_s, 30.0))
        if server.reachable():
            return server
    if backend.model == "smollm2" or backend.model.endswith(".gguf"):
        try:
            return LocalTokenizer(backend.model)
        except (ImportError, FileNotFoundError):
            pass
    return ApproximateTokenizer()
