"""A reply's Responses output: items built from the chat reader's parts, their stream events, the object.

One builder serves both replies: a streamed one sends the events it returns, a whole one keeps only the
items, so the two always hold the same text. Parts of one kind form one item (reasoning, a message, one
function call); a change of kind closes the open item and opens the next.
"""

from __future__ import annotations

import secrets
from typing import Any

from tfc.runtime.engine.chat import CallArguments, CallStart, Content, Reasoning, ReplyEnd
from tfc.runtime.server.responses_protocol import ResponsesRequest


def item_id(prefix: str) -> str:
    """A response's or output item's id (OpenAI's prefixes: resp_, rs_, msg_, fc_)."""
    return f"{prefix}_{secrets.token_hex(12)}"


def _text_part(text: str) -> dict:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


class OutputBuilder:
    """The output items of one reply; `add` and `finish` return their stream events (not yet numbered)."""

    def __init__(self) -> None:
        self.items: list[dict] = []
        self.open: Any = None  # the open item's key: "reasoning", "message" or a reader call index
        self.calls: dict[int, int] = {}  # reader call index -> output index
        self.end: ReplyEnd | None = None

    @property
    def reasoning_tokens(self) -> int:
        return self.end.reasoning_tokens if self.end is not None else 0

    def add(self, parts: list) -> list[dict]:
        """Take reader parts; the events they make."""
        events: list[dict] = []
        for part in parts:
            if isinstance(part, Reasoning | Content) and part.text:
                key = "reasoning" if isinstance(part, Reasoning) else "message"
                if self.open != key:
                    events += self._close("completed") + self._open_text(key)
                events += self._text(part.text)
            elif isinstance(part, CallStart):
                events += self._close("completed")
                self.open = part.index
                self.calls[part.index] = len(self.items)
                item = {
                    "id": item_id("fc"),
                    "type": "function_call",
                    "status": "in_progress",
                    "call_id": part.id,
                    "name": part.name,
                    "arguments": "",
                }
                self.items.append(item)
                events.append(_added(item, len(self.items) - 1))
            elif isinstance(part, CallArguments):
                at = self.calls[part.index]
                self.items[at]["arguments"] += part.text
                events.append(
                    {
                        "type": "response.function_call_arguments.delta",
                        "item_id": self.items[at]["id"],
                        "output_index": at,
                        "delta": part.text,
                    }
                )
            elif isinstance(part, ReplyEnd):
                self.end = part
        return events

    def finish(self, complete: bool) -> list[dict]:
        """Close the open item (incomplete when the reply was cut); a finished reply holds a message."""
        events = self._close("completed" if complete else "incomplete")
        if complete and all(item["type"] == "reasoning" for item in self.items):
            events += self._open_text("message") + self._close("completed")
        return events

    def _open_text(self, key: str) -> list[dict]:
        self.open = key
        if key == "reasoning":
            item = {
                "id": item_id("rs"),
                "type": "reasoning",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
            part = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "id": item_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
            part = _text_part("")
        self.items.append(item)
        at = len(self.items) - 1
        return [
            _added(item, at),
            {
                "type": "response.content_part.added",
                "item_id": item["id"],
                "output_index": at,
                "content_index": 0,
                "part": part,
            },
        ]

    def _text(self, text: str) -> list[dict]:
        at, item = len(self.items) - 1, self.items[-1]
        kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
        item.setdefault("_text", []).append(text)
        event = {
            "type": f"response.{kind}.delta",
            "item_id": item["id"],
            "output_index": at,
            "content_index": 0,
            "delta": text,
        }
        if kind == "output_text":
            event["logprobs"] = []
        return [event]

    def _close(self, status: str) -> list[dict]:
        """The events that close the open item, which takes its final form."""
        if self.open is None:
            return []
        key, self.open = self.open, None
        at = self.calls[key] if isinstance(key, int) else len(self.items) - 1
        item = self.items[at]
        item["status"] = status
        events = []
        if item["type"] == "function_call":
            events.append(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": at,
                    "name": item["name"],
                    "arguments": item["arguments"],
                }
            )
        else:
            text = "".join(item.pop("_text", []))
            kind = "reasoning_text" if item["type"] == "reasoning" else "output_text"
            part = {"type": kind, "text": text} if kind == "reasoning_text" else _text_part(text)
            item["content"] = [part]
            done = {
                "type": f"response.{kind}.done",
                "item_id": item["id"],
                "output_index": at,
                "content_index": 0,
                "text": text,
            }
            if kind == "output_text":
                done["logprobs"] = []
            events += [
                done,
                {
                    "type": "response.content_part.done",
                    "item_id": item["id"],
                    "output_index": at,
                    "content_index": 0,
                    "part": part,
                },
            ]
        events.append({"type": "response.output_item.done", "output_index": at, "item": item})
        return events


def _added(item: dict, at: int) -> dict:
    return {"type": "response.output_item.added", "output_index": at, "item": {**item}}


def usage(prompt: int, output: int, reasoning: int, cached: int) -> dict:
    """The Responses usage object."""
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + output,
    }


def response_object(
    body: ResponsesRequest,
    rid: str,
    created: int,
    model: str,
    status: str,
    output: list[dict] | None = None,
    **extra: Any,
) -> dict:
    """The response object, the request's settings echoed as OpenAI does (`store` false: nothing is kept)."""
    reasoning = body.reasoning
    return {
        "id": rid,
        "object": "response",
        "created_at": created,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": body.instructions,
        "max_output_tokens": body.max_output_tokens,
        "model": model,
        "output": output or [],
        "parallel_tool_calls": body.parallel_tool_calls is not False,
        "previous_response_id": None,
        "reasoning": {
            "effort": reasoning.effort if reasoning else None,
            "summary": (reasoning.summary or reasoning.generate_summary) if reasoning else None,
        },
        "store": False,
        "temperature": 1.0 if body.temperature is None else body.temperature,
        "text": {"format": (body.text.format if body.text and body.text.format else {"type": "text"})},
        "tool_choice": body.tool_choice if body.tool_choice is not None else "auto",
        "tools": body.tools or [],
        "top_p": 1.0 if body.top_p is None else body.top_p,
        "truncation": "disabled",
        "usage": None,
        "user": body.user,
        "safety_identifier": body.safety_identifier,
        "metadata": body.metadata or {},
        "background": False,
        "service_tier": "default",
        **extra,
    }
