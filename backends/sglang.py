"""SGLang: its OpenAI-compatible server, and its native /generate (backend.api: native).

Sampling (workload.sampling): top level on /v1, in `sampling_params` on /generate (the seed as
`sampling_seed`). Exact output length: `ignore_eos` (+ `min_tokens`) on /v1, `sampling_params.ignore_eos`
(+ `min_new_tokens`) on /generate. /generate streams SSE events whose `meta_info` carries
prompt_tokens, completion_tokens (cumulative) and, on the last event, finish_reason
{"type": "length", ...}; then `[DONE]`. Their `text` is the whole answer so far, or only the
new piece when the server runs with --incremental-streaming-output: the parser tells the two
apart (python/sglang/srt/managers/tokenizer_manager.py). /metrics (with --enable-metrics) has the
`sglang:` names of python/sglang/srt/observability/metrics_collector.py (mapped in
harness/engine/server_metrics.py); /start_profile and /stop_profile
exist; /server_info carries the version (/get_server_info is its deprecated alias, asked when
/server_info is missing on an older server).
"""

from __future__ import annotations

import json

from backends.base import NATIVE, SAMPLING_FIELDS, Backend, python_module
from backends.openai import ParsedStream, StreamError, check_field, sse_payloads


class SglangBackend(Backend):
    name = "sglang"
    description = "SGLang (python -m sglang.launch_server)"
    prefix_cache_reset_path = "/flush_cache"
    paths = {**Backend.paths, NATIVE: "/generate"}
    metrics_hint = "start SGLang with --enable-metrics"
    version_path = "/server_info"  # server args plus a "version" field
    old_version_path = "/get_server_info"  # asked when /server_info is missing
    profile_paths = ("/start_profile", "/stop_profile")
    profile_hint = "set SGLANG_TORCH_PROFILER_DIR in the engine's environment (launch.env) to where traces go"
    # /generate's sampling_params (python/sglang/srt/sampling/sampling_params.py) name the seed sampling_seed
    native_sampling_names = {**{name: name for name in SAMPLING_FIELDS}, "seed": "sampling_seed"}

    def request_body(self, api, model, max_tokens, prompt=None, messages=None, ignore_eos=False) -> dict:
        if api != NATIVE:
            return super().request_body(api, model, max_tokens, prompt, messages, ignore_eos)
        if prompt is None:
            prompt = "\n".join(str(m.get("content", "")) for m in messages or [])
        params = {"max_new_tokens": max_tokens}
        if ignore_eos:
            params.update(ignore_eos=True, min_new_tokens=max_tokens)
        return {"text": prompt, "sampling_params": params, "stream": True}

    def sampling_fields(self, api: str, fields: dict) -> dict:
        if api != NATIVE:
            return super().sampling_fields(api, fields)
        return {self.native_sampling_names[name]: value for name, value in fields.items()}

    def add_sampling(self, body: dict, api: str, fields: dict) -> None:
        if api != NATIVE:
            return super().add_sampling(body, api, fields)
        body["sampling_params"].update(self.sampling_fields(api, fields))

    def parse_stream(self, api, reads, read_times_ns) -> ParsedStream:
        if api != NATIVE:
            return super().parse_stream(api, reads, read_times_ns)
        out = ParsedStream()
        payloads, times = sse_payloads(reads, read_times_ns, out)
        text, done_tokens, deltas = "", 0, False
        for payload, t_ns in zip(payloads, times):
            try:
                obj = json.loads(payload)
            except ValueError as e:
                raise StreamError("malformed_json", f"{e}: {payload[:120]!r}") from None
            meta = _checked_meta(obj)
            if meta.get("finish_reason"):
                reason = meta["finish_reason"]
                out.finish_reason = reason.get("type") if isinstance(reason, dict) else str(reason)
            if meta.get("prompt_tokens") is not None:
                out.usage_prompt_tokens = meta["prompt_tokens"]
            tokens = meta.get("completion_tokens")
            new_text = obj.get("text") or ""
            # cumulative text always extends what came before; the first piece that does not
            # means the server sends deltas (--incremental-streaming-output)
            deltas = deltas or (bool(text) and bool(new_text) and not new_text.startswith(text))
            grew = tokens is not None and tokens > done_tokens
            if tokens is not None:
                out.usage_completion_tokens = tokens
            if grew or (tokens is None and bool(new_text) and (deltas or len(new_text) > len(text))):
                out.token_times_ns.append(t_ns)
                out.tokens_per_chunk.append(tokens - done_tokens if grew else 1)
                done_tokens = tokens if grew else done_tokens + 1
            text = text + new_text if deltas else (new_text or text)
        out.text = text
        return out

    def launch_command(self, port: int, model: str) -> list[str]:
        return python_module("sglang.launch_server") + [
            "--model-path",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--enable-metrics",
        ]


GENERATE_FORMAT = "the format of SGLang's /generate"


def _checked_meta(obj) -> dict:
    """One /generate event's meta_info, each field the parse reads checked for its type (StreamError naming it); its
    prompt_tokens is checked as the record takes it (bad_usage)."""
    if not isinstance(obj, dict):
        raise StreamError("malformed_json", f"expected a JSON object, got {str(obj)[:120]!r}")
    if "error" in obj:
        raise StreamError("server_error_event", str(obj["error"])[:200])
    check_field("text", obj.get("text"), str, GENERATE_FORMAT)
    meta = obj.get("meta_info")
    check_field("meta_info", meta, dict, GENERATE_FORMAT)
    meta = meta or {}
    # the running count the chunks are counted from: a count that is not a number cannot be subtracted
    check_field("meta_info.completion_tokens", meta.get("completion_tokens"), int, GENERATE_FORMAT)
    reason = meta.get("finish_reason")
    if isinstance(reason, dict):
        check_field("meta_info.finish_reason.type", reason.get("type"), str, GENERATE_FORMAT)
    else:
        check_field("meta_info.finish_reason", reason, str, GENERATE_FORMAT)
    return meta
