"""Where token counts come from while building prompts, best first:

1. "local_tokenizer" from `backend.tokenizer` when the scenario names one: a GGUF file, a Hugging
   Face tokenizer folder (or its tokenizer.json), or a Hugging Face hub name;
2. "server_tokenize": the engine's own `POST /tokenize` (vLLM shape {"model","prompt"} -> {"tokens"};
   llama.cpp's {"content"} -> {"tokens"} is read too), so counts match what the engine will see;
3. "local_tokenizer": the GGUF tokenizer of the local model (SmolLM2 by default);
4. "approximate": about one token per common word (~4 characters), when none of these is available.

How prompts are built from a source, and how prompt and answer tokens are counted: harness/scenario/prompts.py.
"""

from __future__ import annotations

import functools
import json
import re
import zlib
from pathlib import Path

import numpy as np

from backends.http import request

WORDS = list(
    dict.fromkeys(
        """the of and to in is that for it as was with be by on not he this are or his from at which but have an
they you were her she there been one all we their has would when if so no will more can who some out other them
time only new about like into its then these two first any my now such our after most made over also did many
before must through back where much your way well down should because each just those people how too little
state good very make world still own see men work long get here between both life being under never day same
another know while last might great old year off come since against go came right used take three place small
found part again light water river house stone field music paper market garden table window letter energy
system number group city night power family story money school point law company question order fire animal
model memory server token request queue batch cache block engine speed load user answer reply data text
island mountain forest winter summer morning evening bridge road train ship voice color picture
""".split()
    )
)


class TokenizerError(Exception):
    """A token source that cannot be used (a bad backend.tokenizer, a /tokenize answering errors or garbage).
    `absent`: the server has no /tokenize at all (not an error: another source is used)."""

    def __init__(self, message: str, absent: bool = False):
        super().__init__(message)
        self.absent = absent


class TokenizerSource:
    """encode, as the engine counts a prompt (special tokens such as BOS added)."""

    method: str = ""
    name: str = ""  # where the counts come from, for the console and run.json

    def __init__(self) -> None:
        self._encode_cache: dict[str, list[int]] = {}
        self._added_tokens: int | None = None

    def _encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        ids = self._encode_cache.get(text)
        if ids is None:
            ids = list(self._encode(text))
            self.remember(text, ids)
        return list(ids)

    def remember(self, text: str, ids: list[int] | np.ndarray) -> None:
        """Keeps a text's encoding, computed here or known otherwise (harness/scenario/prompts.py: word tokens
        that re-encode to themselves, given as an int array), so encoding it again costs nothing."""
        if len(self._encode_cache) >= 4096:
            self._encode_cache.clear()
        self._encode_cache[text] = ids.tolist() if isinstance(ids, np.ndarray) else ids

    @property
    def added_tokens(self) -> int:
        """Tokens every encoding carries regardless of text (a BOS, for some tokenizers)."""
        if self._added_tokens is None:
            self._added_tokens = len(self.encode(""))
        return self._added_tokens


class ServerTokenizer(TokenizerSource):
    method = "server_tokenize"

    def __init__(self, url: str, model: str, headers: dict[str, str] | None = None, timeout_s: float = 30.0):
        super().__init__()
        self.url, self.model, self.headers, self.timeout_s = url.rstrip("/"), model, headers or {}, timeout_s
        self.name = f"{self.url}/tokenize"

    def _encode(self, text: str) -> list[int]:
        # "prompt" is vLLM's field and "content" llama.cpp's; each server ignores the other.
        body = {"model": self.model, "prompt": text, "content": text}
        try:
            status, data = request(self.url + "/tokenize", body, self.headers, self.timeout_s)
        except OSError as e:
            if isinstance(e, TimeoutError) or isinstance(getattr(e, "reason", None), TimeoutError):
                # a route that hangs is there but broken: passing it over must be said (absent ones are not)
                raise TokenizerError(
                    f"backend.url: POST {self.name} did not answer within {self.timeout_s:g} s", absent=False
                ) from None
            raise TokenizerError(
                f"backend.url: POST {self.name} failed ({getattr(e, 'reason', e)})", absent=True
            ) from None
        if status >= 400:
            raise TokenizerError(
                f"backend.url: POST {self.name} answered HTTP {status}: {data[:120].decode('utf-8', 'replace')}",
                absent=status in (404, 405),
            )
        try:
            tokens = json.loads(data)["tokens"]
        except (ValueError, KeyError, TypeError):
            tokens = None
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise TokenizerError(f'backend.url: POST {self.name} answered {data[:120]!r}, not {{"tokens": [ids]}}')
        return tokens

    def check(self, timeout_s: float = 5.0) -> str | None:
        """None when /tokenize works; else why not ("absent" when the server has no such route)."""
        saved_timeout_s, self.timeout_s = self.timeout_s, timeout_s
        try:
            self._encode("hello")
            return None
        except TokenizerError as e:
            return "absent" if e.absent else str(e)
        finally:
            self.timeout_s = saved_timeout_s


