"""One forward step of a Llama model over a paged KV cache, for a flat batch of sequence chunks.

Every token of every sequence in the step goes through each weight matrix in one matmul;
only attention is split: single-token (decode) chunks run batched, a few per group, through
a padded block-table gather; longer (prefill) chunks run one by one with a causal mask.
"""

from __future__ import annotations

import math
import mmap
from dataclasses import dataclass

import numpy as np

from native_engine.gguf_model import ModelConfig, ModelWeights

DECODE_GROUP_KEY_BYTES = 2 * 2**20  # gathered keys per batched decode attention (values: as many again)
# lm_head for batches: vocabulary rows per matmul. x @ [hidden, vocab] with few rows repacks all 113 MB of
# the matrix; [vocab, hidden] @ x.T in slices whose result stays in L2 is 20-35% faster, bit for bit the same.
LM_HEAD_SLICE_ROWS = 2048
# Steps of a few tokens (a speculative verification chunk): x [n, in] @ W [in, out] with 2 <= n <= 16
# costs 3x a matrix-vector product, since BLAS repacks all of W first; an [out, in] copy of W times x.T
# in slices of ~256 KB, each repacked within cache, costs 1.2-1.6x (measured with one BLAS thread).
FEW_ROWS_MAX = 16
FEW_ROWS_SLICE_BYTES = 256 * 1024
_LAYER_MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")


@dataclass
class SeqChunk:
    token_ids: list[int]  # the new tokens of this sequence processed this step
    start_pos: int  # position of token_ids[0] == tokens of this sequence already in the KV cache
    block_table: list[int]  # physical KV block ids covering positions [0, start_pos + len(token_ids))
    need_logits: bool  # True for decode steps and the last prefill chunk
    all_logits: bool = False  # with need_logits: a row for every token (speculative verification), not only the last


@dataclass
class _DecodeGroup:
    """Single-token chunks whose attention runs as one batched matmul."""

    rows: np.ndarray  # [n] rows in the flat batch
    blocks: np.ndarray  # [n, max_blocks] block tables padded with block 0
    key_bias: np.ndarray  # [n, 1, 1, max_blocks * block_size] 0 where a key position is valid, else -inf


@dataclass(kw_only=True)
class _StepPlan:
    """Where each chunk's rows sit in the flat batch and what its attention reads."""

    tokens: np.ndarray  # [n_tokens] all chunks' new tokens, in chunk order
    slots: np.ndarray  # [n_tokens] flat KV slot each new token is written to
    rope: np.ndarray  # [n_tokens, 1, head_dim / 2] complex64 rotation at each token's position, for all layers
    decode_groups: list[_DecodeGroup]
    prefill: list[tuple[int, int, int, np.ndarray]]  # (first row, n tokens, start_pos, block table)
    logit_rows: np.ndarray  # rows whose logits are returned, in chunk order
    kv_positions_read: int  # sum over chunks of the context each attends to


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """x * (1 / sqrt(mean(x**2) + eps)) * weight, op for op, in place on two temporaries
    (np.mean's Python wrapper alone cost ~3 ms a step at 61 calls)."""
    scale = np.add.reduce(np.square(x), axis=-1, keepdims=True)
    scale /= x.shape[-1]
    scale += eps
    np.sqrt(scale, out=scale)
    np.divide(1.0, scale, out=scale)
    out = x * scale
    out *= weight
    return out


