"""A weight matrix of the torch runtime kept as the GGUF's own Q4_1 blocks (--dtype int4, CPU).

torch's CPU 4-bit kernel (_weight_int4pack_mm_for_cpu) takes unsigned 4-bit q packed, and per group of
32 input weights a bf16 (scale, zero) computing w = (q - 8) * scale + zero. Q4_1's w = d * q + m is the
same with scale = d, zero = m + 8 d: the file's 4-bit values are used as they are, with no quantization
of our own; only d and m + 8 d are rounded to bf16 (the kernel's activations are bf16 too).
The kernel unpacks the weights once per input row, so it is fast for few rows (decode at low
concurrency: a matrix-vector product reads 4.5 bits a weight) and slow for many; steps of many rows
take a dense copy of the same dequantized weights: bf16, or fp32 on a CPU without bf16 units (torch_kernels.py).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from native_engine.gguf_q4 import BLOCK, Q4Matrix

# Above this many rows the bf16 copy wins. Whole decode steps of SmolLM2 on a 2-core AVX-512 Xeon, 2 threads
# (benchmarks/torch_step.py --dtype int4 --dtype int4-kernel --batch 8 --batch 16): 8 rows 37.3 ms through
# the 4-bit kernel vs 45.3 through bf16, 16 rows 60.0 vs 55.0.
INT4_MAX_ROWS = 8


class Int4Linear:
    """y = x @ W.T for x [n, in] -> [n, out] in its kernel's dtype (as torch_linear.Linear's): few rows through
    the 4-bit kernel from Q4_1 blocks [out, in], many rows through a `dense_dtype` copy of w_out_in, the same weights
    in fp32 [out, in] (gguf_model's, equal to the blocks dequantized)."""

    def __init__(self, matrix: Q4Matrix, w_out_in: np.ndarray, dense_dtype: torch.dtype):
        q = torch.from_numpy(matrix.q.astype("int32"))
        self.packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)  # [out, in / 2] uint8
        scale = torch.from_numpy(matrix.scale.astype("float32"))
        zero = torch.from_numpy(matrix.minimum.astype("float32")) + 8 * scale
        self.scales_and_zeros = torch.stack([scale.t(), zero.t()], dim=-1).to(torch.bfloat16).contiguous()
        self.many_rows_dense = torch.from_numpy(np.ascontiguousarray(w_out_in)).to(dense_dtype)
        n_out, n_in = matrix.q.shape
        self.params = n_out * n_in
        self.packed_bytes = n_out * n_in // 2 + 4 * n_out * (n_in // BLOCK)  # 4 bits a weight, 2 bf16 a block

    def bytes_read(self, rows: int) -> int:
        """Bytes of weights a product with `rows` input rows reads: those of the kernel it takes."""
        if rows <= INT4_MAX_ROWS:
            return self.packed_bytes
        return self.many_rows_dense.numel() * self.many_rows_dense.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) <= INT4_MAX_ROWS:
            return torch.ops.aten._weight_int4pack_mm_for_cpu(
                x.to(torch.bfloat16), self.packed, BLOCK, self.scales_and_zeros
            )
        return F.linear(x.to(self.many_rows_dense.dtype), self.many_rows_dense)
