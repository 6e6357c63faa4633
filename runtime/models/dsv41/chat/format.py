"""The DeepSeek-V4.1 chat format for the engine: a chat request's options checked and mapped, rendered to ids.

Thinking is off unless asked for (`chat_template_kwargs.thinking` or `enable_thinking`, or a
`reasoning_effort`), so a short `max_tokens` is not spent on reasoning by default. `reasoning_effort` is an
integer 1-100 or a name: the released encoder's low 50, high 75, max 100 (default 75), and, as our
choice, OpenAI's medium 75 and xhigh 100; none or minimal turn thinking off. With `tool_choice` none the
tools are still shown to the model but the ｜DSML｜ token is banned, so no call and no markup can come.
"""

from __future__ import annotations

import functools
import re
from typing import Any

from tfc.runtime.engine.chat import ChatOptions, ChatPlan
from tfc.runtime.models.dsv41.chat.dsml import DSML, ChatError
from tfc.runtime.models.dsv41.chat.encoding import THINK_END, Encoding, render
from tfc.runtime.models.dsv41.chat.grammar import json_grammar, tool_grammar
from tfc.runtime.models.dsv41.chat.reply import ReplyIds, ReplyReader

EFFORTS = {"low": 50, "medium": 75, "high": 75, "xhigh": 100, "max": 100}
DEFAULT_EFFORT = 75
OFF = ("none", "minimal")
_NAME = re.compile(r"[^\"\n<>]{1,128}")

__all__ = ["ChatError", "Dsv41ChatFormat", "chat_text"]


def chat_text(prompt: str) -> str:
    """The prompt as one user turn, rendered with the V4.1 chat template in chat (non-thinking) mode."""
    return render([{"role": "user", "content": prompt}], Encoding())


def effort_of(effort: str | int | None) -> tuple[int, bool | None]:
    """(the effort number, whether the name turns thinking on or off, None when it says nothing)."""
    if effort is None:
        return DEFAULT_EFFORT, None
    if isinstance(effort, int) and not isinstance(effort, bool) and 1 <= effort <= 100:
        return effort, True
    if isinstance(effort, str) and effort in OFF:
        return DEFAULT_EFFORT, False
    if isinstance(effort, str) and effort in EFFORTS:
        return EFFORTS[effort], True
    names = ", ".join([*EFFORTS, *OFF])
    raise ChatError(
        f"reasoning_effort: {effort!r} is not an integer 1-100 or one of {names}", "reasoning_effort"
    )


def _functions(tools: tuple[dict, ...]) -> list[dict]:
    """The function objects of OpenAI tools, each with a name the markup can carry."""
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(fn, dict):
            raise ChatError(
                f"tools[{i}]: a tool is {{'type': 'function', 'function': {{...}}}}", f"tools[{i}]"
            )
        name = fn.get("name")
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise ChatError(f"tools[{i}].function.name: a name of 1-128 characters without quotes, "
                            "newlines or angle brackets is needed", f"tools[{i}].function.name")  # fmt: skip
        params = fn.get("parameters")
        if params is not None and not isinstance(params, dict):
            raise ChatError(f"tools[{i}].function.parameters: must be a JSON schema object",
                            f"tools[{i}].function.parameters")  # fmt: skip
        out.append(fn)
    return out


def _choice(choice: str | dict, functions: list[dict]) -> str | None:
    """'none', 'auto', 'required', or the one function's name that tool_choice names."""
    if isinstance(choice, str):
        if choice not in ("none", "auto", "required"):
            raise ChatError(
                f"tool_choice: {choice!r} is not none, auto, required or a function", "tool_choice"
            )
        if choice == "required" and not functions:
            raise ChatError("tool_choice: required needs `tools`", "tool_choice")
        return choice
    fn = choice.get("function") if isinstance(choice, dict) else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise ChatError("tool_choice: a function choice is {'type': 'function', 'function': {'name': ...}}",
                        "tool_choice")  # fmt: skip
    if all(f["name"] != name for f in functions):
        raise ChatError(f"tool_choice.function.name: {name!r} is not one of the request's tools",
                        "tool_choice.function.name")  # fmt: skip
    return name