def silu_times(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """SwiGLU's silu(gate) * up in one array instead of five temporaries."""
    out = np.negative(gate)
    with np.errstate(over="ignore"):  # exp overflows to inf for gate < -88: silu is then 0, as it should be
        np.exp(out, out=out)
    out += 1.0
    np.divide(gate, out, out=out)
    out *= up
    return out


def softmax_last_axis(scores: np.ndarray) -> np.ndarray:
    """In place: scores are a temporary of the caller's, and a fresh array per step costs page faults."""
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores


def touched_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """fp32 zeros whose pages are mapped now: the first write to a fresh page costs a page fault, and in the middle of
    a step it made a new server's steps 5-10% slower. Where mmap has MAP_POPULATE (Linux) the kernel maps them all in
    one call: the 1.5 GB KV cache in 0.6-0.8 s here, where writing zeros over numpy's array (which asks for huge
    pages) took 5-15 s on these VMs."""
    count = math.prod(shape)
    populate = getattr(mmap, "MAP_POPULATE", None)
    if populate is None or count == 0:
        zeros = np.empty(shape, dtype=np.float32)
        zeros.fill(0.0)
        return zeros
    pages = mmap.mmap(-1, 4 * count, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    return np.frombuffer(pages, dtype=np.float32).reshape(shape)


class ModelRunner:
    def __init__(
        self,
        config: ModelConfig,
        weights: ModelWeights,
        num_kv_blocks: int,
        kv_block_size: int = 16,
        few_rows_weights: bool = False,
    ):
        """few_rows_weights: keep [out, in] copies of the layer matrices (+430 MB for SmolLM2) so that
        steps of 2..FEW_ROWS_MAX tokens run near matrix-vector speed (speculative decoding)."""
        if num_kv_blocks < 1 or kv_block_size < 1:
            raise ValueError(f"num_kv_blocks ({num_kv_blocks}) and kv_block_size ({kv_block_size}) must be >= 1")
        self.config = config
        self.weights = weights
        self.num_kv_blocks = num_kv_blocks
        self.kv_block_size = kv_block_size
        c = config
        cache_shape = (c.n_layers, num_kv_blocks, kv_block_size, c.n_kv_heads, c.head_dim)
        self.k_cache = touched_zeros(cache_shape)
        self.v_cache = touched_zeros(cache_shape)
        self.kv_cache_bytes = self.k_cache.nbytes + self.v_cache.nbytes
        self.kv_bytes_per_token = 2 * c.n_layers * c.n_kv_heads * c.head_dim * 4
        self.weight_bytes = weights.matrix_bytes()
        self.lm_head_bytes = weights.lm_head.nbytes
        self.matmul_params = sum(
            m.size for layer in weights.layers for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)
        )
        self.lm_head_params = weights.lm_head.size
        self.lm_head_rows = np.ascontiguousarray(weights.lm_head.T)  # [vocab, hidden]; see LM_HEAD_SLICE_ROWS
        # tied: the token embedding is a strided view of lm_head; rows of the contiguous copy gather 30x faster
        tied = np.may_share_memory(weights.token_embedding, weights.lm_head)
        self.embedding_rows = self.lm_head_rows if tied else weights.token_embedding
        self.last_step_bytes_read = 0
        self.attn_scale = 1.0 / math.sqrt(c.head_dim)  # a Python float: a numpy float64 would upcast the scores
        # RoPE as complex rotations for every position up front: a lookup per step instead of trig.
        half = c.head_dim // 2
        inv_freq = 1.0 / (c.rope_theta ** (np.arange(0, half, dtype=np.float64) * 2 / c.head_dim))
        angles = np.arange(c.context_length, dtype=np.float64)[:, None] * inv_freq[None, :]
        self.rope_rotation = np.exp(1j * angles).astype(np.complex64)  # [context, head_dim / 2]
        self.layer_rows = (
            [
                {name: np.ascontiguousarray(getattr(layer, name).T) for name in _LAYER_MATRICES}
                for layer in weights.layers
            ]
            if few_rows_weights
            else None
        )

    def _matmul(self, x: np.ndarray, layer: int, name: str) -> np.ndarray:
        """x @ the layer's matrix `name`, through the [out, in] copy in cache-sized slices for few rows."""
        if self.layer_rows is None or not 2 <= len(x) <= FEW_ROWS_MAX:
            return x @ getattr(self.weights.layers[layer], name)
        rows = self.layer_rows[layer][name]
        step = max(16, FEW_ROWS_SLICE_BYTES // (4 * rows.shape[1]) // 16 * 16)
        out = np.empty((rows.shape[0], len(x)), dtype=np.float32)
        for start in range(0, rows.shape[0], step):
            np.matmul(rows[start : start + step], x.T, out=out[start : start + step])
        return np.ascontiguousarray(out.T)

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
                raise ValueError(
                    f"chunks[{i}] covers positions [{chunk.start_pos}, {end}); the model's "
                    f"context_length is {c.context_length}"
                )
            table = np.asarray(chunk.block_table, dtype=np.int64)
            if len(table) * bs < end:
                raise ValueError(
                    f"chunks[{i}].block_table has {len(table)} blocks of {bs}; positions up to {end} "
                    f"need {-(-end // bs)}"
                )
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
                logit_rows.extend(range(row, row + n) if chunk.all_logits else (row + n - 1,))
            kv_read += end
            row += n
        tokens = np.concatenate([np.asarray(ch.token_ids, dtype=np.int64) for ch in chunks])
        if tokens.min() < 0 or tokens.max() >= c.vocab_size:
            raise ValueError(f"token ids must lie in [0, {c.vocab_size}); got {int(tokens.min())}..{int(tokens.max())}")
        groups = self._decode_groups(decode_rows, decode_tables, decode_lengths)
        positions = np.concatenate(positions)
        return _StepPlan(
            tokens=tokens,
            slots=np.concatenate(slots),
            rope=self.rope_rotation[positions][:, None, :],
            decode_groups=groups,
            prefill=prefill,
            logit_rows=np.asarray(logit_rows, dtype=np.int64),
            kv_positions_read=kv_read,
        )

    def _decode_groups(self, rows: list[int], tables: list[np.ndarray], lengths: list[int]) -> list[_DecodeGroup]:
        """Sequences of similar length together, each group's gathered keys small enough to stay in cache.

        One batched attention over 64 sequences at context 256 is three times slower than
        eight of 8 sequences: the gathered K/V no longer fit in cache before the matmul reads them.
        """
        if not rows:
            return []
        bs, c = self.kv_block_size, self.config
        block_bytes = bs * c.n_kv_heads * c.head_dim * 4
        groups, members = [], []
        for j in sorted(range(len(rows)), key=lambda j: lengths[j]) + [None]:
            fits = j is not None and (len(members) + 1) * len(tables[j]) * block_bytes <= DECODE_GROUP_KEY_BYTES
            if j is not None and (fits or not members):
                members.append(j)
                continue
            max_blocks = max(len(tables[m]) for m in members)
            blocks = np.zeros((len(members), max_blocks), dtype=np.int64)
            for k, m in enumerate(members):
                blocks[k, : len(tables[m])] = tables[m]
            valid = np.arange(max_blocks * bs)[None, :] < np.asarray([lengths[m] for m in members])[:, None]
            key_bias = np.where(valid, np.float32(0), np.float32(-np.inf))[:, None, None, :]
            groups.append(_DecodeGroup(np.asarray([rows[m] for m in members], dtype=np.int64), blocks, key_bias))
            members = [j]
        return groups

    # -- attention ------------------------------------------------------------
    def _decode_attention(self, layer: int, q: np.ndarray, decode: _DecodeGroup) -> np.ndarray:
        """q [n, n_heads, head_dim] -> [n, n_heads * head_dim] for a group of single-token chunks at once."""
        c = self.config
        n, group = len(decode.rows), c.n_heads // c.n_kv_heads
        # take() copies whole blocks and is several times faster than fancy indexing here
        keys = self.k_cache[layer].take(decode.blocks, axis=0).reshape(n, -1, c.n_kv_heads, c.head_dim)
        values = self.v_cache[layer].take(decode.blocks, axis=0).reshape(n, -1, c.n_kv_heads, c.head_dim)
        q = q.reshape(n, c.n_kv_heads, group, c.head_dim)
        scores = np.matmul(q, keys.transpose(0, 2, 3, 1))  # [n, kv, group, T]
        scores *= self.attn_scale
        scores += decode.key_bias  # padding keys (block 0's, whatever it holds) get weight exactly 0
        out = np.matmul(softmax_last_axis(scores), values.transpose(0, 2, 1, 3))  # [n, kv, group, head_dim]
        return out.reshape(n, c.n_heads * c.head_dim)

    def _prefill_attention(self, layer: int, q: np.ndarray, start_pos: int, table: np.ndarray) -> np.ndarray:
        """q [n, n_heads, head_dim] at positions start_pos.. -> [n, n_heads * head_dim], causal."""
        c, bs = self.config, self.kv_block_size
        n, group = q.shape[0], c.n_heads // c.n_kv_heads
        context = start_pos + n
        blocks = table[: -(-context // bs)]
        keys = self.k_cache[layer].take(blocks, axis=0).reshape(-1, c.n_kv_heads, c.head_dim)[:context]
        values = self.v_cache[layer].take(blocks, axis=0).reshape(-1, c.n_kv_heads, c.head_dim)[:context]
        q = q.reshape(n, c.n_kv_heads, group, c.head_dim).transpose(1, 2, 0, 3)  # [kv, group, n, hd]
        scores = np.matmul(q, keys.transpose(1, 2, 0)[:, None]) * self.attn_scale  # [kv, group, n, T]
        causal = np.arange(context)[None, :] <= (start_pos + np.arange(n))[:, None]
        scores = np.where(causal, scores, -np.inf)
        out = np.matmul(softmax_last_axis(scores), values.transpose(1, 0, 2)[:, None])  # [kv, group, n, hd]
        return out.transpose(2, 0, 1, 3).reshape(n, c.n_heads * c.head_dim)

    # -- the step -------------------------------------------------------------
    def forward(self, chunks: list[SeqChunk]) -> np.ndarray:
        """fp32 logits [rows, vocab], in chunk order: one row per chunk with need_logits, or one per
        token of a chunk that also has all_logits."""
        c, w = self.config, self.weights
        if not chunks:
            raise ValueError("forward() needs at least one SeqChunk")
        plan = self._plan(chunks)
        x = self.embedding_rows[plan.tokens]
        n_tokens, q_dim, kv_dim = len(plan.tokens), c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
        slot_rows = (self.num_kv_blocks * self.kv_block_size, kv_dim)
        for i, layer in enumerate(w.layers):
            qkv = self._matmul(rms_norm(x, layer.attn_norm, c.rms_eps), i, "wqkv")
            # RoPE, in place: q and k heads sit side by side in qkv, their pairs (2i, 2i+1) are complex numbers
            qkv[:, : q_dim + kv_dim].reshape(n_tokens, -1, c.head_dim).view(np.complex64)[...] *= plan.rope
            q = qkv[:, :q_dim].reshape(n_tokens, c.n_heads, c.head_dim)
            self.k_cache[i].reshape(slot_rows)[plan.slots] = qkv[:, q_dim : q_dim + kv_dim]
            self.v_cache[i].reshape(slot_rows)[plan.slots] = qkv[:, q_dim + kv_dim :]
            attn = np.empty((n_tokens, q_dim), dtype=np.float32)
            for decode in plan.decode_groups:
                attn[decode.rows] = self._decode_attention(i, q[decode.rows], decode)
            for row, n, start_pos, table in plan.prefill:
                attn[row : row + n] = self._prefill_attention(i, q[row : row + n], start_pos, table)
            x += self._matmul(attn, i, "wo")
            gate_up = self._matmul(rms_norm(x, layer.ffn_norm, c.rms_eps), i, "w_gate_up")
            x += self._matmul(silu_times(gate_up[:, : c.ffn_size], gate_up[:, c.ffn_size :]), i, "w_down")
        self.last_step_bytes_read = self.weight_bytes + plan.kv_positions_read * self.kv_bytes_per_token
        if not len(plan.logit_rows):
            self.last_step_bytes_read -= self.lm_head_bytes
            return np.zeros((0, c.vocab_size), dtype=np.float32)
        return self._lm_head(rms_norm(x[plan.logit_rows], w.output_norm, c.rms_eps))

    def _lm_head(self, h: np.ndarray) -> np.ndarray:
        """h [n, hidden] -> logits [n, vocab], C order (the sampler scans rows)."""
        if len(h) == 1:  # a matrix-vector product reads [hidden, vocab] fastest
            return h @ self.weights.lm_head
        logits = np.empty((len(h), self.config.vocab_size), dtype=np.float32)
        # few rows (with the few-rows copies, i.e. speculation on): slices repacked within cache, half the
        # time for 5 rows; logits differ from the large slices' in the last bits (1e-5), so only then
        few = self.layer_rows is not None and len(h) <= FEW_ROWS_MAX
        step = FEW_ROWS_SLICE_BYTES // (4 * h.shape[1]) // 16 * 16 if few else LM_HEAD_SLICE_ROWS
        slice_out = np.empty((step, len(h)), dtype=np.float32)
        for start in range(0, self.config.vocab_size, step):
            rows = self.lm_head_rows[start : start + step]
            out = slice_out[: len(rows)]
            np.matmul(rows, h.T, out=out)
            logits[:, start : start + len(rows)] = out.T
        return logits
