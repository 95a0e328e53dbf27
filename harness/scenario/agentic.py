"""workload.kind agentic: agent sessions with tool-result turns and sub-agent fan-out, drawn from workload.agentic or
replayed from a WEKA trace (harness/scenario/agentic_trace.py), and the chat messages each turn sends.

A session is a parent's turns (workload.agentic.turns: user, tool_result, subagent, merge) behind one system prompt
that every session (sub-agents too) shares, so the engine's prefix cache can serve it. A `subagent` turn's answer
starts `fan_out` child sessions of `subagent_turns` turns each (a `subagent_task` turn, then tool_result turns),
run in parallel; the parent's `merge` turn waits for all of them and carries their answers as tool results. Each
turn's kind is in its record (turn_kind) and the summary's by_turn_kind.

Timing: a root session's first turn is due at its slot of the load's arrivals (or its trace start); a later turn
its delay after the previous answer ended (user, subagent: think_time_s; tool_result, merge: tool_delay_s, the
tool's time); a child's first turn when the spawning answer ended (plus its trace offset); the merge turn after the
last child ended. The runner keeps these on its one absolute timeline (harness/client/runner.py).
"""

from __future__ import annotations

import json
import math

import numpy as np

from harness.scenario.agentic_trace import SessionPlan, TurnPlan, read_weka
from harness.scenario.arrivals import trace_offsets_s
from harness.scenario.prompts import prompt_builder
from harness.scenario.scenario import AgenticConfig, ScenarioError
from harness.scenario.workload import RequestSchedule, RequestSpec, _due_times
from harness.scenario.workload_kinds import WorkloadKind, WorkloadKindError

CHILD_KINDS = ("subagent_task", "tool_result")  # a sub-agent's first turn, then its tool turns


class AgenticWorkload(WorkloadKind):
    name = "agentic"
    fields = ("agentic",)

    def check(self, workload):
        turns = (workload.agentic or AgenticConfig()).turns
        if turns[0] != "user":
            raise WorkloadKindError(
                f"workload.agentic.turns[0]: a session opens with its task; make the first turn user (got {turns[0]})"
            )
        for i, kind in enumerate(turns):
            follows = turns[i - 1] if i else None
            if kind == "merge" and follows != "subagent":
                raise WorkloadKindError(
                    f"workload.agentic.turns[{i}]: merge carries the sub-agents' answers, so it comes right after a "
                    f"subagent turn (it follows {follows}); put a subagent turn before it"
                )
            if kind == "subagent" and (i + 1 == len(turns) or turns[i + 1] != "merge"):
                raise WorkloadKindError(
                    f"workload.agentic.turns[{i}]: a subagent turn's children are waited for by the parent's next "
                    "turn; follow it with a merge turn"
                )

    def schedule(self, scenario, tokenizer):
        load = scenario.load
        if load.trace_format == "weka":
            sessions = read_weka(load.trace)
            return _trace_schedule(scenario, tokenizer, sessions)
        return _drawn_schedule(scenario, tokenizer)


def _drawn_schedule(scenario, tokenizer) -> RequestSchedule:
    workload, load = scenario.workload, scenario.load
    agentic = workload.agentic or AgenticConfig()
    per_session = len(agentic.turns) + agentic.turns.count("subagent") * agentic.fan_out * agentic.subagent_turns
    warmup_sessions = math.ceil(load.warmup_requests / per_session)
    measured = None if load.num_requests is None else math.ceil(load.num_requests / per_session)
    if load.process.paced_by == "concurrency" and load.num_requests is None:
        measured = math.ceil(load.max_requests / per_session)
    due = _due_times(scenario, warmup_sessions, measured)
    rng = np.random.default_rng([scenario.seed, 1])
    plans = [_drawn_session(workload, agentic, rng) for _ in due.offsets_s]
    requests = _requests(scenario, tokenizer, plans, due.offsets_s, warmup_sessions)
    return RequestSchedule(requests, tokenizer.method, due.duration_s, due.warnings)


def _drawn_session(workload, agentic: AgenticConfig, rng: np.random.Generator) -> SessionPlan:
    def turn(kind: str, first: bool = False) -> TurnPlan:
        tool = kind in ("tool_result", "merge")
        if kind == "merge":
            tokens = None
        else:
            tokens = int((agentic.tool_result_tokens if tool else workload.input_tokens).sample(rng, 1)[0])
        delay_s = 0.0 if first else float((agentic.tool_delay_s if tool else agentic.think_time_s).sample_s(rng, 1)[0])
        return TurnPlan(kind, tokens, int(workload.output_tokens.sample(rng, 1)[0]), delay_s)

    turns = []
    for i, kind in enumerate(agentic.turns):
        plan = turn(kind, first=i == 0)
        if kind == "subagent":
            plan.children = [
                [turn("subagent_task", first=True)] + [turn("tool_result") for _ in range(agentic.subagent_turns - 1)]
                for _ in range(agentic.fan_out)
            ]
        turns.append(plan)
    return SessionPlan(start_s=None, system_tokens=agentic.system_prompt_tokens, turns=turns)


