"""Incremental detokenization with stop strings: text is released only when no stop string can still start in it."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class StopText:
    """Generated ids -> released text; finds stop strings and holds back what may become one."""

    def __init__(self, tokenizer: Any, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.stops = tuple(s for s in stops if s)
        self.ids: list[int] = []
        self.released = 0  # characters of the text already handed out
        self.text = ""

    def add(self, token: int | None) -> tuple[str, bool]:
        """Append a token (None: no new text, just flush); (newly released text, whether a stop string ended it)."""
        if token is not None:
            self.ids.append(token)
            self.text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        text = self.text
        for stop in self.stops:
            at = text.find(stop, max(0, self.released - len(stop) + 1))
            if at >= 0:
                text = text[:at]
                return self._release(text, len(text)), True
        return self._release(text, len(text) - self._hold(text)), False

    def flush(self, cut: bool = False) -> str:
        """All text not yet released (at the end of a sequence; `cut`, the token limit ended it, changes nothing here)."""
        return self._release(self.text, len(self.text))

    def _hold(self, text: str) -> int:
        """How many trailing characters to hold: a partial UTF-8 character, or a prefix of a stop string."""
        return max(1 if text.endswith("\ufffd") else 0, stop_prefix(text, self.stops))

    def _release(self, text: str, upto: int) -> str:
        upto = max(upto, self.released)
        out = text[self.released : upto]
        self.released = upto
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
