"""The DeepSeek-V4.1 chat encoding: messages, tools and options rendered to the prompt text the model reads.

It follows the released encoder (`encoding/encoding.py` of deepseek-ai/DeepSeek-V4.1-Flash, as
spec/deepseek_v41.md section 11 describes it): BOS; `<｜System｜>` at the start when there is a system
message or a reasoning-effort line; system text, then the tools section, then the response format; user
turns after `<｜User｜>`; tool results merged into a user turn as `<tool_result>` blocks (in the order of the
calls they answer) and consecutive user turns joined by a blank line; after the last user turn (or a later
system turn) `<｜Assistant｜>` and `<think>` (thinking) or `</think>` (chat). A historical assistant turn is
[reasoning `</think>`] content [blank line, calls block] EOS, its reasoning dropped when it comes before the
last user turn, unless tools are offered.

Choices of ours: `developer` renders as `system` (OpenAI's newer name for it; the encoder has no such role);
a request's tools and response format are attached to the first message, an empty system message being
inserted when the first is not one.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tfc.runtime.models.dsv41.chat.dsml import SEPARATOR, ChatError, render_calls

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
SYSTEM, USER, ASSISTANT = "<｜System｜>", "<｜User｜>", "<｜Assistant｜>"
THINK, THINK_END = "<think>", "</think>"

EFFORT_LINE = "Reasoning Effort: {n} (range 1-100, the higher the value, the more thorough the reasoning)\n\n"
RESPONSE_FORMAT = (
    "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n{schema}"
)
TOOL_RESULT = "<tool_result>{content}</tool_result>"

# The official encoder's tools section, word for word (the DSML tags with their leading space).
TOOLS_SECTION = """## Tools

You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "<｜DSML｜ calls>" block like the following:

<｜DSML｜ calls>
<｜DSML｜ invoke name="$TOOL_NAME">
<｜DSML｜ parameter name="$PARAMETER_NAME" string="true|false">$PARAMETER_VALUE</｜DSML｜ parameter>
...
</｜DSML｜ invoke>
<｜DSML｜ invoke name="$TOOL_NAME2">
...
</｜DSML｜ invoke>
</｜DSML｜ calls>

String parameters should be specified as is and set `string="true"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string="false"`.

If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.

Otherwise, output directly after </think> with tool calls or final response.

### Available Tool Schemas

{schemas}

You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.
"""

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True)
class Encoding:
    """How to render: thinking or chat mode, the effort (thinking only), tools, a response-format schema."""

    thinking: bool = False
    effort: int = 75
    tools: tuple[dict, ...] = ()  # OpenAI function objects ({"name", "description", "parameters", ...})
    response_format: Any = None  # the JSON value rendered under "## Response Format:"
    drop_thinking: bool = True
    generation_prompt: bool = True  # the assistant header after a last user (or later system) turn
    open_last: bool = False  # a last assistant turn left open: no EOS (its reasoning open, with no answer)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def text_of(content: Any, where: str) -> str:
    """A message's content as text: a string, None, or a list of text parts (joined by a blank line, as the encoder does)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ChatError(f"{where}.content: must be a string or a list of text parts", f"{where}.content")
    parts = []
    for k, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise ChatError(f"{where}.content[{k}]: only text parts are supported", f"{where}.content")
        parts.append(part["text"])
    return "\n\n".join(parts)


@dataclass
class _Turn:
    """A message after normalising: role, text, reasoning, calls, tool-result blocks, where it came from."""

    role: str
    where: str
    text: str = ""
    reasoning: str = ""
    calls: list | None = None
    blocks: list | None = None  # user turns: [(kind, text, call id)]
    tools: tuple[dict, ...] = ()
    response_format: Any = None


