"""A Messages reply built from the chat reader's parts: content blocks, their stream events, the stop reason.

Reasoning becomes a `thinking` block (its `signature` empty: nothing here signs it), answer text a `text`
block, each tool call a `tool_use` block whose input streams as `input_json_delta` pieces that join into its
JSON object. A block opens when the kind of part changes, so a streamed reply and a whole one have the same
blocks: the whole reply is what its stream events add up to.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from tfc.runtime.engine.chat import CallArguments, CallStart, Content, Reasoning, ReplyEnd

log = logging.getLogger("tfc.messages")
TOOL_ID = "toolu_"
DELTAS = {"text": ("text_delta", "text"), "thinking": ("thinking_delta", "thinking")}


class MessageBlocks:
    """One reply's content blocks; `add(parts)` and `close()` give the stream events as (name, data)."""

    def __init__(self, show_thinking: bool = True) -> None:
        self.show_thinking = show_thinking
        self.blocks: list[dict] = []
        self.open: int | None = None  # the index of the block still taking deltas
        self.calls: dict[int, int] = {}  # a reader call index -> its block's index
        self.arguments: dict[int, list[str]] = {}  # a tool_use block's index -> its input's JSON pieces
        self.end: ReplyEnd | None = None

    def add(self, parts: list) -> list[tuple[str, dict]]:
        """Take the reader's parts; the events they make."""
        events: list[tuple[str, dict]] = []
        for part in parts:
            if isinstance(part, Reasoning):
                self._text(events, "thinking", part.text)
            elif isinstance(part, Content):
                self._text(events, "text", part.text)
            elif isinstance(part, CallStart):
                call_id = TOOL_ID + part.id.removeprefix("call_")
                self._start(events, {"type": "tool_use", "id": call_id, "name": part.name, "input": {}})
                self.calls[part.index] = self.open
                self.arguments[self.open] = []
            elif isinstance(part, CallArguments):
                at = self.calls[part.index]
                self.arguments[at].append(part.text)
                events.append(_delta(at, {"type": "input_json_delta", "partial_json": part.text}))
            elif isinstance(part, ReplyEnd):
                self.end = part
        return events

    def close(self) -> list[tuple[str, dict]]:
        """The stop event of the block still open (none when none is)."""
        if self.open is None:
            return []
        at, self.open = self.open, None
        return [("content_block_stop", {"type": "content_block_stop", "index": at})]

    def content(self) -> list[dict]:
        """The whole reply's content blocks (each tool_use with its input parsed)."""
        out = []
        for at, b in enumerate(self.blocks):
            if b["type"] == "tool_use":
                b = {**b, "input": _input(self.arguments[at])}
            out.append(b)
        return out

    def stop(self, finish: str) -> tuple[str, str | None]:
        """(stop_reason, stop_sequence) of a reply the engine ended with `finish` (stop or length)."""
        if finish == "length":
            return "max_tokens", None
        if self.calls:
            return "tool_use", None
        if self.end is not None and self.end.stop is not None:
            return "stop_sequence", self.end.stop
        return "end_turn", None

    def cut_in_reasoning(self, finish: str) -> bool:
        """Whether max_tokens ended the reply inside its reasoning (no answer at all)."""
        return finish == "length" and self.end is not None and self.end.in_reasoning

    def _text(self, events: list, kind: str, text: str) -> None:
        if self.open is None or self.blocks[self.open]["type"] != kind:
            self._start(events, {"type": "text", "text": ""} if kind == "text" else
                        {"type": "thinking", "thinking": "", "signature": ""})  # fmt: skip
        if kind == "thinking" and not self.show_thinking:
            return
        name, field = DELTAS[kind]
        self.blocks[self.open][field] += text
        events.append(_delta(self.open, {"type": name, field: text}))

    def _start(self, events: list, first: dict) -> None:
        events.extend(self.close())
        self.blocks.append(first)
        self.open = len(self.blocks) - 1
        events.append(("content_block_start", {"type": "content_block_start", "index": self.open,
                                               "content_block": dict(first)}))  # fmt: skip


def _delta(at: int, delta: dict) -> tuple[str, dict]:
    return "content_block_delta", {"type": "content_block_delta", "index": at, "delta": delta}


def _input(pieces: list[str]) -> Any:
    """A tool call's input object from its JSON pieces (the reader always closes the object)."""
    try:
        value = json.loads("".join(pieces))
    except ValueError:
        log.warning("a tool call's arguments are not JSON: %r", "".join(pieces))
        return {}
    return value if isinstance(value, dict) else {}


def usage(prompt: int, completion: int, cached: int) -> dict:
    """Anthropic's usage: input_tokens are the prompt tokens computed, cache_read_input_tokens those the
    prefix cache restored (the two add up to the prompt, as count_tokens gives it)."""
    return {"input_tokens": prompt - cached, "output_tokens": completion, "cache_read_input_tokens": cached,
            "cache_creation_input_tokens": 0}  # fmt: skip
