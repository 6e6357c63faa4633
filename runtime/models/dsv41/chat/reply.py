"""Reading a generated DeepSeek-V4.1 reply token by token: reasoning, answer text and DSML tool calls.

Keyed on token ids, never on text: `</think>` (by its id) ends the reasoning; the ｜DSML｜ id right after a
`<` opens a calls block (and ends the reasoning when it opens inside it). Text that may turn out to be the
start of a block (a trailing `<` and the blank line before it) or of a stop string is held back until the
next token decides. A tool call streams as its name when its invoke tag is read, one JSON fragment per
closed parameter, and the closing brace, so the pieces always join into a JSON object. Markup that breaks
becomes answer text (the ｜DSML｜ token spelled out) and a logged warning; calls closed before the break
stay calls. Stop strings cut the answer only, never the reasoning or a calls block.
"""

from __future__ import annotations

import logging
import re
import secrets
from dataclasses import dataclass

from tfc.runtime.engine.chat import CallArguments, CallStart, Content, Reasoning, ReplyEnd
from tfc.runtime.engine.detok import stop_prefix
from tfc.runtime.models.dsv41.chat.dsml import DSML, MARK, SEPARATOR, parse_block

log = logging.getLogger("tfc.chat")
_OPENER = re.compile(r"\n{0,2}<?\Z")


@dataclass(frozen=True)
class ReplyIds:
    """The ids a reply is keyed on, from the served tokenizer (looked up by text, so any V4.1 vocabulary works)."""

    think_end: int
    dsml: int