def _turns(messages: list[dict]) -> list[_Turn]:
    """Messages checked and normalised; tool results and consecutive user turns merged into one user turn."""
    out: list[_Turn] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        role = m.get("role")
        if role not in ROLES:
            raise ChatError(f"{where}.role: {role!r} is not a role this chat format renders", f"{where}.role")
        if role == "tool":
            block = ("tool_result", text_of(m.get("content"), where), m.get("tool_call_id") or "")
        elif role == "user":
            block = ("text", text_of(m.get("content"), where), "")
        else:
            block = None
        if block is not None:
            if out and out[-1].role == "user":
                out[-1].blocks.append(block)
            else:
                out.append(_Turn("user", where, blocks=[block]))
            continue
        turn = _Turn("system" if role == "developer" else role, where, text_of(m.get("content"), where))
        if role == "assistant":
            reasoning = m.get("reasoning_content")
            reasoning = m.get("reasoning") if reasoning is None else reasoning
            turn.reasoning = text_of(reasoning, where)
            calls = m.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                raise ChatError(f"{where}.tool_calls: must be a list", f"{where}.tool_calls")
            turn.calls = calls or None
        out.append(turn)
    _order_results(out)
    return out


def _order_results(turns: list[_Turn]) -> None:
    """Sort each user turn's tool results into the order of the preceding assistant turn's calls."""
    order: dict[str, int] = {}
    for t in turns:
        if t.role == "assistant" and t.calls:
            order = {c.get("id"): k for k, c in enumerate(t.calls) if isinstance(c, dict) and c.get("id")}
        elif t.role == "user" and order:
            results = sorted((b for b in t.blocks if b[0] == "tool_result"), key=lambda b: order.get(b[2], 0))
            it = iter(results)
            t.blocks = [next(it) if b[0] == "tool_result" else b for b in t.blocks]


def _last_user(turns: list[_Turn]) -> int:
    """The index of the last user turn, or of a later system turn that is not the first message."""
    for i in range(len(turns) - 1, -1, -1):
        if turns[i].role == "user" or (turns[i].role == "system" and i > 0):
            return i
    return -1


def render(messages: list[dict], enc: Encoding) -> str:
    """The prompt text (special tokens as literal text) for the model to continue.

    A conversation that ends with an assistant turn renders that turn closed (with EOS) and no header, or open
    with `enc.open_last`.
    """
    if not messages:
        raise ChatError("messages: at least one message is needed", "messages")
    turns = _turns(messages)
    if enc.tools or enc.response_format is not None:
        if turns[0].role != "system":
            turns.insert(0, _Turn("system", "messages[0]"))
        turns[0].tools, turns[0].response_format = enc.tools, enc.response_format
    drop = enc.drop_thinking and not enc.tools
    last_user = _last_user(turns)
    out = [BOS]
    for i, t in enumerate(turns):
        effort = EFFORT_LINE.format(n=enc.effort) if i == 0 and enc.thinking else ""
        if i == 0 and (effort or t.role == "system"):
            out.append(SYSTEM)
        out.append(effort)
        if t.role == "system":
            out.append((SYSTEM if i > 0 else "") + t.text)
            if t.tools:
                out.append("\n\n" + TOOLS_SECTION.format(schemas="\n".join(_json(f) for f in t.tools)))
            if t.response_format is not None:
                out.append("\n\n" + RESPONSE_FORMAT.format(schema=_json(t.response_format)))
        elif t.role == "user":
            out.append(USER + "\n\n".join(x if kind == "text" else TOOL_RESULT.format(content=x)
                                          for kind, x, _ in t.blocks))  # fmt: skip
        else:
            open_ = enc.open_last and i == len(turns) - 1
            if enc.thinking and (not drop or i > last_user):
                thinking_on = open_ and not t.text and not t.calls  # continuing it continues the reasoning
                out.append(t.reasoning + ("" if thinking_on else THINK_END))
            out.append(t.text)
            if t.calls:
                out.append(SEPARATOR + render_calls(t.calls, t.where))
            out.append("" if open_ else EOS)
        nxt = turns[i + 1].role if i + 1 < len(turns) else None
        asks = nxt == "assistant" or (nxt is None and enc.generation_prompt)
        if asks and (t.role == "user" or (t.role == "system" and i > 0)):
            thinks = enc.thinking and (not drop or i >= last_user)
            out.append(ASSISTANT + (THINK if thinks else THINK_END))
    return "".join(out)
