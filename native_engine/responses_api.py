"""POST /v1/responses on the built-in engine: OpenAI's Responses API as a translation of its chat path.

Request: `input` (a string, or a list of messages whose content is a string or input_text / output_text
parts), `instructions` (a system message before them), `max_output_tokens`, `stream`, and the chat path's
sampling fields. No state is kept, so previous_response_id, tools, background and conversation are refused.

Streamed (stream: true), the events are those OpenAI's streaming reference lists for a text answer
(https://platform.openai.com/docs/api-reference/responses-streaming), in the order vLLM emits them
(vllm/entrypoints/openai/responses/simple_streaming_events.py @ 90d7b6b): response.created,
response.in_progress, response.output_item.added (the message), response.content_part.added (an
output_text part), one response.output_text.delta per token, response.output_text.done,
response.content_part.done, response.output_item.done, then response.completed, or response.incomplete
(incomplete_details.reason max_output_tokens) when the length cap ended it, or response.failed. Each event
is `event: <type>` + `data: <json>` with a `sequence_number` from 0; there is no [DONE] line. The final
response carries usage {input_tokens, input_tokens_details.cached_tokens, output_tokens,
output_tokens_details.reasoning_tokens, total_tokens}, and `timings` (the engine's own account, as its chat
stream's last chunk does).
"""

from __future__ import annotations

import json
import time
import uuid

from native_engine.request_output import RequestOutput
from native_engine.translated_chat import SAMPLING_FIELDS, FieldError, of_type, refuse_set, sse_event, text_of

# the chat path's field names -> this API's, for its errors
NAMES = {"max_tokens": "max_output_tokens", "messages": "input"}
NEUTRAL = {
    "previous_response_id": (None,),
    "tools": (None, []),
    "background": (None, False),
    "conversation": (None,),
}
ROLES = ("user", "assistant", "system", "developer")


def chat_body(body: dict) -> dict:
    """The Responses request as a chat request (RequestError naming the Responses field)."""
    refuse_set(body, NEUTRAL)
    messages = []
    instructions = of_type(body, "instructions", str, "a string")
    if instructions:
        messages.append({"role": "system", "content": instructions})
    value = body.get("input")
    if isinstance(value, str):
        messages.append({"role": "user", "content": value})
    elif isinstance(value, list) and value:
        for i, item in enumerate(value):
            if not isinstance(item, dict) or item.get("type", "message") != "message" or item.get("role") not in ROLES:
                raise FieldError(
                    f"input[{i}] must be a message {{role: user|assistant|system|developer, content}}; this engine "
                    f"reads messages only, got {json.dumps(item)[:60]}",
                    "input",
                )
            content = text_of(item.get("content"), f"input[{i}].content", ("input_text", "output_text"), "input")
            role = "system" if item["role"] == "developer" else item["role"]
            messages.append({"role": role, "content": content})
    else:
        raise FieldError("input is required: a string or a non-empty list of messages", "input")
    out = {"messages": messages, "stream": of_type(body, "stream", bool, "true or false") or False}
    max_tokens = of_type(body, "max_output_tokens", int, "an integer")
    if max_tokens is not None:
        out["max_tokens"] = max_tokens
    out.update({name: body[name] for name in SAMPLING_FIELDS if name in body})
    if "model" in body:
        out["model"] = body["model"]
    return out


def usage_of(out: RequestOutput) -> dict:
    return {
        "input_tokens": out.num_prompt_tokens,
        "input_tokens_details": {"cached_tokens": out.num_cached_tokens},
        "output_tokens": out.num_output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": out.num_prompt_tokens + out.num_output_tokens,
    }


def error_body(message: str, param: str | None, status: int, err_type: str) -> dict:
    """OpenAI's error shape, as the chat path's."""
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


class Answer:
    """One response's events (stream) or object (whole), numbered as they are made."""

    def __init__(self, served_name: str, prompt_tokens: int):
        self.response_id, self.item_id = "resp_" + uuid.uuid4().hex[:24], "msg_" + uuid.uuid4().hex[:24]
        self.model, self.created_at, self.sequence = served_name, int(time.time()), 0

    def event(self, kind: str, **fields) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return sse_event(kind, payload)

    def response(self, status: str, output: list, out: RequestOutput | None = None) -> dict:
        body = {
            "id": self.response_id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": output,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "error": None,
            "usage": usage_of(out) if out is not None else None,
        }
        if out is not None and out.timings:
            body["timings"] = out.timings
        return body

    def message(self, text: str, status: str) -> dict:
        content = [{"type": "output_text", "text": text, "annotations": []}] if status == "completed" else []
        return {"id": self.item_id, "type": "message", "role": "assistant", "status": status, "content": content}

    def opening(self) -> bytes:
        part = {"type": "output_text", "text": "", "annotations": []}
        where = {"output_index": 0, "item_id": self.item_id, "content_index": 0}
        return b"".join(
            [
                self.event("response.created", response=self.response("in_progress", [])),
                self.event("response.in_progress", response=self.response("in_progress", [])),
                self.event("response.output_item.added", output_index=0, item=self.message("", "in_progress")),
                self.event("response.content_part.added", **where, part=part),
            ]
        )

    def delta(self, text: str) -> bytes:
        where = {"output_index": 0, "item_id": self.item_id, "content_index": 0}
        return self.event("response.output_text.delta", **where, delta=text, logprobs=[])

    def closing(self, text: str, out: RequestOutput) -> bytes:
        if out.finish_reason in ("abort", "error"):
            failed = {**self.response("failed", [], out), "error": {"code": "server_error", "message": "engine failed"}}
            return self.event("response.failed", response=failed)
        status = "incomplete" if out.finish_reason == "length" else "completed"
        item = self.message(text, "completed")
        where = {"output_index": 0, "item_id": self.item_id, "content_index": 0}
        return b"".join(
            [
                self.event("response.output_text.done", **where, text=text, logprobs=[]),
                self.event("response.content_part.done", **where, part=item["content"][0]),
                self.event("response.output_item.done", output_index=0, item=item),
                self.event(f"response.{status}", response=self.response(status, [item], out)),
            ]
        )

    def whole(self, text: str, out: RequestOutput) -> dict:
        """The finished response object (stream: false)."""
        status = "incomplete" if out.finish_reason == "length" else "completed"
        return self.response(status, [self.message(text, "completed")], out)
