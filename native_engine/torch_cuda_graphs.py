"""Decode-only steps on CUDA as one fixed-shape function: captured as a CUDA graph per batch size
(graph_buckets.capture_sizes), replayed with the step's inputs copied into its buffers; or, with graphs
off, the same function launched kernel by kernel, so the two differ only in the launches.

A decode step of SmolLM2 is ~400 small kernels (30 layers x norms, matmuls, RoPE, cache writes,
attention); launched one by one from Python, the GPU idles between them. A graph launches them all
at once. Graphs are captured lazily, the first time a step needs that size.
"""

from __future__ import annotations

import numpy as np
import torch

from native_engine.graph_buckets import bucket_for, capture_sizes, pad_decode, unpad

MAX_BATCH = 64  # largest captured batch; larger decode steps run eagerly
MAX_CONTEXT = 2048  # every captured step's block tables are padded to this context


class CudaDecode:
    def __init__(self, runner, graphs: bool = True, max_batch: int = MAX_BATCH, max_context: int = MAX_CONTEXT):
        c, bs = runner.config, runner.kv_block_size
        self.runner, self.use_graphs = runner, graphs
        self.sizes = capture_sizes(max_batch)
        self.max_blocks = -(-min(max_context, c.context_length, runner.num_kv_blocks * bs) // bs)
        self.scratch_block = runner.num_kv_blocks  # the cache's extra block, never handed out
        self.rope = torch.from_numpy(runner.rope_rotation).to(runner.device)
        self.captured: dict[int, tuple] = {}  # size -> (graph, input buffers, logits buffer)
        self.graph_replays = self.eager_steps = 0

    def _buffers(self, size: int) -> dict[str, torch.Tensor]:
        dev, bs = self.runner.device, self.runner.kv_block_size
        long = dict(dtype=torch.int64, device=dev)
        return {
            "tokens": torch.zeros(size, **long),
            "positions": torch.zeros(size, **long),
            "slots": torch.full((size,), self.scratch_block * bs, **long),
            "blocks": torch.full((size, self.max_blocks), self.scratch_block, **long),
            "key_bias": torch.zeros((size, 1, 1, self.max_blocks * bs), device=dev),
        }

    def _step(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        r = self.runner
        rope = self.rope.index_select(0, inputs["positions"])[:, None, :]
        x = r.layers_forward(
            inputs["tokens"],
            rope,
            inputs["slots"],
            lambda i, q: r.decode_attention(i, q, inputs["blocks"], inputs["key_bias"]),
        )
        return r.logits(x)

    def _capture(self, size: int) -> tuple:
        inputs = self._buffers(size)  # padding everywhere: the warm-up steps write only the scratch block
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up outside the capture: cuBLAS workspaces, allocator pools
            for _ in range(2):
                self._step(inputs)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self._step(inputs)
        return graph, inputs, logits

    def run(self, chunks) -> np.ndarray | None:
        """Logits of a decode-only step, or None when it fits no captured shape (the caller runs it eagerly)."""
        size = bucket_for(len(chunks), self.sizes)
        if size is None:
            return None
        padded = pad_decode(
            [ch.token_ids[0] for ch in chunks],
            [ch.start_pos for ch in chunks],
            [ch.block_table for ch in chunks],
            size,
            self.max_blocks,
            self.runner.kv_block_size,
            self.scratch_block,
        )
        if padded is None:
            return None
        if not self.use_graphs:
            inputs = self._buffers(size)
            self._copy_in(inputs, padded)
            self.eager_steps += 1
            return unpad(self._step(inputs).cpu().numpy(), padded)
        if size not in self.captured:
            self.captured[size] = self._capture(size)
        graph, inputs, logits = self.captured[size]
        self._copy_in(inputs, padded)
        graph.replay()
        self.graph_replays += 1
        return unpad(logits.cpu().numpy(), padded)

    @staticmethod
    def _copy_in(inputs: dict[str, torch.Tensor], padded) -> None:
        for name, buffer in inputs.items():
            buffer.copy_(torch.from_numpy(getattr(padded, name)))
