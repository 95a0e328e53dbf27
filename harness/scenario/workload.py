"""Turn a Scenario into a RequestSchedule: every request's prompt, lengths and due time, fixed before load
starts.

Same scenario + same seed -> the same schedule, request for request. Separate random streams feed the
due times, the lengths and the prompt words, so changing a prompt length does not move the arrivals.
- Warm-up requests are the first `load.warmup_requests` slots of the due times (multi_turn: whole
  sessions, rounded up), flagged is_warmup; `load.num_requests` measured requests follow them.
- `load.duration_s`: open arrivals are drawn until the first measured arrival + duration_s, which is
  `RequestSchedule.duration_s`; a closed loop gets `load.max_requests` requests and
  `RequestSchedule.duration_s = duration_s`.
- `arrival: trace` + `kind: random`: prompt and answer lengths come from the trace rows (Mooncake
  hash_ids become shared prompt blocks); other workload kinds take only the timestamps.
- Prompt text and the token-count rule (BOS included in a prompt's count, never in an answer's):
  harness/scenario/prompts.py, the same for every kind.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Self

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from harness.scenario.arrivals import trace_offsets_s
from harness.scenario.images import add_images
from harness.scenario.prompts import answer_tokens, prompt_builder, prompt_tokens
from harness.scenario.scenario import MESSAGE_APIS, Scenario, ScenarioError
from harness.scenario.tokenizer_source import TokenizerSource
from harness.scenario.traces import TraceRow, load_trace, read_jsonl, read_utf8
from harness.scenario.workload_kinds import WorkloadKind, WorkloadKindError, workload_kind


@dataclass
class RequestSpec:
    index: int  # 0-based position in the schedule; warm-up requests come first
    prompt: str | None  # completions: the full prompt; chat: the new user message
    messages: list[dict] | None  # file workloads with chat messages (sent as-is on the chat API)
    prompt_tokens: int  # token count of the prompt as built
    output_tokens: int  # max_tokens to ask
    intended_offset_s: float | None  # seconds after run start; None = closed loop or a later turn
    session_id: int | None = None  # multi_turn: turns of one session share it
    turn_index: int = 0
    think_time_s: float = 0.0  # a later turn (or a sub-agent's first): wait after the previous (spawning) answer
    is_warmup: bool = False
    extra_body: dict | None = None  # merged into the request body (structured: response_format)
    expected: str | None = None  # a known answer (harness/scenario/answers.py): the passage to copy, or a file row's
    expected_match: str = "exact"  # how the answer is scored against it: exact | regex | copy
    model: str | None = None  # the model this request asks for (workload.mix); None: backend.model
    turn_kind: str | None = None  # agentic: user | tool_result | subagent | merge | subagent_task
    parent_session_id: int | None = None  # agentic: a sub-agent's parent session
    parent_turn: int | None = None  # agentic: the parent's turn whose answer starts this sub-agent
    # workload.images (harness/scenario/images.py): the image parts in its user message (0: a text request of a run
    # with images; None: a run without) and their files' bytes (the body carries them base64, 4/3 as many)
    image_count: int | None = None
    image_bytes: int | None = None


@dataclass
class RequestSchedule:
    requests: list[RequestSpec]
    token_count_method: str  # "server_tokenize" | "local_tokenizer" | "approximate"
    duration_s: float | None  # stop dispatching at this offset (load.duration_s runs only)
    warnings: list[str] = field(default_factory=list)


@dataclass
class _DueTimes:
    offsets_s: list[float | None]
    warmup_slots: int
    duration_s: float | None
    trace_rows: list[TraceRow] | None = None
    warnings: list[str] = field(default_factory=list)  # what reading the trace changed (load_trace)


def _due_times(scenario: Scenario, warmup_slots: int, measured_slots: int | None) -> _DueTimes:
    """Due times for warm-up + measured slots (a slot is a request, or a session for multi_turn)."""
    load = scenario.load
    rng = np.random.default_rng([scenario.seed, 0])
    if load.process.paced_by == "concurrency":
        total = warmup_slots + (measured_slots if measured_slots is not None else load.max_requests)
        return _DueTimes([None] * total, warmup_slots, load.duration_s)
    if load.process.paced_by == "trace":
        said: list[str] = []
        rows = load_trace(load.trace, load.trace_format, said)
        offsets = trace_offsets_s([row.timestamp_s for row in rows], load.time_scale)
        if len(rows) <= warmup_slots:
            raise ScenarioError(
                f"load.warmup_requests: {warmup_slots} is not valid: the trace has only "
                f"{len(rows)} requests; use fewer warm-ups"
            )
        start_s = offsets[warmup_slots]
        end = len(rows) if measured_slots is None else min(len(rows), warmup_slots + measured_slots)
        duration_end_s = None
        if load.duration_s is not None:
            duration_end_s = start_s + load.duration_s
            end = int(np.searchsorted(offsets, duration_end_s, side="left"))
        return _DueTimes([float(x) for x in offsets[:end]], warmup_slots, duration_end_s, rows[:end], said)
    process = load.process
    warmup = process.offsets_s(load, warmup_slots + 1, rng)
    if measured_slots is not None:
        rest = process.offsets_s(load, measured_slots, rng)
        return _DueTimes([float(x) for x in np.concatenate([warmup[:-1], warmup[-1] + rest])], warmup_slots, None)
    measured = process.offsets_until_s(load, load.duration_s, rng, max_count=load.max_requests)
    if measured is None:
        raise ScenarioError(
            f"load.max_requests: {load.max_requests} is too small for rate {load.rate:g}/s "
            f"over duration_s {load.duration_s:g}; raise load.max_requests or shorten the run"
        )
    offsets = np.concatenate([warmup[:-1], warmup[-1] + measured])
    return _DueTimes([float(x) for x in offsets], warmup_slots, float(warmup[-1]) + load.duration_s)


@dataclass
class Draws:
    """What a single-turn workload kind draws its n requests from: the schedule (n = its slots), the
    scenario's seeded streams, and the answer lengths drawn from workload.output_tokens."""

    scenario: Scenario
    tokenizer: TokenizerSource
    due: _DueTimes
    length_rng: np.random.Generator
    prompt_rng: np.random.Generator
    output_tokens: list[int]

    @property
    def n(self) -> int:
        return len(self.due.offsets_s)


