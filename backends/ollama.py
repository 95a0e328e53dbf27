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

import json

from backends.base import SAMPLING_FIELDS, Backend, http_post, json_lines
from backends.openai import CHAT, COMPLETIONS, ParsedStream, check_field, spread_usage

DURATIONS_NS = ("prompt_eval_duration", "eval_duration", "load_duration", "total_duration")
OLLAMA_FORMAT = "Ollama's format (docs/api.md)"


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
        pieces, chunk_texts, thinking_chunks = [], [], []
        lines = json_lines(reads, read_times_ns)
        for number, (obj, t_ns) in enumerate(lines, start=1):
            if out.saw_done:  # its clients stop reading at the line with done: true
                out.flag("events_after_done", _after_done_detail(lines[number - 1 :]))
                break
            piece, thought = _line_pieces(obj, api)
            out.name_model(obj.get("model"), number)
            if piece or thought:
                out.token_times_ns.append(t_ns)
                out.tokens_per_chunk.append(1)
                chunk_texts.append(piece + thought)
            if piece:
                pieces.append(piece)
                if out.first_answer_chunk is None:
                    out.first_answer_chunk = len(out.token_times_ns) - 1
            elif thought:
                thinking_chunks.append(len(out.token_times_ns) - 1)
            if obj.get("done"):
                out.saw_done = True
                out.finish_reason = obj.get("done_reason") or "stop"
                out.usage_completion_tokens = obj.get("eval_count")
                out.usage_prompt_tokens = obj.get("prompt_eval_count")
                out.server_timings = {k.replace("duration", "s"): obj[k] / 1e9 for k in DURATIONS_NS if k in obj}
        out.text = "".join(pieces)
        spread_usage(out, chunk_texts)  # several tokens in one line: eval_count counts them
        out.reasoning_tokens = sum(out.tokens_per_chunk[i] for i in thinking_chunks)
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


def _line_pieces(obj: dict, api: str) -> tuple[str, str]:
    """(answer text, thinking text) of one NDJSON line, each field it reads checked for Ollama's type (StreamError
    malformed_event naming it); its counts are checked as the record takes them (bad_usage)."""
    if api == CHAT:
        check_field("message", obj.get("message"), dict, OLLAMA_FORMAT)
        source, prefix = obj.get("message") or {}, "message."
    else:
        source, prefix = obj, ""
    answer_field = "content" if api == CHAT else "response"
    for name in (answer_field, "thinking"):
        check_field(prefix + name, source.get(name), str, OLLAMA_FORMAT)
    check_field("done", obj.get("done"), bool, OLLAMA_FORMAT)
    check_field("done_reason", obj.get("done_reason"), str, OLLAMA_FORMAT)
    check_field("model", obj.get("model"), str, OLLAMA_FORMAT)
    for name in DURATIONS_NS:
        check_field(name, obj.get(name), float, OLLAMA_FORMAT)
    return source.get(answer_field) or "", source.get("thinking") or ""


def _after_done_detail(rest: list[tuple[dict, int]]) -> str:
    first = json.dumps(rest[0][0])[:120]
    return (
        f"{len(rest)} line{'s' * (len(rest) > 1)} after the one with done: true, the first {first}: Ollama's "
        f"clients stop reading there, so they were neither counted nor timed"
    )
