"""Agentic sessions read from a WEKA trace (the kv-cache-tester agentic coding trace format), as session plans.

The format, as AIPerf reads it (ai-dynamo/aiperf, src/aiperf/dataset/loader/weka_trace_models.py at commit
90f31d18c57a572640729b1070a01b1bf2c7c7e4; fixtures tests/fixtures/weka_traces/one_subagent.json at 433ff264b6f4 and
tests/fixtures/weka_subagent/trace_0001.json at d5d6ea5f9a2a): one JSON object per session,
`{"id", "models", "block_size", "hash_id_scope", "tool_tokens", "system_tokens", "requests": [...]}`, whose
`requests` interleave the parent's API calls (`type` "n" or "s": `t` seconds from the session's start, `in` and
`out` tokens, `stop` ("tool_use" when the answer called a tool), `api_time` and `think_time` seconds, `input_types`)
with sub-agent markers (`type` "subagent": `t`, `agent_id`, `duration_ms`, their own `requests`). Markers between
two parent calls run in parallel; the parent's next call comes after they all ended.

A file holds one such object (a .json file), or many, one a line (our JSONL bundle): each line may add `start_s`,
the session's start on the run's clock (WEKA sessions each count from their own start, so a bundle of them has no
common clock of its own); without it a session starts at its first request's `t`.

Timing kept (docs/running.md, agentic sessions): a session's first turn at its start; a later parent turn at its
recorded delay after the previous answer ended: `think_time` where recorded, else the idle gap
t[k] - (t[k-1] + api_time[k-1]) (as AIPerf's end-to-start delay: replayed start-to-start, a turn would be sent before
the answer it continues when our engine answers slower than the recorded one). A sub-agent's first request at its
recorded offset after the parent's spawning answer ended (t - (t_parent + api_time_parent)), its later ones as the
parent's; the turn after the sub-agents at its recorded gap after the last of them ended (think_time, else t minus
the latest recorded sub-agent end: its `duration_ms`, else its last request's t + api_time).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.limits import MAX_TOKENS_PER_REQUEST
from harness.scenario.scenario import ScenarioError
from harness.scenario.traces import read_jsonl, read_utf8


@dataclass
class TurnPlan:
    """One request of an agent session before it has text: its kind, the tokens it adds to the session (None: a
    merge turn, whose content is the sub-agents' answers), its answer length and when it is due."""

    kind: str  # user | tool_result | subagent | merge | subagent_task (a sub-agent's first turn)
    new_tokens: int | None
    output_tokens: int
    delay_s: float  # after the previous answer ended (a sub-agent's first turn: after the spawning answer)
    children: list[list[TurnPlan]] = field(default_factory=list)  # sessions this turn's answer starts


@dataclass
class SessionPlan:
    start_s: float | None  # on the run's clock (a trace); None: the load's arrivals place it
    system_tokens: int  # the shared system prompt's tokens it opens with (0: none)
    turns: list[TurnPlan]

    def requests(self) -> int:
        return sum(1 + sum(len(child) for child in turn.children) for turn in self.turns)


class _WekaCall(BaseModel):
    """A parent's or a sub-agent's API call ("n" normal, "s" streaming); other keys are ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True, allow_inf_nan=False)
    t: float
    type: Literal["n", "s"]
    input_length: int = Field(alias="in", ge=0, le=MAX_TOKENS_PER_REQUEST)
    output_length: int = Field(alias="out", ge=0, le=MAX_TOKENS_PER_REQUEST)
    input_types: list[str] = []
    stop: str | None = ""
    api_time: float | None = None
    think_time: float | None = Field(None, ge=0)

    @property
    def end_s(self) -> float:
        return self.t + max(self.api_time or 0.0, 0.0)


class _WekaSubagent(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    t: float
    type: Literal["subagent"]
    duration_ms: float | None = None
    requests: list[_WekaCall] = Field(min_length=1)

    def absolute(self, call: _WekaCall) -> float:
        """A request's t on the parent's clock: older captures count a sub-agent's requests from its spawn."""
        return self.t + call.t if call.t + 1e-6 < self.t else call.t

    @property
    def end_s(self) -> float:
        if self.duration_ms is not None and self.duration_ms >= 0:
            return self.t + self.duration_ms / 1000
        return max(self.absolute(c) + max(c.api_time or 0.0, 0.0) for c in self.requests)


class _WekaSession(BaseModel):
    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)
    id: str = ""
    system_tokens: int = Field(0, ge=0, le=MAX_TOKENS_PER_REQUEST)
    tool_tokens: int = Field(0, ge=0, le=MAX_TOKENS_PER_REQUEST)
    requests: list[dict[str, Any]] = Field(min_length=1)
    start_s: float | None = Field(None, ge=0)  # our bundle's key: the session's start on the run's clock