def _trace_schedule(scenario, tokenizer, sessions: list[SessionPlan]) -> RequestSchedule:
    """The trace's sessions by start; warm-up sessions until load.warmup_requests requests, then load.num_requests
    (all when not given) or those starting within load.duration_s of the first measured one."""
    load = scenario.load
    sessions = sorted(sessions, key=lambda s: s.start_s)
    offsets = [float(x) for x in trace_offsets_s([s.start_s for s in sessions], load.time_scale)]
    for session in sessions:
        _scale_delays(session.turns, load.time_scale)
    warmup, count = 0, 0
    while warmup < len(sessions) and count < load.warmup_requests:
        count += sessions[warmup].requests()
        warmup += 1
    if warmup >= len(sessions):
        raise ScenarioError(
            f"load.warmup_requests: {load.warmup_requests} takes every session of the trace ({len(sessions)}); "
            "use fewer warm-ups"
        )
    end, count, duration_end_s = len(sessions), 0, None
    if load.duration_s is not None:
        duration_end_s = offsets[warmup] + load.duration_s
        end = sum(1 for x in offsets if x <= duration_end_s)
    elif load.num_requests is not None:
        end = warmup
        while end < len(sessions) and count < load.num_requests:
            count += sessions[end].requests()
            end += 1
    requests = _requests(scenario, tokenizer, sessions[:end], offsets[:end], warmup)
    return RequestSchedule(requests, tokenizer.method, duration_end_s, [])


def _scale_delays(turns: list[TurnPlan], scale: float) -> None:
    for turn in turns:
        turn.delay_s *= scale
        for child in turn.children:
            _scale_delays(child, scale)


def _requests(scenario, tokenizer, plans: list[SessionPlan], offsets_s, warmup_sessions: int) -> list[RequestSpec]:
    """The sessions' requests: each root session, then its sub-agents, numbered in that order."""
    builder = prompt_builder(tokenizer)
    longest = max((plan.system_tokens for plan in plans), default=0)
    system_ids = np.random.default_rng([scenario.seed, 23]).choice(builder.word_ids, size=max(longest, 1))
    prompt_rng = np.random.default_rng([scenario.seed, 2])
    out: list[RequestSpec] = []
    next_session = len(plans)  # root sessions are 0..n-1, as multi_turn's; sub-agents follow

    def session(sid: int, turns: list[TurnPlan], plan: SessionPlan, offset_s, warm: bool, parent=None) -> None:
        nonlocal next_session
        system = (
            builder.random_text(prompt_rng, plan.system_tokens, prefix_ids=system_ids)[0]
            if plan.system_tokens
            else None
        )
        children = []
        for t, turn in enumerate(turns):
            if turn.new_tokens is None:  # a merge turn: the sub-agents' answers are what it adds
                text, count = None, max(sum(child[-1].output_tokens for child in turns[t - 1].children), 1)
            else:
                text, count = builder.random_text(prompt_rng, turn.new_tokens)
            messages = None
            if t == 0:
                messages = ([{"role": "system", "content": system}] if system else []) + [
                    {"role": "user", "content": text}
                ]
            out.append(
                RequestSpec(
                    index=len(out),
                    prompt=text,
                    messages=messages,
                    prompt_tokens=count + (plan.system_tokens if t == 0 else 0),
                    output_tokens=turn.output_tokens,
                    intended_offset_s=offset_s if t == 0 and parent is None else None,
                    session_id=sid,
                    turn_index=t,
                    think_time_s=turn.delay_s,
                    is_warmup=warm,
                    turn_kind=turn.kind,
                    parent_session_id=None if parent is None else parent[0],
                    parent_turn=None if parent is None else parent[1],
                )
            )
            for child in turn.children:
                children.append((next_session, child, (sid, t)))
                next_session += 1
        for child_sid, child_turns, spawner in children:
            session(child_sid, child_turns, plan, None, warm, spawner)

    for sid, (plan, offset_s) in enumerate(zip(plans, offsets_s)):
        session(sid, plan.turns, plan, offset_s, sid < warmup_sessions)
    return out


# --- the messages a turn sends (harness/client/runner.py builds them as the answers come) --------------------------


def call_id(session_id: int, turn_index: int, child: int | None = None) -> str:
    """The id of the tool call a turn's answer made: call_<session>_<turn> (a fan-out's: _<child>)."""
    return f"call_{session_id}_{turn_index}" + ("" if child is None else f"_{child}")


def assistant_message(spec: RequestSpec, answer: str, following: RequestSpec | None, children: int) -> dict:
    """The answer as the history keeps it: with the tool call that the next turn answers (a tool_result turn), or
    one `task` call per sub-agent (the turn that fanned out). The content stays a string ("" for none), as engines
    that read only text need; the calls are synthesized (call_<session>_<turn>), since the answer's text is all the
    runner keeps of it."""
    message = {"role": "assistant", "content": answer}
    if following is not None and following.turn_kind == "tool_result":
        message["tool_calls"] = [_call(call_id(spec.session_id, spec.turn_index), "run_tool", {})]
    elif following is not None and following.turn_kind == "merge":
        message["tool_calls"] = [
            _call(call_id(spec.session_id, spec.turn_index, k), "task", {"subagent": k}) for k in range(children)
        ]
    return message


def _call(identifier: str, name: str, arguments: dict) -> dict:
    return {"id": identifier, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}


def turn_messages(history: list[dict], spec: RequestSpec, previous: RequestSpec | None, answers: list[str]) -> list:
    """A turn's whole request: the session so far plus what this turn adds. A tool_result turn answers the previous
    answer's tool call; a merge turn answers each sub-agent's task call with that sub-agent's last answer."""
    if previous is None:
        return list(spec.messages)
    if spec.turn_kind == "tool_result":
        added = [
            {"role": "tool", "tool_call_id": call_id(previous.session_id, previous.turn_index), "content": spec.prompt}
        ]
    elif spec.turn_kind == "merge":
        added = [
            {"role": "tool", "tool_call_id": call_id(previous.session_id, previous.turn_index, k), "content": answer}
            for k, answer in enumerate(answers)
        ]
        if spec.prompt:
            added.append({"role": "user", "content": spec.prompt})
    else:
        added = [{"role": "user", "content": spec.prompt or ""}]
    return history + added
