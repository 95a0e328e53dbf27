"""TensorRT-LLM's `trtllm-serve`: OpenAI-compatible, with its own extras.

Exact output length: `ignore_eos` and `min_tokens`, both accepted by trtllm-serve's request
models. Prometheus metrics live at /prometheus/metrics (its /metrics is a JSON list of
iteration stats); /health and /version exist.
"""
from __future__ import annotations

from backends.base import Backend


class TrtllmBackend(Backend):
    name = "trtllm"
    description = "TensorRT-LLM (trtllm-serve)"
    metrics_path = "/prometheus/metrics"
    version_path = "/version"

    def launch_command(self, port: int, model: str) -> list[str]:
        return ["trtllm-serve", model, "--host", "127.0.0.1", "--port", str(port)]