class LocalTokenizer(TokenizerSource):
    """A tokenizer file on this machine: a GGUF (the engine's own tokenizer) or a Hugging Face tokenizer."""

    method = "local_tokenizer"

    def __init__(self, model: str):
        super().__init__()
        self.name = model
        self.tokenizer, self._encode_with = _load_local_tokenizer(model)

    def _encode(self, text: str) -> list[int]:
        return self._encode_with(text)


@functools.lru_cache(maxsize=4)
def _load_local_tokenizer(source: str):
    """(the tokenizer, encode(text) -> ids with special tokens added as the engine adds them).
    Reading a GGUF takes seconds, so once."""
    path = Path(source).expanduser()
    if source == "smollm2" or source.endswith(".gguf"):
        # Lazy import: the harness works without native_engine
        from native_engine.model_files import resolve_model
        from native_engine.tokenizer import Tokenizer

        gguf_tokenizer = Tokenizer.from_gguf(resolve_model(source))
        return gguf_tokenizer, functools.partial(gguf_tokenizer.encode, add_special=True)
    from tokenizers import Tokenizer as HFTokenizer

    if path.is_dir():
        path = path / "tokenizer.json"
    hf = HFTokenizer.from_file(str(path)) if path.is_file() else HFTokenizer.from_pretrained(source)
    return hf, lambda text: hf.encode(text, add_special_tokens=True).ids


class ApproximateTokenizer(TokenizerSource):
    """One id per known word, one per 4 characters of anything else: a stand-in for counts only."""

    method = "approximate"
    name = "about one token per word"

    def __init__(self) -> None:
        super().__init__()
        self.id_by_word = {w: i for i, w in enumerate(WORDS)}

    def _encode(self, text: str) -> list[int]:
        ids = []
        for piece in re.findall(r"\w+|[^\w\s]", text):
            if piece in self.id_by_word:
                ids.append(self.id_by_word[piece])
                continue
            for start in range(0, len(piece), 4):  # unknown text: a hashed id per 4 characters
                ids.append(len(WORDS) + zlib.crc32(piece[start : start + 4].encode()) % 65536)
        return ids


def local_tokenizer(source: str) -> LocalTokenizer:
    """backend.tokenizer: a GGUF file, a Hugging Face folder / tokenizer.json, or a hub name."""
    try:
        return LocalTokenizer(source)
    except Exception as e:  # tokenizers and gguf raise their own types for a bad file or an unknown name
        raise TokenizerError(
            f"backend.tokenizer: cannot load {source!r} ({type(e).__name__}: {e}); give a GGUF "
            f"file, a folder with tokenizer.json, or a Hugging Face name this machine can fetch"
        ) from None


def resolve_tokenizer(scenario, url: str | None = None, warnings: list[str] | None = None) -> TokenizerSource:
    """The best source available for this scenario; `url` overrides backend.url (e.g. after a launch).
    Why a better source was passed over goes into `warnings`."""
    backend = scenario.backend
    warnings = [] if warnings is None else warnings
    if getattr(backend, "tokenizer", None):
        return local_tokenizer(backend.tokenizer)
    url = url or backend.url
    if url:
        server = ServerTokenizer(url, backend.model, backend.headers, timeout_s=min(backend.request_timeout_s, 30.0))
        problem = server.check()
        if problem is None:
            return server
        if problem != "absent":
            warnings.append(f"{problem}; prompt lengths are counted locally instead")
    if backend.model == "smollm2" or backend.model.endswith(".gguf"):
        try:
            return LocalTokenizer(backend.model)
        except (ImportError, FileNotFoundError):
            pass
    return ApproximateTokenizer()
