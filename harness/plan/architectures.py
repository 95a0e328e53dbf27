"""A model's architecture as the planner needs it: the shapes that set its weights, KV cache and FLOPs.

Three sources, one dataclass: a GGUF file's metadata (read with `gguf`, the bits per weight from its
tensors' stored sizes), a Hugging Face `config.json`, or the built-in table below (each entry's
`source` is the config.json its numbers were copied from). Dense decoder-only transformers with
grouped-query attention and a gated (SwiGLU) FFN: Llama, Qwen2, Mistral, SmolLM2. Biases, norms'
shapes beyond a vector per layer, and mixture-of-experts are not modelled.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

HF = "https://huggingface.co/{}/blob/main/config.json"


@dataclass(frozen=True)
class Architecture:
    name: str
    n_layers: int
    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_size: int
    vocab_size: int
    weight_bits: float = 16.0  # bf16 checkpoints; a GGUF's own average (Q4_1 is 5.0, Q4_K_M about 4.8)
    tied_embeddings: bool = False  # lm_head shares the embedding matrix (SmolLM2): stored once
    source: str = ""
    # the embedding's and lm_head's bits; None: weight_bits (an average over every tensor, as a GGUF's). A quantized
    # deployment keeps them at 16 (harness/scenario/precision.py)
    embedding_bits: float | None = None

    def layer_params(self) -> int:
        """Weights of one transformer layer: q, k, v, o projections, gate/up/down FFN, two norms."""
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        attention = self.hidden_size * (q_dim + 2 * kv_dim) + q_dim * self.hidden_size
        return attention + 3 * self.hidden_size * self.ffn_size + 2 * self.hidden_size

    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        """Every stored weight: layers, the final norm, the embedding, and lm_head unless tied."""
        embeddings = self.lm_head_params() * (1 if self.tied_embeddings else 2)
        return self.n_layers * self.layer_params() + self.hidden_size + embeddings

    @property
    def lm_head_bits(self) -> float:
        return self.weight_bits if self.embedding_bits is None else self.embedding_bits

    def stored_bytes(self) -> float:
        """Every stored weight at its bits: the layers and final norm at weight_bits, the embeddings at
        lm_head_bits (the norms inside the layers count at weight_bits: 0.004% of Llama-3.1-8B)."""
        embeddings = self.lm_head_params() * (1 if self.tied_embeddings else 2)
        layers = self.param_count() - embeddings
        return (layers * self.weight_bits + embeddings * self.lm_head_bits) / 8

    def step_weight_bytes(self) -> float:
        """The weights a forward step reads: every layer's and lm_head's (the embedding is a lookup)."""
        return (self.matmul_params() * self.weight_bits + self.lm_head_params() * self.lm_head_bits) / 8

    def matmul_params(self) -> int:
        """Weights every token multiplies through (2 FLOPs each): the layers. lm_head is counted apart,
        since only the rows that sample a token go through it; the embedding is a lookup."""
        return self.n_layers * self.layer_params()


def _hf(repo: str) -> str:
    return HF.format(repo)


BUILTIN = {
    a.name: a
    for a in (
        Architecture("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, source=_hf("meta-llama/Llama-3.1-8B")),
        Architecture("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, source=_hf("meta-llama/Llama-3.1-70B")),
        # meta-llama's repository is gated; the numbers match its public copy TheBloke/Llama-2-70B-fp16's config.json
        # (_name_or_path meta-llama/Llama-2-70b-hf): 80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672, vocab
        # 32000 (head_dim 8192 / 64). Llama-2-70b-chat-hf (MLPerf's model) has the same config
        Architecture("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, source=_hf("meta-llama/Llama-2-70b-hf")),
        # 8 KV heads as in the config since Meta's update (relaxml/Llama-3.1-405B-Instruct-QTIP-2Bit-TP8's copy,
        # _name_or_path meta-llama/Meta-Llama-3.1-405B-Instruct, transformers 4.45.2); the first release said 16, the
        # same 8 heads duplicated (discussion #14 on meta-llama/Llama-3.1-405B-Instruct), which doubles the KV bytes
        Architecture(
            "llama-3.1-405b", 126, 16384, 128, 8, 128, 53248, 128256, source=_hf("meta-llama/Llama-3.1-405B-Instruct")
        ),
        Architecture("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, source=_hf("Qwen/Qwen2.5-7B")),
        Architecture("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064, source=_hf("Qwen/Qwen2.5-32B")),
        Architecture("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32768, source=_hf("mistralai/Mistral-7B-v0.3")),
        Architecture(
            "smollm2-135m",
            30,
            576,
            9,
            3,
            64,
            1536,
            49152,
            tied_embeddings=True,
            source=_hf("HuggingFaceTB/SmolLM2-135M-Instruct"),
        ),
    )
}


# Other names of a built-in architecture: name -> (the built-in whose config it shares, the repository it names).
# Llama-3.3-70B(-Instruct) is Llama-3.1-70B's architecture: 80 layers, hidden 8192, 64 heads, 8 KV heads, FFN 28672,
# vocab 128256, untied (meta-llama/Llama-3.3-70B-Instruct's config.json, gated; the same numbers in oumi's
# configs/recipes/llama3_3/README.md). An -Instruct model is its base's architecture, fine-tuned.
ALIASES = {
    "llama-3.3-70b": ("llama-3.1-70b", "meta-llama/Llama-3.3-70B-Instruct"),
    "llama-3.3-70b-instruct": ("llama-3.1-70b", "meta-llama/Llama-3.3-70B-Instruct"),
    "llama-3.1-70b-instruct": ("llama-3.1-70b", "meta-llama/Llama-3.1-70B-Instruct"),
    "llama-3.1-8b-instruct": ("llama-3.1-8b", "meta-llama/Llama-3.1-8B-Instruct"),
    "llama-3.1-405b-instruct": ("llama-3.1-405b", "meta-llama/Llama-3.1-405B-Instruct"),
    "llama-2-70b-chat": ("llama-2-70b", "meta-llama/Llama-2-70b-chat-hf"),
    "qwen2.5-7b-instruct": ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct"),
    "qwen2.5-32b-instruct": ("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct"),
    "mistral-7b-instruct": ("mistral-7b", "mistralai/Mistral-7B-Instruct-v0.3"),
}


def builtin_or_alias(model: str) -> Architecture | None:
    """A built-in architecture by its name, an alias, or a repository id whose name is either
    (meta-llama/Llama-3.3-70B-Instruct); an alias keeps its own name and repository, so reports name that model."""
    key = model.lower()
    name = key.split("/", 1)[1] if key.count("/") == 1 else key
    for candidate in (key, name):
        if candidate in BUILTIN or candidate == "smollm2":
            return BUILTIN.get(candidate) or BUILTIN["smollm2-135m"]
        if candidate in ALIASES:
            builtin, repo = ALIASES[candidate]
            return dataclasses.replace(BUILTIN[builtin], name=candidate, source=_hf(repo))
    return None


def load_architecture(model: str, weight_bits: float | None = None) -> Architecture:
    """A built-in name or alias (case-insensitive; 'smollm2' is SmolLM2-135M; a repository id of one, too), a .gguf
    path or a config.json path; `weight_bits` overrides the stored precision (e.g. 4.5 for a 4-bit quantisation with
    its scales)."""
    if not model.endswith((".gguf", ".json")) and (known := builtin_or_alias(model)) is not None:
        arch = known
    elif model.endswith(".gguf"):
        arch = from_gguf(model)
    elif model.endswith(".json"):
        arch = from_hf_config(model)
    else:
        raise ValueError(
            f"model {model!r}: not a built-in architecture ({', '.join(BUILTIN)}; aliases: {', '.join(ALIASES)}), "
            "nor a .gguf or config.json path"
        )
    return dataclasses.replace(arch, weight_bits=weight_bits) if weight_bits else arch


class HfConfig(BaseModel):
    """The keys of a Hugging Face config.json the planner reads (Llama, Qwen2 and Mistral spell them the same
    way); the others are ignored."""

    model_config = ConfigDict(extra="ignore")
    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    num_key_value_heads: int | None = None  # None: as many as the query heads (no grouped-query attention)
    head_dim: int | None = None  # None: hidden_size / num_attention_heads
    torch_dtype: str | None = "bfloat16"
    tie_word_embeddings: bool | None = False
    name_or_path: str | None = Field(None, alias="_name_or_path")


DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}


def _read_hf_config(path: str | Path) -> HfConfig:
    """The config.json at `path`; ValueError naming what it lacks or holds wrongly."""
    try:
        return HfConfig.model_validate_json(Path(path).read_bytes())
    except ValidationError as error:
        missing = [str(e["loc"][0]) for e in error.errors() if e["type"] == "missing"]
        if missing:
            raise ValueError(
                f"{path}: config.json lacks {', '.join(missing)}; is it a decoder-only LLM's config?"
            ) from None
        first = error.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise ValueError(f"{path}: config.json {where or '(top)'}: {first['msg']}") from None


def from_hf_config(path: str | Path) -> Architecture:
    """The architecture in a Hugging Face config.json."""
    config = _read_hf_config(path)
    heads = config.num_attention_heads
    return Architecture(
        name=config.name_or_path or Path(path).parent.name,
        n_layers=config.num_hidden_layers,
        hidden_size=config.hidden_size,
        n_heads=heads,
        n_kv_heads=config.num_key_value_heads or heads,
        head_dim=config.head_dim or config.hidden_size // heads,
        ffn_size=config.intermediate_size,
        vocab_size=config.vocab_size,
        weight_bits=float(DTYPE_BITS.get(config.torch_dtype, 16)),
        tied_embeddings=bool(config.tie_word_embeddings),
        source=str(path),
    )


def from_gguf(path: str | Path) -> Architecture:
    """The architecture in a GGUF's metadata; weight bits are the tensors' stored bytes over their elements."""
    from native_engine.gguf_model import open_gguf  # parses the file once per process

    reader = open_gguf(path)

    def field(key: str, default=None):
        found = reader.fields.get(key)
        if found is None and default is None:
            raise ValueError(f"{path}: GGUF metadata lacks {key!r}")
        return default if found is None else found.contents()

    arch = field("general.architecture")
    heads = int(field(f"{arch}.attention.head_count"))
    hidden = int(field(f"{arch}.embedding_length"))
    tensors = {t.name: t for t in reader.tensors}
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    vocab = int(field(f"{arch}.vocab_size", len(tokens.data) if tokens is not None else None))
    stored_bits = 8 * sum(int(t.n_bytes) for t in reader.tensors) / sum(int(t.n_elements) for t in reader.tensors)
    return Architecture(
        name=str(field("general.name", Path(path).stem)),
        n_layers=int(field(f"{arch}.block_count")),
        hidden_size=hidden,
        n_heads=heads,
        n_kv_heads=int(field(f"{arch}.attention.head_count_kv", heads)),
        head_dim=int(field(f"{arch}.attention.key_length", hidden // heads)),
        ffn_size=int(field(f"{arch}.feed_forward_length")),
        vocab_size=vocab,
        weight_bits=round(stored_bits, 3),
        tied_embeddings="output.weight" not in tensors,
        source=str(path),
    )