@dataclass
class Prompts:
    """A workload kind's requests: (prompt, its token count) each, with whatever the kind adds per request."""

    prompts: list[tuple[str | None, int]]
    output_tokens: list[int]
    messages: list[list[dict] | None] | None = None  # chat messages sent as they are (file rows)
    extra_bodies: list[dict | None] | None = None  # merged into each request body (structured: response_format)
    expected: list[tuple[str, str] | None] | None = None  # known answers: (answer, how it is matched)
    warnings: list[str] = field(default_factory=list)


class SingleTurn(WorkloadKind):
    """A kind with one request per schedule slot, each prompt from `prompts`."""

    def schedule(self, scenario: Scenario, tokenizer: TokenizerSource) -> RequestSchedule:
        load = scenario.load
        due = _due_times(scenario, load.warmup_requests, load.num_requests)
        output_rng = np.random.default_rng([scenario.seed, 5])
        outputs = scenario.workload.output_tokens.sample(output_rng, len(due.offsets_s))
        draws = Draws(
            scenario,
            tokenizer,
            due,
            length_rng=np.random.default_rng([scenario.seed, 1]),
            prompt_rng=np.random.default_rng([scenario.seed, 2]),
            output_tokens=[int(o) for o in outputs],
        )
        return _schedule_of(self.prompts(draws), due, tokenizer)

    def prompts(self, draws: Draws) -> Prompts:
        raise NotImplementedError


