"""The GGUF's byte-level BPE tokenizer, its chat template, and streaming detokenization."""

from __future__ import annotations

import codecs
import json
import os
import re
import uuid
from pathlib import Path

import gguf
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import AddedToken, Regex, models, pre_tokenizers
from tokenizers import Tokenizer as BpeTokenizer

from native_engine.file_cache import cache_dir, entry_name, file_identity
from native_engine.gguf_model import open_gguf, stop_token_ids

# llama.cpp's pre-tokenizer for `tokenizer.ggml.pre == "smollm"` (llama-vocab.cpp): single
# digits first, then the GPT-2 split, each regex applied to the pieces of the one before.
SMOLLM_PRE_TOKENIZER_REGEXES = (
    r"\p{N}",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
)
PRE_TOKENIZERS = {"smollm": SMOLLM_PRE_TOKENIZER_REGEXES}


def byte_level_alphabet() -> dict[str, int]:
    """GPT-2's reversible map from printable characters back to the bytes they stand for."""
    printable = (
        list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    )
    chars = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            chars.append(256 + extra)
            extra += 1
    return {chr(ch): byte for byte, ch in zip(printable, chars)}


class Tokenizer:
    def __init__(
        self,
        tokens: list[str],
        token_types: list[int],
        merges: list[str],
        pre: str,
        bos_token_id: int,
        eos_token_ids: list[int],
        add_bos: bool,
        chat_template: str | None,
    ):
        """eos_token_ids: the declared eos first, then other turn-ending control tokens."""
        if pre not in PRE_TOKENIZERS:
            raise ValueError(f"tokenizer.ggml.pre is {pre!r}; supported: {', '.join(PRE_TOKENIZERS)}")
        self.vocab_size = len(tokens)
        self.bos_token_id = bos_token_id
        self.eos_token_id = eos_token_ids[0]
        self.eos_token_ids = list(eos_token_ids)
        self.add_bos = add_bos
        self.chat_template = chat_template
        self.special_token_ids = {i for i, t in enumerate(token_types) if t == gguf.TokenType.CONTROL}
        bpe = models.BPE(
            vocab={t: i for i, t in enumerate(tokens)},
            merges=[tuple(m.split(" ", 1)) for m in merges],
            ignore_merges=False,
        )
        self._bpe = BpeTokenizer(bpe)
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in PRE_TOKENIZERS[pre]]
        self._bpe.pre_tokenizer = pre_tokenizers.Sequence(
            splits + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )
        self._bpe.add_special_tokens(
            [AddedToken(tokens[i], special=True, normalized=False) for i in sorted(self.special_token_ids)]
        )
        # The same BPE, reading control-token spellings in the text as plain text (for chat content).
        self._plain_bpe = BpeTokenizer.from_str(self._bpe.to_str())
        self._plain_bpe.encode_special_tokens = True
        self._control_ids = {tokens[i]: i for i in self.special_token_ids}
        self._control_regex = re.compile("|".join(map(re.escape, sorted(self._control_ids, key=len, reverse=True))))
        alphabet = byte_level_alphabet()

        def raw_bytes(token_id: int, text: str) -> bytes:
            """Byte-level tokens spell bytes with printable stand-ins; control and unused tokens are plain text."""
            if token_id in self.special_token_ids or not all(ch in alphabet for ch in text):
                return text.encode("utf-8")
            return bytes(alphabet[ch] for ch in text)

        self._token_bytes = [raw_bytes(i, t) for i, t in enumerate(tokens)]
        self._tokens = tokens
        # No text longer than max_token_bytes * n characters can fit in n tokens (a character is >= 1 byte).
        self.max_token_bytes = max(map(len, self._token_bytes))

    @classmethod
    def from_gguf(cls, path_or_reader: str | Path | gguf.GGUFReader) -> Tokenizer:
        """The tokenizer of a GGUF file (its fields kept in the user's cache, gguf_tokenizer_fields) or of an open
        reader (an engine's, which parsed the file for its weights anyway)."""
        if isinstance(path_or_reader, gguf.GGUFReader):
            return cls(**tokenizer_fields(path_or_reader))
        return cls(**gguf_tokenizer_fields(Path(path_or_reader)))

    def encode(self, text: str, add_special: bool = False) -> list[int]:
        """Token ids of text; control tokens written in the text (<|im_start|>) become single ids.

        add_special prepends the BOS token when the model file asks for it (add_bos_token).
        """
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = self._encode(self._bpe, text)
        return [self.bos_token_id] + ids if add_special and self.add_bos else ids

    @staticmethod
    def _encode(bpe: BpeTokenizer, text: str) -> list[int]:
        # encode_batch releases the GIL (encode does not), so a long prompt tokenized in a worker
        # thread does not stall the server's event loop.
        return bpe.encode_batch([text], add_special_tokens=False)[0].ids

    def control_tokens_in(self, text: str) -> list[str]:
        return self._control_regex.findall(text) if self._control_ids else []

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the chat prompt, with control tokens only where the template writes them.

        Message text that spells a control token (a user writing `<|im_end|>`) stays plain text, so
        it cannot end a turn or forge a system message. The template is rendered with a marker in
        place of each content; control tokens are taken from the template's text, and each run
        between them (template text and contents together) is tokenized as one piece, which is
        what tokenizing the whole rendered text gives for ordinary content. A template that edits
        content (trim) would see the marker, so contents go in as sent.
        """
        nonce = uuid.uuid4().hex
        marked = [
            {**m, "content": f"\x00{nonce}:{i}\x00"} if isinstance(m, dict) else m for i, m in enumerate(messages)
        ]
        rendered = self.apply_chat_template(marked, add_generation_prompt)
        parts = re.split(f"\x00{nonce}:(\\d+)\x00", rendered)  # template, content index, template, ...
        ids: list[int] = []
        run = ""
        for k, part in enumerate(parts):
            if k % 2:
                run += messages[int(part)]["content"]
                continue
            pos = 0
            for control in self._control_regex.finditer(part) if self._control_ids else ():
                run += part[pos : control.start()]
                ids += self._encode(self._plain_bpe, run) if run else []
                ids.append(self._control_ids[control.group()])
                run, pos = "", control.end()
            run += part[pos:]
        return ids + (self._encode(self._plain_bpe, run) if run else [])

    def token_bytes(self, token_id: int) -> bytes:
        return self._token_bytes[token_id]

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        raw = b"".join(self._token_bytes[i] for i in ids if not (skip_special and i in self.special_token_ids))
        return raw.decode("utf-8", errors="replace")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        if not self.chat_template:
            raise ValueError("this GGUF has no tokenizer.chat_template; send a plain prompt instead of messages")
        for i, message in enumerate(messages):
            if (
                not isinstance(message, dict)
                or not isinstance(message.get("role"), str)
                or not isinstance(message.get("content"), str)
            ):
                raise ValueError(f"messages[{i}] must be a dict with str 'role' and str 'content'")
        # the settings transformers renders chat templates with
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )

        def raise_exception(message):
            raise ValueError(f"chat template: {message}")

        template = env.from_string(self.chat_template)
        return template.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self._tokens[self.bos_token_id],
            eos_token=self._tokens[self.eos_token_id],
            raise_exception=raise_exception,
        )


class IncrementalDetokenizer:
    """Feed ids one at a time; get back only complete characters (multi-byte UTF-8 is held back)."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.text = ""

    def feed(self, token_id: int) -> str:
        if self._skip_special and token_id in self._tokenizer.special_token_ids:
            return ""
        new_text = self._utf8.decode(self._tokenizer.token_bytes(token_id))
        self.text += new_text
        return new_text

    def flush(self) -> str:
        """Text still held at the end (an unfinished character becomes U+FFFD)."""
        new_text = self._utf8.decode(b"", final=True)
        self.text += new_text
        return new_text


