"""The chat contract between a family's chat format and the server, in family-neutral terms.

The server hands a chat format the messages and `ChatOptions` (what the request asked); the format answers
with a `ChatPlan`: the prompt ids, a reader that turns generated ids into reply parts, and how to constrain
decoding (a Lark grammar, ids to ban). Reply parts are what a chat reply is made of on the wire.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatOptions:
    """A chat request's options as the client gave them (the format checks and maps them)."""

    thinking: bool | None = None  # None: the format's default
    effort: str | int | None = None
    tools: tuple[dict, ...] = ()  # OpenAI tool objects {"type": "function", "function": {...}}
    tool_choice: str | dict = (
        "auto"  # "none" | "auto" | "required" | {"type": "function", "function": {"name"}}
    )
    parallel_tool_calls: bool = True
    response_format: dict | None = None  # OpenAI response_format
    stop: tuple[str, ...] = ()
    add_generation_prompt: bool = True  # False: no assistant header after the last turn
    continue_final_message: bool = False  # the last message is an assistant turn left open (no end of turn)


@dataclass(frozen=True)
class ChatPlan:
    """What a chat request runs as: prompt ids, the reply reader, the decoding constraint."""

    prompt: tuple[int, ...]
    reader: Callable[[], Any]
    grammar: str | None = None  # a Lark grammar (llguidance) the reply must follow
    banned: frozenset[int] = frozenset()  # ids the reply may never contain
    thinking: bool = False
    grammar_for: str = ""  # the request field the grammar comes from (names it in a 400)


@dataclass(frozen=True)
class Reasoning:
    """Reasoning text."""

    text: str


@dataclass(frozen=True)
class Content:
    """Answer text."""

    text: str


@dataclass(frozen=True)
class CallStart:
    """A tool call opens: its index in the reply, its id and the function's name."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class CallArguments:
    """More of a tool call's arguments (JSON text; the pieces of one call join into one JSON object)."""

    index: int
    text: str


@dataclass(frozen=True)
class ReplyEnd:
    """The reader's last word: reasoning tokens, whether the reply ended inside its reasoning, calls made, and
    the stop string that ended it (None when none did)."""

    reasoning_tokens: int
    in_reasoning: bool
    calls: int
    stop: str | None = None
