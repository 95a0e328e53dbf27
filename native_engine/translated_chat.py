"""Another API's request run on the engine's chat path: its body translated to a chat body, errors named in its terms.

Pure functions: the routes themselves live in server.py (translated_route), which turns a FieldError into its 400.

The Responses API (responses_api.py) and Anthropic's Messages API (messages_api.py) are each such a
translation, as vLLM serves them (vllm/entrypoints/anthropic/serving.py @ 82df3f4 converts a Messages
request into a ChatCompletionRequest; vllm/entrypoints/openai/responses/ renders chat outputs as
Responses events): the prompt is rendered by the same chat template, sampled by the same engine.
"""

from __future__ import annotations

import json
import re

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "seed", "ignore_eos", "min_tokens")


class FieldError(ValueError):
    """What is wrong with a request, `param` naming its field (a 400 in the API's own error shape)."""

    def __init__(self, message: str, param: str | None):
        super().__init__(message)
        self.message, self.param = message, param


def of_type(body: dict, name: str, kind: type, kind_name: str):
    """body[name], None when absent or null; FieldError naming it when it is not of `kind` (bool never an int)."""
    value = body.get(name)
    if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise FieldError(f"{name} must be {kind_name}, got {json.dumps(value)[:40]}", name)
    return value


def text_of(content, where: str, part_types: tuple[str, ...], param: str) -> str:
    """A message's content, a string or a list of text parts (`type` one of part_types); RequestError naming
    `where` (and the request field `param`) for anything else: this engine reads text only."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise FieldError(f"{where} must be a string or a list of text parts", param)
    texts = []
    for j, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") not in part_types:
            kinds = " or ".join(repr(t) for t in part_types)
            raise FieldError(
                f"{where}[{j}] must be a text part (type {kinds}); this engine reads text only, got "
                f"{json.dumps(part)[:60]}",
                param,
            )
        if not isinstance(part.get("text"), str):
            raise FieldError(f"{where}[{j}].text must be a string, got {json.dumps(part.get('text'))[:40]}", param)
        texts.append(part["text"])
    return "".join(texts)


def refuse_set(body: dict, neutral: dict[str, tuple]) -> None:
    """Fields this engine does not implement, refused unless they ask for nothing (their neutral values)."""
    for name, allowed in neutral.items():
        value = body.get(name)
        if not any(value is a or type(value) is type(a) and value == a for a in allowed):
            raise FieldError(
                f"{name} is not supported by this engine; leave it out, got {json.dumps(value)[:60]}", name
            )


def renamed(message: str, param: str | None, names: dict[str, str]) -> tuple[str, str | None]:
    """The chat path's error (message, param) in the other API's field names (max_tokens -> max_output_tokens)."""
    for chat_name, own_name in names.items():
        message = re.sub(rf"\b{chat_name}\b", own_name, message)  # whole names: `stop` is not `stop_token_ids`
    return message, names.get(param, param)


def sse_event(event: str, payload: dict) -> bytes:
    """One named server-sent event (`event:` line, then the JSON), as the Responses and Messages APIs send them."""
    data = json.dumps(payload, separators=(",", ":"), ensure_ascii=False)
    return f"event: {event}\ndata: {data}\n\n".encode()