# The tokenizer's fields of a GGUF, kept as JSON: gguf's reader parses every metadata array element by element, and
# SmolLM2's 49,152 tokens and 48,900 merges took 2.5-4.8 s a process here (bench plan, each `bench run` client that
# counts prompts, each test's bench), where reading the JSON copy takes ~0.1 s. Keyed by the file's path, size and
# mtime, so a rewritten file is read again; bump the version when the fields change.
TOKENIZER_CACHE_VERSION = 1


def tokenizer_fields(reader: gguf.GGUFReader) -> dict:
    """Tokenizer's constructor arguments, read from an open GGUF."""

    def field(key, default=None):
        found = reader.fields.get(key)
        if found is None:
            if default is None:
                raise ValueError(f"GGUF file lacks {key!r}; cannot build its tokenizer")
            return default
        return found.contents()

    kind = field("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(f"tokenizer.ggml.model is {kind!r}; native_engine reads only 'gpt2' (byte-level BPE)")
    eos = int(field("tokenizer.ggml.eos_token_id"))
    return {
        "tokens": field("tokenizer.ggml.tokens"),
        "token_types": [int(t) for t in field("tokenizer.ggml.token_type")],
        "merges": field("tokenizer.ggml.merges"),
        "pre": field("tokenizer.ggml.pre"),
        "bos_token_id": int(field("tokenizer.ggml.bos_token_id")),
        "eos_token_ids": [eos] + [i for i in stop_token_ids(reader) if i != eos],
        "add_bos": bool(field("tokenizer.ggml.add_bos_token", False)),
        "chat_template": field("tokenizer.chat_template", ""),
    }


def gguf_tokenizer_fields(path: Path) -> dict:
    """tokenizer_fields of the GGUF at `path`, from the cache when it holds this file's (same path, size, mtime);
    else parsed and written there. A cache that cannot be written (a read-only home) is left alone."""
    identity = file_identity(path, TOKENIZER_CACHE_VERSION)
    cached = cache_dir("gguf-tokenizers") / f"{entry_name(identity)}.json"
    try:
        doc = json.loads(cached.read_text(encoding="utf-8"))
        if doc.get("identity") == identity:
            return doc["fields"]
    except (OSError, ValueError, AttributeError, KeyError):
        pass  # not there yet, or torn: parse the file
    fields = tokenizer_fields(open_gguf(path))
    try:
        cached.parent.mkdir(parents=True, exist_ok=True)
        partial = cached.with_suffix(f".{os.getpid()}.tmp")
        partial.write_text(json.dumps({"identity": identity, "fields": fields}), encoding="utf-8")
        partial.replace(cached)  # whole or absent: two processes may write it at once
    except OSError:
        pass
    return fields
