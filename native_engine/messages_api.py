"""POST /v1/messages on the built-in engine: Anthropic's Messages API as a translation of its chat path.

Request (https://docs.anthropic.com/en/api/messages): `max_tokens` (required), `messages` (role user or
assistant, content a string or a list of text blocks), `system` (a string or text blocks), `stop_sequences`,
`stream`, temperature, top_p, top_k (and the chat path's other sampling fields). Tools are refused.

Streamed (stream: true), the events are those of Anthropic's streaming guide
(https://platform.claude.com/docs/en/build-with-claude/streaming), as vLLM also sends them
(vllm/entrypoints/anthropic/serving.py @ 82df3f4): message_start (the message with empty content and
usage.input_tokens), content_block_start (a text block at index 0), a ping, one content_block_delta with a
text_delta per token, content_block_stop, message_delta (delta.stop_reason end_turn | stop_sequence |
max_tokens, and usage with the total output_tokens, which Anthropic documents as cumulative), message_stop.
Each is `event: <type>` + `data: <json>`; no [DONE] line (vLLM adds one; Anthropic does not). Errors have
Anthropic's shape, {"type": "error", "error": {"type": "invalid_request_error", "message": ...}}, the
message opening with the field's name. The last message_delta also carries the engine's `timings`.
"""

from __future__ import annotations

import json
import uuid

from native_engine.request_output import RequestOutput
from native_engine.translated_chat import SAMPLING_FIELDS, FieldError, of_type, refuse_set, sse_event, text_of

NAMES = {"stop": "stop_sequences"}
NEUTRAL = {"tools": (None, []), "tool_choice": (None,), "thinking": (None,)}
BLOCK_TYPES = ("text",)
# Anthropic's error types by HTTP status (https://docs.anthropic.com/en/api/errors)
ERROR_TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "request_too_large", 503: "overloaded_error"}


def error_body(message: str, param: str | None, status: int, err_type: str) -> dict:
    """Anthropic's error shape; the message names the field (`param` first when it does not already)."""
    if param is not None and not message.startswith(param):
        message = f"{param}: {message}"
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def chat_body(body: dict) -> dict:
    """The Messages request as a chat request (RequestError naming the Messages field)."""
    refuse_set(body, NEUTRAL)
    if "max_tokens" not in body:
        raise FieldError("max_tokens is required (the most tokens to generate)", "max_tokens")
    messages = []
    system = body.get("system")
    if system is not None:
        messages.append({"role": "system", "content": text_of(system, "system", BLOCK_TYPES, "system")})
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise FieldError('messages is required: a non-empty list of {"role", "content"}', "messages")
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
            raise FieldError(f"messages[{i}].role must be user or assistant, got {json.dumps(turn)[:60]}", "messages")
        content = text_of(turn.get("content"), f"messages[{i}].content", BLOCK_TYPES, "messages")
        messages.append({"role": turn["role"], "content": content})
    out = {
        "messages": messages,
        "max_tokens": body["max_tokens"],
        "stream": of_type(body, "stream", bool, "true or false") or False,
    }
    stop = of_type(body, "stop_sequences", list, "a list of strings")
    if stop is not None:
        out["stop"] = stop
    out.update({name: body[name] for name in SAMPLING_FIELDS if name in body})
    if "model" in body:
        out["model"] = body["model"]
    return out


def stop_reason_of(out: RequestOutput) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence): a stop string ends with stop_sequence, EOS with end_turn, the cap max_tokens."""
    if out.finish_reason == "length":
        return "max_tokens", None
    if isinstance(out.stop_reason, str):
        return "stop_sequence", out.stop_reason
    return "end_turn", None


def message(message_id: str, model: str, content: list, out: RequestOutput | None, input_tokens: int) -> dict:
    stop_reason, stop_sequence = stop_reason_of(out) if out is not None else (None, None)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "content": content,
        "model": model,
        "stop_reason": stop_reason,
        "stop_sequence": stop_sequence,
        "usage": {"input_tokens": input_tokens, "output_tokens": out.num_output_tokens if out is not None else 0},
    }


class Answer:
    """One message's events (stream) or object (whole)."""

    def __init__(self, served_name: str, prompt_tokens: int):
        self.message_id, self.model, self.prompt_tokens = "msg_" + uuid.uuid4().hex[:24], served_name, prompt_tokens

    def opening(self) -> bytes:
        start = message(self.message_id, self.model, [], None, self.prompt_tokens)
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}
        return (
            sse_event("message_start", {"type": "message_start", "message": start})
            + sse_event("content_block_start", block)
            + sse_event("ping", {"type": "ping"})
        )

    def delta(self, text: str) -> bytes:
        delta = {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}}
        return sse_event("content_block_delta", delta)

    def closing(self, text: str, out: RequestOutput) -> bytes:
        if out.finish_reason in ("abort", "error"):
            error = {"type": "error", "error": {"type": "api_error", "message": "the engine failed while running it"}}
            return sse_event("error", error)
        stop_reason, stop_sequence = stop_reason_of(out)
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": {"output_tokens": out.num_output_tokens},
        }
        if out.timings:
            delta["timings"] = out.timings
        return (
            sse_event("content_block_stop", {"type": "content_block_stop", "index": 0})
            + sse_event("message_delta", delta)
            + sse_event("message_stop", {"type": "message_stop"})
        )

    def whole(self, text: str, out: RequestOutput) -> dict:
        """The finished message (stream: false)."""
        return message(self.message_id, self.model, [{"type": "text", "text": text}], out, out.num_prompt_tokens)
