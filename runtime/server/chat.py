"""Chat requests between the HTTP body and the engine: options for the chat format, constraints, reply JSON.

The chat format (the family's) renders and reads; this module only moves OpenAI fields into `ChatOptions`,
compiles the plan's grammar into a per-choice constraint, and turns reply parts into a message or into
stream deltas (reasoning both as `reasoning_content` and as `reasoning`).
"""

from __future__ import annotations

import logging
from typing import Any

from tfc.runtime.engine.chat import (
    CallArguments,
    CallStart,
    ChatOptions,
    ChatPlan,
    Content,
    Reasoning,
    ReplyEnd,
)
from tfc.runtime.engine.constraint import AllOf, BannedTokens
from tfc.runtime.engine.grammar import GrammarError, Grammars

log = logging.getLogger("tfc.chat")
_GRAMMARS: dict[int, Grammars] = {}


class ConstraintError(Exception):
    """A grammar the constraint library refused: a 400 naming the request field it came from."""

    def __init__(self, message: str, param: str) -> None:
        super().__init__(message)
        self.message, self.param = message, param


def options(body: Any, stops: tuple[str, ...] = ()) -> ChatOptions:
    """The chat options of a chat completion (or /tokenize) body."""
    kwargs = body.chat_template_kwargs
    thinking = (
        None
        if kwargs is None
        else (kwargs.thinking if kwargs.thinking is not None else kwargs.enable_thinking)
    )
    effort = (
        body.reasoning_effort if body.reasoning_effort is not None else (kwargs and kwargs.reasoning_effort)
    )
    choice = body.tool_choice
    return ChatOptions(
        thinking=thinking, effort=effort or None,
        tools=tuple(t.model_dump(exclude_none=True) for t in body.tools or ()),
        tool_choice=(choice if isinstance(choice, str) else choice.model_dump()) if choice is not None else "auto",
        parallel_tool_calls=body.parallel_tool_calls,
        response_format=body.response_format.model_dump(by_alias=True, exclude_none=True)
        if body.response_format is not None else None,
        stop=stops,
    )  # fmt: skip


def messages(body: Any) -> list[dict]:
    """The body's messages as plain dicts."""
    return [m.model_dump(exclude_none=True) for m in body.messages]


def constraints(state: Any, plan: ChatPlan, n: int) -> list[Any]:
    """One fresh constraint per choice (None when the plan has none), with the server's grammar compiler."""
    key = id(state.tokenizer)
    if key not in _GRAMMARS:
        _GRAMMARS[key] = Grammars(
            state.tokenizer, state.engine.info.vocab_size, tuple(state.engine.info.eos_ids)
        )
    return plan_constraints(_GRAMMARS[key], plan, n)


def plan_constraints(grammars: Grammars, plan: ChatPlan, n: int) -> list[Any]:
    """One fresh constraint per choice for a chat plan: its grammar compiled, its banned ids."""
    if plan.grammar is None and not plan.banned:
        return [None] * n
    grammar = None
    if plan.grammar is not None:
        try:
            grammar = grammars.compile(plan.grammar)
        except GrammarError as error:
            raise ConstraintError(f"{plan.grammar_for}: the constraint library refused it ({error})",
                                  plan.grammar_for) from None  # fmt: skip
    out = []
    for i in range(n):
        parts = []
        if grammar is not None:
            parts.append(grammar if i == 0 else grammar.copy())
        if plan.banned:
            parts.append(BannedTokens(grammars.vocab_size, plan.banned))
        out.append(parts[0] if len(parts) == 1 else AllOf(parts))
    return out


class Reply:
    """One choice's reply assembled from reader parts: reasoning, content, tool calls, the reader's end."""

    def __init__(self) -> None:
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.calls: dict[int, dict] = {}
        self.end: ReplyEnd | None = None

    def add(self, parts: list) -> list[dict]:
        """Take parts; the stream deltas they make (consecutive text of one kind merged)."""
        deltas: list[dict] = []
        for part in parts:
            if isinstance(part, Reasoning):
                self.reasoning.append(part.text)
                _merge(deltas, "reasoning_content", part.text)
            elif isinstance(part, Content):
                self.content.append(part.text)
                _merge(deltas, "content", part.text)
            elif isinstance(part, CallStart):
                self.calls[part.index] = {"id": part.id, "type": "function",
                                          "function": {"name": part.name, "arguments": ""}}  # fmt: skip
                deltas.append({"tool_calls": [{"index": part.index, **self.calls[part.index]}]})
            elif isinstance(part, CallArguments):
                self.calls[part.index]["function"]["arguments"] += part.text
                deltas.append({"tool_calls": [{"index": part.index, "function": {"arguments": part.text}}]})
            elif isinstance(part, ReplyEnd):
                self.end = part
        for d in deltas:
            if "reasoning_content" in d:
                d["reasoning"] = d["reasoning_content"]
        return deltas

    def finish_reason(self, engine_finish: str) -> str:
        """length and errors as the engine says; a reply that called tools ends with tool_calls."""
        if engine_finish == "stop" and self.calls:
            return "tool_calls"
        return engine_finish

    def cut_in_reasoning(self, engine_finish: str) -> bool:
        """Whether max_tokens ended the reply before its reasoning did (no answer at all)."""
        return engine_finish == "length" and self.end is not None and self.end.in_reasoning

    def message(self) -> dict:
        """The assistant message of a whole reply."""
        msg: dict[str, Any] = {
            "role": "assistant",
            "content": "".join(self.content) if self.content else None,
        }
        if self.reasoning or (self.end is not None and self.end.reasoning_tokens):
            msg["reasoning_content"] = msg["reasoning"] = "".join(self.reasoning)
        if self.calls:
            msg["tool_calls"] = [self.calls[i] for i in sorted(self.calls)]
        elif msg["content"] is None and not self.reasoning:
            msg["content"] = ""
        return msg

    @property
    def reasoning_tokens(self) -> int:
        return self.end.reasoning_tokens if self.end is not None else 0


def _merge(deltas: list[dict], key: str, text: str) -> None:
    if deltas and set(deltas[-1]) == {key}:
        deltas[-1][key] += text
    else:
        deltas.append({key: text})


def warn_cut(rid: str, max_tokens: int) -> str:
    """The line said (and logged) when max_tokens ran out inside the reasoning."""
    line = f"max_tokens ({max_tokens}) ran out while the model was still reasoning: no answer was produced"
    log.warning("%s: %s", rid, line)
    return line
