"""The weight matrices of the torch runtime: y = x @ W kept int8 or bf16 (or fp32, or int4: torch_int4.py).

int8 weights are symmetric per output channel. Which kernel reads them depends on the rows of x:
few rows (decode at low concurrency) go through torch's weight-only kernel (bf16 activations, the
int8 matrix read once: memory-bound, as a matrix-vector product is); many rows quantize activations
per token too and run torch._int_mm (VNNI/AMX on CPUs: compute-bound, int8 x int8 is fastest), except
a matrix whose inputs carry outlier channels (ffn_down), which takes a dense copy for many rows. On a CPU
without VNNI/AMX every many-row step takes the dense copy, fp32 there (torch_kernels.py decides).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from native_engine import gguf_q4
from native_engine.gguf_model import ModelWeights
from native_engine.torch_int4 import Int4Linear
from native_engine.torch_kernels import CpuKernels

DTYPES = ("int4", "int8", "bf16", "fp32")  # int4: the GGUF's Q4_1 blocks, torch_int4.py
# Above this many rows _int_mm wins (measured on a 2-core AVX-512/AMX Xeon, one thread, SmolLM2's
# matrices: at 8 rows weight-only 0.93 ms per layer vs bf16 0.62; at 64 rows _int_mm 0.75 vs 9.6).
WEIGHT_ONLY_MAX_ROWS = 4


class Linear:
    """y = x @ W for x [n, in] -> [n, out], W given as numpy [in, out] and stored in `dtype`.
    y comes in its kernel's dtype (bf16 from the bf16 and int8 weight-only kernels, else fp32): callers
    add it to fp32 residuals (the add upcasts) or cast it, and a bf16 y feeds the next bf16 kernel as is."""

    def __init__(
        self, w_in_out: np.ndarray, dtype: str, kernels: CpuKernels, device: str = "cpu", outlier_inputs: bool = False
    ):
        if dtype not in DTYPES[1:]:
            raise ValueError(f"dtype {dtype!r}: choose one of {', '.join(DTYPES[1:])} (int4 is torch_int4.Int4Linear)")
        weight = torch.from_numpy(np.ascontiguousarray(w_in_out.T)).to(device)  # [out, in], as torch's kernels take
        self.dtype = dtype
        self.params = weight.numel()
        self.many_rows_dense = None  # int8: the copy many-row steps multiply by instead of _int_mm
        if dtype == "int8":
            # symmetric per output channel: each row's largest |w| maps to 127
            scales = (weight.abs().amax(dim=1) / 127.0).clamp_min(1e-12)
            self.int8_out_in = torch.round(weight / scales[:, None]).to(torch.int8)
            self.scales = scales
            self.scales_bf16 = scales.to(torch.bfloat16)
            self.int8_bytes = weight.numel() + 4 * weight.shape[0]
            # inputs with outlier channels (ffn_down's) lose too much as int8 activations, and without
            # VNNI/AMX _int_mm is slower than a dense matmul: many-row steps take a dense copy instead
            if outlier_inputs or not kernels.int8_activations:
                self.many_rows_dense = weight.to(kernels.dense_dtype)
            else:
                self.int8_in_out = self.int8_out_in.t().contiguous()  # _int_mm's layout
        elif dtype == "bf16":
            self.weight = weight.to(torch.bfloat16)
        else:
            self.weight = weight

    def bytes_read(self, rows: int) -> int:
        """Bytes of weights a product with `rows` input rows reads: those of the kernel it takes."""
        if self.dtype != "int8":
            return self.weight.numel() * self.weight.element_size()
        if rows <= WEIGHT_ONLY_MAX_ROWS or self.many_rows_dense is None:
            return self.int8_bytes
        return self.many_rows_dense.numel() * self.many_rows_dense.element_size()

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.dtype == "int8" and len(x) <= WEIGHT_ONLY_MAX_ROWS:
            return torch.ops.aten._weight_int8pack_mm(x.to(torch.bfloat16), self.int8_out_in, self.scales_bf16)
        if self.dtype == "int8" and self.many_rows_dense is not None:
            return F.linear(x.to(self.many_rows_dense.dtype), self.many_rows_dense)
        if self.dtype == "int8":
            # one activation scale per row (token): one scale for the whole batch let one token's outlier
            # channels flatten every other token (top-1 agreement fell to 61%)
            x = x.float()
            x_scales = x.abs().amax(dim=1, keepdim=True).div_(127.0).clamp_min_(1e-12)
            x_int8 = torch.round(x / x_scales).to(torch.int8)
            out = torch._int_mm(x_int8, self.int8_in_out).float()
            return out.mul_(x_scales).mul_(self.scales)
        if self.dtype == "bf16":
            return F.linear(x.to(torch.bfloat16), self.weight)
        return F.linear(x, self.weight)


class LayerMatrices:
    """One layer's norms and matrices in `dtype` (int4: the file's Q4_1 blocks, torch_int4.py)."""

    def __init__(self, weights: ModelWeights, index: int, dtype: str, device: str, kernels: CpuKernels):
        layer = weights.layers[index]
        self.attn_norm = torch.tensor(layer.attn_norm, device=device)
        self.ffn_norm = torch.tensor(layer.ffn_norm, device=device)
        if dtype == "int4":  # the file's own 4-bit blocks
            blocks = gguf_q4.layer_matrices(weights, index)
            self.wqkv, self.wo, self.w_gate_up, self.w_down = (
                Int4Linear(blocks[name], getattr(layer, name).T, kernels.dense_dtype)
                for name in ("wqkv", "wo", "w_gate_up", "w_down")
            )
            return
        self.wqkv = Linear(layer.wqkv, dtype, kernels, device)
        self.wo = Linear(layer.wo, dtype, kernels, device)
        self.w_gate_up = Linear(layer.w_gate_up, dtype, kernels, device)
        self.w_down = Linear(layer.w_down, dtype, kernels, device, outlier_inputs=True)

    def matrices(self) -> tuple:
        return self.wqkv, self.wo, self.w_gate_up, self.w_down

    def bytes_read(self, rows: int) -> int:
        """Bytes a step of `rows` tokens reads from this layer's norms and matrices."""
        return 4 * (len(self.attn_norm) + len(self.ffn_norm)) + sum(m.bytes_read(rows) for m in self.matrices())


def lm_head_matrix(weights: ModelWeights, dtype: str, device: str, kernels: CpuKernels) -> Linear:
    """int4: the lm_head (SmolLM2's tied embedding, Q8_0 in the file) stays int8, dense for many rows (in 4 bits
    of our own quantizing, top-1 agreement of few-row steps fell from 97.5% to 85.3%)."""
    if dtype == "int4":
        return Linear(weights.lm_head, "int8", kernels, device, outlier_inputs=True)
    return Linear(weights.lm_head, dtype, kernels, device)