def _schedule_of(built: Prompts, due: _DueTimes, tokenizer: TokenizerSource) -> RequestSchedule:
    n = len(built.prompts)
    messages, extra_bodies = built.messages or [None] * n, built.extra_bodies or [None] * n
    expected = built.expected or [None] * n
    requests = [
        RequestSpec(
            index=i,
            prompt=text,
            messages=messages[i],
            prompt_tokens=count,
            output_tokens=int(built.output_tokens[i]),
            intended_offset_s=due.offsets_s[i],
            is_warmup=i < due.warmup_slots,
            extra_body=extra_bodies[i],
            **({"expected": expected[i][0], "expected_match": expected[i][1]} if expected[i] else {}),
        )
        for i, (text, count) in enumerate(built.prompts)
    ]
    return RequestSchedule(requests, tokenizer.method, due.duration_s, due.warnings + built.warnings)


class RandomWorkload(SingleTurn):
    """Random words of the drawn lengths; under a trace, each row's lengths and shared blocks."""

    name = "random"

    def prompts(self, draws):
        if draws.due.trace_rows is not None:
            rows = draws.due.trace_rows
            prompts = _trace_prompts(draws.scenario, draws.tokenizer, rows, draws.prompt_rng)
            return Prompts(prompts, [max(row.output_tokens, 1) for row in rows])
        builder = prompt_builder(draws.tokenizer)
        lengths = draws.scenario.workload.input_tokens.sample(draws.length_rng, draws.n)
        return Prompts([builder.random_text(draws.prompt_rng, int(k)) for k in lengths], draws.output_tokens)


class SharedPrefixWorkload(SingleTurn):
    name = "shared_prefix"
    fields = ("num_groups", "prefix_tokens", "group_assignment")
    required = ("num_groups", "prefix_tokens")

    def prompts(self, draws):
        prompts = _shared_prefix_prompts(draws.scenario, draws.tokenizer, draws.n, draws.length_rng, draws.prompt_rng)
        return Prompts(prompts, draws.output_tokens)


class RepeatWorkload(SingleTurn):
    name = "repeat"

    def prompts(self, draws):
        lengths = draws.scenario.workload.input_tokens.sample(draws.length_rng, draws.n)
        repeats = [_repeat_prompt(draws.tokenizer, draws.prompt_rng, int(k)) for k in lengths]
        return Prompts(
            [(text, count) for text, count, _ in repeats],
            draws.output_tokens,
            expected=[(passage, "copy") for _, _, passage in repeats],
        )


class FileWorkload(SingleTurn):
    name = "file"
    fields = ("path", "format")
    required = ("path",)

    def prompts(self, draws):
        scenario, tokenizer = draws.scenario, draws.tokenizer
        workload = scenario.workload
        rows, warnings = _read_prompt_file(workload.path, workload.format, draws.n)
        if any(row.messages is not None for row in rows) and scenario.backend.api not in MESSAGE_APIS:
            raise ScenarioError(
                f"workload.path: {workload.path} has messages rows; they need a backend.api that sends messages: "
                + ", ".join(MESSAGE_APIS)
            )
        return Prompts(
            [(row.prompt, _count_tokens(tokenizer, row)) for row in rows],
            [_answer_tokens(tokenizer, row) or o for row, o in zip(rows, draws.output_tokens)],
            messages=[row.messages for row in rows],
            expected=[row.expected for row in rows],
            warnings=warnings,
        )


class StructuredWorkload(SingleTurn):
    name = "structured"
    fields = ("schemas",)
    required = ("schemas",)

    def check(self, workload):
        if workload.ignore_eos:
            raise WorkloadKindError(
                "workload.ignore_eos: set it to false for kind structured; the grammar decides "
                "where an answer ends, and output_tokens is only its upper bound"
            )

    def prompts(self, draws):
        rows = _read_schema_file(draws.scenario.workload.schemas, draws.n)
        formats = [{"type": "json_schema", "json_schema": {"name": row.name, "schema": row.schema}} for row in rows]
        return Prompts(
            [(row.prompt, prompt_tokens(draws.tokenizer, row.prompt)) for row in rows],
            draws.output_tokens,
            extra_bodies=[{"response_format": response_format} for response_format in formats],
        )


