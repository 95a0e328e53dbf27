"""The forward step of model_runner.py in torch: weights kept int4/int8 (or bf16), same paged KV cache, CPU or CUDA.

Same interface as ModelRunner (forward over SeqChunks -> fp32 logits as numpy) and the same step plan:
validation, KV slots, RoPE lookup and decode groups come from ModelRunner's own planning code, so
both runtimes read exactly the same blocks. What differs is the kernels: the weight matmuls are
torch_linear.py's (int4: the GGUF's own Q4_1 blocks, torch_int4.py), and attention is torch's
scaled_dot_product_attention over the blocks of each sequence only (gathered, or viewed, never the whole cache).
On CUDA, decode-only steps replay CUDA graphs (torch_cuda_graphs.py) unless turned off.

Install torch's CPU build first (`pip install torch --index-url https://download.pytorch.org/whl/cpu`),
then `pip install -e '.[torch]'`: PyPI's Linux torch is the CUDA build (docs/runtimes.md).
Which kernels run many-row steps depends on the CPU: torch_kernels.py.
"""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import torch
import torch.nn.functional as F

from native_engine.gguf_model import ModelConfig, ModelWeights
from native_engine.model_runner import ModelRunner, SeqChunk
from native_engine.torch_kernels import this_cpu
from native_engine.torch_linear import DTYPES, LayerMatrices, lm_head_matrix

DEVICES = ("cpu", "cuda", "auto")
log = logging.getLogger(__name__)


