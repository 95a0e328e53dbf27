"""TensorRT-LLM's `trtllm-serve`: OpenAI-compatible, with its own extras.

Exact output length: `ignore_eos` and `min_tokens`, both accepted by trtllm-serve's request
models. Prometheus metrics: /prometheus/metrics, names with the `trtllm_` prefix only
(tensorrt_llm/metrics/collector.py); its /metrics is a JSON list of iteration stats. That page
is mounted only when the LLM API option `return_perf_metrics` is true (request histograms:
TTFT, TPOT, queue, prefill, decode), and the running/waiting/KV-cache gauges need
`enable_iter_perf_stats` too; both default to false. So a launch writes them into an extra
options file (`--extra_llm_api_options`, YAML) unless the command line already passes one —
then, if that file lacks them, the scraper finds no page (404) and run.json says why.

Engine build: given a checkpoint rather than a built engine, the TensorRT backend builds one at start-up
and its builder logs `[TRT-LLM] [I] Total time of building <network>: HH:MM:SS` per engine (and `Total
time of building all engines: HH:MM:SS` when it builds several; tensorrt_llm/builder.py, commands/build.py);
their sum is run.json's startup.engine_build_s. The PyTorch backend builds nothing and logs no such line.
"""

from __future__ import annotations

import re
from pathlib import Path

from backends.base import Backend

METRICS_OPTIONS = "return_perf_metrics: true\nenable_iter_perf_stats: true\n"
OPTIONS_FLAGS = ("--extra_llm_api_options", "--config")
BUILD_TIME = re.compile(r"Total time of building (.+?): (\d+):(\d\d):(\d\d)")


class TrtllmBackend(Backend):
    name = "trtllm"
    description = "TensorRT-LLM (trtllm-serve)"
    metrics_path = "/prometheus/metrics"
    metrics_hint = (
        "trtllm-serve mounts it only with `return_perf_metrics: true` (and the running/waiting/KV "
        "gauges need `enable_iter_perf_stats: true`) in its --extra_llm_api_options file"
    )
    version_path = "/version"

    def launch_command(self, port: int, model: str) -> list[str]:
        return ["trtllm-serve", model, "--host", "127.0.0.1", "--port", str(port)]

    def launch_args(self, out_dir: Path, args: list[str]) -> list[str]:
        if any(a.split("=")[0] in OPTIONS_FLAGS for a in args):
            return []  # the user's own options file decides (a 404 on /prometheus/metrics is reported)
        out_dir.mkdir(parents=True, exist_ok=True)
        path = out_dir / "trtllm_metrics_options.yaml"
        path.write_text(METRICS_OPTIONS)
        return ["--extra_llm_api_options", str(path.resolve())]

    def engine_build_s(self, log_text: str) -> float | None:
        found = [(name, 3600 * int(h) + 60 * int(m) + int(s)) for name, h, m, s in BUILD_TIME.findall(log_text)]
        if not found:
            return None
        totals = [seconds for name, seconds in found if name == "all engines"]  # then the per-network lines are in it
        return float(totals[-1] if totals else sum(seconds for _, seconds in found))