def read_weka(path: str | Path, field_path: str = "load.trace") -> list[SessionPlan]:
    """The sessions of a WEKA trace file (one JSON object) or bundle (one object a line), in the file's order."""
    path = Path(path)
    if path.suffix == ".json":
        try:
            records = [(f"{field_path}: {path}", json.loads(read_utf8(path, field_path)))]
        except json.JSONDecodeError as error:
            raise ScenarioError(f"{field_path}: {path} line {error.lineno}: not valid JSON: {error.msg}") from None
    else:
        records = list(read_jsonl(path, field_path))
    sessions = [_session_plan(where, record) for where, record in records]
    if not sessions:
        raise ScenarioError(f"{field_path}: {path}: no sessions in the file")
    return sessions


def _parsed(model, where: str, record: Any):
    try:
        return model.model_validate(record)
    except ValidationError as error:
        first = error.errors()[0]
        at = ".".join(str(part) for part in first["loc"])
        raise ScenarioError(
            f"{where}: field {at!r}: {first['msg']} (WEKA sessions: id, system_tokens, requests of "
            '{"t", "type": "n"|"s", "in", "out", "stop", "api_time", "think_time"} and {"type": "subagent", "t", '
            '"duration_ms", "requests"})'
        ) from None


def _session_plan(where: str, record: Any) -> SessionPlan:
    session = _parsed(_WekaSession, where, record)
    calls: list[_WekaCall] = []
    spawned: list[list[_WekaSubagent]] = []  # per parent call, the sub-agents its answer started
    for i, item in enumerate(session.requests):
        at = f"{where} requests[{i}]"
        if isinstance(item, dict) and item.get("type") == "subagent":
            if not calls:
                raise ScenarioError(f"{at}: a sub-agent before the session's first request; nothing spawned it")
            spawned[-1].append(_parsed(_WekaSubagent, at, item))
        else:
            calls.append(_parsed(_WekaCall, at, item))
            spawned.append([])
    prefix = session.system_tokens + session.tool_tokens
    turns = []
    for k, call in enumerate(calls):
        previous = calls[k - 1] if k else None
        after = spawned[k - 1] if k else []
        turns.append(
            TurnPlan(
                kind=_kind(k, call, previous, after, spawned[k]),
                new_tokens=_new_tokens(call, previous, prefix, after),
                output_tokens=max(call.output_length, 1),
                delay_s=_delay_s(call, previous, after),
                children=[_child_turns(entry, call, prefix) for entry in spawned[k]],
            )
        )
    start_s = session.start_s if session.start_s is not None else max(calls[0].t, 0.0)
    return SessionPlan(start_s=start_s, system_tokens=prefix, turns=turns)


def _kind(k: int, call: _WekaCall, previous: _WekaCall | None, after: list, spawns: list) -> str:
    if after:
        return "merge"
    if spawns:
        return "subagent"
    if previous is not None and (previous.stop == "tool_use" or "tool_result" in call.input_types):
        return "tool_result"
    return "user"


def _new_tokens(call: _WekaCall, previous: _WekaCall | None, prefix: int, after: list) -> int:
    """What the call adds to its session: its input less what the session held (the previous input and answer;
    the system prompt for a first call; the sub-agents' answers, which a merge turn carries as they come)."""
    if previous is None:
        return max(call.input_length - prefix, 1)
    answers = sum(max(entry.requests[-1].output_length, 1) for entry in after)
    return max(call.input_length - previous.input_length - previous.output_length - answers, 1)


def _delay_s(call: _WekaCall, previous: _WekaCall | None, after: list[_WekaSubagent]) -> float:
    if previous is None:
        return 0.0
    if call.think_time is not None:
        return call.think_time
    ended_s = max(entry.end_s for entry in after) if after else previous.end_s
    return max(call.t - ended_s, 0.0)


def _child_turns(entry: _WekaSubagent, spawner: _WekaCall, prefix: int) -> list[TurnPlan]:
    turns = []
    for k, call in enumerate(entry.requests):
        previous = entry.requests[k - 1] if k else None
        if previous is None:
            delay_s = max(entry.absolute(call) - spawner.end_s, 0.0)
            kind = "subagent_task"
        else:
            delay_s = (
                call.think_time
                if call.think_time is not None
                else max(entry.absolute(call) - (entry.absolute(previous) + max(previous.api_time or 0.0, 0.0)), 0.0)
            )
            kind = _kind(k, call, previous, [], [])
        turns.append(
            TurnPlan(
                kind=kind,
                new_tokens=_new_tokens(call, previous, prefix, []),
                output_tokens=max(call.output_length, 1),
                delay_s=delay_s,
            )
        )
    return turns
