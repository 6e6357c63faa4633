"""DSML, DeepSeek-V4.1's tool-call markup: rendering calls into a turn, and parsing a generated block.

V4.1 tag names carry a leading space after the ｜DSML｜ token (spec/deepseek_v41.md section 11):

    <｜DSML｜ calls>
    <｜DSML｜ invoke name="get_weather">
    <｜DSML｜ parameter name="city" string="true">Paris</｜DSML｜ parameter>
    </｜DSML｜ invoke>
    </｜DSML｜ calls>

Generated text is parsed with the ｜DSML｜ *token* replaced by MARK (a private-use character), so the same
characters spelled by ordinary tokens stay text. V4's unspaced tags (`tool_calls`, `invoke`, `parameter`
right after the token) and V3.2's `function_calls` are recognised and refused by name, never parsed as V4.1.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from tfc.runtime.engine.request import PromptError

DSML = "｜DSML｜"
MARK = "\ue000"  # stands for the ｜DSML｜ token in parsed text
BLOCK, INVOKE, PARAM = " calls", " invoke", " parameter"
SEPARATOR = "\n\n"  # between an assistant turn's content and its calls block, even when the content is empty


class ChatError(PromptError):
    """Messages the DeepSeek-V4.1 chat format cannot render."""


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_calls(calls: list[dict], where: str) -> str:
    """The calls block of a historical assistant turn (OpenAI `tool_calls` in, DSML text out)."""
    invokes = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ChatError(f"{at}.function.name: a tool call needs a function name", f"{at}.function.name")
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except ValueError:
                raise ChatError(f"{at}.function.arguments: not JSON", f"{at}.function.arguments") from None
        if args is None:
            args = {}
        if not isinstance(args, dict):
            raise ChatError(f"{at}.function.arguments: must be a JSON object", f"{at}.function.arguments")
        params = "\n".join(
            f'<{DSML}{PARAM} name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
            f"{v if isinstance(v, str) else _json(v)}</{DSML}{PARAM}>"
            for k, v in args.items()
        )
        invokes.append(f'<{DSML}{INVOKE} name="{fn["name"]}">\n{params}\n</{DSML}{INVOKE}>')
    return f"<{DSML}{BLOCK}>\n" + "\n".join(invokes) + f"\n</{DSML}{BLOCK}>"


# -- parsing a generated block --------------------------------------------------------------------------

_OPEN_BLOCK = f"<{MARK}{BLOCK}>"
_CLOSE_BLOCK = f"</{MARK}{BLOCK}>"
_INVOKE = re.compile(f"<{MARK}{INVOKE}" + r'\s+name="([^"\n]*)"\s*>')
_PARAM = re.compile(f"<{MARK}{PARAM}" + r'\s+name="([^"\n]*)"\s+string="(true|false)"\s*>')
_CLOSE_INVOKE = f"</{MARK}{INVOKE}>"
_CLOSE_PARAM = f"</{MARK}{PARAM}>"
_OLD = re.compile(f"</?{MARK}(tool_calls|function_calls|invoke|parameter)")
_WS = re.compile(r"\s*")


@dataclass
class Call:
    """One parsed invoke: its name, the parameters closed so far, whether its close tag was read."""

    name: str
    params: list[tuple[str, str, bool]] = field(default_factory=list)  # (key, raw value, string="true")
    closed: bool = False

    def fragment(self, k: int) -> str:
        """The JSON text parameter k adds to the arguments object."""
        key, raw, is_str = self.params[k]
        value = _json(raw) if is_str else _json_value(raw)
        return ("{" if k == 0 else ", ") + _json(key) + ": " + value

    def closing(self) -> str:
        """The JSON text that closes the arguments object."""
        return "}" if self.params else "{}"

    def arguments(self) -> str:
        """The whole arguments object as JSON text."""
        return "".join(self.fragment(k) for k in range(len(self.params))) + self.closing()


def _json_value(raw: str) -> str:
    """A string="false" value as JSON; a value that is not JSON is kept as a JSON string."""
    try:
        return _json(json.loads(raw))
    except ValueError:
        return _json(raw)


@dataclass
class Parsed:
    """What a block's text parses to so far: its calls, where parsing stopped, and why if it broke."""

    calls: list[Call]
    done: int  # characters of the text that form a closed block (0 while it is open)
    error: str | None = None
    error_at: int = 0  # where the text that is not a V4.1 block starts


def parse_block(text: str, final: bool) -> Parsed:
    """Parse a calls block that starts at text[0] (MARK for the ｜DSML｜ token); `final`: no more text comes.

    A prefix that can still become a block parses without error; text that cannot (or an open block at
    the end) sets `error` and `error_at`, the start of the element that broke.
    """
    calls: list[Call] = []

    def broke(why: str, at: int) -> Parsed:
        old = _OLD.match(text, at)
        if old:
            era = "V3.2" if old.group(1) == "function_calls" else "V4"
            why = f"{era} markup <{DSML}{old.group(1)}> (unspaced tag), not V4.1's"
        return Parsed(calls, 0, why, at)

    def pending(at: int) -> bool:
        """Whether the tag starting at `at` is still being written (no '>' and no further ｜DSML｜ yet)."""
        rest = text[at:]
        return not final and ">" not in rest and MARK not in rest[3:]

    def literal(tag: str, at: int) -> int:
        """The end of `tag` at `at`, 0 while the text ends inside it, -1 when something else is there."""
        part = text[at : at + len(tag)]
        if part == tag:
            return at + len(tag)
        return 0 if tag.startswith(part) and not final else -1

    at = literal(_OPEN_BLOCK, 0)
    if at <= 0:
        return Parsed(calls, 0) if at == 0 else broke("the block does not open with <｜DSML｜ calls>", 0)
    while True:
        at = _WS.match(text, at).end()
        if at >= len(text):
            return broke("the calls block is not closed", at) if final else Parsed(calls, 0)
        end = literal(_CLOSE_BLOCK, at)
        if end > 0:
            return Parsed(calls, end) if calls else broke("a calls block with no invoke", at)
        m = _INVOKE.match(text, at)
        if m is None:
            return Parsed(calls, 0) if pending(at) else broke("expected <｜DSML｜ invoke name=...>", at)
        call = Call(m.group(1))
        calls.append(call)
        at = m.end()
        while True:
            at = _WS.match(text, at).end()
            if at >= len(text):
                return broke("an invoke is not closed", at) if final else Parsed(calls, 0)
            end = literal(_CLOSE_INVOKE, at)
            if end > 0:
                call.closed, at = True, end
                break
            p = _PARAM.match(text, at)
            if p is None:
                if pending(at):
                    return Parsed(calls, 0)
                return broke("expected <｜DSML｜ parameter name=... string=...>", at)
            close = text.find(_CLOSE_PARAM, p.end())
            if close < 0:
                mark = text.find(MARK, p.end())
                stray = mark >= 0 and not (
                    text[mark - 2 : mark] == "</" and _CLOSE_PARAM.startswith(text[mark - 2 :])
                )
                return broke("a parameter is not closed", at) if final or stray else Parsed(calls, 0)
            key = p.group(1)
            if any(key == k for k, _, _ in call.params):
                return broke(f"parameter {key!r} given twice", at)
            call.params.append((key, text[p.end() : close], p.group(2) == "true"))
            at = close + len(_CLOSE_PARAM)
