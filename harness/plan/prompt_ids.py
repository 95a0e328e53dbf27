"""Each planned request's prompt as the engine's token ids, encoded once and kept compact.

bench run's plan (harness/scenario/workload.build_schedule) encodes every prompt to count it; the simulated engine
needs the same ids. `KeptEncodings` wraps the tokenizer the plan is built with and keeps what it encoded, so the
simulator does not encode each prompt a second time (with the engine's GGUF tokenizer that second pass cost as much
as building the plan: ~1 ms a 600-token prompt). The ids are kept as int32 arrays (2.4 KB a 600-token prompt, where a
list of Python ints takes ~21 KB) and listed when the request reaches its engine.
"""

from __future__ import annotations

import numpy as np

from harness.scenario.tokenizer_source import TokenizerSource
from harness.scenario.workload import RequestSpec


class KeptEncodings(TokenizerSource):
    """The tokenizer it wraps, keeping every text it encodes with its ids."""

    def __init__(self, tokenizer: TokenizerSource) -> None:
        super().__init__()
        self.tokenizer, self.method, self.name = tokenizer, tokenizer.method, tokenizer.name
        self.kept: dict[str, np.ndarray] = {}

    def _encode(self, text: str) -> list[int]:
        kept = self.kept.get(text)
        return kept.tolist() if kept is not None else self.tokenizer.encode(text)

    def remember(self, text: str, ids: list[int] | np.ndarray) -> None:
        """Kept here only, not also as a list in TokenizerSource's cache: that cache's churn (4,096 lists of ~600
        ints freed at a time) cost ~1 CPU-s of a 100,000-request plan, and what it would answer is kept here. The
        prompt builder gives an int array: cast, not listed and read back (~40 us of a 600-token prompt, 4 CPU-s of
        a 100,000-request plan)."""
        self.kept[text] = np.asarray(ids).astype(np.int32)


class PromptIds:
    """The requests' prompt ids by request index; each lookup a fresh list of Python ints (what Sequence holds)."""

    def __init__(self, ids: list[np.ndarray]) -> None:
        self.ids = ids

    def __getitem__(self, index: int) -> list[int]:
        return self.ids[index].tolist()

    def __len__(self) -> int:
        return len(self.ids)


def prompt_text(request: RequestSpec) -> str:
    """What the engine encodes of a request: its prompt, or a chat's message contents in order."""
    if request.prompt is not None:
        return request.prompt
    return "".join(str(m.get("content", "")) for m in request.messages)


def prompt_token_ids(requests: list[RequestSpec], tokenizer: TokenizerSource) -> PromptIds:
    """Each request's prompt as the engine's token ids: those the tokenizer kept (KeptEncodings) where it encoded
    the same text while the plan was built, else encoded now."""
    kept = tokenizer.kept if isinstance(tokenizer, KeptEncodings) else {}
    ids = []
    for r in requests:
        text = prompt_text(r)
        found = kept.get(text)
        ids.append(found if found is not None else np.array(tokenizer.encode(text), dtype=np.int32))
    return PromptIds(ids)
