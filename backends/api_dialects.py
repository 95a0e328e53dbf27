"""The request builder and answer parser of each backend.api beyond completions and chat, by name.

A new API is one module (its builder and parser) plus one line here; `Backend` looks the API up here before it
falls back to the OpenAI dialect (backends/openai.py). `generates`: whether its answers stream tokens (an
embeddings or rerank answer does not: no TTFT, no ITL, no output tokens).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from backends.anthropic_messages import ANTHROPIC_MESSAGES, build_messages_body, parse_messages
from backends.embeddings_api import EMBEDDINGS, build_embeddings_body, parse_embeddings
from backends.openai import ParsedStream
from backends.rerank_api import RERANK, build_rerank_body, parse_rerank
from backends.responses_api import RESPONSES, build_responses_body, parse_responses


@dataclass(frozen=True, kw_only=True)
class ApiDialect:
    path: str  # the route on an OpenAI-compatible server
    build: Callable[..., dict]  # (model, max_tokens, prompt, messages, ignore_eos) -> the request body
    parse: Callable[[list[bytes], list[int]], ParsedStream]  # (reads, their times) -> the parsed answer
    generates: bool = True


DIALECTS = {
    EMBEDDINGS: ApiDialect(path="/v1/embeddings", build=build_embeddings_body, parse=parse_embeddings, generates=False),
    RERANK: ApiDialect(path="/v1/rerank", build=build_rerank_body, parse=parse_rerank, generates=False),
    RESPONSES: ApiDialect(path="/v1/responses", build=build_responses_body, parse=parse_responses),
    ANTHROPIC_MESSAGES: ApiDialect(path="/v1/messages", build=build_messages_body, parse=parse_messages),
}
