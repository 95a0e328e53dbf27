"""One forward step of a Llama model over a paged KV cache, for a flat batch of sequence chunks.

Every token of every sequence in the step goes through each weight matrix in one matmul;
only attention is split: all single-token (decode) chunks share one batched attention
through a padded block-table gather, longer (prefill) chunks run one by one.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from native_engine.gguf_model import ModelConfig, ModelWeights


@dataclass
class SeqChunk:
    token_ids: list[int]  # the new tokens of this sequence processed this step
    start_pos: int  # position of token_ids[0] == tokens of this sequence already in the KV cache
    block_table: list[int]  # physical KV block ids covering positions [0, start_pos + len(token_ids))
    need_logits: bool  # True for decode steps and the last prefill chunk


@dataclass
class _StepPlan:
    """Where each chunk's rows sit in the flat batch and what its attention reads."""
    slots: np.ndarray  # [n_tokens] flat KV slot each new token is written to
    positions: np.ndarray  # [n_tokens]
    decode_rows: np.ndarray  # [n_decode] rows of single-token chunks
    decode_blocks: np.ndarray  # [n_decode, max_blocks] padded block tables of those chunks
    decode_key_mask: np.ndarray  # [n_decode, max_blocks * block_size] True where a key position is valid
    prefill: list[tuple[int, int, int, np.ndarray]]  # (first row, n tokens, start_pos, block table)
    logit_rows: np.ndarray  # rows whose logits are returned, in chunk order
    kv_positions_read: int  # sum over chunks of the context each attends to


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    variance = np.mean(np.square(x), axis=-1, keepdims=True)
    return x * (1.0 / np.sqrt(variance + eps)) * weight


def softmax_last_axis(scores: np.ndarray) -> np.ndarray:
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