def cpu_threads() -> int:
    """Cores this process may run on (a container's or taskset's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_device(device: str) -> str:
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: choose one of {', '.join(DEVICES)}")
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda': this torch sees no CUDA GPU (a CPU build, or no driver); use --device cpu")
    return device


class TorchModelRunner:
    # The step plan (checks, slots, RoPE rows, decode groups) is ModelRunner's, read off this object's
    # config, kv_block_size, num_kv_blocks and rope_rotation: one planning code for both runtimes.
    _plan = ModelRunner._plan
    _decode_groups = ModelRunner._decode_groups

    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        num_kv_blocks: int,
        kv_block_size: int = 16,
        dtype: str = "int4",
        threads: int = 0,
        device: str = "cpu",
        cuda_graphs: bool = True,
    ):
        if num_kv_blocks < 1 or kv_block_size < 1:
            raise ValueError(f"num_kv_blocks ({num_kv_blocks}) and kv_block_size ({kv_block_size}) must be >= 1")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        if dtype in ("int4", "int8") and device != "cpu":  # checked before resolving: same answer with or without a GPU
            raise ValueError(f"dtype {dtype!r} runs on CPUs only (torch's CPU kernels); use --dtype bf16 on CUDA")
        self.device = device = resolve_device(device)
        self.threads = threads or cpu_threads()
        torch.set_num_threads(self.threads)
        self.config, self.num_kv_blocks, self.kv_block_size, self.dtype = config, num_kv_blocks, kv_block_size, dtype
        c = config
        self.kernels = this_cpu()  # which kernels many-row steps take on this CPU (used by int4 and int8)
        if device == "cpu" and dtype in ("int4", "int8"):
            log.info("torch runtime, %s weights: %s", dtype, self.kernels.describe())
        self.layers = [LayerMatrices(weights, i, dtype, device, self.kernels) for i in range(c.n_layers)]
        self.output_norm = torch.tensor(weights.output_norm, device=device)
        self.lm_head = lm_head_matrix(weights, dtype, device, self.kernels)
        tied = np.may_share_memory(weights.token_embedding, weights.lm_head)
        rows = np.ascontiguousarray(weights.lm_head.T) if tied else np.ascontiguousarray(weights.token_embedding)
        self.embedding = torch.from_numpy(rows).to(device)  # fp32: a few rows are looked up a step
        # one block more than the block manager hands out: padded rows of a CUDA graph write there
        cache_shape = (c.n_layers, num_kv_blocks + 1, kv_block_size, c.n_kv_heads, c.head_dim)
        self.k_cache = torch.zeros(cache_shape, dtype=torch.float32, device=device)  # zeros: pages touched now
        self.v_cache = torch.zeros(cache_shape, dtype=torch.float32, device=device)
        kv_dim = c.n_kv_heads * c.head_dim  # each layer's cache as rows of slots, for the step's writes
        self.k_slots, self.v_slots = (
            [layer.view(-1, kv_dim) for layer in cache] for cache in (self.k_cache, self.v_cache)
        )
        self.kv_cache_bytes = 2 * self.k_cache.numel() * 4
        self.kv_bytes_per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4
        # FLOPs count weights, not bytes: int4 holds half a byte a weight, int8 one, bf16 two
        self.matmul_params = sum(m.params for layer in self.layers for m in layer.matrices())
        self.lm_head_params = self.lm_head.params
        self.weight_bytes = self.weight_bytes_read(1, 1)  # a single sequence's decode step
        self.last_step_bytes_read = 0
        self.attn_scale = 1.0 / math.sqrt(c.head_dim)
        half = c.head_dim // 2
        inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2 / c.head_dim))
        angles = np.arange(c.context_length, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.rope_rotation = np.exp(1j * angles).astype(np.complex64)  # read by _plan
        self.cuda_decode = None  # decode-only steps on CUDA: one fixed-shape function, graph-captured or not
        if device == "cuda":
            from native_engine.torch_cuda_graphs import CudaDecode

            self.cuda_decode = CudaDecode(self, graphs=cuda_graphs)

    def weight_bytes_read(self, rows: int, logit_rows: int) -> int:
        """Bytes of weights a step of `rows` tokens reads, `logit_rows` of them through the lm_head: each
        matrix's kernel for that many rows decides (a 4-bit kernel for few rows, a dense copy for many)."""
        lm_head = self.lm_head.bytes_read(logit_rows) if logit_rows else 0
        return sum(layer.bytes_read(rows) for layer in self.layers) + lm_head + 4 * self.config.hidden_size

    def _tensor(self, array: np.ndarray) -> torch.Tensor:
        return torch.from_numpy(array).to(self.device, non_blocking=True)

    # -- attention: q [n, n_heads, head_dim] -> [n, n_heads * head_dim] ------------------
    def decode_attention(self, layer: int, q: torch.Tensor, blocks: torch.Tensor, key_bias: torch.Tensor):
        """Single-token chunks at once; the query heads of a KV head are SDPA's 'length' (GQA without copies).
        blocks [n, max_blocks]; key_bias [n, 1, 1, max_blocks * block_size]: 0 for valid keys, -inf after."""
        c = self.config
        n, group = q.shape[0], c.n_heads // c.n_kv_heads
        keys = self.k_cache[layer].index_select(0, blocks.reshape(-1)).view(n, -1, c.n_kv_heads, c.head_dim)
        values = self.v_cache[layer].index_select(0, blocks.reshape(-1)).view(n, -1, c.n_kv_heads, c.head_dim)
        out = F.scaled_dot_product_attention(
            q.reshape(n, c.n_kv_heads, group, c.head_dim),
            keys.transpose(1, 2),
            values.transpose(1, 2),
            attn_mask=key_bias,
            scale=self.attn_scale,
        )
        return out.reshape(n, c.n_heads * c.head_dim)

    def _one_decode_attention(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor):
        """One sequence alone (batch 1): keys and values [1, n_kv_heads, context, head_dim], no mask.
        On one thread: SDPA splits its 3 KV heads across threads, and the hand-off costs more than the
        work (16 us on one thread, 35 to 700 us on two of a shared 2-core machine)."""
        c = self.config
        torch.set_num_threads(1)
        out = F.scaled_dot_product_attention(
            q.view(1, c.n_kv_heads, -1, c.head_dim), keys, values, scale=self.attn_scale
        )
        torch.set_num_threads(self.threads)
        return out.view(1, c.n_heads * c.head_dim)

    def _one_sequence_kv(self, table: np.ndarray, context: int):
        """Per layer, (keys, values) of one sequence as SDPA takes them. Consecutive blocks (the usual case:
        the block manager hands out free blocks in order) are a view of the cache for all layers at once,
        made once a step; others are gathered layer by layer."""
        c = self.config

        def heads_first(cache):  # [..., blocks, block, kv_heads, dim] -> [..., 1, kv_heads, context, dim]
            # a view, never a copy: this step's own keys are written into the cache after it is made
            rows = cache.view(*cache.shape[:-4], 1, -1, c.n_kv_heads, c.head_dim)
            return rows[..., :context, :, :].transpose(-3, -2)

        if table[-1] - table[0] == len(table) - 1 and np.all(np.diff(table) == 1):
            blocks = slice(int(table[0]), int(table[-1]) + 1)
            keys, values = heads_first(self.k_cache[:, blocks]), heads_first(self.v_cache[:, blocks])
            return lambda i: (keys[i], values[i])
        blocks = self._tensor(table)
        return lambda i: (
            heads_first(self.k_cache[i].index_select(0, blocks)),
            heads_first(self.v_cache[i].index_select(0, blocks)),
        )

    def _prefill_attention(self, layer: int, q: torch.Tensor, start_pos: int, table: np.ndarray):
        c, bs = self.config, self.kv_block_size
        n, context = q.shape[0], start_pos + q.shape[0]
        blocks = self._tensor(table[: -(-context // bs)])
        keys = self.k_cache[layer].index_select(0, blocks).reshape(-1, c.n_kv_heads, c.head_dim)[:context]
        values = self.v_cache[layer].index_select(0, blocks).reshape(-1, c.n_kv_heads, c.head_dim)[:context]
        causal = (
            torch.arange(context, device=self.device)[None, :]
            <= (start_pos + torch.arange(n, device=self.device))[:, None]
        )  # [n, context]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None],
            keys.transpose(0, 1)[None],
            values.transpose(0, 1)[None],
            attn_mask=causal,
            scale=self.attn_scale,
            enable_gqa=True,
        )  # [1, n_heads, n, head_dim]
        return out[0].transpose(0, 1).reshape(n, c.n_heads * c.head_dim)

    # -- the step -------------------------------------------------------------------
    def layers_forward(self, tokens: torch.Tensor, rope: torch.Tensor, slots: torch.Tensor, attend) -> torch.Tensor:
        """Hidden states [n_tokens, hidden] after every layer; attend(layer, q) -> attention output.
        Only tensors go in and out, so a CUDA graph can capture it (torch_cuda_graphs.py).
        The residual stream x stays fp32; matmul outputs stay in their kernel's dtype (bf16 for the
        quantized ones) where the next op takes them as they are (x + out upcasts in the add itself,
        silu(gate) * up feeds ffn_down in bf16), which saves a conversion op per matmul at batch 1."""
        c = self.config
        n_tokens, q_dim, kv_dim = len(tokens), c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        x = self.embedding.index_select(0, tokens)
        for i, layer in enumerate(self.layers):
            qkv = layer.wqkv(F.rms_norm(x, (c.hidden_size,), layer.attn_norm, c.rms_eps)).float()
            # RoPE: q and k heads side by side, their pairs (2i, 2i+1) as complex numbers, as in model_runner
            qk = torch.view_as_complex(qkv[:, : q_dim + kv_dim].view(n_tokens, -1, c.head_dim // 2, 2))
            qk = torch.view_as_real(qk * rope).view(n_tokens, q_dim + kv_dim)
            self.k_slots[i].index_copy_(0, slots, qk[:, q_dim:])
            self.v_slots[i].index_copy_(0, slots, qkv[:, q_dim + kv_dim :])
            x = x + layer.wo(attend(i, qk[:, :q_dim].view(n_tokens, c.n_heads, c.head_dim)))
            gate_up = layer.w_gate_up(F.rms_norm(x, (c.hidden_size,), layer.ffn_norm, c.rms_eps))
            x = x + layer.w_down(F.silu(gate_up[:, : c.ffn_size]).mul_(gate_up[:, c.ffn_size :]))
        return x

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return self.lm_head(F.rms_norm(x, (self.config.hidden_size,), self.output_norm, self.config.rms_eps)).float()

    @torch.inference_mode()
    def forward(self, chunks: list[SeqChunk]) -> np.ndarray:
        """fp32 logits [number of chunks with need_logits, vocab], in chunk order."""
        c = self.config
        if not chunks:
            raise ValueError("forward() needs at least one SeqChunk")
        plan = self._plan(chunks)
        self.last_step_bytes_read = (
            self.weight_bytes_read(len(plan.tokens), len(plan.logit_rows))
            + plan.kv_positions_read * self.kv_bytes_per_token
        )
        if self.cuda_decode is not None and not plan.prefill and len(plan.logit_rows) == len(chunks):
            found = self.cuda_decode.run(chunks)
            if found is not None:
                return found
        if len(plan.tokens) == 1 and plan.decode_groups:  # batch 1: no mask, no output buffer, 4 small tensors
            kv = self._one_sequence_kv(plan.decode_groups[0].blocks[0], chunks[0].start_pos + 1)

            def attend(i, q):
                return self._one_decode_attention(q, *kv(i))
        else:
            groups = [
                (self._tensor(g.rows), self._tensor(g.blocks), self._tensor(g.key_bias)) for g in plan.decode_groups
            ]

            def attend(i, q):
                out = torch.empty((len(q), c.n_heads * c.head_dim), device=self.device)
                for rows, blocks, key_bias in groups:
                    out[rows] = self.decode_attention(i, q[rows], blocks, key_bias)
                for row, n, start_pos, table in plan.prefill:
                    out[row : row + n] = self._prefill_attention(i, q[row : row + n], start_pos, table)
                return out

        x = self.layers_forward(self._tensor(plan.tokens), self._tensor(plan.rope), self._tensor(plan.slots), attend)
        if not len(plan.logit_rows):
            return np.zeros((0, c.vocab_size), dtype=np.float32)
        if len(plan.logit_rows) < len(x):
            x = x.index_select(0, self._tensor(plan.logit_rows))
        return self.logits(x).cpu().numpy()
