"""Incremental detokenization with stop strings: text is released only when no stop string can still start in it.

Each id decodes a bounded window, the way vLLM and `tokenizers`' DecodeStream do: ids[:read] are settled
text that no later id changes; a new id decodes ids[prefix:] (ids[prefix:read] again, as context) and the
text past the context's is the tail, settled once it no longer ends in an unfinished UTF-8 character. Only
the characters a stop string can still reach are kept in front of what was released.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

PARTIAL = "\ufffd"  # what a decode shows for an unfinished UTF-8 character
PENDING = 8  # undecided ids past which a settle point is looked for a few ids back
LOOKBACK = 4  # ids left undecided then: a UTF-8 character has at most 3 bytes before its last one
TRIM = 256  # released characters kept beyond the stop strings' reach before the front is dropped


class StopText:
    """Generated ids -> released text; finds stop strings and holds back what may become one."""

    def __init__(self, tokenizer: Any, stops: Sequence[str], min_tokens: int = 0) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.min_tokens = min_tokens  # a stop string ends nothing until more ids than this were added
        self.reach = max((len(s) for s in self.stops), default=1)
        self.ids: list[int] = []
        self.prefix = self.read = 0  # ids[prefix:read] are decoded again as context; ids[:read] are settled
        self.context = ""  # the text of ids[prefix:read] decoded alone
        self.settled = ""  # the text of ids[:read], less its first `base` characters
        self.tail = ""  # the text of ids[read:], which later ids may still change
        self.base = 0  # characters dropped from the front: released, and out of any stop string's reach
        self.released = 0  # characters of the text already handed out

    def add(self, token: int | None) -> tuple[str, bool]:
        """Append a token (None: no new text, just flush); (newly released text, whether a stop string ended it)."""
        if token is not None:
            self.ids.append(token)
            self._decode()
        text = self.settled + self.tail
        for stop in self.stops if len(self.ids) > self.min_tokens else ():
            at = text.find(stop, max(0, self.released - self.base - len(stop) + 1))
            if at >= 0:
                return self._release(text, at), True
        return self._release(text, len(text) - self._hold(text)), False

    def flush(self, cut: bool = False) -> str:
        """All text not yet released (at the end of a sequence; `cut`, the token limit ended it, changes nothing here)."""
        text = self.settled + self.tail
        return self._release(text, len(text))

    def _decode(self) -> None:
        """Decode the window after a new id; settle it when it ends in a whole character."""
        window = self._text(self.prefix, len(self.ids))
        if len(window) > len(self.context) and not window.endswith(PARTIAL):
            self._settle(len(self.ids), window)
            return
        if len(self.ids) - self.read > PENDING:  # a long run of ids ending in U+FFFD or showing nothing
            cut = len(self.ids) - LOOKBACK
            head, rest = self._text(self.prefix, cut), self._text(cut, len(self.ids))
            # ids[:cut] end in a whole character, or the ids after them ended the one left open
            ended = not head.endswith(PARTIAL) or (rest and head + rest == window)
            if ended and head.startswith(self.context):  # no later id can change the text of ids[:cut]
                self._settle(cut, head)
                window = self._text(self.prefix, len(self.ids))
        self.tail = window[len(self.context) :]

    def _settle(self, upto: int, window: str) -> None:
        """ids[:upto] become settled text; `window` is the text of ids[prefix:upto]."""
        self.settled += window[len(self.context) :]
        self.prefix, self.read = self.read, upto
        self.context = self._text(self.prefix, self.read)
        self.tail = ""

    def _text(self, lo: int, hi: int) -> str:
        """The text of ids[lo:hi] decoded alone."""
        return self.tokenizer.decode(self.ids[lo:hi], skip_special_tokens=True) if hi > lo else ""

    def _hold(self, text: str) -> int:
        """How many trailing characters to hold: a partial UTF-8 character, or a prefix of a stop string."""
        return max(1 if text.endswith(PARTIAL) else 0, stop_prefix(text, self.stops))

    def _release(self, text: str, upto: int) -> str:
        """Hand out `text` (the settled text and the tail) up to `upto`; drop what no stop string can reach."""
        start = self.released - self.base
        upto = max(upto, start)
        out = text[start:upto]
        self.released = self.base + upto
        drop = min(self.released - self.reach - self.base, len(self.settled))
        if drop > TRIM:
            self.settled = self.settled[drop:]
            self.base += drop
        return out


def stop_prefix(text: str, stops: Sequence[str]) -> int:
    """The length of the longest end of `text` that a stop string starts with (text to hold back)."""
    hold = 0
    for stop in stops:
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                hold = max(hold, n)
                break
    return hold