def _schema_of(fmt: dict | None) -> tuple[Any, bool]:
    """(the schema a response_format asks for or None, whether it is strict)."""
    if fmt is None or fmt.get("type") == "text":
        return None, False
    if fmt.get("type") == "json_object":
        return {"type": "object"}, False
    if fmt.get("type") == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict | bool):
            raise ChatError("response_format.json_schema.schema: a JSON schema object is needed",
                            "response_format.json_schema.schema")  # fmt: skip
        return schema, bool(spec.get("strict"))
    raise ChatError(f"response_format.type: {fmt.get('type')!r} is not text, json_object or json_schema",
                    "response_format.type")  # fmt: skip


class Dsv41ChatFormat:
    """Renders prompts and chat requests to the ids the model sees, with the image's tokenizer."""

    def __init__(self, tokenizer: Any, bos_id: int | None) -> None:
        self.tokenizer = tokenizer
        self.bos_id = bos_id
        think_end, dsml = tokenizer.token_to_id(THINK_END), tokenizer.token_to_id(DSML)
        self.ids = ReplyIds(think_end, dsml) if think_end is not None and dsml is not None else None

    def encode(self, prompt: str, chat: bool) -> list[int]:
        """Prompt ids: the chat rendering (special tokens matched), or BOS + the plain text."""
        if chat:
            return self._ids(chat_text(prompt))
        ids = self._ids(prompt)
        return ([self.bos_id] if self.bos_id is not None else []) + ids

    def render(self, messages: list[dict], options: ChatOptions | None = None) -> list[int]:
        """The ids of a conversation rendered for the model to answer."""
        return list(self.plan(messages, options or ChatOptions()).prompt)

    def plan(self, messages: list[dict], options: ChatOptions) -> ChatPlan:
        """The prompt ids, reply reader and decoding constraint of one chat request."""
        last = len(messages) - 1
        if messages and (messages[-1].get("role") == "assistant") != options.continue_final_message:
            said = ("continue_final_message needs an assistant turn last" if options.continue_final_message
                    else "the last message is an assistant turn; end with a user turn")  # fmt: skip
            raise ChatError(said, f"messages[{last}]")
        effort, says = effort_of(options.effort)
        thinking = options.thinking if options.thinking is not None else bool(says)
        functions = _functions(options.tools)
        if functions and self.ids is None:
            raise ChatError(
                "tools: this tokenizer has no ｜DSML｜ token, so tools cannot be offered", "tools"
            )
        choice = (
            _choice(options.tool_choice, functions) if functions or options.tool_choice != "auto" else "auto"
        )
        schema, strict = _schema_of(options.response_format)
        enc = Encoding(thinking, effort, tuple(functions), schema, generation_prompt=options.add_generation_prompt,
                       open_last=options.continue_final_message)  # fmt: skip
        text = render(messages, enc)
        think_end = self.ids.think_end if thinking and self.ids else None
        grammar, about = None, ""
        if choice not in ("none", "auto"):
            chosen = functions if choice == "required" else [f for f in functions if f["name"] == choice]
            parallel = options.parallel_tool_calls and choice == "required"
            grammar, about = tool_grammar(chosen, self.ids.dsml, think_end, parallel), "tools"
        elif schema is not None:
            grammar, about = json_grammar(schema, think_end, lenient=not strict), "response_format"
        tools_on = bool(functions) and choice != "none"
        reader = functools.partial(
            ReplyReader, self.tokenizer, self.ids or ReplyIds(-1, -1), thinking=thinking, tools=tools_on,
            parallel=options.parallel_tool_calls, stops=options.stop,
        )  # fmt: skip
        banned = frozenset({self.ids.dsml}) if functions and choice == "none" else frozenset()
        return ChatPlan(tuple(self._ids(text)), reader, grammar, banned, thinking, grammar_for=about)

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids
