"""Ollama, through its own API: /api/generate (completions) and /api/chat (chat).

The length cap is `options.num_predict` (workload.sampling goes into `options` too); Ollama has no
ignore_eos, so a model may stop early (then usage and the plan disagree, and the record shows it).
Streams are NDJSON, one object per line: `response` (generate) or `message.content` (chat) per token,
then a last object with `done: true`, `done_reason`, `prompt_eval_count`, `eval_count` and the server's own durations
in nanoseconds (`prompt_eval_duration`, `eval_duration`, `load_duration`, `total_duration`).
Thinking models (on by default where the model supports it; docs/api.md, `think`) first stream
their reasoning as `message.thinking` (chat) or `thinking` (generate): those tokens count in
`eval_count` and arrive before any content, so they are tokens here too (the first one is the
first token), ParsedStream.reasoning_tokens says how many there were and first_answer_chunk where
the answer began; the text is only the answer. No Prometheus page. Launch: `ollama serve` on OLLAMA_HOST,
then POST /api/pull of the model
(what `ollama pull` does) and an empty generate that loads it (what `ollama run` does).
"""

from __future__ import annotations

from backends.base import SAMPLING_FIELDS, Backend, http_post, json_lines
from backends.openai import CHAT, COMPLETIONS, ParsedStream

DURATIONS_NS = ("prompt_eval_duration", "eval_duration", "load_duration", "total_duration")


class OllamaBackend(Backend):
    name = "ollama"
    description = "Ollama (ollama serve), native /api/generate and /api/chat"
    paths = {COMPLETIONS: "/api/generate", CHAT: "/api/chat"}
    ready_paths = ("/api/version",)
    metrics_path = None
    version_path = "/api/version"
    forces_length = False  # no ignore_eos: num_predict only caps the length
    # sampling goes into `options` beside num_predict, under the names of its docs/api.md (repeat_penalty)
    sampling_names = {**{name: name for name in SAMPLING_FIELDS}, "repetition_penalty": "repeat_penalty"}

    def request_body(self, api, model, max_tokens, prompt=None, messages=None, ignore_eos=False) -> dict:
        self.endpoint_path(api)
        body = {"model": model, "stream": True, "options": {"num_predict": max_tokens}}
        if api == CHAT:
            body["messages"] = messages if messages is not None else [{"role": "user", "content": prompt or ""}]
        else:
            # raw: the prompt as planned, without the model's chat template around it
            body["prompt"] = prompt if prompt is not None else "\n".join(str(m.get("content", "")) for m in messages)
            body["raw"] = True
        return body

    def add_sampling(self, body: dict, api: str, fields: dict) -> None:
        body["options"].update(self.sampling_fields(api, fields))

    def parse_stream(self, api, reads, read_times_ns) -> ParsedStream:
        out = ParsedStream()
        pieces = []
        for obj, t_ns in json_lines(reads, read_times_ns):
            source = (obj.get("message") or {}) if api == CHAT else obj
            piece = source.get("content") if api == CHAT else source.get("response")
            thought = source.get("thinking")
            if piece or thought:
                out.token_times_ns.append(t_ns)
                out.tokens_per_chunk.append(1)
            if piece:
                pieces.append(piece)
                if out.first_answer_chunk is None:
                    out.first_answer_chunk = len(out.token_times_ns) - 1
            elif thought:
                out.reasoning_tokens += 1
            if obj.get("done"):
                out.saw_done = True
                out.finish_reason = obj.get("done_reason") or "stop"
                out.usage_completion_tokens = obj.get("eval_count")
                out.usage_prompt_tokens = obj.get("prompt_eval_count")
                out.server_timings = {k.replace("duration", "s"): obj[k] / 1e9 for k in DURATIONS_NS if k in obj}
        out.text = "".join(pieces)
        return out

    def launch_command(self, port: int, model: str) -> list[str]:
        return ["ollama", "serve"]

    def launch_env(self, port: int) -> dict[str, str]:
        return {"OLLAMA_HOST": f"127.0.0.1:{port}"}

    def after_ready(self, url: str, model: str, log) -> None:
        status = http_post(url + "/api/pull", {"model": model, "stream": False}, timeout_s=3600)
        if status >= 400:
            raise RuntimeError(f"backend.model: Ollama could not pull {model!r} (HTTP {status}); check the name")
        log.write(f"bench: pulled {model}\n".encode())
        status = http_post(url + "/api/generate", {"model": model, "prompt": "", "keep_alive": "30m"}, timeout_s=600)
        if status >= 400:
            raise RuntimeError(f"backend.model: Ollama could not load {model!r} (HTTP {status})")
