"""llama.cpp: the real `llama-server`, and the llama-cpp-python server.

llama-server: `ignore_eos` forces the length (it has no min_tokens); the final chunk always
carries `usage` and `timings` (cache_n, prompt_n, prompt_ms, predicted_n, predicted_ms: the
request's prefill and decode, kept as server_timings and read by harness/metrics/phases.py), the chat
stream opens with a role-only delta and finishes on an empty trailing chunk. /health, /props
(build_info), and /metrics with `llamacpp:` names only when started with --metrics
(tools/server/server-context.cpp): no KV-usage gauge any more (kv_cache_usage_ratio is gone);
the prefix-cache rate comes from prompt_tokens_cached_total against prompt_tokens_total, which
excludes cached tokens; n_tokens_max is a gauge (no _total). It closes the connection after
each streamed answer, so the runner opens a new one per request (TTFT includes a loopback connect).

llama-cpp-python (`python -m llama_cpp.server`): no ignore_eos, so the EOS tokens get a -inf
logit_bias (give them in backend.eos_token_ids); no usage in streams, no /health, no /metrics.
"""

from __future__ import annotations

from backends.base import SAMPLING_FIELDS, Backend, python_module
from backends.openai import CHAT, COMPLETIONS, build_request_body

# both servers read the OpenAI names except repetition_penalty, which they call repeat_penalty (llama-server:
# tools/server/server-schema.cpp; llama-cpp-python: its CreateCompletionRequest)
LLAMA_SAMPLING = {**{name: name for name in SAMPLING_FIELDS}, "repetition_penalty": "repeat_penalty"}


class LlamaServerBackend(Backend):
    name = "llamacpp"
    description = "llama.cpp's llama-server"
    version_path = "/props"
    metrics_hint = "start llama-server with --metrics"
    # it answers "Keep-Alive" yet closes the connection after a streamed answer; a reused
    # connection then fails the next request ("Can not write request body")
    keep_alive = False
    sampling_names = LLAMA_SAMPLING
    paths = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}  # request_body builds these two only

    def request_body(self, api, model, max_tokens, prompt=None, messages=None, ignore_eos=False) -> dict:
        self.endpoint_path(api)
        body = build_request_body(api, model, max_tokens, prompt, messages, ignore_eos=False)
        if ignore_eos:
            body["ignore_eos"] = True
        return body

    def launch_command(self, port: int, model: str) -> list[str]:
        return ["llama-server", "--host", "127.0.0.1", "--port", str(port), "-m", model, "--metrics", "--cont-batching"]

    def sizing_args(self, sizing) -> list[tuple[tuple[str, ...], str]]:
        # -c is the context of all slots together: each of the --parallel slots gets c / parallel
        return [
            (("-t", "--threads"), str(sizing.threads)),
            (("-np", "--parallel"), str(sizing.slots)),
            (("-c", "--ctx-size"), str(sizing.slots * sizing.tokens_per_slot)),
        ]


class LlamaCppPythonBackend(Backend):
    name = "llamacpp_python"
    description = "llama-cpp-python (python -m llama_cpp.server)"
    ready_paths = ("/v1/models",)
    metrics_path = None
    sampling_names = LLAMA_SAMPLING
    paths = {COMPLETIONS: "/v1/completions", CHAT: "/v1/chat/completions"}  # request_body builds these two only

    def request_body(self, api, model, max_tokens, prompt=None, messages=None, ignore_eos=False) -> dict:
        self.endpoint_path(api)
        body = build_request_body(api, model, max_tokens, prompt, messages, ignore_eos=False)
        if ignore_eos:
            if not self.eos_token_ids:
                raise ValueError(
                    "backend.eos_token_ids: llama-cpp-python has no ignore_eos; give the model's "
                    "end-of-sequence token ids (SmolLM2: [0, 2]) or set workload.ignore_eos: false"
                )
            body["logit_bias"] = {str(i): -100.0 for i in self.eos_token_ids}  # never sampled
        return body

    def launch_command(self, port: int, model: str) -> list[str]:
        # --interrupt_requests defaults to True: a new request would cut off the one in flight
        return python_module("llama_cpp.server") + [
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--interrupt_requests",
            "False",
        ]
