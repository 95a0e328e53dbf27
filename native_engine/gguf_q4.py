"""A GGUF's own 4-bit weights (Q4_1 blocks), read raw for runtimes with a 4-bit kernel (torch --dtype int4).

Q4_1 stores each matrix row in blocks of 32 weights along the input dimension: an fp16 scale d, an fp16
minimum m and 32 unsigned 4-bit q, so w = d * q + m. gguf_model.py dequantizes them to fp32 for numpy;
here they stay 4-bit, so a kernel that reads (q, d, m) computes with exactly the file's weights.
A matrix stored in another type (F32, Q8_0, ...) is quantized to Q4_1 blocks by gguf's own quantizer.
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np

from native_engine.gguf_model import ModelWeights, open_gguf

BLOCK = 32  # weights per Q4_1 block
Q4_1 = gguf.GGMLQuantizationType.Q4_1


@dataclass
class Q4Matrix:
    """w[o, BLOCK * b + j] = scale[o, b] * q[o, BLOCK * b + j] + minimum[o, b]."""

    q: np.ndarray  # uint8 [out, in], 0..15
    scale: np.ndarray  # float16 [out, in / BLOCK]
    minimum: np.ndarray  # float16 [out, in / BLOCK]

    def dequantize(self) -> np.ndarray:
        """fp32 [out, in], computed as gguf's dequantizer does (d * q + m in fp32): the same numbers."""
        n_out, n_in = self.q.shape
        q = self.q.reshape(n_out, n_in // BLOCK, BLOCK).astype(np.float32)
        w = self.scale.astype(np.float32)[..., None] * q + self.minimum.astype(np.float32)[..., None]
        return w.reshape(n_out, n_in)


def from_q4_1_bytes(raw: np.ndarray, n_out: int, n_in: int) -> Q4Matrix:
    """Q4_1 bytes [out, in / BLOCK * 20] (per block: d, m, then 16 bytes of nibbles: the low nibbles are
    weights 0..15 of the block, the high ones 16..31) -> Q4Matrix."""
    blocks = np.ascontiguousarray(raw).reshape(n_out, n_in // BLOCK, 4 + BLOCK // 2)
    scale = blocks[..., 0:2].copy().view(np.float16)[..., 0]
    minimum = blocks[..., 2:4].copy().view(np.float16)[..., 0]
    nibbles = blocks[..., 4:]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)  # [out, blocks, 32]
    return Q4Matrix(q=q.reshape(n_out, n_in), scale=scale, minimum=minimum)


def quantize(w_out_in: np.ndarray) -> Q4Matrix:
    """Q4_1 blocks of an fp32 matrix (for a file that stores it in another type)."""
    n_out, n_in = w_out_in.shape
    if n_in % BLOCK:
        raise ValueError(f"a {n_out}x{n_in} matrix cannot be stored as Q4_1: rows must be a multiple of {BLOCK}")
    raw = gguf.quants.quantize(np.ascontiguousarray(w_out_in, dtype=np.float32), Q4_1)
    return from_q4_1_bytes(raw, n_out, n_in)


def stack_rows(*parts: Q4Matrix) -> Q4Matrix:
    """Rows concatenated: the fused matrices (q, k, v; gate, up), as gguf_model.py fuses them."""
    return Q4Matrix(
        q=np.concatenate([p.q for p in parts]),
        scale=np.concatenate([p.scale for p in parts]),
        minimum=np.concatenate([p.minimum for p in parts]),
    )


# the tensors of each fused matrix of LayerWeights, in gguf_model.py's order
LAYER_TENSORS = {
    "wqkv": ("attn_q", "attn_k", "attn_v"),
    "wo": ("attn_output",),
    "w_gate_up": ("ffn_gate", "ffn_up"),
    "w_down": ("ffn_down",),
}


def layer_matrices(weights: ModelWeights, layer: int) -> dict[str, Q4Matrix]:
    """The layer's four matrices as Q4_1 blocks, [out, in]: the file's own blocks where it stores Q4_1,
    else the fp32 weights quantized."""
    reader = open_gguf(weights.gguf_file) if weights.gguf_file is not None else None
    tensors = {t.name: t for t in reader.tensors} if reader is not None else {}
    found = {}
    for name, parts in LAYER_TENSORS.items():
        stored = [tensors.get(f"blk.{layer}.{part}.weight") for part in parts]
        if all(t is not None and t.tensor_type == Q4_1 for t in stored):
            found[name] = stack_rows(*(from_q4_1_bytes(t.data, int(t.shape[1]), int(t.shape[0])) for t in stored))
        else:
            found[name] = quantize(getattr(weights.layers[layer], name).T)
    return found
