"""backend.api: rerank — vLLM's POST /v1/rerank (Jina's and Cohere's shape): the request, and the reading of its one
JSON answer.

A request is one query and DOCUMENTS_PER_REQUEST documents, all cut from the plan's prompt (workload.input_tokens is
the request's whole text, as vLLM's random-rerank dataset counts it): the first fifth of its words the query, the
rest in four equal parts. Like an embeddings answer it streams nothing: a latency (send to the body's last byte), the
documents scored (`embedded_items`) and the server's token count, no TTFT, ITL or output tokens. Shapes:
vllm/entrypoints/pooling/score/protocol.py (RerankRequest, RerankResponse, RerankUsage; older vLLM sent only
usage.total_tokens).
"""

from __future__ import annotations

import math

from backends.openai import ParsedStream, StreamError, check_field, json_object

RERANK = "rerank"
RERANK_FORMAT = "vLLM's rerank format"
DOCUMENTS_PER_REQUEST = 4


def split_query_and_documents(text: str) -> tuple[str, list[str]]:
    """The query (the first fifth of the words, at least one) and DOCUMENTS_PER_REQUEST documents (the rest in equal
    parts; a document short of words repeats the last word, so none is empty)."""
    words = text.split() or ["?"]
    cut = max(1, len(words) // (DOCUMENTS_PER_REQUEST + 1))
    query, rest = words[:cut], words[cut:] or words[-1:]
    size = math.ceil(len(rest) / DOCUMENTS_PER_REQUEST)
    documents = [rest[i * size : (i + 1) * size] or rest[-1:] for i in range(DOCUMENTS_PER_REQUEST)]
    return " ".join(query), [" ".join(d) for d in documents]


def build_rerank_body(
    model: str,
    max_tokens: int,
    prompt: str | None = None,
    messages: list[dict] | None = None,
    ignore_eos: bool = False,
) -> dict:
    """The plan's prompt (a chat plan's messages joined) as a query and its documents; every document scored (top_n
    0); max_tokens and ignore_eos mean nothing here."""
    if prompt is None:
        prompt = "\n".join(str(m.get("content", "")) for m in messages or [])
    query, documents = split_query_and_documents(prompt)
    return {"model": model, "query": query, "documents": documents, "top_n": 0}


def parse_rerank(reads: list[bytes], read_times_ns) -> ParsedStream:
    """The scored documents and the usage; StreamError naming a field that is not vLLM's shape."""
    obj = json_object(b"".join(reads))
    results, usage = obj.get("results"), obj.get("usage")
    check_field("results", results, list, RERANK_FORMAT)
    check_field("usage", usage, dict, RERANK_FORMAT)
    if not results:
        raise StreamError("malformed_event", "results is empty: the server scored nothing")
    for i, result in enumerate(results):
        check_field(f"results[{i}]", result, dict, RERANK_FORMAT)
        check_field(f"results[{i}].index", result.get("index"), int, RERANK_FORMAT)
        score = result.get("relevance_score")
        if isinstance(score, bool) or not isinstance(score, int | float) or not math.isfinite(score):
            raise StreamError("malformed_event", f"results[{i}].relevance_score is {score!r}, not a number")
    out = ParsedStream(saw_done=True, finish_reason="stop", embedded_items=len(results))
    usage = usage or {}
    out.usage_prompt_tokens = usage.get("prompt_tokens", usage.get("total_tokens"))
    out.usage_completion_tokens = 0
    out.name_model(obj.get("model"), 1)
    return out
