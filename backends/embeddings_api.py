"""backend.api: embeddings — OpenAI's POST /v1/embeddings: the request, and the reading of its one JSON answer.

An embeddings answer generates no tokens: it is one JSON body, so a request has a latency (send to the
body's last byte) and a count of items embedded, and no TTFT, ITL or output tokens. The parse returns a
ParsedStream with no token chunks and `embedded_items` set, which the record reads as "nothing to stream".
Shapes: OpenAI's API reference (https://platform.openai.com/docs/api-reference/embeddings/create), as
vLLM serves it (vllm/entrypoints/pooling/embed/, `data[i].embedding`, `usage.prompt_tokens`).
"""

from __future__ import annotations

from backends.openai import ParsedStream, StreamError, check_field, json_object

EMBEDDINGS = "embeddings"
EMBEDDINGS_FORMAT = "OpenAI's embeddings format"


def build_embeddings_body(
    model: str,
    max_tokens: int,
    prompt: str | None = None,
    messages: list[dict] | None = None,
    ignore_eos: bool = False,
) -> dict:
    """One input, the plan's prompt (a chat plan's messages joined); max_tokens and ignore_eos mean nothing here."""
    if prompt is None:
        prompt = "\n".join(str(m.get("content", "")) for m in messages or [])
    return {"model": model, "input": prompt, "encoding_format": "float"}


def parse_embeddings(reads: list[bytes], read_times_ns) -> ParsedStream:
    """The answer's items and usage; StreamError naming a field that is not OpenAI's shape."""
    obj = json_object(b"".join(reads))
    data, usage = obj.get("data"), obj.get("usage")
    check_field("data", data, list, EMBEDDINGS_FORMAT)
    check_field("usage", usage, dict, EMBEDDINGS_FORMAT)
    check_field("model", obj.get("model"), str, EMBEDDINGS_FORMAT)
    if not data:
        raise StreamError("malformed_event", "data is empty: the server embedded nothing")
    dims = set()
    for i, item in enumerate(data):
        check_field(f"data[{i}]", item, dict, EMBEDDINGS_FORMAT)
        vector = item.get("embedding")
        if isinstance(vector, str):  # base64 float32 (encoding_format: base64): 4 bytes a number
            dims.add((len(vector) * 3 // 4 - vector.count("=")) // 4)
            continue
        check_field(f"data[{i}].embedding", vector, list, EMBEDDINGS_FORMAT)
        if not vector:
            raise StreamError("malformed_event", f"data[{i}].embedding is empty")
        dims.add(len(vector))
    out = ParsedStream(saw_done=True, finish_reason="stop", embedded_items=len(data))
    out.embedding_dims = dims.pop() if len(dims) == 1 else None
    out.usage_prompt_tokens = (usage or {}).get("prompt_tokens")
    out.usage_completion_tokens = 0
    out.name_model(obj.get("model"), 1)
    return out
