"""Tool calls on the chat path: a request's `tools` and `tool_choice` checked, rendered into the prompt, turned
into an output grammar, and the constrained output read back as OpenAI's `tool_calls`.

One text form everywhere, Hermes-style: a call is `<tool_call>{"name": "NAME", "arguments": {...}}</tool_call>`,
in the prompt (the tools' instructions, earlier assistant turns' calls) and in the output the grammar allows.
SmolLM2's chat template renders `role` and `content` only (no tools, no tool_calls), so this module writes
them as text:
- `tools` (unless tool_choice is "none"): a system block listing each tool as JSON inside `<tools></tools>`
  and saying how to call one; appended to the first system message, or a system message of its own first.
- an assistant message's `tool_calls`: each call's text after the message's content, one a line.
- a `{"role": "tool", "tool_call_id", "content"}` message: a turn of role "tool" with the result as sent.

tool_choice, as the grammar (llguidance) enforces it:
- "required": one call of one of the tools, its arguments valid against that tool's `parameters` schema.
- {"type": "function", "function": {"name": N}}: the same, of tool N only.
- "auto": free text, or one call (the marker `<tool_call>` at the very start commits the answer to a call);
  the model decides. SmolLM2-135M seldom calls a tool on its own: "auto" is the real path, not a useful agent.
- "none": no grammar, free text, the tools left out of the prompt.

The wire shapes follow OpenAI's Chat Completions and vLLM's (vllm/entrypoints/openai/serving_chat.py @ 003fe59):
`message.tool_calls` [{"id", "type": "function", "function": {"name", "arguments": JSON text}}], content null,
finish_reason "tool_calls"; a stream sends the call's header ({"index": 0, "id", "type", "function": {"name",
"arguments": ""}}) once the name is known, then the arguments' text in fragments ({"index": 0, "function":
{"arguments": ...}}). A call cut short by max_tokens keeps finish_reason "length" and arguments as far as they came.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass

from native_engine.guided import JSON_SEPARATORS, Grammar

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
CALL_TAIL = "}" + CALL_CLOSE  # what ends a call's text after its arguments
CHOICES = ("none", "auto", "required")
# OpenAI's rule for a function name; it also keeps names free of JSON escapes, so a call's prefix is plain text
NAME_PATTERN = re.compile(r"[A-Za-z0-9_-]{1,64}")
NO_PARAMETERS = {"type": "object", "properties": {}}  # OpenAI: parameters left out means none
NAMED_CHOICE = '{"type": "function", "function": {"name": ...}}'


class ToolCallError(ValueError):
    """What is wrong with a request's tools, tool_choice or tool messages; `param` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class Tool:
    name: str
    description: str | None
    parameters: dict  # the JSON schema of its arguments

    def as_prompt_json(self) -> str:
        function = {"name": self.name, "description": self.description, "parameters": self.parameters}
        function = {k: v for k, v in function.items() if v is not None}
        return json.dumps({"type": "function", "function": function}, ensure_ascii=False)


@dataclass(frozen=True)
class ToolRequest:
    """A chat request's tools and how it may call them: choice is "none", "auto", "required" or "named"."""

    tools: tuple[Tool, ...]
    choice: str
    named: str | None = None  # the function tool_choice names

    @property
    def callable(self) -> tuple[Tool, ...]:
        return tuple(t for t in self.tools if self.named in (None, t.name))


def tool_request(body: dict) -> ToolRequest | None:
    """The request's tools and tool_choice checked, or None when it has no tools; ToolCallError names the field."""
    tools = parsed_tools(body.get("tools"))
    choice, named = parsed_choice(body.get("tool_choice"))
    if not tools:
        if choice in ("required", "named"):
            raise ToolCallError(
                f"tool_choice {json.dumps(body['tool_choice'])[:60]} needs tools; send the functions in tools",
                "tool_choice",
            )
        return None
    if named is not None and named not in {t.name for t in tools}:
        listed = ", ".join(t.name for t in tools)
        raise ToolCallError(f"tool_choice names function {named!r}, which is not in tools ({listed})", "tool_choice")
    return ToolRequest(tools, choice or "auto", named)