class ModelRunner:
    def __init__(self, config: ModelConfig, weights: ModelWeights, num_kv_blocks: int, kv_block_size: int = 16):
        if num_kv_blocks < 1 or kv_block_size < 1:
            raise ValueError(f"num_kv_blocks ({num_kv_blocks}) and kv_block_size ({kv_block_size}) must be >= 1")
        self.config = config
        self.weights = weights
        self.num_kv_blocks = num_kv_blocks
        self.kv_block_size = kv_block_size
        c = config
        cache_shape = (c.n_layers, num_kv_blocks, kv_block_size, c.n_kv_heads, c.head_dim)
        self.k_cache = np.zeros(cache_shape, dtype=np.float32)
        self.v_cache = np.zeros(cache_shape, dtype=np.float32)
        self.kv_cache_bytes = self.k_cache.nbytes + self.v_cache.nbytes
        self.kv_bytes_per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4
        self.weight_bytes = weights.matrix_bytes()
        self.lm_head_bytes = (weights.lm_head if weights.lm_head is not None else weights.token_embedding).nbytes
        self.last_step_bytes_read = 0
        # RoPE angles for every position up front: a lookup per step instead of trig.
        half = c.head_dim // 2
        inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2 / c.head_dim))
        angles = np.arange(c.context_length, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.rope_cos = np.cos(angles).astype(np.float32)
        self.rope_sin = np.sin(angles).astype(np.float32)

    # -- planning -------------------------------------------------------------
    def _plan(self, chunks: list[SeqChunk]) -> _StepPlan:
        bs, c = self.kv_block_size, self.config
        slots, positions, logit_rows, prefill = [], [], [], []
        decode_rows, decode_tables, decode_lengths = [], [], []
        row, kv_read = 0, 0
        for i, chunk in enumerate(chunks):
            n = len(chunk.token_ids)
            end = chunk.start_pos + n
            if n == 0:
                raise ValueError(f"chunks[{i}].token_ids is empty; send at least one token per chunk")
            if chunk.start_pos < 0 or end > c.context_length:
                raise ValueError(f"chunks[{i}] covers positions [{chunk.start_pos}, {end}); the model's "
                                 f"context_length is {c.context_length}")
            table = np.asarray(chunk.block_table, dtype=np.int64)
            if len(table) * bs < end:
                raise ValueError(f"chunks[{i}].block_table has {len(table)} blocks of {bs}; positions up to {end} "
                                 f"need {-(-end // bs)}")
            if len(table) and (table.min() < 0 or table.max() >= self.num_kv_blocks):
                raise ValueError(f"chunks[{i}].block_table holds ids outside [0, {self.num_kv_blocks})")
            pos = np.arange(chunk.start_pos, end)
            positions.append(pos)
            slots.append(table[pos // bs] * bs + pos % bs)
            if n == 1:
                decode_rows.append(row)
                decode_tables.append(table[: -(-end // bs)])
                decode_lengths.append(end)
            else:
                prefill.append((row, n, chunk.start_pos, table))
            if chunk.need_logits:
                logit_rows.append(row + n - 1)
            kv_read += end
            row += n
        max_blocks = max((len(t) for t in decode_tables), default=0)
        decode_blocks = np.zeros((len(decode_tables), max_blocks), dtype=np.int64)
        for j, t in enumerate(decode_tables):
            decode_blocks[j, : len(t)] = t
        key_mask = np.arange(max_blocks * bs)[None, :] < np.asarray(decode_lengths, dtype=np.int64)[:, None]
        tokens = np.concatenate([np.asarray(ch.token_ids, dtype=np.int64) for ch in chunks]) if chunks else None
        if tokens is not None and (tokens.min() < 0 or tokens.max() >= c.vocab_size):
            raise ValueError(f"token ids must lie in [0, {c.vocab_size}); got {int(tokens.min())}..{int(tokens.max())}")
        return _StepPlan(np.concatenate(slots), np.concatenate(positions), np.asarray(decode_rows, dtype=np.int64),
                         decode_blocks, key_mask, prefill, np.asarray(logit_rows, dtype=np.int64), kv_read)

    # -- attention ------------------------------------------------------------
    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Rotate halves (the GGUF pair layout is reordered at load time; see gguf_model)."""
        half = x.shape[-1] // 2
        cos = self.rope_cos[positions][:, None, :]
        sin = self.rope_sin[positions][:, None, :]
        x1, x2 = x[..., :half], x[..., half:]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    def _decode_attention(self, layer: int, q: np.ndarray, plan: _StepPlan) -> np.ndarray:
        """q [n_decode, n_heads, head_dim] -> [n_decode, n_heads * head_dim], all sequences at once."""
        c = self.config
        n, group = len(plan.decode_rows), c.n_heads // c.n_kv_heads
        keys = self.k_cache[layer][plan.decode_blocks].reshape(n, -1, c.n_kv_heads, c.head_dim)
        values = self.v_cache[layer][plan.decode_blocks].reshape(n, -1, c.n_kv_heads, c.head_dim)
        q = q.reshape(n, c.n_kv_heads, group, c.head_dim)
        scores = np.matmul(q, keys.transpose(0, 2, 3, 1)) * (1.0 / np.sqrt(c.head_dim))  # [n, kv, group, T]
        scores = np.where(plan.decode_key_mask[:, None, None, :], scores, -np.inf)
        out = np.matmul(softmax_last_axis(scores), values.transpose(0, 2, 1, 3))  # [n, kv, group, head_dim]
        return out.reshape(n, c.n_heads * c.head_dim)

    def _prefill_attention(self, layer: int, q: np.ndarray, start_pos: int, table: np.ndarray) -> np.ndarray:
        """q [n, n_heads, head_dim] at positions start_pos.. -> [n, n_heads * head_dim], causal."""
        c, bs = self.config, self.kv_block_size
        n, group = q.shape[0], c.n_heads // c.n_kv_heads
        context = start_pos + n
        blocks = table[: -(-context // bs)]
        keys = self.k_cache[layer][blocks].reshape(-1, c.n_kv_heads, c.head_dim)[:context]
        values = self.v_cache[layer][blocks].reshape(-1, c.n_kv_heads, c.head_dim)[:context]
        q = q.reshape(n, c.n_kv_heads, group, c.head_dim).transpose(1, 2, 0, 3)  # [kv, group, n, hd]
        scores = np.matmul(q, keys.transpose(1, 2, 0)[:, None]) * (1.0 / np.sqrt(c.head_dim))  # [kv, group, n, T]
        causal = np.arange(context)[None, :] <= (start_pos + np.arange(n))[:, None]
        scores = np.where(causal, scores, -np.inf)
        out = np.matmul(softmax_last_axis(scores), values.transpose(1, 0, 2)[:, None])  # [kv, group, n, hd]
        return out.transpose(2, 0, 1, 3).reshape(n, c.n_heads * c.head_dim)

    # -- the step -------------------------------------------------------------
    def forward(self, chunks: list[SeqChunk]) -> np.ndarray:
        """fp32 logits [number of chunks with need_logits, vocab], in chunk order."""
        c, w = self.config, self.weights
        if not chunks:
            raise ValueError("forward() needs at least one SeqChunk")
        plan = self._plan(chunks)
        tokens = np.concatenate([np.asarray(ch.token_ids, dtype=np.int64) for ch in chunks])
        x = w.token_embedding[tokens]
        n_tokens, q_dim, kv_dim = len(tokens), c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        flat_kv = (self.num_kv_blocks * self.kv_block_size, c.n_kv_heads, c.head_dim)
        for i, layer in enumerate(w.layers):
            qkv = rms_norm(x, layer.attn_norm, c.rms_eps) @ layer.wqkv
            q = self._rope(qkv[:, :q_dim].reshape(n_tokens, c.n_heads, c.head_dim), plan.positions)
            k = self._rope(qkv[:, q_dim:q_dim + kv_dim].reshape(n_tokens, c.n_kv_heads, c.head_dim), plan.positions)
            self.k_cache[i].reshape(flat_kv)[plan.slots] = k
            self.v_cache[i].reshape(flat_kv)[plan.slots] = qkv[:, q_dim + kv_dim:].reshape(-1, c.n_kv_heads, c.head_dim)
            attn = np.empty((n_tokens, q_dim), dtype=np.float32)
            if len(plan.decode_rows):
                attn[plan.decode_rows] = self._decode_attention(i, q[plan.decode_rows], plan)
            for row, n, start_pos, table in plan.prefill:
                attn[row:row + n] = self._prefill_attention(i, q[row:row + n], start_pos, table)
            x += attn @ layer.wo
            gate_up = rms_norm(x, layer.ffn_norm, c.rms_eps) @ layer.w_gate_up
            gate, up = gate_up[:, :c.ffn_size], gate_up[:, c.ffn_size:]
            x += (gate / (1.0 + np.exp(-gate)) * up) @ layer.w_down
        self.last_step_bytes_read = self.weight_bytes + plan.kv_positions_read * self.kv_bytes_per_token
        if not len(plan.logit_rows):
            self.last_step_bytes_read -= self.lm_head_bytes
            return np.zeros((0, c.vocab_size), dtype=np.float32)
        h = rms_norm(x[plan.logit_rows], w.output_norm, c.rms_eps)
        lm_head = w.lm_head if w.lm_head is not None else w.token_embedding.T
        return np.ascontiguousarray(h @ lm_head, dtype=np.float32)


def measure_read_bandwidth_gbs(n_bytes: int = 256 * 2**20, repeats: int = 5) -> float:
    """Best observed GB/s of a matrix-vector product over an fp32 matrix of n_bytes (the decode roofline)."""
    cols = 1024
    rows = max(1, n_bytes // (4 * cols))
    matrix = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    vector = np.ones((1, rows), dtype=np.float32)
    best_s = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        vector @ matrix
        best_s = min(best_s, time.perf_counter() - start)
    return matrix.nbytes / best_s / 1e9
