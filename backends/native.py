"""The built-in numpy engine (native_engine): vLLM's dialect and metric names under `native:`.

Its final stream chunk carries `timings` (queue_ms, prefill_ms, decode_ms, cache_n, preemptions:
native_engine/llm_engine.py request_timings), kept as the record's server_timings. With
backend.trace a launched engine gets --step-trace, and GET /step_trace gives every step.
"""

from __future__ import annotations

from pathlib import Path

from backends.base import Backend, python_module

# what native_engine/server.py's sampling_params reads; it has no repetition, presence or frequency penalty
NATIVE_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "seed")


class NativeBackend(Backend):
    name = "native"
    description = "the built-in engine (python -m native_engine serve)"
    prefix_cache_reset_path = "/reset_prefix_cache"
    step_trace_path = "/step_trace"
    replicas_path = "/replicas"  # `serve --data-parallel N`: the router lists its engine replicas there
    sampling_names = {name: name for name in NATIVE_SAMPLING}

    def launch_command(self, port: int, model: str) -> list[str]:
        # `model` is the served name here; the weights file goes in launch.args (--model PATH)
        return python_module("native_engine") + ["serve", "--host", "127.0.0.1", "--port", str(port)]

    def launch_args(self, out_dir: Path, args: list[str]) -> list[str]:
        return ["--step-trace"] if self.step_trace and "--step-trace" not in args else []