class MultiTurnWorkload(WorkloadKind):
    """Sessions of `turns` requests; a slot of the due times is a session, its later turns follow answers."""

    name = "multi_turn"
    fields = ("turns", "think_time_s")
    required = ("turns",)

    def schedule(self, scenario, tokenizer):
        return _multi_turn_schedule(scenario, tokenizer)


def build_schedule(scenario: Scenario, tokenizer: TokenizerSource) -> RequestSchedule:
    schedule = workload_kind(scenario.workload.kind).schedule(scenario, tokenizer)
    if scenario.workload.mix:
        assign_models(schedule.requests, scenario.workload.mix, scenario.seed)
    if scenario.workload.images is not None:
        add_images(schedule.requests, scenario.workload.images, scenario.seed)
    return schedule


def assign_models(requests: list[RequestSpec], mix, seed: int) -> None:
    """Each request's model drawn by workload.mix's weights from its own seeded stream (so the prompts and times
    are those of the scenario without the mix); every turn of a session asks the model its first turn drew."""
    names = [share.model for share in mix]
    weights = np.array([share.weight for share in mix], dtype=np.float64)
    draws = np.random.default_rng([seed, 17]).choice(len(names), size=len(requests), p=weights / weights.sum())
    by_session: dict[int, str] = {}
    for spec, drawn in zip(requests, draws):
        model = names[drawn]
        if spec.session_id is not None:
            model = by_session.setdefault(spec.session_id, model)
        spec.model = model


def _shared_prefix_prompts(scenario, tokenizer, n, length_rng, prompt_rng) -> list[tuple[str, int]]:
    workload = scenario.workload
    builder = prompt_builder(tokenizer)
    prefixes = [
        np.random.default_rng([scenario.seed, 4, g]).choice(builder.word_ids, size=workload.prefix_tokens)
        for g in range(workload.num_groups)
    ]
    if workload.group_assignment == "round_robin":
        groups = np.arange(n) % workload.num_groups
    else:
        groups = length_rng.integers(0, workload.num_groups, size=n)
    suffix_lengths = workload.input_tokens.sample(length_rng, n)
    return [
        builder.random_text(prompt_rng, workload.prefix_tokens + int(k), prefix_ids=prefixes[g])
        for g, k in zip(groups, suffix_lengths)
    ]


REPEAT_INSTRUCTION = "Repeat the following text exactly, word for word.\n\nText:"


def _repeat_prompt(tokenizer, prompt_rng, passage_tokens: int) -> tuple[str, int, str]:
    """A prompt whose answer copies it: an instruction, a passage of random words, a cue to repeat
    it. Where a `random` workload's answers share little with their prompts, these share most of
    their tokens (what n-gram speculative decoding feeds on). Returns (prompt, its tokens, the passage):
    the passage is the known answer its exact-copy rate is scored by (harness/scenario/answers.py)."""
    passage, _ = prompt_builder(tokenizer).random_text(prompt_rng, passage_tokens + tokenizer.added_tokens)
    text = f"{REPEAT_INSTRUCTION}{passage}\n\nRepeated text:"
    return text, prompt_tokens(tokenizer, text), passage.strip()


def hash_block_ids(tokenizer: TokenizerSource, seed: int, hash_id: int, block_size: int) -> np.ndarray:
    """The word tokens of one Mooncake block: a pure function of (seed, hash_id), so equal ids share text."""
    return hash_blocks_ids(tokenizer, seed, [hash_id], block_size)


