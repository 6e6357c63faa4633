"""An Anthropic Messages body translated into the chat completion the engine runs, and errors named back.

`system` becomes a system turn; a user turn's text blocks a user message and each `tool_result` a tool
message (the chat format merges them into one user turn, results in the order of the calls); an assistant
turn's text, `thinking` and `tool_use` blocks one assistant message with its reasoning and tool calls.
Consecutive turns of one role join, as Anthropic's API joins them. Tools, `tool_choice`, `thinking` and
`output_config` map onto the chat fields of the same meaning, so rendering, grammars and the reply reader
are the chat route's own.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tfc.runtime.server.admission import BadRequest
from tfc.runtime.server.messages_protocol import (
    CountTokensRequest,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
    block,
    parse,
    tool,
)
from tfc.runtime.server.protocol import ChatCompletionRequest

ALLOWED = {
    "user": ("text", "tool_result"),
    "assistant": ("text", "tool_use", "thinking"),
    "system": ("text",),
}
# chat-field names the chat format reports, and their Messages names (a message index is mapped apart)
RENAMES = (
    (re.compile(r"tools\[(\d+)\]\.function\.name"), r"tools[\1].name"),
    (re.compile(r"tools\[(\d+)\]\.function\.parameters"), r"tools[\1].input_schema"),
    (re.compile(r"tool_choice\.function\.name"), "tool_choice.name"),
    (re.compile(r"reasoning_effort"), "output_config.effort"),
    (re.compile(r"response_format[.\w]*"), "output_config.format"),
    (re.compile(r"stop\b"), "stop_sequences"),
    (re.compile(r"prompt\b"), "messages"),
)
_MESSAGE = re.compile(r"messages\[(\d+)\][.\w\[\]]*")


@dataclass(frozen=True)
class Translated:
    """The chat completion a Messages body runs as; per chat message, the Messages field it came from."""

    chat: ChatCompletionRequest
    origins: tuple[str, ...]
    show_thinking: bool = True

    def param(self, name: str | None) -> str | None:
        """A chat field's name (as the chat format or the engine gave it) as the Messages field it came from."""
        if name is None:
            return None
        m = _MESSAGE.fullmatch(name)
        if m:
            at = int(m.group(1))
            return self.origins[at] if at < len(self.origins) else "messages"
        for pattern, new in RENAMES:
            if pattern.match(name):
                return pattern.sub(new, name, count=1)
        return name

    def message(self, text: str, name: str | None) -> str:
        """An error line whose leading chat field name is replaced by the Messages name."""
        if name and text.startswith(name):
            return f"{self.param(name)}{text[len(name) :]}"
        return text


def translate(body: CountTokensRequest) -> Translated:
    """The chat completion of a Messages (or count_tokens) body; a 400 naming the field it cannot serve."""
    last = body.messages[-1]
    if last.role == "assistant":
        at = f"messages[{len(body.messages) - 1}]"
        raise BadRequest(f"{at}: a final assistant turn (prefill) is not supported; end with a user turn", at)
    messages, origins = _messages(body)
    fields: dict[str, Any] = {"messages": messages}
    fields.update(_tools(body))
    thinking = body.thinking
    if thinking is not None:
        if thinking.type == "enabled" and thinking.budget_tokens is None:
            raise BadRequest("thinking.budget_tokens: field required when thinking is enabled",
                             "thinking.budget_tokens")  # fmt: skip
        if thinking.type != "enabled" and thinking.budget_tokens is not None:
            raise BadRequest("thinking.budget_tokens: only with type 'enabled'", "thinking.budget_tokens")
        fields["chat_template_kwargs"] = {"thinking": thinking.type != "disabled"}
    out = body.output_config
    if out is not None and out.effort is not None:
        fields["reasoning_effort"] = out.effort
    if out is not None and out.format is not None:
        fields["response_format"] = {"type": "json_schema",
                                     "json_schema": {"name": "output", "schema": out.format.json_schema, "strict": True}}  # fmt: skip
    if isinstance(body, MessagesRequest):
        fields.update(_sampling(body))
    chat = parse(ChatCompletionRequest, fields)
    show = thinking is None or thinking.display != "omitted"
    return Translated(chat, tuple(origins), show)


def _sampling(body: MessagesRequest) -> dict[str, Any]:
    """The generation fields of a Messages body as chat fields."""
    if body.container is not None:
        raise BadRequest("container: code-execution containers are not supported", "container")
    budget = body.thinking.budget_tokens if body.thinking is not None else None
    if budget is not None and budget >= body.max_tokens:
        raise BadRequest(f"thinking.budget_tokens: must be less than max_tokens ({body.max_tokens})",
                         "thinking.budget_tokens")  # fmt: skip
    return {"max_tokens": body.max_tokens, "temperature": body.temperature, "top_p": body.top_p,
            "top_k": body.top_k, "seed": body.seed, "stop": body.stop_sequences, "draft": body.draft}  # fmt: skip


