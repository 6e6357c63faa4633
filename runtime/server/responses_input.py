"""A Responses request translated into the chat completion it runs as, and chat refusals named in its terms.

Items become chat messages: `instructions` a leading system message; `message` items their role's turn
(`developer` stays `developer`, which the chat format renders as system); the assistant side of one past
reply (a `reasoning` item, an assistant `message`, its `function_call` items, in that order) one assistant
turn with its reasoning, text and tool calls; each `function_call_output` a tool turn. Function tools,
`tool_choice`, `reasoning.effort` and `text.format` become the chat route's `tools`, `tool_choice`,
`reasoning_effort` and `response_format`, so both routes share one renderer, grammar and sampler.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError
from tfc.runtime.server.admission import BadRequest, field_path
from tfc.runtime.server.protocol import ChatCompletionRequest
from tfc.runtime.server.responses_protocol import ResponsesRequest

ROLES = ("user", "assistant", "system", "developer")
TEXT_PARTS = {"input_text": "text", "output_text": "text", "refusal": "refusal"}
PART_FIELDS = {
    "input_text": {"type", "text"},
    "output_text": {"type", "text", "annotations", "logprobs"},
    "refusal": {"type", "refusal"},
}
ITEM_FIELDS = {
    "message": ({"type", "role", "content", "id", "status", "phase"}, {"role", "content"}),
    "function_call": (
        {"type", "call_id", "name", "arguments", "id", "status"},
        {"call_id", "name", "arguments"},
    ),
    "function_call_output": ({"type", "call_id", "output", "id", "status"}, {"call_id", "output"}),
    "reasoning": ({"type", "id", "summary", "content", "encrypted_content", "status"}, set()),
}
TOOL_FIELDS = {"type", "name", "description", "parameters", "strict"}
FORMAT_FIELDS = {
    "text": {"type"},
    "json_object": {"type"},
    "json_schema": {"type", "name", "schema", "description", "strict"},
}
# chat field names as the chat format names them in a refusal -> the Responses field they came from
RENAMES = (
    (re.compile(r"^tools\[(\d+)\]\.function\."), r"tools[\1]."),
    (re.compile(r"^tool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"^reasoning_effort"), "reasoning.effort"),
    (re.compile(r"^response_format\.json_schema\."), "text.format."),
    (re.compile(r"^response_format"), "text.format"),
    (re.compile(r"^max_tokens"), "max_output_tokens"),
    (re.compile(r"^messages$"), "input"),
)
_MESSAGE_AT = re.compile(r"^messages\[(\d+)\](?:\.tool_calls\[(\d+)\](?:\.function)?)?")


@dataclass
class Translation:
    """The chat body a Responses request runs as, and where each of its messages (and calls) came from."""

    chat: ChatCompletionRequest | None = None
    origins: list[str] = field(default_factory=list)  # per message: "instructions", "input", "input[i]"
    call_origins: dict[tuple[int, int], str] = field(default_factory=dict)  # (message, call) -> "input[i]"

    def rename(self, param: str | None, message: str) -> tuple[str | None, str]:
        """A chat refusal's (field, message) in the Responses request's own field names."""
        if not param:
            return param, message
        new = param
        hit = _MESSAGE_AT.match(param)
        if hit is not None:
            m, call = int(hit[1]), hit[2]
            where = self.call_origins.get((m, int(call))) if call is not None else None
            where = where or (self.origins[m] if m < len(self.origins) else "input")
            # instructions and a string input are one text: their message has no fields below it
            new = where if where in ("instructions", "input") else where + param[hit.end() :]
        else:
            for pattern, repl in RENAMES:
                new = pattern.sub(repl, new)
        return new, message.replace(param, new, 1) if message.startswith(param) else message


def _fields(obj: Any, where: str, allowed: set[str], required: set[str]) -> dict:
    """An object's fields checked: a JSON object, no unknown field, every required one present."""
    if not isinstance(obj, dict):
        raise BadRequest(f"{where}: must be a JSON object", where, code="invalid_value")
    for key in obj:
        if key not in allowed:
            raise BadRequest(f"unknown field {where + '.' + key!r}", f"{where}.{key}", code="unknown_field")
    for key in sorted(required):
        if obj.get(key) is None:
            raise BadRequest(
                f"field {where + '.' + key!r} is required", f"{where}.{key}", code="missing_field"
            )
    return obj


