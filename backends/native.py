"""The built-in numpy engine (native_engine): vLLM's dialect and metric names under `native:`."""
from __future__ import annotations

from backends.base import Backend, python_module


class NativeBackend(Backend):
    name = "native"
    description = "the built-in engine (python -m native_engine serve)"
    replicas_path = "/replicas"   # `serve --data-parallel N`: the router lists its engine replicas there

    def launch_command(self, port: int, model: str) -> list[str]:
        # `model` is the served name here; the weights file goes in launch.args (--model PATH)
        return python_module("native_engine") + ["serve", "--host", "127.0.0.1", "--port", str(port)]