def parsed_tools(value) -> tuple[Tool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ToolCallError(f"tools must be a list of function tools, got {json.dumps(value)[:40]}", "tools")
    tools, names = [], set()
    for i, entry in enumerate(value):
        where = f"tools[{i}]"
        if (
            not isinstance(entry, dict)
            or entry.get("type") != "function"
            or not isinstance(entry.get("function"), dict)
        ):
            raise ToolCallError(
                f'{where} must be {{"type": "function", "function": {{"name", "description", "parameters"}}}}, '
                f"got {json.dumps(entry)[:60]}",
                "tools",
            )
        function = entry["function"]
        name, description = function.get("name"), function.get("description")
        parameters = NO_PARAMETERS if function.get("parameters") is None else function["parameters"]
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ToolCallError(
                f"{where}.function.name must be 1 to 64 letters, digits, _ or -, got {json.dumps(name)[:40]}", "tools"
            )
        if name in names:
            raise ToolCallError(f"{where}.function.name {name!r} is given twice; name each function once", "tools")
        if description is not None and not isinstance(description, str):
            raise ToolCallError(f"{where}.function.description must be a string", "tools")
        if not isinstance(parameters, dict):
            raise ToolCallError(
                f"{where}.function.parameters must be a JSON schema object, got {json.dumps(parameters)[:40]}", "tools"
            )
        names.add(name)
        tools.append(Tool(name, description, parameters))
    return tuple(tools)


def parsed_choice(value) -> tuple[str | None, str | None]:
    """(None | "none" | "auto" | "required" | "named", the named function)."""
    if value is None or value in CHOICES:
        return value, None
    function = value.get("function") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("type") != "function" or not isinstance(function, dict):
        raise ToolCallError(
            f'tool_choice must be "none", "auto", "required" or {NAMED_CHOICE}, got {json.dumps(value)[:60]}',
            "tool_choice",
        )
    if not isinstance(function.get("name"), str):
        raise ToolCallError(f"tool_choice.function.name must be a string; send {NAMED_CHOICE}", "tool_choice")
    return "named", function["name"]


# ---- the grammar ---------------------------------------------------------------------------------
def call_schema(tools: tuple[Tool, ...]) -> dict:
    """A call's JSON: {"name": one of the tools, "arguments": valid against that tool's parameters}, keys in
    that order, with the fixed separators structured output uses (guided.JSON_SEPARATORS)."""
    one_of = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters},
            "required": ["name", "arguments"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    return {"anyOf": one_of, "x-guidance": JSON_SEPARATORS}


def tool_grammar(request: ToolRequest) -> Grammar | None:
    """The output grammar of tool_choice (llguidance's Lark with an embedded JSON schema); None for "none"."""
    import llguidance as llg

    if request.choice == "none":
        return None
    call = f'"{CALL_OPEN}" call_json "{CALL_CLOSE}"'
    rules = f"call: {call}\ncall_json: %json {json.dumps(call_schema(request.callable))}\n"
    if request.choice == "auto":  # free text that does not open a call, or a call
        rules = f"start: call | TEXT\nTEXT: /(?s:.*)/ & ~/{CALL_OPEN}(?s:.*)/\n" + rules
    else:
        rules = "start: call\n" + rules
    return Grammar("tool_choice", llg.grammar_from("lark", rules))


def tool_schema_grammars(request: ToolRequest) -> list[Grammar]:
    """One grammar per tool's parameters schema, compiled on their own so a bad one is named by its index."""
    import llguidance as llg

    return [
        Grammar(
            f"tools[{i}].function.parameters",
            llg.LLMatcher.grammar_from_json_schema(t.parameters, overrides=JSON_SEPARATORS),
        )
        for i, t in enumerate(request.tools)
    ]


# ---- the prompt ----------------------------------------------------------------------------------
def tools_instructions(request: ToolRequest) -> str:
    listed = "\n".join(t.as_prompt_json() for t in request.tools)
    return (
        "You can call functions. Their signatures (JSON schemas of their arguments) are in <tools></tools>:\n"
        f"<tools>\n{listed}\n</tools>\n"
        f'To call one, answer with {CALL_OPEN}{{"name": <function name>, "arguments": <arguments object>}}'
        f"{CALL_CLOSE}"
    )


def call_text(name: str, arguments: str) -> str:
    """A call as the model writes it (and the grammar allows): arguments, a JSON text, as sent."""
    return f"{call_prefix(name)}{arguments}{CALL_TAIL}"


def call_prefix(name: str) -> str:
    return f'{CALL_OPEN}{{"name": {json.dumps(name)}, "arguments": '


def with_tools(messages: list[dict], request: ToolRequest | None) -> list[dict]:
    """The flat {role, content} messages with the tools' instructions in the system turn (not for "none")."""
    if request is None or request.choice == "none":
        return messages
    block = tools_instructions(request)
    if messages and messages[0]["role"] == "system":
        first = {"role": "system", "content": f"{messages[0]['content']}\n\n{block}"}
        return [first, *messages[1:]]
    return [{"role": "system", "content": block}, *messages]


def assistant_calls_text(i: int, calls, known_ids: set[str]) -> str:
    """An assistant message's tool_calls as text, one call a line; their ids go into known_ids."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise ToolCallError(f"{where} must be a list of tool calls, got {json.dumps(calls)[:40]}", "messages")
    texts = []
    for j, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise ToolCallError(
                f'{where}[{j}] must be {{"id", "type": "function", "function": {{"name", "arguments"}}}}', "messages"
            )
        if not isinstance(call.get("id"), str):
            raise ToolCallError(f"{where}[{j}].id must be a string (the id a tool message answers)", "messages")
        name, arguments = function.get("name"), function.get("arguments")
        if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
            raise ToolCallError(f"{where}[{j}].function.name must be a function name, got {name!r:.40}", "messages")
        if not isinstance(arguments, str) or not _is_json_object(arguments):
            raise ToolCallError(
                f"{where}[{j}].function.arguments must be a JSON object as a string, got {json.dumps(arguments)[:40]}",
                "messages",
            )
        known_ids.add(call["id"])
        texts.append(call_text(name, arguments))
    return "\n".join(texts)


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def check_tool_message(i: int, message: dict, known_ids: set[str]) -> None:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str):
        raise ToolCallError(
            f"messages[{i}].tool_call_id must be a string: the id of the call this result answers", "messages"
        )
    if call_id not in known_ids:
        raise ToolCallError(
            f"messages[{i}].tool_call_id {call_id!r} answers no earlier assistant tool_calls; send the call's id",
            "messages",
        )


# ---- the output ----------------------------------------------------------------------------------
def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class ToolCallReader:
    """A constrained answer's text read back as deltas of content or of one tool call, as they stream.

    Undecided while the text could still open a call (a prefix of `<tool_call>`); a call's header goes out when
    its name is complete (at once for a named tool_choice), then its arguments, holding back what could be the
    call's closing `}</tool_call>`."""

    def __init__(self, request: ToolRequest):
        self.names = [t.name for t in request.callable]
        self.text = ""
        self.is_call: bool | None = True if request.named else None
        self.name = request.named
        self.call_id: str | None = None
        self.sent = 0  # characters of text already sent (content, or the call's prefix and arguments)

    def feed(self, new_text: str) -> list[dict]:
        self.text += new_text
        return self._deltas(final=False)

    def finish(self) -> list[dict]:
        return self._deltas(final=True)

    def finish_reason(self, engine_reason: str) -> str:
        """A call the grammar completed ends with "tool_calls"; one cut short keeps the engine's ("length")."""
        return "tool_calls" if self.call_id is not None and self.text.endswith(CALL_TAIL) else engine_reason

    def _deltas(self, final: bool) -> list[dict]:
        if self.is_call is None:
            if self.text.startswith(CALL_OPEN):
                self.is_call = True
            elif final or not CALL_OPEN.startswith(self.text):
                self.is_call = False
            else:
                return []
        if not self.is_call:
            piece, self.sent = self.text[self.sent :], len(self.text)
            return [{"content": piece}] if piece else []
        deltas = self._header()
        if self.call_id is None:
            return deltas
        end = self._arguments_end(final)
        if end > self.sent:
            deltas.append({"tool_calls": [{"index": 0, "function": {"arguments": self.text[self.sent : end]}}]})
            self.sent = end
        return deltas

    def _header(self) -> list[dict]:
        if self.call_id is not None:
            return []
        if self.name is None:
            self.name = next((n for n in self.names if self.text.startswith(call_prefix(n))), None)
        if self.name is None:
            return []
        self.call_id, self.sent = new_call_id(), len(call_prefix(self.name))
        function = {"name": self.name, "arguments": ""}
        return [{"tool_calls": [{"index": 0, "id": self.call_id, "type": "function", "function": function}]}]

    def _arguments_end(self, final: bool) -> int:
        """Where the call's arguments end in its text so far. At the end, a whole JSON object ends them, whatever
        of the closing `}</tool_call>` came after it (max_tokens may cut that tail anywhere); arguments cut short
        go as far as they came."""
        if final:
            start = len(call_prefix(self.name))
            try:
                return start + json.JSONDecoder().raw_decode(self.text[start:])[1]
            except ValueError:
                pass
        return len(self.text) - _held_back(self.text, final)

    def message(self) -> dict:
        """The whole answer's message (after finish()): content, or content null and the call."""
        if not self.is_call:
            return {"role": "assistant", "content": self.text, "tool_calls": []}
        if self.call_id is None:  # cut short before the name was complete
            return {"role": "assistant", "content": None, "tool_calls": []}
        arguments = self.text[len(call_prefix(self.name)) : self._arguments_end(final=True)]
        function = {"name": self.name, "arguments": arguments}
        return {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"id": self.call_id, "type": "function", "function": function}],
        }


def _held_back(text: str, final: bool) -> int:
    """How many characters at the end of a call's text may be (final: are) its closing `}</tool_call>`."""
    if final:
        return len(CALL_TAIL) if text.endswith(CALL_TAIL) else 0
    return next((k for k in range(len(CALL_TAIL), 0, -1) if text.endswith(CALL_TAIL[:k])), 0)
