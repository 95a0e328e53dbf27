"""A request as the engine sees it: sampling parameters plus the token state of one sequence."""

from __future__ import annotations

import enum
import functools
import time
from dataclasses import dataclass, field

import numpy as np

from native_engine.stop_strings import StopStrings, check_stop

# Below 1e-4 sampling is already greedy to float32 precision, and near 1e-45 the division overflows
# to NaN; past 100 every row is all but uniform. Send 0 for greedy.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-4, 100.0


@dataclass
class SamplingParams:
    max_tokens: int = 16
    temperature: float = 1.0  # 0 means greedy
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None  # per-request generator, so a seeded request repeats exactly
    min_tokens: int = 0  # EOS and stop tokens are masked until this many tokens exist
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    grammar: object | None = None  # native_engine.guided.Grammar: a JSON schema or regex the output must match

    def __post_init__(self):
        # Field names match the OpenAI request, so the server can pass these errors straight on.
        if self.max_tokens < 1:
            raise ValueError("max_tokens: must be >= 1")
        if not (self.temperature == 0 or MIN_TEMPERATURE <= self.temperature <= MAX_TEMPERATURE):
            raise ValueError(
                f"temperature: must be 0 (greedy) or in [{MIN_TEMPERATURE}, {MAX_TEMPERATURE}], got {self.temperature}"
            )
        if not 0 < self.top_p <= 1:
            raise ValueError("top_p: must be in (0, 1]")
        if not 0 <= self.min_p <= 1:
            raise ValueError("min_p: must be in [0, 1]")
        if self.top_k < -1:
            raise ValueError("top_k: must be -1 or 0 (off) or a positive count")
        if self.seed is not None and self.seed < 0:
            raise ValueError("seed: must be >= 0")
        if self.min_tokens < 0 or self.min_tokens > self.max_tokens:
            raise ValueError("min_tokens: must be in [0, max_tokens]")
        check_stop(self.stop)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @functools.cached_property
    def stop_strings(self) -> StopStrings:
        """The stop strings' matcher, built once (the engine checks it at each token)."""
        return StopStrings(self.stop)

    @property
    def longest_stop(self) -> int:
        """Characters of the longest stop string (0: none); that many minus one are held back while streaming."""
        return self.stop_strings.longest


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Sequence:
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_s: float = field(default_factory=time.perf_counter)

    def __post_init__(self):
        self.token_ids: list[int] = list(self.prompt_token_ids)  # prompt + output so far
        self.num_prompt_tokens = len(self.prompt_token_ids)
        self.num_computed_tokens = 0  # tokens whose KV is in the cache
        self.num_cached_tokens = 0  # prompt tokens served by the prefix cache (first schedule)
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # hash chain of this sequence's full blocks, grown lazily
        self.block_keys: list[bytes] = []  # the token ids of each of those blocks, packed (their cache keys)
        self.num_keyed_blocks = 0  # head blocks already offered to the prefix cache
        self.status = SequenceStatus.WAITING
        self.finish_reason: str | None = None  # "stop" | "length" | "abort"
        self.stop_reason: int | str | None = None
        self.num_preemptions = 0
        self.scheduled_s: float | None = None  # first time it got a slot: end of queue time
        self.first_token_s: float | None = None
        self.last_token_s: float | None = None
        self.text = ""  # decoded output text (cut at a stop string)
        self.num_released_chars = 0  # text[:this] has gone to the client; the rest may hold a stop string
        self.detokenizer = None  # set by the engine
        self.spec_token_ids: list[int] = []  # drafted tokens to verify in the next step (speculative decoding)
        self.grammar_matcher = None  # llguidance matcher of a constrained request (set by the engine)
        # disaggregation (kv_transfer.py): where a prefill worker writes this prompt's KV, the KV a decode
        # worker starts from, and the handoff's costs and prefill-side phases for the request's timings
        self.export_kv_to: str | None = None
        self.handoff = None
        self.kv_transfer: dict = {}

    @functools.cached_property
    def rng(self) -> np.random.Generator:
        """The request's generator (seeded: a seeded request repeats exactly), made where it is first used:
        an unseeded one draws its seed from the OS (~20 us), and `bench plan`'s sequences never sample."""
        return np.random.default_rng(self.params.seed)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens
