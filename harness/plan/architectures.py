"""A model's architecture as the planner needs it: the shapes that set its weights, KV cache and FLOPs.

Three sources, one dataclass: a GGUF file's metadata (read with `gguf`, the bits per weight from its
tensors' stored sizes), a Hugging Face `config.json`, or the built-in table below (each entry's
`source` is the config.json its numbers were copied from). Decoder-only transformers with a gated (SwiGLU) FFN:
dense ones with grouped-query attention (Llama, Qwen2, Mistral, SmolLM2), and mixture-of-experts ones
(Mixtral, Qwen3-MoE, DeepSeek-V2/V3/R1 with multi-head latent attention, GPT-OSS with its sliding-window layers):

- **Experts**: an MoE layer holds `n_experts` routed experts and `n_shared_experts` always-on ones, each a gated FFN
  of `expert_ffn_size`, and a router (hidden x experts); a token goes through its `experts_per_token` routed
  experts and the shared ones. The first `dense_layers` layers keep a dense FFN of `ffn_size` (DeepSeek's
  first_k_dense_replace). Every expert is stored; a step reads the experts its tokens were routed to
  (harness/plan/roofline_model.py).
- **MLA** (`kv_lora_rank` > 0): the KV cache holds one latent of kv_lora_rank + qk_rope_head_dim elements a token a
  layer (DeepSeek-V3: 512 + 64), not K and V per head, and every GPU of a TP group holds all of it (vLLM and
  SGLang replicate it); `head_dim` is the query-key width (qk_nope + qk_rope) and `v_head_dim` the value's.
- **Sliding windows** (`sliding_window` > 0): `sliding_layers` of the layers attend to, and keep the KV of, at most
  the last `sliding_window` tokens (GPT-OSS: every other layer, 128 tokens).
- **Precision**: `expert_bits` is the routed experts' bits when the checkpoint stores them apart (GPT-OSS: MXFP4,
  4.25 bits: 4-bit values and an 8-bit scale per 32); an fp8 checkpoint (DeepSeek-V3's quantization_config) stores
  the layers at 8 bits and the embedding and lm_head at 16.

Not modelled: biases (GPT-OSS's attention and expert biases, 0.01% of its weights), norms' shapes beyond a vector per
layer (Qwen3's per-head q/k norms, MLA's latent norms are counted), attention sinks (one scalar a head), DeepSeek's
multi-token-prediction layer (num_nextn_predict_layers: 14 B weights HF's 685 B counts and the 671 B does not; an
engine loads it only for speculative decoding), the router's expert-bias correction, and DeepSeek's grouped routing
(n_group / topk_group: routing is taken as uniform over all experts).
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
    ffn_size: int  # a dense layer's FFN width (DeepSeek's first layers; unused where every layer is MoE)
    vocab_size: int
    weight_bits: float = 16.0  # bf16 checkpoints; a GGUF's own average (Q4_1 is 5.0, Q4_K_M about 4.8)
    tied_embeddings: bool = False  # lm_head shares the embedding matrix (SmolLM2): stored once
    source: str = ""
    # the embedding's and lm_head's bits; None: weight_bits (an average over every tensor, as a GGUF's). A quantized
    # deployment keeps them at 16 (harness/scenario/precision.py)
    embedding_bits: float | None = None
    # mixture of experts (n_experts 0: a dense model)
    n_experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 0  # top-k: routed experts a token goes through
    n_shared_experts: int = 0  # experts every token goes through, beside the routed ones (DeepSeek: 1)
    expert_ffn_size: int = 0  # one expert's FFN width (moe_intermediate_size; Mixtral's intermediate_size)
    dense_layers: int = 0  # layers keeping a dense FFN (DeepSeek's first_k_dense_replace, Qwen's mlp_only_layers)
    expert_bits: float | None = None  # the routed experts' bits; None: weight_bits (GPT-OSS's MXFP4: 4.25)
    # multi-head latent attention (kv_lora_rank 0: grouped-query attention)
    q_lora_rank: int = 0  # 0: queries projected straight from the hidden state
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0  # 0: head_dim
    # sliding-window attention: sliding_layers of the layers keep at most the last sliding_window tokens
    sliding_window: int = 0
    sliding_layers: int = 0

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    @property
    def moe_layers(self) -> int:
        return self.n_layers - self.dense_layers if self.is_moe else 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def value_head_dim(self) -> int:
        return self.v_head_dim or self.head_dim

    def attention_params(self) -> int:
        """One layer's attention weights: q, k, v, o projections (MLA: the query and KV down- and up-projections,
        their norms, and o)."""
        h, heads = self.hidden_size, self.n_heads
        if not self.is_mla:
            q_dim, kv_dim = heads * self.head_dim, self.n_kv_heads * self.head_dim
            return h * (q_dim + 2 * kv_dim) + q_dim * h
        q_dim = heads * self.head_dim
        query = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * q_dim if self.q_lora_rank else h * q_dim
        nope = self.head_dim - self.qk_rope_head_dim
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank
        kv += self.kv_lora_rank * heads * (nope + self.value_head_dim)
        return query + kv + heads * self.value_head_dim * h

    def layer_params(self) -> int:
        """Weights of one dense transformer layer: attention, gate/up/down FFN of ffn_size, two norms."""
        return self.attention_params() + 3 * self.hidden_size * self.ffn_size + 2 * self.hidden_size

    def expert_params(self) -> int:
        """One expert's weights: a gated FFN of expert_ffn_size."""
        return 3 * self.hidden_size * self.expert_ffn_size

    def moe_layer_params(self) -> int:
        """Weights of one MoE layer: attention, the router, every routed and shared expert, two norms."""
        experts = (self.n_experts + self.n_shared_experts) * self.expert_params()
        router = self.hidden_size * self.n_experts
        return self.attention_params() + router + experts + 2 * self.hidden_size

    def routed_expert_params(self) -> int:
        """Every routed expert's weights, all MoE layers: what expert parallelism divides and a step reads in part."""
        return self.moe_layers * self.n_experts * self.expert_params()

    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def param_count(self) -> int:
        """Every stored weight: layers, the final norm, the embedding, and lm_head unless tied."""
        embeddings = self.lm_head_params() * (1 if self.tied_embeddings else 2)
        return self.matmul_params() + self.hidden_size + embeddings

    def active_params(self) -> int:
        """The weights one token goes through, as model cards count "active" parameters: the layers with
        experts_per_token routed experts (and the shared ones), the embedding row's matrix and lm_head."""
        return self.param_count() - self.routed_expert_params() + self.moe_layers * self.active_expert_params()

    def active_expert_params(self) -> int:
        return self.experts_per_token * self.expert_params()

    @property
    def lm_head_bits(self) -> float:
        return self.weight_bits if self.embedding_bits is None else self.embedding_bits

    @property
    def routed_expert_bits(self) -> float:
        return self.weight_bits if self.expert_bits is None else self.expert_bits

    def stored_bytes(self) -> float:
        """Every stored weight at its bits: the layers and final norm at weight_bits (the routed experts at
        expert_bits), the embeddings at lm_head_bits (the norms inside the layers count at weight_bits: 0.004% of
        Llama-3.1-8B)."""
        embeddings = self.lm_head_params() * (1 if self.tied_embeddings else 2)
        layers = self.param_count() - embeddings
        return (
            self.routed_expert_bytes()
            + ((layers - self.routed_expert_params()) * self.weight_bits + embeddings * self.lm_head_bits) / 8
        )

    def routed_expert_bytes(self) -> float:
        return self.routed_expert_params() * self.routed_expert_bits / 8

    def one_expert_bytes(self) -> float:
        return self.expert_params() * self.routed_expert_bits / 8

    def step_weight_bytes(self) -> float:
        """The weights a forward step reads with every expert touched: every layer's and lm_head's (the embedding is
        a lookup). An MoE step reads its tokens' experts only: always_read_bytes() + the experts touched."""
        return self.always_read_bytes() + self.routed_expert_bytes()

    def always_read_bytes(self) -> float:
        """The weights every step reads whatever the routing: the layers less the routed experts (attention, dense
        FFNs, shared experts, routers, norms), and lm_head."""
        dense = (self.matmul_params() - self.routed_expert_params()) * self.weight_bits
        return (dense + self.lm_head_params() * self.lm_head_bits) / 8

    def matmul_params(self) -> int:
        """Every weight in the layers, every expert included (a dense model's: the weights every token multiplies
        through, 2 FLOPs each). lm_head is counted apart, since only the rows that sample a token go through it;
        the embedding is a lookup."""
        dense = self.n_layers - self.moe_layers
        return dense * self.layer_params() + self.moe_layers * self.moe_layer_params()

    def active_matmul_params(self) -> int:
        """The layers' weights a token multiplies through: matmul_params with its routed experts only."""
        return self.matmul_params() - self.routed_expert_params() + self.moe_layers * self.active_expert_params()

    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query, attended position) pair over every layer: q.k over head_dim and the weighted sum over
        value_head_dim, 2 each per head (4 x heads x head_dim where they are equal)."""
        return 2 * self.n_layers * self.n_heads * (self.head_dim + self.value_head_dim)

    def kv_elements_per_token_layer(self, tensor_parallel: int = 1) -> int:
        """K and V elements one layer keeps for a token on one GPU: MLA's latent (kv_lora_rank + qk_rope_head_dim,
        on every GPU of the group), else 2 x this GPU's KV heads x head_dim."""
        if self.is_mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        heads = max(1, -(-self.n_kv_heads // tensor_parallel))
        return 2 * heads * self.head_dim

    @property
    def full_attention_layers(self) -> int:
        """Layers that keep every token's KV (the others keep at most sliding_window tokens)."""
        return self.n_layers - (self.sliding_layers if self.sliding_window else 0)


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
        # Mixture of experts. Each entry's numbers are its config.json's (the fields named in from_hf_config); the
        # parameter counts they give are checked against the model cards in tests/test_plan_moe.py.
        # Mixtral: num_local_experts 8, num_experts_per_tok 2, each expert's FFN intermediate_size 14336, no shared
        # experts, every layer MoE; sliding_window null (full attention over its 32k context)
        Architecture(
            "mixtral-8x7b",
            32,
            4096,
            32,
            8,
            128,
            14336,
            32000,
            n_experts=8,
            experts_per_token=2,
            expert_ffn_size=14336,
            source=_hf("mistralai/Mixtral-8x7B-v0.1"),
        ),
        # Qwen3-MoE: num_experts 128, num_experts_per_tok 8, moe_intermediate_size 768, decoder_sparse_step 1 and
        # mlp_only_layers [] (every layer MoE; intermediate_size 6144 is unused), head_dim 128, no sliding window
        Architecture(
            "qwen3-30b-a3b",
            48,
            2048,
            32,
            4,
            128,
            6144,
            151936,
            n_experts=128,
            experts_per_token=8,
            expert_ffn_size=768,
            source=_hf("Qwen/Qwen3-30B-A3B"),
        ),
        Architecture(
            "qwen3-235b-a22b",
            94,
            4096,
            64,
            4,
            128,
            12288,
            151936,
            n_experts=128,
            experts_per_token=8,
            expert_ffn_size=1536,
            source=_hf("Qwen/Qwen3-235B-A22B"),
        ),
        # DeepSeek-V3 (R1 is the same architecture): n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1,
        # moe_intermediate_size 2048, first_k_dense_replace 3 (those layers' FFN: intermediate_size 18432); MLA with
        # q_lora_rank 1536, kv_lora_rank 512, qk_nope_head_dim 128 + qk_rope_head_dim 64 (head_dim 192), v_head_dim
        # 128; quantization_config fp8 (block 128 x 128: the layers at 8 bits, embedding and lm_head bf16).
        # num_nextn_predict_layers 1 (the MTP layer) is not counted
        Architecture(
            "deepseek-v3",
            61,
            7168,
            128,
            128,
            192,
            18432,
            129280,
            weight_bits=8.0,
            embedding_bits=16.0,
            n_experts=256,
            experts_per_token=8,
            n_shared_experts=1,
            expert_ffn_size=2048,
            dense_layers=3,
            q_lora_rank=1536,
            kv_lora_rank=512,
            qk_rope_head_dim=64,
            v_head_dim=128,
            source=_hf("deepseek-ai/DeepSeek-V3"),
        ),
        # GPT-OSS: num_local_experts 128 (20b: 32), experts_per_token 4, intermediate_size 2880 (each expert's),
        # head_dim 64, sliding_window 128 on the "sliding_attention" half of layer_types (alternating with
        # "full_attention"); quantization_config mxfp4 on the experts only (attention, router, embedding and lm_head
        # bf16: modules_to_not_convert)
        Architecture(
            "gpt-oss-120b",
            36,
            2880,
            64,
            8,
            64,
            2880,
            201088,
            n_experts=128,
            experts_per_token=4,
            expert_ffn_size=2880,
            expert_bits=4.25,
            sliding_window=128,
            sliding_layers=18,
            source=_hf("openai/gpt-oss-120b"),
        ),
        Architecture(
            "gpt-oss-20b",
            24,
            2880,
            64,
            8,
            64,
            2880,
            201088,
            n_experts=32,
            experts_per_token=4,
            expert_ffn_size=2880,
            expert_bits=4.25,
            sliding_window=128,
            sliding_layers=12,
            source=_hf("openai/gpt-oss-20b"),
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
    # DeepSeek-R1 and the V3 updates are DeepSeek-V3's architecture (their config.json: the same shapes)
    "deepseek-r1": ("deepseek-v3", "deepseek-ai/DeepSeek-R1"),
    "deepseek-r1-0528": ("deepseek-v3", "deepseek-ai/DeepSeek-R1-0528"),
    "deepseek-v3-0324": ("deepseek-v3", "deepseek-ai/DeepSeek-V3-0324"),
    "mixtral-8x7b-v0.1": ("mixtral-8x7b", "mistralai/Mixtral-8x7B-v0.1"),
    "mixtral-8x7b-instruct": ("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    "mixtral-8x7b-instruct-v0.1": ("mixtral-8x7b", "mistralai/Mixtral-8x7B-Instruct-v0.1"),
    "qwen3-30b-a3b-instruct-2507": ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B-Instruct-2507"),
    "qwen3-235b-a22b-instruct-2507": ("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B-Instruct-2507"),
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
    whole = {"weight_bits": weight_bits, "embedding_bits": None, "expert_bits": None}  # an average over every tensor
    return dataclasses.replace(arch, **whole) if weight_bits else arch


class HfConfig(BaseModel):
    """The keys of a Hugging Face config.json the planner reads, as each family spells them (Llama, Qwen2 and Mistral
    the same way; the experts' count is num_local_experts in Mixtral and GPT-OSS, num_experts in Qwen-MoE,
    n_routed_experts in DeepSeek); the others are ignored."""

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
    # mixture of experts
    num_local_experts: int | None = None  # Mixtral, GPT-OSS
    num_experts: int | None = None  # Qwen2-MoE, Qwen3-MoE
    n_routed_experts: int | None = None  # DeepSeek-V2/V3
    num_experts_per_tok: int | None = None
    experts_per_token: int | None = None  # GPT-OSS's own spelling beside num_experts_per_tok
    moe_intermediate_size: int | None = None  # None: intermediate_size (Mixtral, GPT-OSS)
    n_shared_experts: int | None = None  # DeepSeek
    shared_expert_intermediate_size: int | None = None  # Qwen2-MoE: one shared expert this wide
    first_k_dense_replace: int | None = None  # DeepSeek: the first layers keep a dense FFN
    moe_layer_freq: int | None = None  # DeepSeek: 1, every layer past the dense ones
    decoder_sparse_step: int | None = None  # Qwen-MoE: every step-th layer is MoE
    mlp_only_layers: list[int] | None = None  # Qwen-MoE: layers kept dense
    # multi-head latent attention (DeepSeek)
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    qk_rope_head_dim: int | None = None
    v_head_dim: int | None = None
    # sliding-window attention
    sliding_window: int | None = None
    use_sliding_window: bool | None = None  # Qwen: false leaves sliding_window unused
    layer_types: list[str] | None = None  # GPT-OSS: "sliding_attention" / "full_attention" per layer
    quantization_config: dict | None = None  # quant_method fp8 (DeepSeek-V3), mxfp4 (GPT-OSS's experts)


DTYPE_BITS = {"float32": 32, "float16": 16, "bfloat16": 16}
MXFP4_BITS = 4.25  # 4-bit E2M1 values and one 8-bit E8M0 scale per 32 (OCP MX): GPT-OSS's experts


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


def _moe_fields(config: HfConfig, path: str | Path) -> dict:
    """Architecture's expert fields from a config (empty for a dense model)."""
    experts = config.num_local_experts or config.num_experts or config.n_routed_experts or 0
    if not experts:
        return {}
    expert_ffn = config.moe_intermediate_size or config.intermediate_size
    shared = config.n_shared_experts or 0
    if config.shared_expert_intermediate_size:  # Qwen2-MoE: one wide shared expert, counted in expert widths
        shared = round(config.shared_expert_intermediate_size / expert_ffn)
    if (config.moe_layer_freq or 1) != 1:
        raise ValueError(f"{path}: moe_layer_freq {config.moe_layer_freq}: MoE on every n-th layer is not modelled")
    layers = config.num_hidden_layers
    step = config.decoder_sparse_step or 1
    moe = {i for i in range(layers) if (i + 1) % step == 0} - set(config.mlp_only_layers or [])
    dense = max(layers - len(moe), config.first_k_dense_replace or 0)
    return {
        "n_experts": experts,
        "experts_per_token": config.num_experts_per_tok or config.experts_per_token or 1,
        "n_shared_experts": shared,
        "expert_ffn_size": expert_ffn,
        "dense_layers": dense,
    }


def _mla_fields(config: HfConfig) -> dict:
    """MLA's ranks and widths (empty without kv_lora_rank); head_dim is the query-key width, nope + rope."""
    if not config.kv_lora_rank:
        return {}
    rope, nope = config.qk_rope_head_dim or 0, config.qk_nope_head_dim or 0
    return {
        "head_dim": nope + rope,
        "q_lora_rank": config.q_lora_rank or 0,
        "kv_lora_rank": config.kv_lora_rank,
        "qk_rope_head_dim": rope,
        "v_head_dim": config.v_head_dim or 0,
    }


def _window_fields(config: HfConfig) -> dict:
    """The sliding window and how many layers use it: layer_types' sliding ones, else every layer (Mistral); none
    where Qwen's use_sliding_window is false."""
    if not config.sliding_window or config.use_sliding_window is False:
        return {}
    types = config.layer_types
    sliding = sum(t == "sliding_attention" for t in types) if types else config.num_hidden_layers
    return {"sliding_window": config.sliding_window, "sliding_layers": sliding} if sliding else {}


def _precision_fields(config: HfConfig) -> dict:
    """The checkpoint's own bits: torch_dtype, or quantization_config's fp8 (the layers) and mxfp4 (the experts)."""
    method = str((config.quantization_config or {}).get("quant_method", "")).lower()
    bits = float(DTYPE_BITS.get(config.torch_dtype, 16))
    if method == "fp8":
        return {"weight_bits": 8.0, "embedding_bits": bits}
    if method == "mxfp4":
        return {"weight_bits": bits, "expert_bits": MXFP4_BITS}
    return {"weight_bits": bits}


def from_hf_config(path: str | Path) -> Architecture:
    """The architecture in a Hugging Face config.json: dense, mixture-of-experts, MLA and sliding-window fields."""
    config = _read_hf_config(path)
    heads = config.num_attention_heads
    fields = {
        "name": config.name_or_path or Path(path).parent.name,
        "n_layers": config.num_hidden_layers,
        "hidden_size": config.hidden_size,
        "n_heads": heads,
        "n_kv_heads": config.num_key_value_heads or heads,
        "head_dim": config.head_dim or config.hidden_size // heads,
        "ffn_size": config.intermediate_size,
        "vocab_size": config.vocab_size,
        "tied_embeddings": bool(config.tie_word_embeddings),
        "source": str(path),
    }
    fields |= _moe_fields(config, path) | _mla_fields(config) | _window_fields(config) | _precision_fields(config)
    return Architecture(**fields)


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