def hash_blocks_ids(tokenizer: TokenizerSource, seed: int, hash_ids, block_size: int) -> np.ndarray:
    """The word tokens of consecutive Mooncake blocks, one after another: each block a pure function of (seed, its
    hash_id). Drawn by a counter hash (SplitMix64's finalizer over seed, hash_id and position), all of a row's
    blocks in one array operation, rather than by a generator seeded per block, which cost ~40 us a block: a
    100,000-row trace names ~2 million blocks."""
    word_ids = prompt_builder(tokenizer).word_ids
    keys = [(seed * 0x9E3779B97F4A7C15 + h * 0xD1B54A32D192ED03 + 3) % 2**64 for h in hash_ids]
    with np.errstate(over="ignore"):
        position = np.arange(1, block_size + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
        x = (np.array(keys, dtype=np.uint64)[:, None] + position[None, :]).ravel()
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    return word_ids[x % np.uint64(len(word_ids))]


# Rows whose blocks are drawn in one hash_blocks_ids call: numpy's per-call cost was most of a row's ~30 us drawn
# alone; 1,024 rows of ~20 blocks of 32 tokens are ~5 MB at once.
TRACE_ROWS_AT_ONCE = 1024


def _trace_prompts(scenario, tokenizer, rows: list[TraceRow], prompt_rng) -> list[tuple[str, int]]:
    block_size, builder = scenario.load.trace_block_size, prompt_builder(tokenizer)
    prompts = []
    for first in range(0, len(rows), TRACE_ROWS_AT_ONCE):
        some = rows[first : first + TRACE_ROWS_AT_ONCE]
        blocks = hash_blocks_ids(tokenizer, scenario.seed, [h for row in some for h in row.hash_ids or ()], block_size)
        ends = np.cumsum([len(row.hash_ids or ()) * block_size for row in some]).tolist()
        for row, start, end in zip(some, [0, *ends], ends):
            prompts.append(builder.random_text(prompt_rng, max(row.input_tokens, 1), prefix_ids=blocks[start:end]))
    return prompts


def _multi_turn_schedule(scenario: Scenario, tokenizer: TokenizerSource) -> RequestSchedule:
    workload, load = scenario.workload, scenario.load
    turns = workload.turns
    warmup_sessions = math.ceil(load.warmup_requests / turns)
    # A closed loop run by duration gets load.max_requests requests, so that many turns, not sessions.
    measured_requests = (
        load.max_requests if load.process.paced_by == "concurrency" and load.num_requests is None else load.num_requests
    )
    measured_sessions = None if measured_requests is None else math.ceil(measured_requests / turns)
    due = _due_times(scenario, warmup_sessions, measured_sessions)
    length_rng = np.random.default_rng([scenario.seed, 1])
    prompt_rng = np.random.default_rng([scenario.seed, 2])
    requests: list[RequestSpec] = []
    measured_left = measured_requests if measured_requests is not None else math.inf
    for session_id, offset_s in enumerate(due.offsets_s):
        is_warmup = session_id < warmup_sessions
        session_turns = turns if is_warmup else min(turns, measured_left)
        if session_turns <= 0:
            break
        measured_left -= 0 if is_warmup else session_turns
        lengths = workload.input_tokens.sample(length_rng, session_turns)
        outputs = workload.output_tokens.sample(length_rng, session_turns)
        thinks_s = workload.think_time_s.sample_s(length_rng, session_turns)
        for turn in range(session_turns):
            text, count = prompt_builder(tokenizer).random_text(prompt_rng, int(lengths[turn]))
            requests.append(
                RequestSpec(
                    index=len(requests),
                    prompt=text,
                    messages=None,
                    prompt_tokens=count,
                    output_tokens=int(outputs[turn]),
                    intended_offset_s=offset_s if turn == 0 else None,
                    session_id=session_id,
                    turn_index=turn,
                    think_time_s=float(thinks_s[turn]) if turn > 0 else 0.0,
                    is_warmup=is_warmup,
                )
            )
    return RequestSchedule(requests, tokenizer.method, due.duration_s, due.warnings)


@dataclass(frozen=True)
class PromptRow:
    """One prompt of a workload.path file, cycled through by the schedule."""

    prompt: str | None  # None for a messages row
    messages: list[dict] | None = None  # chat messages, sent as the file has them
    output_tokens: int | None = None  # the row's own max_tokens; None: workload.output_tokens
    answer: str | None = None  # ShareGPT: the gpt turn, whose token count is the answer length
    expected: tuple[str, str] | None = None  # a known answer: (text, exact | regex)

    def counted_texts(self) -> list[str]:
        """What the prompt's token count covers: for messages rows, the contents only (the engine's chat
        template adds a few tokens on top)."""
        if self.messages is None:
            return [self.prompt]
        return [str(ChatMessage.model_validate(m).content) for m in self.messages]


@dataclass(frozen=True)
class SchemaRow:
    """One structured-output request: the JSON schema its answer must follow, its name and the prompt."""

    name: str
    schema: dict
    prompt: str


class ChatMessage(BaseModel):
    """An OpenAI chat message as a prompt file writes it; only its content is read (for the token count)."""

    model_config = ConfigDict(extra="ignore")
    content: Any = ""  # a string, or a list of content parts (counted as written)


class _FileRecord(BaseModel):
    """A line of a JSONL prompt file; keys it does not name are ignored. NEEDS is the error for a line
    that is not an object or misses what it needs, FIXES says what each other field must be."""

    model_config = ConfigDict(extra="ignore", strict=True)
    NEEDS: ClassVar[str]
    FIXES: ClassVar[dict[str, str]] = {}

    @classmethod
    def read(cls, where: str, record: Any) -> Self:
        """The line as this model; ScenarioError naming the file, line, field and the fix when it does not fit."""
        try:
            return cls.model_validate(record)
        except ValidationError as error:
            first = error.errors()[0]
            name = first["loc"][0] if first["loc"] and isinstance(record, dict) else None
            if name not in cls.FIXES:
                raise ScenarioError(f"{where}: {cls.NEEDS}") from None
            raise ScenarioError(f"{where} field {name!r}: {record[name]!r} is not valid: {cls.FIXES[name]}") from None


class _PromptRecord(_FileRecord):
    """A line of a workload.path JSONL file: a prompt or chat messages, with an optional answer length and
    known answer."""

    NEEDS = 'needs "prompt": a string, or "messages": a list of {"role", "content"} objects'
    FIXES = {
        "output_tokens": "must be a whole number >= 1",
        "expected": "must be a non-empty string",
        "match": "must be 'exact' or 'regex'",
    }
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = Field(None, min_length=1)
    output_tokens: int | None = Field(None, ge=1)
    expected: str | None = Field(None, min_length=1)
    match: Literal["exact", "regex"] = "exact"

    @model_validator(mode="after")
    def _prompt_or_messages(self) -> Self:
        if self.prompt is None and self.messages is None:
            raise ValueError("no prompt")
        return self


class _SchemaRecord(_FileRecord):
    """A line of a workload.schemas file: a JSON schema, with an optional prompt and name."""

    NEEDS = 'needs "schema": a JSON schema object (plus optional "prompt", "name")'
    FIXES = {"prompt": "must be a string", "name": "must be a string"}
    json_schema: dict[str, Any] = Field(alias="schema")
    prompt: str | None = None
    name: str | None = None


class _ShareGptTurn(BaseModel):
    model_config = ConfigDict(extra="ignore")
    speaker: str | None = Field(None, alias="from")  # human | gpt | system | ...
    value: str | None = None


class _ShareGptEntry(BaseModel):
    """One conversation of a ShareGPT file; keys other than its turns are ignored."""

    model_config = ConfigDict(extra="ignore")
    conversations: list[_ShareGptTurn]

    def prompt_row(self) -> PromptRow | None:
        """The first human turn is the prompt, the gpt turn after it the answer; None when it has no such pair."""
        turns = self.conversations
        human = next((i for i, turn in enumerate(turns) if turn.speaker == "human"), None)
        if human is None or human + 1 >= len(turns):
            return None
        prompt, answer = turns[human], turns[human + 1]
        if not prompt.value or answer.speaker != "gpt" or not answer.value:
            return None
        return PromptRow(prompt.value, answer=answer.value)


def _count_tokens(tokenizer: TokenizerSource, row: PromptRow) -> int:
    return sum(prompt_tokens(tokenizer, text) for text in row.counted_texts())


def _answer_tokens(tokenizer: TokenizerSource, row: PromptRow) -> int | None:
    if row.answer is not None:
        return answer_tokens(tokenizer, row.answer)
    return row.output_tokens


def _read_schema_file(path: str, n: int) -> list[SchemaRow]:
    """n rows, cycling through the file's schemas."""
    rows = []
    for where, record in read_jsonl(path, "workload.schemas"):
        row = _SchemaRecord.read(where, record)
        schema = row.json_schema
        rows.append(
            SchemaRow(
                name=f"schema_{len(rows)}" if row.name is None else row.name,
                schema=schema,
                prompt=row.prompt or f"Answer with a JSON object that follows this schema: {json.dumps(schema)}",
            )
        )
    if not rows:
        raise ScenarioError(f"workload.schemas: {path}: no schemas")
    return [rows[i % len(rows)] for i in range(n)]


def _read_prompt_file(path: str, file_format: str, n: int) -> tuple[list[PromptRow], list[str]]:
    """n rows, cycling through the file; plus warnings."""
    if file_format == "auto":
        file_format = "sharegpt" if path.endswith(".json") else "jsonl"
    rows, skipped = (_read_sharegpt if file_format == "sharegpt" else _read_jsonl)(path)
    if not rows:
        raise ScenarioError(f"workload.path: {path}: no usable rows ({skipped} malformed)")
    warnings = [f"workload.path: skipped {skipped} malformed entries of {path}"] if skipped else []
    return [rows[i % len(rows)] for i in range(n)], warnings


def _read_jsonl(path: str) -> tuple[list[PromptRow], int]:
    rows = []
    for where, record in read_jsonl(path, "workload.path"):
        row = _PromptRecord.read(where, record)
        rows.append(PromptRow(row.prompt, row.messages, row.output_tokens, expected=_expected_answer(where, row)))
    return rows, 0


def _expected_answer(where: str, row: _PromptRecord) -> tuple[str, str] | None:
    """A row's known answer: (expected, match), match exact (default) or regex; None when it has none."""
    if row.expected is None:
        if "match" in row.model_fields_set:
            raise ScenarioError(f"{where} field 'match': given without 'expected'; add the answer it matches")
        return None
    if row.match == "regex":
        try:
            re.compile(row.expected)
        except re.error as error:
            raise ScenarioError(f"{where} field 'expected': not a valid regular expression ({error})") from None
    return row.expected, row.match


def _read_sharegpt(path: str) -> tuple[list[PromptRow], int]:
    """Every conversation with a human turn answered by a gpt turn; the others are counted as skipped."""
    try:
        entries = json.loads(read_utf8(path, "workload.path"))
    except json.JSONDecodeError as error:
        raise ScenarioError(
            f"workload.path: {path} line {error.lineno} column {error.colno}: not valid JSON: {error.msg}"
        ) from None
    if not isinstance(entries, list):
        raise ScenarioError(f'workload.path: {path}: ShareGPT files are a JSON list of {{"conversations": [...]}}')
    rows = []
    for entry in entries:
        try:
            row = _ShareGptEntry.model_validate(entry).prompt_row()
        except ValidationError:
            row = None
        if row is not None:
            rows.append(row)
    return rows, len(entries) - len(rows)
