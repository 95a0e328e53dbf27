"""Experiment (issue #16): does torch.compile remove the torch runtime's per-op overhead of a batch-1 decode?

    flock /tmp/bench.lock python benchmarks/torch_compile_step.py            # int4, 2 threads, context 128

Compiles (inductor, CPU, dynamic=False) only the fixed-shape parts of a layer of a batch-1 decode step,
as two functions shared by all layers (the weights are arguments, so one graph serves every layer):
  pre:  rms_norm -> wqkv (4-bit kernel) -> RoPE in real arithmetic on interleaved pairs -> q, k, v
  post: wo -> residual add -> rms_norm -> gate_up -> silu * mul -> down -> residual add
The KV cache write and SDPA stay eager, as in TorchModelRunner. Checks the compiled step's logits against
TorchModelRunner.forward, whether inductor keeps _weight_int4pack_mm_for_cpu as an extern call, and times
both interleaved step by step in one process.

    flock /tmp/bench.lock python benchmarks/torch_compile_step.py --inductor-threads 1 --whole-step-blocks 16

--whole-step-blocks N also compiles the whole step as ONE graph (attention included, over a block table
padded to N blocks and masked, as torch_cuda_graphs.CudaDecode does on CUDA): one compile per context bucket.

Result: NEGATIVE, no win at batch 1. Measured 2026-11-30 on the shared 2-core Xeon, torch 2.13.0+cpu,
int4 (Q4_1 blocks), 2 threads, context 128, steps interleaved in one process (median / best ms per step):
  load 2.3 (uptime 1-min), default inductor:      eager forward 13.88 / 13.21, eager parts with real RoPE
                                                  14.12 / 13.49, compiled parts 16.22 / 15.18
  load 1.6, --inductor-threads 1:                 eager 14.09 / 13.24, compiled parts 16.61 / 15.63
  load 1.7, --inductor-threads 1 --skip-guards:   eager 12.88 / 12.33, compiled parts 14.42 / 14.06
  load 1.7, --cpp-wrapper --inductor-threads 1:   eager 13.32 / 12.64, compiled parts 15.05 / 14.42
  load 1.5-1.6, --inductor-threads 1 --whole-step-blocks 16:
                                                  eager 20.63 / 13.50, compiled parts 23.82 / 15.86,
                                                  compiled whole step 18.34 / 13.98 (heavy, varying load)
  load 2.0-2.6, --inductor-threads 1 --whole-step-blocks 16 --cpp-wrapper:
                                                  eager 19.02 / 13.97, compiled parts 21.68 / 16.39,
                                                  compiled whole step 15.59 / 13.10 (the only config ahead)
  load 1.7, same again (on-disk cache warm, 60 steps): eager 14.05 / 12.80, compiled parts 15.43 / 14.49,
                                                  compiled whole step 13.12 / 12.14
  Compile time: parts 12.2 s cold (2.9-5.4 s with inductor's on-disk cache warm; 13.3 s with cpp_wrapper),
  whole step 46.6 s cold (3.4 s warm), 97.3 s cold with --cpp-wrapper. Outputs: the real-arithmetic RoPE
  equals the complex form exactly (max |logit diff| 0.0); compiled vs eager max |logit diff| 0.125 on
  logits up to 27.9 (bf16 rounding of fused rms_norm), same argmax. Inductor keeps
  _weight_int4pack_mm_for_cpu as an extern call (as it must).
Why: the per-layer parts are 60 compiled calls a step, and each call's dynamo guard check + Python
wrapper cost more than the ~10 eager ops it replaces. The whole-step graph has one call but still runs
~190 small fused C++ kernels + 120 int4 matmuls + 30 SDPAs from its Python wrapper, and its attention
runs over the padded context on 2 threads (eager runs batch-1 SDPA on 1 thread): a tie with eager in
Python. With inductor's C++ wrapper (no Python between kernels) the whole step is ~5-7% faster
(13.1 vs 14.0 ms median in the quieter run), far from the <= 9 ms target, and compiles for 97 s per
context bucket: not wired in.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from native_engine.gguf_model import load_gguf
from native_engine.gguf_q4 import BLOCK as Q4_BLOCK
from native_engine.model_files import resolve_model
from native_engine.model_runner import SeqChunk

KV_BLOCK = 16


def make_layer_parts(config):
    import torch
    import torch.nn.functional as F

    c = config
    q_dim, kv_dim, half = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim, c.head_dim // 2

    def int4_mm(x, packed, scales_and_zeros):
        return torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, Q4_BLOCK, scales_and_zeros)

    def pre(x, attn_norm, packed, sz, cos, sin):
        """x [1, hidden] fp32; cos, sin [1, 1, half] -> q [1, q_dim], k [1, kv_dim], v [1, kv_dim] fp32."""
        qkv = int4_mm(F.rms_norm(x, (c.hidden_size,), attn_norm, c.rms_eps), packed, sz).float()
        pairs = qkv[:, : q_dim + kv_dim].view(1, -1, half, 2)
        even, odd = pairs[..., 0], pairs[..., 1]  # (even + i odd) * (cos + i sin), as the complex form
        qk = torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).view(1, q_dim + kv_dim)
        return qk[:, :q_dim], qk[:, q_dim:], qkv[:, q_dim + kv_dim :].contiguous()

    def post(x, attn, wo_p, wo_sz, ffn_norm, gu_p, gu_sz, down_p, down_sz):
        x = x + int4_mm(attn, wo_p, wo_sz)
        gate_up = int4_mm(F.rms_norm(x, (c.hidden_size,), ffn_norm, c.rms_eps), gu_p, gu_sz)
        return x + int4_mm(F.silu(gate_up[:, : c.ffn_size]) * gate_up[:, c.ffn_size :], down_p, down_sz)

    return pre, post


def compiled_step(runner, pre, post):
    """forward() of one single-token chunk with the layer parts given (compiled or not): fp32 logits numpy."""
    import torch

    @torch.inference_mode()
    def forward(chunk: SeqChunk):
        plan = runner._plan([chunk])
        rope = torch.from_numpy(plan.rope)
        cos, sin = rope.real.contiguous(), rope.imag.contiguous()
        slots = torch.from_numpy(plan.slots)
        kv = runner._one_sequence_kv(plan.decode_groups[0].blocks[0], chunk.start_pos + 1)
        x = runner.embedding.index_select(0, torch.from_numpy(plan.tokens))
        for i, layer in enumerate(runner.layers):
            q, k, v = pre(x, layer.attn_norm, layer.wqkv.packed, layer.wqkv.scales_and_zeros, cos, sin)
            runner.k_slots[i].index_copy_(0, slots, k)
            runner.v_slots[i].index_copy_(0, slots, v)
            attn = runner._one_decode_attention(q, *kv(i))
            x = post(
                x,
                attn,
                layer.wo.packed,
                layer.wo.scales_and_zeros,
                layer.ffn_norm,
                layer.w_gate_up.packed,
                layer.w_gate_up.scales_and_zeros,
                layer.w_down.packed,
                layer.w_down.scales_and_zeros,
            )
        return runner.logits(x).cpu().numpy()

    return forward


def whole_step(runner, pre, post, max_blocks: int):
    """forward() of one single-token chunk as one fixed-shape function over a block table padded to max_blocks
    (masked keys past the context, as torch_cuda_graphs.CudaDecode): one graph for the whole step when compiled."""
    import torch

    bs = runner.kv_block_size

    def step(token, cos, sin, slot, blocks, key_bias):
        x = runner.embedding.index_select(0, token)
        for i, layer in enumerate(runner.layers):
            q, k, v = pre(x, layer.attn_norm, layer.wqkv.packed, layer.wqkv.scales_and_zeros, cos, sin)
            runner.k_slots[i].index_copy_(0, slot, k)
            runner.v_slots[i].index_copy_(0, slot, v)
            attn = runner.decode_attention(i, q.view(1, runner.config.n_heads, -1), blocks, key_bias)
            x = post(
                x,
                attn,
                layer.wo.packed,
                layer.wo.scales_and_zeros,
                layer.ffn_norm,
                layer.w_gate_up.packed,
                layer.w_gate_up.scales_and_zeros,
                layer.w_down.packed,
                layer.w_down.scales_and_zeros,
            )
        return runner.logits(x)

    def inputs(chunk: SeqChunk):
        plan = runner._plan([chunk])
        rope = torch.from_numpy(plan.rope)
        table = np.full((1, max_blocks), runner.num_kv_blocks, dtype=np.int64)  # padding: the scratch block
        table[0, : len(chunk.block_table)] = chunk.block_table
        key_bias = torch.full((1, 1, 1, max_blocks * bs), float("-inf"))
        key_bias[..., : chunk.start_pos + 1] = 0
        return (
            torch.from_numpy(plan.tokens),
            rope.real.contiguous(),
            rope.imag.contiguous(),
            torch.from_numpy(plan.slots),
            torch.from_numpy(table),
            key_bias,
        )

    return step, inputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=128)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--mode", default=None, help="torch.compile mode (default: inductor's default)")
    parser.add_argument("--cpp-wrapper", action="store_true", help="inductor's C++ wrapper instead of Python's")
    parser.add_argument("--inductor-threads", type=int, default=-1, help="OpenMP threads of inductor's kernels")
    parser.add_argument(
        "--whole-step-blocks",
        type=int,
        default=0,
        help="also compile the whole step over block tables padded to this many blocks",
    )
    parser.add_argument("--profile", action="store_true", help="print torch.profiler's top ops after timing")
    parser.add_argument(
        "--skip-guards",
        action="store_true",
        help="set_stance(skip_guard_eval_unsafe=True); fails with --whole-step-blocks",
    )
    args = parser.parse_args()
    import torch
    import torch._inductor.config as inductor_config

    inductor_config.cpp_wrapper = args.cpp_wrapper
    inductor_config.cpp.threads = args.inductor_threads
    from torch._inductor.utils import run_and_get_code

    from native_engine.torch_runner import TorchModelRunner

    config, weights = load_gguf(resolve_model("smollm2"))
    per_seq = -(-(args.context + 1) // KV_BLOCK)
    runner = TorchModelRunner(
        config, weights, max(2 * per_seq, args.whole_step_blocks), KV_BLOCK, dtype="int4", threads=args.threads
    )
    prompt = np.random.default_rng(0).integers(100, 40000, args.context).tolist()
    table = list(range(per_seq))
    runner.forward([SeqChunk(prompt, 0, table, False)])
    chunk = SeqChunk([1000], args.context, table, True)  # rewrites the same slot each step: same state

    pre, post = make_layer_parts(config)
    eager_parts = compiled_step(runner, pre, post)
    cpre = torch.compile(pre, dynamic=False, mode=args.mode)
    cpost = torch.compile(post, dynamic=False, mode=args.mode)
    compiled = compiled_step(runner, cpre, cpost)
    report = {
        "options": vars(args),
        "threads": args.threads,
        "context": args.context,
        "torch": torch.__version__,
        "load_before": os.getloadavg(),
    }

    start = time.perf_counter()
    with torch.inference_mode():
        compiled_logits, code = run_and_get_code(compiled, chunk)
    report["compile_s"] = round(time.perf_counter() - start, 1)
    source = "\n".join(code)
    report["int4_mm_extern_calls_in_generated_code"] = source.count("_weight_int4pack_mm_for_cpu")
    report["generated_code_chars"] = len(source)
    Path("/tmp/torch_compile_step_code.py").write_text(source)

    steps = {
        "forward (eager)": lambda: runner.forward([chunk]),
        "eager parts (real RoPE)": lambda: eager_parts(chunk),
        "compiled parts": lambda: compiled(chunk),
    }
    if args.whole_step_blocks:
        step, inputs = whole_step(runner, pre, post, args.whole_step_blocks)
        cstep = torch.compile(step, dynamic=False, mode=args.mode)
        start = time.perf_counter()
        with torch.inference_mode():
            whole_logits, code = run_and_get_code(lambda: cstep(*inputs(chunk)).numpy())
        Path("/tmp/torch_compile_whole_step_code.py").write_text("\n".join(code))
        report["whole_step_compile_s"] = round(time.perf_counter() - start, 1)

        def run_whole():
            with torch.inference_mode():
                return cstep(*inputs(chunk)).numpy()

        steps["compiled whole step"] = run_whole
    eager_logits = runner.forward([chunk])
    if args.whole_step_blocks:
        report["max_abs_diff_whole_vs_forward"] = float(np.abs(whole_logits - eager_logits).max())
        report["whole_same_argmax"] = bool(whole_logits.argmax() == eager_logits.argmax())
    parts_logits = eager_parts(chunk)
    report["max_abs_diff_compiled_vs_forward"] = float(np.abs(compiled_logits - eager_logits).max())
    report["max_abs_diff_eager_parts_vs_forward"] = float(np.abs(parts_logits - eager_logits).max())
    report["logit_scale"] = float(np.abs(eager_logits).max())
    report["same_argmax"] = bool(compiled_logits.argmax() == eager_logits.argmax())

    if args.skip_guards:
        torch.compiler.set_stance("default", skip_guard_eval_unsafe=True)
    times = {name: [] for name in steps}
    for _ in range(3):
        for step in steps.values():
            step()
    for _ in range(args.steps):
        for name, step in steps.items():
            begin = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - begin)
    report["steps"] = {
        name: {"median_ms": round(float(np.median(t)) * 1e3, 2), "best_ms": round(min(t) * 1e3, 2)}
        for name, t in times.items()
    }
    report["load_after"] = os.getloadavg()
    print(json.dumps(report, indent=1))
    if args.profile:
        for name in ("forward (eager)", "compiled whole step" if args.whole_step_blocks else "compiled parts"):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(10):
                    steps[name]()
            print(name)
            print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))


if __name__ == "__main__":
    main()
