"""POST /v1/rerank (and /rerank) on the built-in engine: the documents ordered by their relevance to the query.

The request and answer are vLLM's rerank API (vllm/entrypoints/pooling/score/protocol.py: RerankRequest `query`,
`documents`, `top_n` with 0 for all; RerankResponse `id`, `model`, `usage` {prompt_tokens, total_tokens}, `results`
[{index, document {text}, relevance_score}], best first), itself Jina's and Cohere's shape. vLLM scores each pair
with a cross-encoder; SmolLM2 is none, so here a document's relevance is the cosine of its embedding and the
query's (native_engine/embeddings.py: a bi-encoder). The serving path is real (every text through the model), the
scores are no judge of quality.
"""

from __future__ import annotations

import uuid

import numpy as np

from native_engine.embeddings import MAX_INPUTS, EmbeddingInputError, input_token_ids


def rerank_items(body: dict, tokenizer, vocab_size: int, max_len: int) -> tuple[list[list[int]], list[str], int]:
    """(the query's ids then each document's, the documents' texts, top_n); EmbeddingInputError naming the field."""
    query, documents, top_n = body.get("query"), body.get("documents"), body.get("top_n", 0)
    if not isinstance(query, str) or not query:
        raise EmbeddingInputError("query is required: a non-empty string", "query")
    if not isinstance(documents, list) or not documents or not all(isinstance(d, str) and d for d in documents):
        raise EmbeddingInputError("documents is required: a list of non-empty strings", "documents")
    if len(documents) > MAX_INPUTS - 1:
        raise EmbeddingInputError(f"documents has {len(documents)} items; send at most {MAX_INPUTS - 1}", "documents")
    if type(top_n) is not int or top_n < 0:
        raise EmbeddingInputError(f"top_n must be a whole number >= 0 (0: all documents), got {top_n!r}", "top_n")
    items = input_token_ids([query, *documents], tokenizer, vocab_size, max_len)
    return items, documents, top_n


def rerank_answer(model: str, vectors: list[np.ndarray], documents: list[str], items: list[list[int]], top_n: int):
    """The answer: each document's cosine with the query (vectors are unit length), best first, top_n of them."""
    query, docs = vectors[0], np.stack(vectors[1:])
    scores = docs @ query
    order = np.argsort(-scores, kind="stable")[: top_n or len(documents)]
    results = [
        {"index": int(i), "document": {"text": documents[i]}, "relevance_score": float(scores[i])} for i in order
    ]
    tokens = sum(len(ids) for ids in items)
    usage = {"prompt_tokens": tokens, "total_tokens": tokens}
    return {"id": f"rerank-{uuid.uuid4().hex}", "model": model, "usage": usage, "results": results}