class ReplyReader:
    """One reply: `add(token)` -> (parts, stop string hit); `flush()` -> the rest and a ReplyEnd."""

    def __init__(self, tokenizer, ids: ReplyIds, *, thinking: bool, tools: bool, parallel: bool = True,
                 stops: tuple[str, ...] = (), min_tokens: int = 0) -> None:  # fmt: skip
        self.tokenizer, self.ids = tokenizer, ids
        self.reasoning = thinking
        self.tools, self.parallel = tools, parallel
        self.stops = tuple(s for s in stops if s)
        self.min_tokens = min_tokens  # a stop string ends nothing until more ids than this were read
        self.seen = 0
        self.pending: list[int] = []  # ids whose text is an unfinished UTF-8 character
        self.held = ""  # text of the current channel not released yet
        self.block: str | None = None  # an open calls block, MARK for the ｜DSML｜ token
        self.separator = ""
        self.sent: list[list[int]] = []  # per call of the open block: [index or -1, params sent, closed]
        self.calls = 0
        self.reasoning_tokens = 0
        self.done = False
        self.stopped_by: str | None = None  # the stop string that ended the reply

    # -- the engine's side ---------------------------------------------------------------------------------

    def add(self, token: int) -> tuple[list, bool]:
        """The parts this token completes, and whether a stop string ended the reply here."""
        out: list = []
        in_reasoning = self.reasoning
        self.seen += 1
        if token == self.ids.think_end and self.reasoning and self.block is None:
            self._text(self._decode(), out)
            self._release(out, everything=True)
            self.reasoning = False
        elif token == self.ids.dsml:
            self._text(self._decode(), out)
            self._mark(out)
        else:
            self.pending.append(token)
            self._text(self._decode(partial=True), out)
        if in_reasoning and self.reasoning:
            self.reasoning_tokens += 1
        if self.done:
            out.append(self._end())
        return out, self.done

    def flush(self, cut: bool = False) -> list:
        """Everything still held and the ReplyEnd; an open block is closed as broken, or with `cut` (the reply
        ran out of tokens) its complete calls are kept and its unfinished tag dropped, never shown as text."""
        out: list = []
        self._text(self._decode(), out)
        if self.block is not None and cut:
            self._cut_block(out)
        if self.block is not None:
            self._progress(out, final=True)
        self._release(out, everything=True)
        out.append(self._end())
        return out

    # -- text and markup -------------------------------------------------------------------------------------

    def _decode(self, partial: bool = False) -> str:
        """The text of the pending ids; with `partial`, nothing while they end inside a UTF-8 character."""
        if not self.pending:
            return ""
        text = self.tokenizer.decode(self.pending, skip_special_tokens=True)
        if partial and text.endswith("\ufffd"):
            return ""
        self.pending = []
        return text

    def _text(self, text: str, out: list) -> None:
        if not text:
            return
        if self.block is not None:
            self.block += text
            self._progress(out)
        else:
            self.held += text
            self._release(out)

    def _mark(self, out: list) -> None:
        """A ｜DSML｜ token: inside a block it is markup; after a `<` it opens one; elsewhere it is text."""
        if self.block is not None:
            self.block += MARK
            self._progress(out)
        elif self.tools and self.held.endswith("<"):
            before = self.held[:-1]
            self.separator = SEPARATOR if before.endswith(SEPARATOR) else before[len(before.rstrip("\n")) :]
            self.held = before[: len(before) - len(self.separator)]
            self._release(out, everything=True)
            self.reasoning = False  # a block that opens inside the reasoning ends it
            self.block, self.sent = "<" + MARK, []
            self._progress(out)
        else:
            self.held += DSML
            self._release(out)

    def _release(self, out: list, everything: bool = False) -> None:
        """Hand out held text, keeping back what may start a block or a stop string."""
        text, hold = self.held, 0
        if not self.reasoning and self.stops and self.seen > self.min_tokens:
            hits = [(at, s) for s in self.stops if (at := text.find(s)) >= 0]
            if hits:  # the earliest; at one place, the first given
                cut, self.stopped_by = min(hits, key=lambda hit: hit[0])
                text, self.done, everything = text[:cut], True, True
        if not everything:
            if self.tools:
                hold = len(_OPENER.search(text).group())
            if not self.reasoning:
                hold = max(hold, stop_prefix(text, self.stops))
        keep = len(text) - hold
        if keep > 0:
            out.append(Reasoning(text[:keep]) if self.reasoning else Content(text[:keep]))
        self.held = "" if self.done else text[keep:]

    def _progress(self, out: list, final: bool = False) -> None:
        """Parse the open block again and send what it newly completes."""
        parsed = parse_block(self.block, final)
        for k, call in enumerate(parsed.calls):
            if k == len(self.sent):
                keep = self.parallel or self.calls + k == 0
                index = self.calls + k if keep else -1
                if not keep:
                    log.warning(
                        "a tool call past the first with parallel_tool_calls off was dropped: %s", call.name
                    )
                self.sent.append([index, 0, 0])
                if keep:
                    out.append(CallStart(index, "call_" + secrets.token_hex(12), call.name))
            index, params, closed = self.sent[k]
            if index < 0:
                continue
            for j in range(params, len(call.params)):
                out.append(CallArguments(index, call.fragment(j)))
            self.sent[k][1] = len(call.params)
            if call.closed and not closed:
                out.append(CallArguments(index, call.closing()))
                self.sent[k][2] = 1
        if parsed.done:
            rest = self.block[parsed.done :]
            self._close_block()
            self._text(rest, out)
        elif parsed.error:
            log.warning("DSML markup that does not parse was returned as text: %s", parsed.error)
            for (index, _, closed), call in zip(self.sent, parsed.calls, strict=False):
                if index >= 0 and not closed:  # a call whose arguments were opened keeps what it has
                    out.append(CallArguments(index, call.closing()))
            at = parsed.error_at if parsed.calls else 0  # a block that made no call is all text again
            broken = self.block[at:].replace(MARK, DSML)
            if at == 0:
                broken = self.separator + broken
            self._close_block()
            self.tools = False  # the rest of the reply is text
            self.held += broken
            self._release(out)

    def _cut_block(self, out: list) -> None:
        """End a calls block the token limit cut off: opened calls close with what they have, the rest is dropped."""
        parsed = parse_block(self.block, final=False)
        for (index, _, closed), call in zip(self.sent, parsed.calls, strict=False):
            if index >= 0 and not closed:
                out.append(CallArguments(index, call.closing()))
        log.warning("a tool-call block cut off by max_tokens: its unfinished markup was dropped")
        self._close_block()

    def _close_block(self) -> None:
        self.calls += sum(1 for index, _, _ in self.sent if index >= 0)
        self.block, self.sent, self.separator = None, [], ""

    def _end(self) -> ReplyEnd:
        return ReplyEnd(self.reasoning_tokens, self.reasoning, self.calls, self.stopped_by)