def _string(obj: dict, key: str, where: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise BadRequest(f"{where}.{key}: must be a string", f"{where}.{key}", code="invalid_value")
    return value


def _parts(content: Any, where: str, kinds: tuple[str, ...]) -> list[str]:
    """The texts of a content list of the given part types (anything else, images included, refused)."""
    if not isinstance(content, list):
        raise BadRequest(f"{where}: must be a string or a list of content parts", where, code="invalid_value")
    texts = []
    for k, part in enumerate(content):
        at = f"{where}[{k}]"
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in kinds:
            raise BadRequest(
                f"{at}.type: {kind!r} is not served here (text only: {', '.join(kinds)})",
                f"{at}.type",
                code="invalid_value",
            )
        _fields(part, at, PART_FIELDS.get(kind, {"type", "text"}), set())
        texts.append(_string(part, TEXT_PARTS.get(kind, "text"), at))
    return texts


def _text_of(content: Any, where: str) -> str | list[dict]:
    """A message's content as the chat route takes it: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": t} for t in _parts(content, where, ("input_text", "output_text", "refusal"))
    ]


def _output(value: Any, where: str) -> str:
    """A function_call_output's `output`: a string or a list of input_text parts (joined)."""
    if isinstance(value, str):
        return value
    return "".join(_parts(value, where, ("input_text",)))


def _reasoning_text(item: dict, where: str) -> str:
    if item.get("encrypted_content") is not None:
        raise BadRequest(
            f"{where}.encrypted_content: this server never encrypts reasoning; send `content`",
            f"{where}.encrypted_content",
            code="invalid_value",
        )
    content = item.get("content")
    if content:
        return "".join(_parts(content, f"{where}.content", ("reasoning_text",)))
    return "\n\n".join(_parts(item.get("summary") or [], f"{where}.summary", ("summary_text",)))


class _Messages:
    """Chat messages being built from items, with their origins; the assistant turn still open."""

    def __init__(self, t: Translation, messages: list[dict]) -> None:
        self.t, self.out = t, messages

    def add(self, message: dict, where: str) -> None:
        self.out.append(message)
        self.t.origins.append(where)

    def assistant(self, where: str, stage: int) -> dict:
        """The open assistant turn, or a new one when this item cannot follow what it already holds."""
        last = self.out[-1] if self.out else None
        # a second reasoning item or assistant message opens a new turn; function calls gather in one
        if (
            last is None
            or last["role"] != "assistant"
            or last["_stage"] > stage
            or last["_stage"] == stage < 2
        ):
            last = {"role": "assistant", "content": None, "_stage": stage}
            self.add(last, where)
        last["_stage"] = stage
        return last


def _items(t: Translation, items: list, messages: list[dict]) -> None:
    """Append the chat messages of an input item list."""
    out = _Messages(t, messages)
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise BadRequest(f"{where}: must be a JSON object", where, code="invalid_value")
        kind = item.get("type", "message")
        if kind not in ITEM_FIELDS:
            detail = "stored items are not kept here" if kind == "item_reference" else "not served here"
            raise BadRequest(
                f"{where}.type: {kind!r} is {detail} (message, function_call, function_call_output "
                "and reasoning items are)",
                f"{where}.type",
                code="invalid_value",
            )
        allowed, required = ITEM_FIELDS[kind]
        _fields(item, where, allowed, required)
        if kind == "message":
            role = item["role"]
            if role not in ROLES:
                raise BadRequest(
                    f"{where}.role: {role!r} is not one of {', '.join(ROLES)}",
                    f"{where}.role",
                    code="invalid_value",
                )
            text = _text_of(item["content"], f"{where}.content")
            if role == "assistant":
                turn = out.assistant(where, 1)
                turn["content"] = text
            else:
                out.add({"role": role, "content": text}, where)
        elif kind == "reasoning":
            out.assistant(where, 0)["reasoning_content"] = _reasoning_text(item, where)
        elif kind == "function_call":
            turn = out.assistant(where, 2)
            calls = turn.setdefault("tool_calls", [])
            t.call_origins[(len(messages) - 1, len(calls))] = where
            calls.append(
                {
                    "id": _string(item, "call_id", where),
                    "type": "function",
                    "function": {
                        "name": _string(item, "name", where),
                        "arguments": _string(item, "arguments", where),
                    },
                }
            )
        else:
            out.add(
                {
                    "role": "tool",
                    "tool_call_id": _string(item, "call_id", where),
                    "content": _output(item["output"], f"{where}.output"),
                },
                where,
            )
    for m in messages:
        m.pop("_stage", None)
    if messages and messages[-1]["role"] == "assistant":
        where = t.origins[-1]
        raise BadRequest(
            f"{where}: the input ends with the assistant's turn; end it with a user message or a "
            "function_call_output",
            where,
            code="invalid_value",
        )


def _tools(tools: list | None) -> list[dict] | None:
    """Responses function tools as chat tools."""
    if tools is None:
        return None
    out = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise BadRequest(
                f"{where}.type: {kind!r} tools are not served (function tools are)",
                f"{where}.type",
                code="invalid_value",
            )
        _fields(tool, where, TOOL_FIELDS, {"name"})
        fn = {k: v for k, v in tool.items() if k != "type" and v is not None}
        out.append({"type": "function", "function": fn})
    return out


def _tool_choice(choice: Any) -> str | dict | None:
    if choice is None or choice in ("none", "auto", "required"):
        return choice
    kind = choice.get("type") if isinstance(choice, dict) else None
    if kind != "function":
        raise BadRequest(
            "tool_choice: none, auto, required or {'type': 'function', 'name': ...}",
            "tool_choice",
            code="invalid_value",
        )
    _fields(choice, "tool_choice", {"type", "name"}, {"name"})
    return {"type": "function", "function": {"name": _string(choice, "name", "tool_choice")}}


def _format(fmt: dict | None) -> dict | None:
    """`text.format` as the chat route's `response_format`."""
    if fmt is None:
        return None
    kind = fmt.get("type")
    if kind not in FORMAT_FIELDS:
        raise BadRequest(
            f"text.format.type: {kind!r} is not text, json_object or json_schema",
            "text.format.type",
            code="invalid_value",
        )
    _fields(fmt, "text.format", FORMAT_FIELDS[kind], {"schema"} if kind == "json_schema" else set())
    if kind != "json_schema":
        return {"type": kind}
    spec = {k: fmt[k] for k in ("name", "description", "schema", "strict") if fmt.get(k) is not None}
    return {"type": "json_schema", "json_schema": spec}


def translate(body: ResponsesRequest) -> Translation:
    """The chat completion body a Responses body runs as (a BadRequest names the Responses field)."""
    t = Translation()
    messages: list[dict] = []
    if body.instructions:
        messages.append({"role": "system", "content": body.instructions})
        t.origins.append("instructions")
    if isinstance(body.input, str):
        messages.append({"role": "user", "content": body.input})
        t.origins.append("input")
    elif isinstance(body.input, list) and body.input:
        _items(t, body.input, messages)
    else:
        raise BadRequest(
            "input: a string or a non-empty list of items is needed", "input", code="invalid_value"
        )
    effort = body.reasoning.effort if body.reasoning is not None else None
    t.chat = _chat_body(
        t,
        messages=messages,
        tools=_tools(body.tools),
        tool_choice=_tool_choice(body.tool_choice),
        parallel_tool_calls=True if body.parallel_tool_calls is None else body.parallel_tool_calls,
        response_format=_format(body.text.format if body.text is not None else None),
        reasoning_effort=effort,
        max_completion_tokens=body.max_output_tokens,
        temperature=body.temperature,
        top_p=body.top_p,
        seed=body.seed,
        top_k=body.top_k,
        min_p=body.min_p,
        user=body.user,
        draft=body.draft,
    )
    return t


def _chat_body(t: Translation, **fields: Any) -> ChatCompletionRequest:
    """The chat body; a value the chat route's own checks refuse is named in the Responses request's terms."""
    try:
        return ChatCompletionRequest(**fields)
    except ValidationError as error:
        first = error.errors()[0]
        param = field_path(first["loc"])
        param, _ = t.rename(param, "")
        raise BadRequest(f"{param}: {first['msg']}", param, code="invalid_value") from None
