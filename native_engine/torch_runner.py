"""The forward step of model_runner.py in torch, for CPUs: weights kept int8 (or bf16), same paged KV cache.

Same interface as ModelRunner (forward over SeqChunks -> fp32 logits as numpy) and the same step plan:
validation, KV slots, RoPE lookup and decode groups come from ModelRunner's own planning code, so
both runtimes read exactly the same blocks. What differs is the kernels: every weight matmul goes
in int8 (per-output-channel weight scales, activations quantized per token each step: fbgemm's
kernel for one row, torch._int_mm for more) or bf16, and attention is torch's scaled_dot_product_attention over the blocks
of each sequence only (an index_select of its block table, never the whole cache).

Only this file imports torch; `pip install -e '.[torch]'` (or `pip install torch`, CPU build) installs it.
"""
from __future__ import annotations

import math
import os
import warnings

import numpy as np
import torch
import torch.nn.functional as F

from native_engine.gguf_model import ModelConfig, ModelWeights
from native_engine.model_runner import ModelRunner, SeqChunk

DTYPES = ("int8", "bf16", "fp32")


def cpu_threads() -> int:
    """Cores this process may run on (a container's or taskset's share, not the host's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class Linear:
    """y = x @ W for x [n, in] fp32 -> [n, out] fp32, W given as numpy [in, out] and stored in `dtype`."""

    def __init__(self, w_in_out: np.ndarray, dtype: str):
        weight = torch.from_numpy(np.ascontiguousarray(w_in_out.T))  # [out, in], the layout torch's kernels take
        self.dtype = dtype
        if dtype == "int8":
            # symmetric per output channel: each row's largest |w| maps to 127
            scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12).double()
            zero_points = torch.zeros(weight.shape[0], dtype=torch.long)
            with warnings.catch_warnings():  # torch 2.10+ marks qint8 tensors deprecated (torchao is the successor)
                warnings.simplefilter("ignore", UserWarning)
                quantized = torch.quantize_per_channel(weight, scales, zero_points, 0, torch.qint8)
            # two copies of the int8 matrix (one read per step): fbgemm's packed layout for one row,
            # a plain [in, out] one for torch._int_mm on batches
            self.packed = torch.ops.quantized.linear_prepack(quantized, None)
            self.int8_in_out = quantized.int_repr().t().contiguous()
            self.scales = scales.float()
            self.nbytes = weight.numel() + 8 * weight.shape[0]
        elif dtype == "bf16":
            self.weight = weight.to(torch.bfloat16)
            self.nbytes = 2 * weight.numel()
        elif dtype == "fp32":
            self.weight = weight
            self.nbytes = 4 * weight.numel()
        else:
            raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype == "int8" and len(x) == 1:
            # one row: fbgemm's per-tensor activation scale is a per-token one. reduce_range=False keeps 8-bit
            # activations (exact with AVX-512 VNNI, as here; fbgemm's older AVX2 path can saturate)
            return torch.ops.quantized.linear_dynamic(x, self.packed, False)
        if self.dtype == "int8":
            # one activation scale per row (token): fbgemm's single scale for the whole batch let one
            # token's outlier channels flatten every other token (top-1 agreement fell to 61%)
            x_scales = (x.abs().amax(dim=1, keepdim=True) / 127.0).clamp_min(1e-12)
            x_int8 = torch.round(x / x_scales).to(torch.int8)
            return torch._int_mm(x_int8, self.int8_in_out).float() * x_scales * self.scales
        if self.dtype == "bf16":
            return F.linear(x.to(torch.bfloat16), self.weight).float()
        return F.linear(x, self.weight)


class _Layer:
    def __init__(self, layer, dtype: str):
        self.attn_norm = torch.tensor(layer.attn_norm)
        self.wqkv = Linear(layer.wqkv, dtype)
        self.wo = Linear(layer.wo, dtype)
        self.ffn_norm = torch.tensor(layer.ffn_norm)
        self.w_gate_up = Linear(layer.w_gate_up, dtype)
        self.w_down = Linear(layer.w_down, dtype)

    def matrix_bytes(self) -> int:
        return 4 * (len(self.attn_norm) + len(self.ffn_norm)) + sum(
            m.nbytes for m in (self.wqkv, self.wo, self.w_gate_up, self.w_down))


class TorchModelRunner:
    # The step plan (checks, slots, RoPE rows, decode groups) is ModelRunner's, read off this object's
    # config, kv_block_size, num_kv_blocks and rope_rotation: one planning code for both runtimes.
    _plan = ModelRunner._plan
    _decode_groups = ModelRunner._decode_groups

    def __init__(self, config: ModelConfig, weights: ModelWeights, num_kv_blocks: int, kv_block_size: int = 16,
                 dtype: str = "int8", threads: int = 0):
        if num_kv_blocks < 1 or kv_block_size < 1:
            raise ValueError(f"num_kv_blocks ({num_kv_blocks}) and kv_block_size ({kv_block_size}) must be >= 1")
        if dtype not in DTYPES:
            raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES)}")
        torch.set_num_threads(threads or cpu_threads())
        self.config, self.num_kv_blocks, self.kv_block_size, self.dtype = config, num_kv_blocks, kv_block_size, dtype
        c = config
        self.layers = [_Layer(layer, dtype) for layer in weights.layers]
        self.output_norm = torch.tensor(weights.output_norm)
        lm_head_rows = np.ascontiguousarray(weights.lm_head.T)  # [vocab, hidden]
        self.lm_head = Linear(weights.lm_head, dtype)
        tied = np.may_share_memory(weights.token_embedding, weights.lm_head)
        # lookups stay fp32 (a few rows a step); tied models share the rows with nothing else kept
        self.embedding = torch.from_numpy(lm_head_rows if tied else np.ascontiguousarray(weights.token_embedding))
        cache_shape = (c.n_layers, num_kv_blocks, kv_block_size, c.n_kv_heads, c.head_dim)
        self.k_cache = torch.zeros(cache_shape, dtype=torch.float32)  # zeros: pages touched now, not mid-step
        self.v_cache = torch.zeros(cache_shape, dtype=torch.float32)
        self.kv_cache_bytes = 2 * self.k_cache.numel() * 4
        self.kv_bytes_per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4
        self.lm_head_bytes = self.lm_head.nbytes
        self.weight_bytes = sum(layer.matrix_bytes() for layer in self.layers) + self.lm_head_bytes + 4 * c.hidden_size
        self.last_step_bytes_read = 0
        self.attn_scale = 1.0 / math.sqrt(c.head_dim)
        half = c.head_dim // 2
        inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2 / c.head_dim))
        angles = np.arange(c.context_length, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.rope_rotation = np.exp(1j * angles).astype(np.complex64)  # read by _plan

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.config.rms_eps) * weight

    # -- attention: q [n, n_heads, head_dim] -> [n, n_heads * head_dim] ------------------
    def _decode_attention(self, layer: int, q: torch.Tensor, blocks: torch.Tensor, key_bias: torch.Tensor):
        """A group of single-token chunks at once; each query head group of a KV head is SDPA's 'length'."""
        c = self.config
        n, group = q.shape[0], c.n_heads // c.n_kv_heads
        keys = self.k_cache[layer].index_select(0, blocks.reshape(-1)).reshape(n, -1, c.n_kv_heads, c.head_dim)
        values = self.v_cache[layer].index_select(0, blocks.reshape(-1)).reshape(n, -1, c.n_kv_heads, c.head_dim)
        out = F.scaled_dot_product_attention(  # key_bias: 0 for valid keys, -inf for the padding of short tables
            q.reshape(n, c.n_kv_heads, group, c.head_dim), keys.transpose(1, 2), values.transpose(1, 2),
            attn_mask=key_bias, scale=self.attn_scale)
        return out.reshape(n, c.n_heads * c.head_dim)

    def _prefill_attention(self, layer: int, q: torch.Tensor, start_pos: int, table: np.ndarray):
        c, bs = self.config, self.kv_block_size
        n, context = q.shape[0], start_pos + q.shape[0]
        blocks = torch.from_numpy(table[: -(-context // bs)])
        keys = self.k_cache[layer].index_select(0, blocks).reshape(-1, c.n_kv_heads, c.head_dim)[:context]
        values = self.v_cache[layer].index_select(0, blocks).reshape(-1, c.n_kv_heads, c.head_dim)[:context]
        causal = torch.arange(context)[None, :] <= (start_pos + torch.arange(n))[:, None]  # [n, context]
        out = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
            attn_mask=causal, scale=self.attn_scale, enable_gqa=True)  # [1, n_heads, n, head_dim]
        return out[0].transpose(0, 1).reshape(n, c.n_heads * c.head_dim)

    # -- the step -------------------------------------------------------------------
    @torch.inference_mode()
    def forward(self, chunks: list[SeqChunk]) -> np.ndarray:
        """fp32 logits [number of chunks with need_logits, vocab], in chunk order."""
        c = self.config
        if not chunks:
            raise ValueError("forward() needs at least one SeqChunk")
        plan = self._plan(chunks)
        n_tokens, q_dim, kv_dim = len(plan.tokens), c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        x = self.embedding.index_select(0, torch.from_numpy(plan.tokens))
        rope = torch.from_numpy(plan.rope)  # [n_tokens, 1, head_dim / 2] complex64
        slots = torch.from_numpy(plan.slots)
        groups = [(torch.from_numpy(g.rows), torch.from_numpy(g.blocks), torch.from_numpy(g.key_bias))
                  for g in plan.decode_groups]
        slot_rows = (self.num_kv_blocks * self.kv_block_size, kv_dim)
        for i, layer in enumerate(self.layers):
            qkv = layer.wqkv(self._rms_norm(x, layer.attn_norm))
            # RoPE: q and k heads side by side, their pairs (2i, 2i+1) as complex numbers, as in model_runner
            qk = torch.view_as_complex(qkv[:, :q_dim + kv_dim].reshape(n_tokens, -1, c.head_dim // 2, 2))
            qk = torch.view_as_real(qk * rope).reshape(n_tokens, q_dim + kv_dim)
            q = qk[:, :q_dim].reshape(n_tokens, c.n_heads, c.head_dim)
            self.k_cache[i].view(slot_rows).index_copy_(0, slots, qk[:, q_dim:])
            self.v_cache[i].view(slot_rows).index_copy_(0, slots, qkv[:, q_dim + kv_dim:].contiguous())
            attn = torch.empty((n_tokens, q_dim), dtype=torch.float32)
            for rows, blocks, key_bias in groups:
                attn[rows] = self._decode_attention(i, q[rows], blocks, key_bias)
            for row, n, start_pos, table in plan.prefill:
                attn[row:row + n] = self._prefill_attention(i, q[row:row + n], start_pos, table)
            x = x + layer.wo(attn)
            gate_up = layer.w_gate_up(self._rms_norm(x, layer.ffn_norm))
            x = x + layer.w_down(F.silu(gate_up[:, :c.ffn_size]) * gate_up[:, c.ffn_size:])
        self.last_step_bytes_read = self.weight_bytes + plan.kv_positions_read * self.kv_bytes_per_token
        if not len(plan.logit_rows):
            self.last_step_bytes_read -= self.lm_head_bytes
            return np.zeros((0, c.vocab_size), dtype=np.float32)
        h = self._rms_norm(x.index_select(0, torch.from_numpy(plan.logit_rows)), self.output_norm)
        return self.lm_head(h).float().contiguous().numpy()
