"""POST /v1/embeddings on the built-in engine: each input's mean-pooled final hidden states, L2-normalized.

A decoder model used as a sentence embedder, as vLLM's pooling runner does (vllm-project/vllm
docs/source/models/pooling_models.md: a Pooler over "the final hidden states of the input"; MEAN is one of
its PoolingType values in vllm/model_executor/layers/pooler.py), with the embed task's normalization.
The hidden states are the model's output after its final RMSNorm (what Hugging Face's LlamaModel returns
as last_hidden_state), averaged over every token of the input.

The forward here has no KV cache and runs beside the engine's steps, in a worker thread (numpy releases
the GIL), one input at a time: it reads the numpy runner's weights and writes nothing the engine reads.
Request and response follow OpenAI's embeddings API (https://platform.openai.com/docs/api-reference/embeddings):
`input` a string, a list of strings, a list of token ids or a list of such lists; `encoding_format` float or
base64 (little-endian float32, what the openai client asks for by default); usage.prompt_tokens.
"""

from __future__ import annotations

import asyncio
import base64
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from native_engine.model_runner import rms_norm, silu_times, softmax_last_axis

# Query rows per attention block: the scores of one block are n_heads x QUERY_BLOCK_ROWS x input length floats,
# 9 x 256 x 8192 x 4 B = 75 MB for SmolLM2 at its whole context, instead of 2.4 GB for all rows at once.
QUERY_BLOCK_ROWS = 256
MAX_INPUTS = 2048  # OpenAI's own limit on the items of one embeddings request (its API reference, `input`)
ENCODING_FORMATS = ("float", "base64")


class EmbeddingInputError(ValueError):
    """What is wrong with a request's input; `param` names its field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


def final_hidden_states(runner, token_ids: list[int]) -> np.ndarray:
    """[n, hidden] float32: the model's output for each token after the final norm, causal, positions from 0.
    `runner` is a numpy ModelRunner (its weights, embedding rows and RoPE table are read, nothing written)."""
    c, w = runner.config, runner.weights
    n, q_dim, kv_dim = len(token_ids), c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    x = runner.embedding_rows[np.asarray(token_ids)].astype(np.float32, copy=True)
    rope = runner.rope_rotation[:n][:, None, :]  # [n, 1, head_dim / 2]
    for layer in w.layers:
        qkv = rms_norm(x, layer.attn_norm, c.rms_eps) @ layer.wqkv
        qkv[:, : q_dim + kv_dim].reshape(n, -1, c.head_dim).view(np.complex64)[...] *= rope
        q = qkv[:, :q_dim].reshape(n, c.n_heads, c.head_dim)
        k = qkv[:, q_dim : q_dim + kv_dim].reshape(n, c.n_kv_heads, c.head_dim)
        v = qkv[:, q_dim + kv_dim :].reshape(n, c.n_kv_heads, c.head_dim)
        x += causal_attention(q, k, v, runner.attn_scale) @ layer.wo
        gate_up = rms_norm(x, layer.ffn_norm, c.rms_eps) @ layer.w_gate_up
        x += silu_times(gate_up[:, : c.ffn_size], gate_up[:, c.ffn_size :]) @ layer.w_down
    return rms_norm(x, w.output_norm, c.rms_eps)


def causal_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """q [n, heads, hd], k and v [n, kv_heads, hd] -> [n, heads * hd], each row attending to rows up to its own."""
    n, heads, hd = q.shape
    kv_heads = k.shape[1]
    group = heads // kv_heads
    keys = k.transpose(1, 2, 0)[:, None]  # [kv, 1, hd, n]
    values = v.transpose(1, 0, 2)[:, None]  # [kv, 1, n, hd]
    out = np.empty((n, heads * hd), dtype=np.float32)
    for start in range(0, n, QUERY_BLOCK_ROWS):
        rows = q[start : start + QUERY_BLOCK_ROWS]
        m = len(rows)
        block = rows.reshape(m, kv_heads, group, hd).transpose(1, 2, 0, 3)  # [kv, group, m, hd]
        scores = np.matmul(block, keys[..., : start + m]) * scale  # [kv, group, m, start + m]
        causal = np.arange(start + m)[None, :] <= (start + np.arange(m))[:, None]
        scores = np.where(causal, scores, -np.inf).astype(np.float32)
        mixed = np.matmul(softmax_last_axis(scores), values[:, :, : start + m])  # [kv, group, m, hd]
        out[start : start + m] = mixed.transpose(2, 0, 1, 3).reshape(m, heads * hd)
    return out


def embedding_of(runner, token_ids: list[int]) -> np.ndarray:
    """The input's embedding: its final hidden states averaged over its tokens, scaled to length 1."""
    pooled = final_hidden_states(runner, token_ids).mean(axis=0)
    return (pooled / max(float(np.linalg.norm(pooled)), 1e-12)).astype(np.float32)


def input_token_ids(value, tokenizer, vocab_size: int, max_len: int) -> list[list[int]]:
    """The request's `input` as one token list per item (EmbeddingInputError naming `input` otherwise)."""
    if isinstance(value, str) or _is_ids(value):
        value = [value]
    if not isinstance(value, list) or not value:
        raise EmbeddingInputError(
            "input is required: a string, a list of strings, a list of token ids or a list of such lists", "input"
        )
    if len(value) > MAX_INPUTS:
        raise EmbeddingInputError(f"input has {len(value)} items; send at most {MAX_INPUTS} a request", "input")
    items = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            ids = tokenizer.encode(item, add_special=True) if item else []
        elif _is_ids(item):
            if any(not 0 <= t < vocab_size for t in item):
                raise EmbeddingInputError(f"input[{i}]: token ids must lie in [0, {vocab_size})", "input")
            ids = item
        else:
            raise EmbeddingInputError(f"input[{i}] must be a string or a list of token ids", "input")
        if not ids:
            raise EmbeddingInputError(f"input[{i}] is empty; send at least one token", "input")
        if len(ids) > max_len:
            raise EmbeddingInputError(
                f"input[{i}] is {len(ids)} tokens; this server's context (max_model_len) is {max_len}", "input"
            )
        items.append(ids)
    return items


def _is_ids(value) -> bool:
    return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)


def encoded(vector: np.ndarray, encoding_format: str):
    """float: a JSON list of numbers; base64: the float32 bytes, little-endian, as OpenAI's API sends them."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return [float(v) for v in vector]


class Embedder:
    """Embeds inputs on a thread of its own, one request at a time (a second waits: two would share the cores), so
    a burst of embeddings never holds the default executor's threads that tokenize the chat requests."""

    def __init__(self, runner):
        self.runner = runner
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embeddings")

    def _embed_all(self, items: list[list[int]]) -> list[np.ndarray]:
        return [embedding_of(self.runner, ids) for ids in items]

    async def embed(self, items: list[list[int]]) -> list[np.ndarray]:
        return await asyncio.get_running_loop().run_in_executor(self._thread, self._embed_all, items)

    def close(self) -> None:
        self._thread.shutdown(wait=False, cancel_futures=True)