def _tools(body: CountTokensRequest) -> dict[str, Any]:
    """tools, tool_choice and parallel_tool_calls as chat fields."""
    tools = [tool(raw, f"tools[{i}]") for i, raw in enumerate(body.tools or ())]
    out: dict[str, Any] = {}
    if tools:
        out["tools"] = [{"type": "function", "function": {"name": t.name, "description": t.description,
                         "parameters": t.input_schema}} for t in tools]  # fmt: skip
    choice = body.tool_choice
    if choice is None:
        return out
    if choice.type == "tool":
        if choice.name is None:
            raise BadRequest("tool_choice.name: field required for type 'tool'", "tool_choice.name")
        if all(t.name != choice.name for t in tools):
            raise BadRequest(f"tool_choice.name: {choice.name!r} is not one of the request's tools",
                             "tool_choice.name")  # fmt: skip
        out["tool_choice"] = {"type": "function", "function": {"name": choice.name}}
    elif choice.name is not None:
        raise BadRequest("tool_choice.name: only for type 'tool'", "tool_choice.name")
    elif choice.type == "any":
        if not tools:
            raise BadRequest("tool_choice: type 'any' needs `tools`", "tool_choice")
        out["tool_choice"] = "required"
    else:
        out["tool_choice"] = choice.type
    if choice.disable_parallel_tool_use:
        out["parallel_tool_calls"] = False
    return out


def _messages(body: CountTokensRequest) -> tuple[list[dict], list[str]]:
    """The chat messages of a body's system and turns, and where each came from."""
    out: list[dict] = []
    origins: list[str] = []
    if body.system is not None:
        out.append({"role": "system", "content": _text(body.system, "system")})
        origins.append("system")
    previous = None
    for i, message in enumerate(body.messages):
        where = f"messages[{i}]"
        content = message.content
        blocks = [TextBlock(type="text", text=content)] if isinstance(content, str) else [
            block(raw, f"{where}.content[{k}]", ALLOWED[message.role]) for k, raw in enumerate(content)
        ]  # fmt: skip
        if message.role == "assistant":
            turn = _assistant(blocks)
            if previous == "assistant":  # Anthropic joins consecutive turns of one role
                _join(out[-1], turn)
            else:
                out.append(turn)
                origins.append(where)
        elif message.role == "system":
            out.append({"role": "system", "content": [{"type": "text", "text": b.text} for b in blocks]})
            origins.append(where)
        else:
            for chat in _user(blocks, where):
                out.append(chat)
                origins.append(where)
        previous = message.role
    return out, origins


def _user(blocks: list, where: str) -> list[dict]:
    """A user turn's messages: its text as user messages, each tool result as a tool message, in order."""
    out: list[dict] = []
    text: list[dict] = []
    for k, b in enumerate(blocks):
        if isinstance(b, ToolResultBlock):
            if text:
                out.append({"role": "user", "content": text})
                text = []
            result = "" if b.content is None else _text(b.content, f"{where}.content[{k}].content")
            out.append({"role": "tool", "tool_call_id": b.tool_use_id, "content": result})
        else:
            text.append({"type": "text", "text": b.text})
    if text or not out:
        out.append({"role": "user", "content": text})
    return out


def _assistant(blocks: list) -> dict:
    """An assistant turn as one chat message: text, reasoning, tool calls."""
    text = [b.text for b in blocks if isinstance(b, TextBlock)]
    turn: dict[str, Any] = {"role": "assistant", "content": "\n\n".join(text) if text else None}
    reasoning = [b.thinking for b in blocks if isinstance(b, ThinkingBlock)]
    if reasoning:
        turn["reasoning_content"] = "\n\n".join(reasoning)
    calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": b.input}}
             for b in blocks if isinstance(b, ToolUseBlock)]  # fmt: skip
    if calls:
        turn["tool_calls"] = calls
    return turn


def _join(turn: dict, more: dict) -> None:
    """Fold a following assistant turn into `turn`."""
    for key in ("content", "reasoning_content"):
        if more.get(key):
            turn[key] = f"{turn[key]}\n\n{more[key]}" if turn.get(key) else more[key]
    if more.get("tool_calls"):
        turn["tool_calls"] = [*turn.get("tool_calls", []), *more["tool_calls"]]


def _text(content: str | list, where: str) -> str | list[dict]:
    """A system prompt's or tool result's content: a string, or its text blocks as text parts."""
    if isinstance(content, str):
        return content
    return [
        {"type": "text", "text": block(raw, f"{where}[{k}]", ("text",)).text} for k, raw in enumerate(content)
    ]
