"""Read a Llama-architecture GGUF file into fp32 numpy weights laid out for `x @ W`."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import gguf
import numpy as np

SUPPORTED_ARCHS = ("llama",)
# Turn-ending control tokens of common chat templates; ChatML's <|im_end|> is SmolLM2's.
STOP_TOKEN_TEXTS = ("<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end_of_text|>")


@dataclass
class ModelConfig:
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    context_length: int
    rope_theta: float
    rms_eps: float
    bos_token_id: int
    eos_token_ids: list[int] = field(default_factory=list)
    name: str = ""


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # [hidden]
    wqkv: np.ndarray  # [hidden, (n_heads + 2 * n_kv_heads) * head_dim]: q, k, v columns side by side
    wo: np.ndarray  # [n_heads * head_dim, hidden]
    ffn_norm: np.ndarray  # [hidden]
    w_gate_up: np.ndarray  # [hidden, 2 * ffn]: gate columns then up columns
    w_down: np.ndarray  # [ffn, hidden]


@dataclass
class ModelWeights:
    token_embedding: np.ndarray  # [vocab, hidden]; with tied embeddings a transposed view of lm_head
    layers: list[LayerWeights]
    output_norm: np.ndarray  # [hidden]
    lm_head: np.ndarray  # [hidden, vocab], contiguous: x @ lm_head is twice as fast as x @ embedding.T
    # the file they came from: runtimes with 4-bit kernels read its Q4_1 blocks as stored (gguf_q4.py)
    gguf_reader: gguf.GGUFReader | None = None

    def matrix_bytes(self) -> int:
        """Bytes one forward step reads from weights (embedding rows for the inputs are negligible)."""
        total = self.output_norm.nbytes + self.lm_head.nbytes
        for layer in self.layers:
            for array in (layer.attn_norm, layer.wqkv, layer.wo, layer.ffn_norm, layer.w_gate_up, layer.w_down):
                total += array.nbytes
        return total


def _field(reader: gguf.GGUFReader, key: str, default=None):
    found = reader.fields.get(key)
    if found is None:
        if default is None:
            raise ValueError(f"GGUF file lacks the metadata field {key!r}; it is not a complete Llama GGUF")
        return default
    return found.contents()


def read_config(reader: gguf.GGUFReader) -> ModelConfig:
    arch = _field(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(
            f"general.architecture is {arch!r}; native_engine runs only {', '.join(SUPPORTED_ARCHS)} "
            "models (use the llama.cpp or vLLM backend for others)"
        )
    hidden = int(_field(reader, f"{arch}.embedding_length"))
    n_heads = int(_field(reader, f"{arch}.attention.head_count"))
    n_kv_heads = int(_field(reader, f"{arch}.attention.head_count_kv", n_heads))
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(_field(reader, f"{arch}.vocab_size", len(tokens.data) if tokens is not None else None))
    eos = int(_field(reader, "tokenizer.ggml.eos_token_id"))
    eos_token_ids = [eos] + [i for i in stop_token_ids(reader) if i != eos]
    return ModelConfig(
        n_layers=int(_field(reader, f"{arch}.block_count")),
        hidden_size=hidden,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        head_dim=int(_field(reader, f"{arch}.rope.dimension_count", hidden // n_heads)),
        ffn_size=int(_field(reader, f"{arch}.feed_forward_length")),
        vocab_size=vocab,
        context_length=int(_field(reader, f"{arch}.context_length")),
        rope_theta=float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rms_eps=float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_ids=eos_token_ids,
        name=str(_field(reader, "general.name", "")),
    )


def stop_token_ids(reader: gguf.GGUFReader) -> list[int]:
    """Control tokens that end a turn in chat templates, besides the declared eos token."""
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    types = reader.fields.get("tokenizer.ggml.token_type")
    if tokens is None or types is None:
        return []
    wanted = set(STOP_TOKEN_TEXTS)
    found = []
    for token_id, (text, kind) in enumerate(zip(tokens.contents(), types.contents())):
        if kind == gguf.TokenType.CONTROL and text in wanted:
            found.append(token_id)
    return found


def open_gguf(path: str | Path | gguf.GGUFReader) -> gguf.GGUFReader:
    """A parsed GGUF, shared by load_gguf and Tokenizer.from_gguf: parsing SmolLM2's 49152-token
    vocabulary takes seconds. Keyed on size and mtime, so a rewritten file is parsed again."""
    if isinstance(path, gguf.GGUFReader):
        return path
    resolved = Path(path).resolve()
    stat = resolved.stat()
    return _parsed_gguf(str(resolved), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=4)
def _parsed_gguf(path: str, size: int, mtime_ns: int) -> gguf.GGUFReader:
    return gguf.GGUFReader(path)


def load_gguf(path: str | Path | gguf.GGUFReader) -> tuple[ModelConfig, ModelWeights]:
    """Config and fp32 weights of a GGUF file (or an open GGUFReader)."""
    reader = open_gguf(path)
    config = read_config(reader)
    tensors = {t.name: t for t in reader.tensors}

    def tensor(name: str) -> np.ndarray:
        """Dequantized fp32 in numpy order: [out, in] for a matrix (GGUF lists dims reversed)."""
        if name not in tensors:
            raise ValueError(f"GGUF file {path} lacks the tensor {name!r}")
        t = tensors[name]
        return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32)

    def for_x_at_w(*out_in_blocks: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(np.concatenate(out_in_blocks, axis=0).T)

    c = config
    layers = []
    for i in range(c.n_layers):
        p = f"blk.{i}."
        layers.append(
            LayerWeights(
                attn_norm=tensor(p + "attn_norm.weight"),
                # Q and K rows as llama.cpp's converter stored them: RoPE rotates adjacent pairs (2i, 2i+1)
                wqkv=for_x_at_w(tensor(p + "attn_q.weight"), tensor(p + "attn_k.weight"), tensor(p + "attn_v.weight")),
                wo=for_x_at_w(tensor(p + "attn_output.weight")),
                ffn_norm=tensor(p + "ffn_norm.weight"),
                w_gate_up=for_x_at_w(tensor(p + "ffn_gate.weight"), tensor(p + "ffn_up.weight")),
                w_down=for_x_at_w(tensor(p + "ffn_down.weight")),
            )
        )
    embedding = tensor("token_embd.weight")
    if embedding.shape != (c.vocab_size, c.hidden_size):
        raise ValueError(f"token_embd.weight has shape {embedding.shape}, expected {(c.vocab_size, c.hidden_size)}")
    if "output.weight" in tensors:
        lm_head = for_x_at_w(tensor("output.weight"))
        embedding = np.ascontiguousarray(embedding)
    else:  # tied: one copy, laid out for the lm_head matmul; lookups read it transposed
        lm_head = for_x_at_w(embedding)
        embedding = lm_head.T
    weights = ModelWeights(
        token_embedding=embedding,
        layers=layers,
        output_norm=tensor("output_norm.weight"),
        lm_head=lm_head,
        gguf_reader=reader,
    )
    return config, weights
